"""A cached folder is built whole, then renamed into place (engine/cache.py: the shapes and the speech corpus)."""

import errno
import os

import pytest

from emarule.engine.cache import build_once
from emarule.errors import UserError

MSG = "cannot write in {cache} ({reason}); set EMARULE_CACHE"


def complete(root):
    return (root / "done").is_file()


def writer(calls):
    def build(tmp):
        calls.append(tmp)
        (tmp / "data").write_text("x")
        (tmp / "done").write_text("")
    return build


def test_a_complete_folder_is_reused_without_building(tmp_path):
    calls = []
    root = build_once(tmp_path / "c" / "k", writer(calls), complete, MSG)
    assert build_once(root, writer(calls), complete, MSG) == root and len(calls) == 1
    assert sorted(p.name for p in root.parent.iterdir()) == ["k"]  # no temporary folder left


def test_a_damaged_folder_is_replaced_whole(tmp_path):
    root = tmp_path / "k"
    root.mkdir()
    (root / "half").write_text("")  # a copy that never finished
    calls = []
    build_once(root, writer(calls), complete, MSG)
    assert len(calls) == 1 and sorted(p.name for p in root.iterdir()) == ["data", "done"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k"]


def test_a_failed_build_leaves_nothing(tmp_path):
    def fails(tmp):
        (tmp / "data").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        build_once(tmp_path / "k", fails, complete, MSG)
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_cache_is_one_line_naming_it(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match=r"cannot write in .*file \(.*\); set EMARULE_CACHE"):
        build_once(tmp_path / "file" / "k", writer([]), complete, MSG)


@pytest.mark.parametrize("code,reason,fix", [(errno.ENOSPC, "no space left on the device", "free space"),
                                             (errno.EFBIG, "file too large for the file-size limit", "free space"),
                                             (errno.EDQUOT, "disk quota exceeded", "free space"),
                                             (errno.EACCES, "Permission denied", "set EMARULE_CACHE")])
def test_a_write_that_fails_while_building_is_one_line_and_leaves_nothing(tmp_path, code, reason, fix):
    def fails(tmp):
        (tmp / "data").write_text("x")
        raise OSError(code, os.strerror(code), str(tmp / "more"))

    with pytest.raises(UserError) as e:
        build_once(tmp_path / "k", fails, complete, MSG, "cannot write in {cache} ({reason}); free space")
    assert str(e.value) == f"cannot write in {tmp_path} ({reason}); {fix}" and list(tmp_path.iterdir()) == []
