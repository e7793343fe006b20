"""The generated corpus's cache: a folder is reused only whole and as its manifest records it (else rebuilt), and
a write that fails while building (disk full, file-size limit) is one line naming the folder, nothing left."""

import errno
import json
import shutil
import subprocess
import sys

import pytest

from emarule.errors import UserError
from emarule.speech import corpus

REQ = corpus.CorpusRequest(seed=5, utterances={"train-clean-100": 3, "dev-clean": 2}, speakers=2)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return corpus.ensure(REQ, tmp_path_factory.mktemp("corpus"))


@pytest.fixture
def copy(built, tmp_path, monkeypatch):
    """A copy of the built corpus, and the list of rebuilds `ensure` makes of it."""
    shutil.copytree(built, tmp_path / built.name)
    calls, real = [], corpus.build
    monkeypatch.setattr(corpus, "build", lambda r, out: calls.append(r) or real(r, out))
    return tmp_path / built.name, calls


def manifest(root):
    return json.loads((root / "manifest.json").read_text())


def test_a_whole_corpus_is_reused(copy):
    root, calls = copy
    assert corpus.ensure(REQ, root.parent) == root and calls == []


@pytest.mark.parametrize("damage", ["flipped", "truncated", "missing", "other request", "other version"])
def test_a_damaged_or_stale_corpus_is_rebuilt(copy, damage):
    root, calls = copy
    files = manifest(root)["files"]
    flac = root / next(n for n in files if n.endswith(".flac"))
    if damage == "flipped":
        raw = bytearray(flac.read_bytes())
        raw[-1] ^= 0xFF
        flac.write_bytes(bytes(raw))
    elif damage == "truncated":  # what a full disk leaves
        flac.write_bytes(flac.read_bytes()[:100])
    elif damage == "missing":
        flac.unlink()
    else:
        m = manifest(root)
        m["request" if damage == "other request" else "version"] = {"seed": 6} if damage == "other request" else 1
        (root / "manifest.json").write_text(json.dumps(m))
    assert corpus.ensure(REQ, root.parent) == root and calls == [REQ]
    assert manifest(root)["files"] == files and corpus.complete(root, REQ)


def test_a_full_disk_at_the_manifest_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    real = corpus.Path.write_text

    def write_text(self, *args, **kwargs):
        if self.name == "manifest.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(corpus.Path, "write_text", write_text)
    with pytest.raises(UserError, match=r"cannot write in .*c \(no space left on the device\); free space") as e:
        corpus.ensure(corpus.CorpusRequest(seed=5, utterances={"dev-clean": 1}, speakers=1), tmp_path / "c")
    assert "\n" not in str(e.value) and list((tmp_path / "c").iterdir()) == []


def test_a_file_size_limit_in_the_synthesis_processes_is_one_line_and_stops_them_all(tmp_path):
    # A real RLIMIT_FSIZE (the processes that synthesize the splits inherit it): their FLACs fail to write.
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (20000, resource.RLIM_INFINITY))\n"
            "from emarule.errors import UserError\n"
            "from emarule.speech import corpus\n"
            "try:\n"
            "    corpus.ensure(corpus.CorpusRequest(seed=5, utterances={'train-clean-100': 40, 'dev-clean': 40, "
            "'test-clean': 40}, speakers=2), sys.argv[1])\n"
            "except UserError as e:\n"
            "    print(e)\n")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c")], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert "file too large for the file-size limit" in res.stdout and "raise the limit" in res.stdout, res.stdout
    assert "espeakng-loader" not in res.stdout
    assert list((tmp_path / "c").iterdir()) == []  # no split went on writing after the folder was removed


def test_a_split_that_failed_to_write_is_an_os_error_and_another_failure_says_synthesis():
    with pytest.raises(OSError) as e:
        corpus.split_result(corpus.WRITE_FAILED, json.dumps([errno.EDQUOT, "Disk quota exceeded", "x.flac"]), "")
    assert e.value.errno == errno.EDQUOT and e.value.filename == "x.flac"
    with pytest.raises(UserError, match="synthesis failed .*espeakng-loader"):
        corpus.split_result(1, "", "Traceback...\nImportError: no espeakng_loader")
