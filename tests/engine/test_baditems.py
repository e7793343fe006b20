"""Corrupt data (emarule/engine/baditems.py and the loaders' checks): found before the first step where it
is cheap, else an error naming the file when an item fails to decode, or with
`data.skip_bad_items: true` skipped, counted and reported. Never a traceback, never silent."""

import json
import pickle

import numpy as np
import pytest

from emarule.engine.baditems import BadItem, Guarded, ItemError, guarded_collate
from emarule.cli.main import main
from emarule.errors import UserError
from emarule.speech.librispeech import list_split, read_audio
from emarule.vision.data import ImageFolderSource, load_sources
from speech_util import write_tree
from vision_util import image_folder


def truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


# --- checks before the first step ----------------------------------------------------------------


@pytest.mark.parametrize("val,needle", [(("n01",), "1 class folder(s) only in train/ (e.g. n02)"),
                                        (("n01", "n03"), "only in train/ (e.g. n02), 1 only in val/ (e.g. n03)")])
def test_imagenet_splits_with_other_classes_are_refused_for_every_task(tmp_path, val, needle):
    root = image_folder(tmp_path, val_classes=val)
    with pytest.raises(UserError) as e:
        load_sources("imagenet", root, 32, None, None, 2)  # byol and dino read ImageNet through this
    assert "train/ and val/ hold different class folders" in str(e.value) and needle in str(e.value)


def write_cifar(root, train_labels, test_labels):
    d = root / "cifar-10-batches-py"
    d.mkdir()
    for name, labels in [(f"data_batch_{k}", train_labels) for k in range(1, 6)] + [("test_batch", test_labels)]:
        data = np.zeros((len(labels), 3072), dtype=np.uint8)
        with open(d / name, "wb") as f:
            pickle.dump({"data": data, "labels": list(labels)}, f)


@pytest.mark.parametrize("train,test,needle", [([0, 1, 10], [0], "training label 10 at item 2 is not a class 0..9"),
                                               ([0, 1], [3, -1], "test label -1 at item 1 is not a class 0..9")])
def test_cifar_labels_out_of_range_are_refused_before_training(tmp_path, train, test, needle):
    write_cifar(tmp_path, train, test)
    with pytest.raises(UserError, match="the pickles are corrupt") as e:
        load_sources("cifar10", tmp_path, 32, None, None, 10)
    assert needle in str(e.value)


def test_a_transcript_that_is_not_utf8_is_named_with_its_line(tmp_path):
    write_tree(tmp_path, "dev-clean", {(84, 121): [(0.25, "HE HOPED"), (0.25, "A")]})
    trans = tmp_path / "dev-clean" / "84" / "121" / "84-121.trans.txt"
    trans.write_bytes(trans.read_bytes().replace(b"A\n", b"\xe9T\xe9\n"))
    with pytest.raises(UserError) as e:
        list_split(tmp_path, "dev-clean")
    assert str(e.value).startswith(f"{trans}: not UTF-8 text (byte 0xe9 on line 2)")


def test_an_unreadable_audio_header_is_named(tmp_path):
    write_tree(tmp_path, "dev-clean", {(84, 121): [(0.25, "HE HOPED"), (0.25, "A")]})
    flac = tmp_path / "dev-clean" / "84" / "121" / "84-121-0001.flac"
    flac.write_bytes(b"not a flac file at all" * 10)
    with pytest.raises(UserError) as e:
        list_split(tmp_path, "dev-clean")
    assert str(e.value).startswith(f"{flac}: cannot read its audio header (") and "84-121.trans.txt" in str(e.value)


# --- an item that fails to decode while training ----------------------------------------------


def test_a_truncated_or_foreign_jpeg_names_the_file(tmp_path):
    root = image_folder(tmp_path)
    src = ImageFolderSource(root, "train", 32)
    truncate(root / "train" / "n01" / "1.JPEG")
    (root / "train" / "n02" / "2.JPEG").write_text("a text file named like an image\n")
    paths = [p for p, _ in src.ds.samples]
    for name, why in (("n01/1.JPEG", "truncated"), ("n02/2.JPEG", "cannot identify image file")):
        with pytest.raises(ItemError) as e:
            src.image(paths.index(str(root / "train" / name)))
        assert str(e.value).startswith(f"cannot decode {root / 'train' / name} (") and why in str(e.value)
        assert "set data.skip_bad_items: true" in str(e.value)


