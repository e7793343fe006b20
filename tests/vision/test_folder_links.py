"""emarule/vision/folder_links.py: links in an ImageNet folder that loop, or would put one class's images under
another's label, are refused by name before anything is read; a split kept elsewhere and links to files are
followed."""

import re
import shutil

import pytest

from emarule.errors import UserError
from emarule.vision import data as D
from vision_util import image_folder


@pytest.mark.parametrize("link, target, message", [
    ("train/n01/loop", ".", "is a link to the folder"),                 # a cycle inside a class folder
    ("train/n01/other", "../n02", "label another class's images"),      # another class's images under n01
    ("train/n02/deep/up", "../../..", "is a link to the folder"),       # a cycle further down
    ("val/n01/self", "self", "loops back on itself"),                   # a link to itself
    ("train/n01/gone.JPEG", "nowhere.JPEG", "leads nowhere"),
])
def test_links_that_loop_or_relabel_are_refused_before_anything_is_read(tmp_path, link, target, message):
    root = image_folder(tmp_path / "inet")
    (root / link).parent.mkdir(parents=True, exist_ok=True)
    (root / link).symlink_to(target)
    with pytest.raises(UserError, match=re.escape(str(root / link)) + ".*" + re.escape(message)):
        D.imagenet(root, 24)


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_split_that_links_back_to_the_data_root_is_refused(tmp_path, split):
    root = image_folder(tmp_path / "inet")
    shutil.rmtree(root / split)
    (root / split).symlink_to(".")
    with pytest.raises(UserError, match="holds the data root .* itself \\(a loop\\)"):
        D.imagenet(root, 24)


def test_a_split_elsewhere_and_links_to_files_are_followed(tmp_path):
    store = image_folder(tmp_path / "store")
    root = tmp_path / "inet"
    root.mkdir()
    (root / "train").symlink_to(store / "train")
    (root / "val").mkdir()
    for c in ("n01", "n02"):
        (root / "val" / c).mkdir()
        for f in (store / "val" / c).iterdir():
            (root / "val" / c / f.name).symlink_to(f)
    train, val = D.imagenet(root, 24)
    assert (len(train), len(val)) == (32, 8) and sorted(set(val.labels)) == [0, 1]
