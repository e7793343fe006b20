"""Every reader of an ImageNet folder decodes through `ImageFolderSource.pil`: the supervised task's (polyak)
training and evaluation views name a file that fails to decode, as BYOL's and DINO's do, and with
`data.skip_bad_items` a run skips it."""

import pytest

from cli_util import invoke
from emarule.engine.baditems import ItemError
from emarule.vision import supervised as S
from emarule.vision.data import imagenet
from vision_util import image_folder


@pytest.fixture
def damaged(tmp_path):
    root = image_folder(tmp_path / "inet")
    for split in ("train", "val"):
        bad = root / split / "n01" / "3.JPEG"
        bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    train, val = imagenet(root, 24)
    return root, train, val


def index(source, root, split):
    return [p for p, _ in source.ds.samples].index(str(root / split / "n01" / "3.JPEG"))


def test_a_truncated_jpeg_in_a_supervised_view_names_the_file(damaged):
    root, train, val = damaged
    views = S.TrainViews(train, "imagenet", 24, seed=0)
    with pytest.raises(ItemError) as e:
        views.__getitems__([0, index(train, root, "train")])
    assert str(e.value).startswith(f"cannot decode {root / 'train' / 'n01' / '3.JPEG'} (OSError: image file is")
    with pytest.raises(ItemError, match="cannot decode .*val/n01/3.JPEG"):
        S.EvalViews(val, 24)[index(val, root, "val")]


def test_a_polyak_run_skips_a_truncated_training_jpeg_when_asked(damaged, tmp_path):
    root, _, _ = damaged
    (root / "val" / "n01" / "3.JPEG").write_bytes((root / "val" / "n01" / "2.JPEG").read_bytes())
    res = invoke("run", "polyak-r50", "--preset", "tiny", "--set", "data.source=imagenet", "--data", root,
                 "--set", "data.skip_bad_items=true", "--out", tmp_path / "run")
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert "skipped" in res.output and "3.JPEG" in res.output
