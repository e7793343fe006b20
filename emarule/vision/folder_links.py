"""Links in an ImageNet-style data folder, decided before anything is read: torchvision's ImageFolder follows
every link, so a link to a folder loops (the same images counted again and again, or a scan that never ends)
or puts another class's images under this class's label. Pure Python; one-line UserErrors.

- `train/` and `val/` may be links (to another disk, say), but not to the data root or a folder that holds it.
- Below them, a link to a folder is refused wherever it is: replace it by the folder itself.
- A link to a file is followed when it leads to a regular file (a broken or looping link is refused).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from emarule.errors import UserError

FIX = "replace the link by the folder it points to, or remove it"


def check_split(root: Path, split_dir: Path) -> None:
    """The split folder and every link below it, as the module says; nothing is followed before it is checked."""
    top = Path(os.path.realpath(split_dir))
    data = Path(os.path.realpath(root))
    if data == top or data.is_relative_to(top):
        raise UserError(f"{split_dir} is a link to {top}, which holds the data root {root} itself (a loop); {FIX}")
    stack = [Path(split_dir)]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as e:
            raise UserError(f"cannot read {folder}: {e.strerror}; check the folder's permissions") from None
        for entry in entries:
            if entry.is_symlink():
                _check_link(Path(entry.path))
            elif entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))


def _check_link(link: Path) -> None:
    try:
        mode = os.stat(link).st_mode  # follows the link: ELOOP for a loop, ENOENT for a broken one
    except OSError as e:
        what = "loops back on itself" if e.errno == errno.ELOOP else "leads nowhere"
        raise UserError(f"{link} is a link that {what}; {FIX}") from None
    if stat.S_ISDIR(mode):
        raise UserError(f"{link} is a link to the folder {os.path.realpath(link)}: links to folders inside a data "
                        f"split are not followed (they loop, or label another class's images as this one's); {FIX}")
    if not stat.S_ISREG(mode):
        raise UserError(f"{link} is a link to something that is not a regular file; {FIX}")
