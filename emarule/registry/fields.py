"""The language a spec section is written in: a `Field` per leaf (its types, bounds, default and meaning).

Pure Python, importing nothing of emarule: the shared sections (emarule/config/schema.py) and each task's own
(emarule/registry/sections.py) are written in it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

NUM = (int, float)


@dataclass(frozen=True)
class Field:
    types: tuple  # accepted Python types of the value (bool is never taken as a number)
    lo: float | None = None  # inclusive lower bound
    hi: float | None = None  # inclusive upper bound
    hi_open: float | None = None  # exclusive upper bound (momenta and betas: < 1)
    lo_open: float | None = None  # exclusive lower bound (batch sizes, lrs: > 0)
    choices: tuple | None = None
    nullable: bool = False
    items: "Field | None" = None  # for lists: the shape of every item
    length: int | None = None  # for lists of fixed length (Adam betas)
    pattern: tuple[str, str] | None = None  # (regex a string must match whole, what it means in words)
    doc: str = ""
    default: Any = None  # the value a spec without the key gets: `value(spec, key)` and the typed config read it here
    null_is_default: bool = False  # a null in the spec also reads as `default` ("use the default"); implies nullable

    def __post_init__(self):
        if self.null_is_default:
            object.__setattr__(self, "nullable", True)

    def resolve(self, raw: Any) -> Any:
        """What a read of this key gets for the spec's `raw` value (the key is present)."""
        return self.default if raw is None and self.null_is_default else raw


def num(doc="", **kw) -> Field:
    return Field(NUM, doc=doc, **kw)


def integer(doc="", **kw) -> Field:
    return Field((int,), doc=doc, **kw)


def text(doc="", **kw) -> Field:
    return Field((str,), doc=doc, **kw)


def flag(doc="") -> Field:
    return Field((bool,), doc=doc)


def momentum(doc="") -> Field:
    return Field(NUM, lo=0.0, hi_open=1.0, doc=doc)


def numlist(doc="", item: Field | None = None, **kw) -> Field:
    return Field((list,), items=item or num(), doc=doc, **kw)


def with_defaults(tree: dict, defaults: dict[str, Any]) -> dict:
    """`tree` with each dotted key's Field given its default: a section's defaults sit under its types."""
    out = {k: (with_defaults(v, {}) if isinstance(v, dict) else v) for k, v in tree.items()}
    for dotted, default in defaults.items():
        node = out
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node[p]
        if not isinstance(node.get(leaf), Field):
            raise KeyError(f"{dotted}: no such key to give a default")
        node[leaf] = replace(node[leaf], default=default)
    return out


# data.skip_bad_items (emarule/engine/baditems.py): an item that fails to decode is an error naming its file,
# or, when true, skipped, counted and reported in the summary and the metrics (skipped_items).
SKIP_BAD_ITEMS = Field((bool,), doc="skip (and count) training items that fail to decode, instead of stopping",
                       default=False)

POSITIVE = dict(lo_open=0.0)
NONNEG = dict(lo=0.0)
