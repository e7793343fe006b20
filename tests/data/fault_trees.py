"""Tiny damaged data sets for the corrupt-data examples of docs/faults.md (their `<!-- setup: -->` runs this).

python tests/data/fault_trees.py classes DIR    ImageNet layout whose val/ has a class folder train/ lacks
python tests/data/fault_trees.py truncated DIR  ImageNet layout with one training JPEG cut in half
python tests/data/fault_trees.py transcript DIR LibriSpeech layout with a transcript that is not UTF-8
python tests/data/fault_trees.py loop DIR       ImageNet layout with a class folder that links back to itself
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from speech_util import write_tree  # noqa: E402
from vision_util import image_folder  # noqa: E402


def main(kind: str, root: Path) -> None:
    if kind == "classes":
        image_folder(root, val_classes=("n01", "n03"))
    elif kind == "truncated":
        image_folder(root)
        bad = root / "train" / "n01" / "3.JPEG"
        bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    elif kind == "transcript":
        write_tree(root, "train-clean-100", {(100, 1): [(0.25, "HE HOPED"), (0.25, "A")]})
        trans = root / "train-clean-100" / "100" / "1" / "100-1.trans.txt"
        trans.write_bytes(trans.read_bytes().replace(b"A\n", b"\xe9T\xe9\n"))
    elif kind == "loop":
        image_folder(root)
        (root / "train" / "n01" / "again").symlink_to(".")
    else:
        raise SystemExit(f"unknown tree {kind!r}: classes, truncated, transcript or loop")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