def test_a_flac_cut_short_or_damaged_names_the_file(tmp_path):
    write_tree(tmp_path, "dev-clean", {(84, 121): [(1.0, "HE HOPED"), (1.0, "A")]})
    utts = list_split(tmp_path, "dev-clean")
    with pytest.raises(ItemError, match="16000 samples decoded where its header says 32000: the file is cut short"):
        read_audio(utts[0].path, seconds=2.0)  # a header that promises more than the file holds
    truncate(utts[1].path, keep=1 / 3)  # the FLAC cut to a third of its bytes
    with pytest.raises(ItemError) as e:
        read_audio(utts[1].path, utts[1].seconds)
    assert str(e.value).startswith(f"cannot decode {utts[1].path} (")


def test_guarded_items_become_markers_and_collate_drops_them():
    class Data:
        def __len__(self):
            return 3

        def __getitem__(self, i):
            if i == 1:
                raise ItemError("/data/1.jpg", "truncated")
            return i

    g = Guarded(Data())
    items = [g[i] for i in range(3)]
    assert items[1] == BadItem(1, "/data/1.jpg", "truncated") and str(items[1].error()).startswith(
        "cannot decode /data/1.jpg (truncated)")
    got = guarded_collate(list)(items)
    assert got.batch == [0, 2] and got.bad == [items[1]]
    assert guarded_collate(list)([items[1]]).batch is None


def test_a_batched_data_set_is_asked_for_the_batch_and_a_bad_item_in_it_still_marks_just_that_item():
    class Batched:
        calls = []

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return self.__getitems__([i])[0]

        def __getitems__(self, indices):
            self.calls.append(list(indices))
            if 2 in indices:
                raise ItemError("/data/2.jpg", "truncated")
            return [10 * i for i in indices]

    g = Guarded(Batched())
    assert g.__getitems__([0, 1]) == [0, 10] and Batched.calls == [[0, 1]]
    assert g.__getitems__([1, 2, 3]) == [10, BadItem(2, "/data/2.jpg", "truncated"), 30]


TINY = ["run", "byol-r18", "--preset", "tiny", "--set", "data.source=imagenet"]


def test_training_stops_on_a_bad_item_naming_it_or_skips_and_counts_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    root = image_folder(tmp_path / "data")
    bad = root / "train" / "n02" / "5.JPEG"
    truncate(bad)
    with pytest.raises(SystemExit) as e:
        main([*TINY, "--data", str(root), "--out", str(tmp_path / "a")])
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error")]
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith(f"error: cannot decode {bad} (")
    with pytest.raises(SystemExit) as e:
        main([*TINY, "--set", "data.skip_bad_items=true", "--data", str(root), "--out", str(tmp_path / "a")])
    out, err = capsys.readouterr()
    assert e.value.code == 0, err
    assert f"warning: skipped {bad} (" in err
    epochs = json.loads((tmp_path / "a" / "hparams.json").read_text())["total_epochs"]
    assert f"skipped: {int(epochs)} training items that failed to decode (data.skip_bad_items)" in out
    rows = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped_items"] for r in rows if r["kind"] == "train"][-1] == int(epochs)  # once per epoch


def test_skip_bad_items_may_be_turned_on_to_resume_a_run_a_bad_file_stopped(tmp_path):
    from emarule.engine.context import RunContext
    from emarule.scaling import plan
    from emarule.config.load import load_spec
    from emarule.engine.preflight import fingerprint

    def ctx(*sets):
        s = load_spec("byol-r18", preset="tiny", overrides=list(sets))
        return RunContext(spec=s, kappa=1.0, ema_rule="exponential", plan=plan(s, 1.0, "exponential"), out=tmp_path)

    assert fingerprint(ctx("data.skip_bad_items=true")) == fingerprint(ctx())
    assert fingerprint(ctx("data.train_samples=64")) != fingerprint(ctx())


def test_a_bad_validation_file_is_an_error_naming_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    root = image_folder(tmp_path / "data")
    bad = root / "val" / "n01" / "2.JPEG"
    truncate(bad)
    with pytest.raises(SystemExit) as e:
        main([*TINY, "--set", "data.skip_bad_items=true", "--data", str(root), "--out", str(tmp_path / "a")])
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error")]
    assert e.value.code == 2 and len(err) == 1
    assert err[0].startswith(f"error: cannot decode {bad} (") and "evaluation items are never skipped" in err[0]
