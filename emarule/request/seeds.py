"""`--seeds` for `emarule sweep` and `emarule reproduce`: a count, a range or a list. Torch-free.

    --seeds 5          seeds 0, 1, 2, 3, 4
    --seeds 100-104    seeds 100 … 104
    --seeds 3,7,11     exactly these (one seed alone: --seeds 7-7)
    --seeds 0-4,100-104  a list may hold ranges: these ten

A verdict has to hold on seeds it was not tuned on, so a range or a list picks fresh ones; run names
keep `s<seed>`, so the runs of different seed sets sit side by side in one root.
"""

from __future__ import annotations

from emarule.errors import UserError

# The largest seed: every seeding path takes it (torch.manual_seed takes up to 2^64 − 1, the precision
# study adds its spec's seed and 2 to it; the other streams go through emarule.engine.seeding.mix). 2^32 − 1,
# numpy's legacy bound, leaves room for both.
MAX_SEED = 2**32 - 1
MAX_SEEDS = 100  # each seed is a full set of runs, one after another
FORMS = "a count (--seeds 5), a range (--seeds 100-104) or a list (--seeds 3,7,11 or 0-4,100-104)"


def _seed(item: str, text: str) -> int:
    item = item.strip()
    if item.startswith("-"):
        raise UserError(f"--seeds {text}: {item} is not a seed; seeds are whole numbers from 0 to {MAX_SEED}")
    if not item.isdigit() or not item.isascii():
        raise UserError(f"--seeds {text}: {item!r} is not a whole number; give {FORMS}")
    v = int(item)
    if v > MAX_SEED:
        raise UserError(f"--seeds {text}: seed {item} is above {MAX_SEED} (2^32 − 1)")
    return v


def _range(item: str, text: str) -> list[int]:
    lo, hi = item.split("-", 1)
    if not lo.strip() or not hi.strip():
        raise UserError(f"--seeds {text}: a range needs both ends, e.g. --seeds 100-104")
    a, b = _seed(lo, text), _seed(hi, text)
    if a > b:
        raise UserError(f"--seeds {text}: the range {item.strip()} runs backwards; write it low-high, e.g. "
                        f"--seeds {b}-{a}")
    if b - a + 1 > MAX_SEEDS:
        raise UserError(f"--seeds {text}: {b - a + 1} seeds, at most {MAX_SEEDS} (each seed is a full set of "
                        f"runs, one after another)")
    return list(range(a, b + 1))


def _is_range(item: str) -> bool:
    return "-" in item.strip()[1:]  # a leading minus is a negative number, refused by _seed


def parse_seeds(text) -> tuple[int, ...]:
    """The seeds `--seeds TEXT` names, in the order given; one line naming the problem otherwise."""
    t = str(text).strip()
    if not t:
        raise UserError(f"--seeds is empty; give {FORMS}")
    if "," in t:
        items = t.split(",")
        if not all(i.strip() for i in items):
            raise UserError(f"--seeds {t}: an empty item; give seeds separated by commas, e.g. --seeds 3,7,11")
        seeds = [s for i in items for s in (_range(i, t) if _is_range(i) else [_seed(i, t)])]
        dup = next((s for i, s in enumerate(seeds) if s in seeds[:i]), None)
        if dup is not None:
            raise UserError(f"--seeds {t}: seed {dup} is listed twice; give each seed once")
    elif _is_range(t):
        seeds = _range(t, t)
    else:
        if t.startswith("-") and t[1:].isdigit():
            raise UserError(f"--seeds must be ≥ 1, got {t}")
        if not t.isdigit() or not t.isascii():
            raise UserError(f"--seeds {t!r}: give {FORMS}")
        n = int(t)
        if n < 1:
            raise UserError(f"--seeds must be ≥ 1, got {n}")
        if n > MAX_SEEDS:
            raise UserError(f"--seeds {t}: at most {MAX_SEEDS} (each seed is a full set of runs, one after "
                            f"another); give a smaller number, e.g. --seeds 5")
        seeds = list(range(n))
    if len(seeds) > MAX_SEEDS:
        raise UserError(f"--seeds {t}: {len(seeds)} seeds, at most {MAX_SEEDS} (each seed is a full set of runs, "
                        f"one after another)")
    return tuple(seeds)


def _runs(seeds) -> list[list[int]]:
    """`seeds` cut into runs of consecutive ascending seeds, in order."""
    runs: list[list[int]] = []
    for x in seeds:
        if runs and x == runs[-1][-1] + 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    return runs


def seeds_text(seeds) -> str:
    """The shortest `--seeds` form naming `seeds`: 5, 100-104, 7-7, 3,7,11 or 0-4,100-104."""
    s = list(seeds)
    if s == list(range(len(s))):
        return str(len(s))
    runs = _runs(s)
    if len(runs) == 1:  # one seed alone too: 7-7 (a bare 7 is a count)
        return f"{s[0]}-{s[-1]}"
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ",".join(map(str, r)) for r in runs)


def seeds_label(seeds) -> str:
    """The seeds for a reader: 0–4, 100–104, 3, 7, 11 or 0–4, 100–104."""
    return ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in _runs(seeds))
