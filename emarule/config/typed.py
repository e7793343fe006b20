"""The typed config a task and the engine read: `cfg.data.num_classes`, `cfg.ema.also`. Torch-free.

`typed(spec)` is made once from a spec `load_spec` resolved and checked (the RunContext makes it: `ctx.cfg`).
It walks the spec's schema (`schema.COMMON` plus its task's sections, emarule/registry/sections.py), so it has exactly
the keys a spec of that task may have: each Field's value is the spec's, or the Field's default where the spec
leaves the key out (or writes null for a Field whose null means its default); lists become tuples; each section
is a small read-only object. A key the task does not have is an AttributeError naming its path and the keys
there. The spec dict itself stays what hparams.json records.

A section is true when the spec gives it with at least one key, false when it leaves it out or writes null
(`if cfg.pseudo_label:`), as the plain spec's section is; its keys read their defaults either way.
"""

from __future__ import annotations

from typing import Any

from emarule.config.schema import Field, schema_for

RESOLVED = ("preset", "source")  # what load_spec records beside the schema's keys


class Section:
    """One read-only section of the typed config (the whole config is the section at path "")."""

    __slots__ = ("_path", "_values", "_given", "_task")

    def __init__(self, path: str, values: dict[str, Any], given: bool, task: str | None):
        for name, v in (("_path", path), ("_values", values), ("_given", given), ("_task", task)):
            object.__setattr__(self, name, v)

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        if name.startswith("__"):  # copy, pickle and friends probing for optional hooks
            raise AttributeError(name)
        raise AttributeError(self._unknown(name))

    def _unknown(self, name: str) -> str:
        keys = ", ".join(sorted(self._values))
        if not self._path:
            return (f"{name}: not a section of a {self._task!r} spec; its sections and keys: {keys} "
                    f"(emarule/config/)")
        return f"{self._path}.{name}: not a key of a {self._task!r} spec; {self._path} has: {keys} (emarule/config/)"

    def __setattr__(self, name: str, value: Any) -> None:
        path = f"{self._path}.{name}" if self._path else name
        raise AttributeError(f"{path}: the config is read-only; change the spec instead (--set {path}=VALUE)")

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)

    def __bool__(self) -> bool:
        return self._given

    def __contains__(self, name: str) -> bool:
        """Whether this task's config has the key or section `name` at all (`"data" in cfg`)."""
        return name in self._values

    def __dir__(self) -> list[str]:
        return sorted(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Section) and (self._path, self._values) == (other._path, other._values)

    def __hash__(self) -> int:
        return hash(self._path)

    def __reduce__(self):
        return Section, (self._path, self._values, self._given, self._task)

    def __repr__(self) -> str:
        return f"Section({self._path or 'spec'!r}, {self._values!r})"

    def as_dict(self) -> dict[str, Any]:
        """Every key with the value read, nested sections as dicts and tuples as lists (as a spec writes them)."""
        return {k: v.as_dict() if isinstance(v, Section) else _plain(v) for k, v in self._values.items()}


def _frozen(v: Any) -> Any:
    if isinstance(v, list | tuple):
        return tuple(_frozen(x) for x in v)
    return v


def _plain(v: Any) -> Any:
    return [_plain(x) for x in v] if isinstance(v, tuple) else v


def _section(path: str, tree: Any, schema: dict, task: str | None) -> Section:
    given = isinstance(tree, dict) and bool(tree)
    tree = tree if isinstance(tree, dict) else {}
    values: dict[str, Any] = {}
    for key, sub in schema.items():
        if key == "presets":  # load_spec has applied the one asked for and removed the rest
            continue
        where = f"{path}.{key}" if path else key
        if isinstance(sub, dict):
            values[key] = _section(where, tree.get(key), sub, task)
        elif isinstance(sub, Field):
            values[key] = _frozen(sub.resolve(tree[key]) if key in tree else sub.default)
    if not path:
        values.update({k: tree[k] for k in RESOLVED if k in tree})
    return Section(path, values, given, task)


def typed(spec: dict) -> Section:
    """The typed, read-only view of a resolved spec, every default filled in from the schema."""
    task = spec.get("task")
    return _section("", spec, schema_for(task if isinstance(task, str) else None), task)


def config_of(spec_or_cfg: dict | Section) -> Section:
    """`cfg` as is, or the typed view of a spec dict (for callers that hold the spec)."""
    return spec_or_cfg if isinstance(spec_or_cfg, Section) else typed(spec_or_cfg)


Config = Section  # the whole config's type, for annotations
