"""What a spec computes, as far as comparing two runs goes: without the fields that only describe it. Pure
Python, torch-free, so that `compare` and the sweep can ask it without loading the engine."""

from __future__ import annotations

# Spec fields that describe a recipe and change nothing it computes (schema.COMMON: the title, the paper's
# section, the full recipe's data set name, the paper's result): a docs fix that edits them must not
# strand every run made before it, so `--resume` leaves them out of the comparison.
DESCRIPTIVE = frozenset({"title", "section", "dataset", "paper_result"})


# Keys at the value that computes what a spec without the key computes: a run recorded without one compares
# equal to a spec that names it so (every run made with the views in the loader's workers, docs/speed.md).
NEUTRAL = {("data", "augment_on"): "cpu"}


def comparable(spec: dict) -> dict:
    """A spec as far as what it computes: without its descriptive fields, its file's path (`source`) and its
    `NEUTRAL` keys. What `--resume` compares, and what `emarule reproduce` compares before it reuses a study's
    results."""
    out = {k: v for k, v in spec.items() if k not in DESCRIPTIVE and k != "source"}
    for (section, key), value in NEUTRAL.items():
        if isinstance(out.get(section), dict) and out[section].get(key, value) == value:
            out[section] = {k: v for k, v in out[section].items() if k != key}
    return out
