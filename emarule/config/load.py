"""Load an experiment spec: YAML at κ=1, then a preset, then `--set key=value` overrides.

Every failure is a `UserError` naming the file and the key path, so the CLI prints one line.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import yaml

from emarule.config.files import regular_file
from emarule.errors import UserError
from emarule.config import constraints
from emarule.config.schema import NAME, check_needs, check_tree, get, schema_for

class _Loader(yaml.SafeLoader):
    """YAML with 1.2's floats: `5e-4` is a number, not the string PyYAML's 1.1 rules make it."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                  |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


# A spec is a few hundred values a few levels deep; these bounds leave room for any real one and refuse
# a tree that would exhaust the stack (thousands of levels) or memory (aliases that expand exponentially).
MAX_DEPTH = 32
MAX_NODES = 100_000


class SpecShapeError(yaml.YAMLError):
    """A YAML document that parses but is not a spec: a duplicate key, too deep, too large once aliases expand."""

    def __init__(self, problem: str, mark=None, fix: str = "fix the YAML"):
        super().__init__(problem)
        self.problem, self.problem_mark, self.fix = problem, mark, fix


def _check_shape(root) -> None:
    """Depth and size of the tree the node graph expands to (an alias counts its whole subtree each
    time it is used), and duplicate keys; iterative, so no depth can overflow the stack here."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    stack = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, done = stack.pop()
        kids = _children(node)
        if done:
            on_path.discard(id(node))
            size[id(node)] = 1 + sum(size[id(k)] for k in kids)
            depth[id(node)] = 1 + max((depth[id(k)] for k in kids), default=0)
            if depth[id(node)] > MAX_DEPTH:
                raise SpecShapeError(f"nested more than {MAX_DEPTH} levels deep", node.start_mark,
                                     "a spec is a few levels of sections; flatten it")
            if size[id(node)] > MAX_NODES:
                raise SpecShapeError(f"expands to more than {MAX_NODES:,} values (YAML aliases repeat a subtree "
                                     f"each time they are used)", node.start_mark, "write the values out, "
                                     "without aliases that refer to aliases")
            continue
        if id(node) in size:
            continue
        if id(node) in on_path:
            raise SpecShapeError("an alias refers to the node that contains it (an endless tree)", node.start_mark,
                                 "remove the recursive alias")
        on_path.add(id(node))
        stack.append((node, True))
        if isinstance(node, yaml.MappingNode):
            _no_duplicate_keys(node)
        stack.extend((k, False) for k in kids if id(k) not in size)


def _children(node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _no_duplicate_keys(node) -> None:
    seen: dict = {}
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            continue
        if key.value in seen:
            raise SpecShapeError(f"key {key.value!r} appears twice in one mapping (first at line "
                                 f"{seen[key.value].line + 1})", key.start_mark,
                                 "keep one of them (YAML would silently take the last)")
        seen[key.value] = key.start_mark


# What PyYAML's constructors raise, instead of a YAMLError, on a scalar its tag cannot read (`!!float abc`,
# `!!int 1.5`, `!!bool abc`, `!!timestamp abc`, a date such as 2023-13-45 that the implicit resolver tags).
CONSTRUCT_ERRORS = (ValueError, LookupError, TypeError, AttributeError, OverflowError)


def yaml_load(text: str, loader_class: type = _Loader):
    """The one document of `text`, its shape checked (`_check_shape`) before it is built; every failure is a
    YAMLError (a SpecShapeError where the document parses but is no spec's shape)."""
    loader = loader_class(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise SpecShapeError("nested too deep to parse", None, "a spec is a few levels of sections; "
                                 "flatten it") from None
        if node is None:
            return None
        _check_shape(node)
        try:
            return loader.construct_document(node)
        except CONSTRUCT_ERRORS:
            raise _unreadable_scalar(node, text, loader_class) from None
    finally:
        loader.dispose()


def _unreadable_scalar(root, text: str, loader_class: type) -> SpecShapeError:
    """The first scalar of the tree that its tag cannot read, named with its tag and place."""
    stack = [root]
    while stack:
        node = stack.pop()
        stack.extend(reversed(_children(node)))
        if not isinstance(node, yaml.ScalarNode):
            continue
        probe = loader_class("")
        try:
            probe.construct_object(node, deep=True)
            continue
        except CONSTRUCT_ERRORS:
            pass
        finally:
            probe.dispose()
        kind = node.tag.rsplit(":", 1)[-1]
        if text[node.start_mark.index:].startswith("!"):
            return SpecShapeError(f"not a valid {kind} ({node.value!r} under its !!{kind} tag)", node.start_mark,
                                  f"write a valid {kind}, or drop the !!{kind} tag")
        return SpecShapeError(f"not a valid {kind} ({node.value!r} reads as one)", node.start_mark,
                              "quote the value to keep it a string")
    return SpecShapeError("a value its tag cannot read", None, "check the values' !! tags")


EXPERIMENTS_ENV = "EMARULE_EXPERIMENTS"


def experiments_dir() -> Path:
    """The folder of the named experiments' specs: $EMARULE_EXPERIMENTS where it is set and not empty, else the
    specs installed with the package. Read at each call, so a process sees the variable as it is now."""
    given = os.environ.get(EXPERIMENTS_ENV, "")
    if not given:
        from importlib import resources

        # a wheel installs into a folder, so the package's resource is a real path (a zip import would fail here)
        return Path(os.fspath(resources.files("emarule").joinpath("experiments")))
    p = Path(given).expanduser().absolute()
    if p.is_file():
        raise UserError(f"{EXPERIMENTS_ENV}={given} is a file; point it at a folder of <name>.yaml specs, or unset "
                        f"it to use the specs installed with emarule")
    if not p.is_dir():
        raise UserError(f"{EXPERIMENTS_ENV}={given}: no such folder; point it at a folder of <name>.yaml specs, or "
                        f"unset it to use the specs installed with emarule")
    return p


def experiment_names() -> list[str]:
    return sorted(p.stem for p in experiments_dir().glob("*.yaml"))


def no_experiments() -> UserError:
    """What `list` (and a lookup by name) says where the folder of specs holds none."""
    where = experiments_dir()
    if os.environ.get(EXPERIMENTS_ENV):
        return UserError(f"{EXPERIMENTS_ENV}={os.environ[EXPERIMENTS_ENV]} holds no <name>.yaml spec; point it at a "
                         f"folder of specs, or unset it to use the specs installed with emarule")
    return UserError(f"no experiment specs in {where}: this emarule was installed without its specs; reinstall it "
                     f"(pip install --force-reinstall emarule)")


def spec_path(name: str | None, path: str | os.PathLike | None) -> Path:
    if path is not None and name:
        raise UserError(f"give an experiment name ({name!r}) or --spec {path}, not both")
    if path is not None:
        p = Path(path)
        if p.is_dir():
            raise UserError(f"--spec {p} is a directory; pass the YAML spec file itself, e.g. --spec {p / 'my.yaml'}")
        regular_file(p, "--spec", "pass the YAML spec file itself")
        if not p.is_file():
            raise UserError(f"spec file not found: {p}; pass --spec PATH to an existing YAML file")
        return p
    if not name:
        raise UserError("no experiment given; name one (see `emarule list`) or pass --spec PATH")
    p = experiments_dir() / f"{name}.yaml"
    if not p.is_file():
        known = experiment_names()
        if not known:
            raise no_experiments()
        raise UserError(f"unknown experiment {name!r}; choose one of: {', '.join(known)} (or pass --spec PATH)")
    return p


def read_yaml(p: Path) -> dict:
    regular_file(p, "spec", "pass the YAML spec file itself")
    try:
        data = yaml_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(f"{p}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); "
                        f"save the spec as a UTF-8 YAML file") from None
    except SpecShapeError as e:
        where = f" at line {e.problem_mark.line + 1}" if e.problem_mark else ""
        raise UserError(f"{p}: {e.problem}{where}; {e.fix}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or "malformed YAML"
        raise UserError(f"{p}: {problem}{where}; fix the YAML syntax") from None
    except OSError as e:
        raise UserError(f"cannot read spec {p}: {e.strerror}") from None
    if not isinstance(data, dict):
        raise UserError(f"{p}: a spec must be a YAML mapping of sections (batch, optimizer, ema, ...)")
    return data


def parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise UserError(f"--set {item!r}: expected key=value, e.g. --set optimizer.lr=0.1")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise UserError(f"--set {item!r}: empty key; expected key=value, e.g. --set ema.momentum=0.996")
    try:
        value = yaml_load(raw) if raw.strip() else None
    except SpecShapeError as e:
        raise UserError(f"--set {key}: the value is {e.problem}; {e.fix}") from None
    except yaml.YAMLError:
        raise UserError(f"--set {item!r}: cannot parse the value {raw!r}") from None
    return key, value


def set_dotted(tree: dict, key: str, value: Any, where: str) -> None:
    parts = key.split(".")
    if key == "task":
        # the task decides which keys a spec may hold; the spec was checked against its own task's keys
        raise UserError(f"{where}: task cannot be changed (a spec's keys are checked against its task); "
                        f"pick another experiment or --spec a file with the task you want")
    node = tree
    for part in parts[:-1]:
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise UserError(f"{where}: {key}: {part} is not a section")
        node = nxt
    old = node.get(parts[-1])
    if isinstance(old, dict) and isinstance(value, dict):
        # a mapping replaces the section: refused when that would silently drop keys it leaves out
        dropped = [str(k) for k in old if k not in value]
        if dropped:
            raise UserError(f"{where}: {key} is a section holding {', '.join(dropped)}, which a mapping would "
                            f"drop; set its keys one at a time, e.g. {key}.{dropped[0]}=VALUE")
    node[parts[-1]] = value


def _not_given_twice(key: str, item: str, given: dict) -> None:
    """`--set k=a --set k=b` (or a section and a key inside it) would let the last one win unseen."""
    for other, first in given.items():
        if key == other or key.startswith(other + ".") or other.startswith(key + "."):
            same = "twice" if key == other else "in two overlapping --set options"
            raise UserError(f"--set {key} is given {same} ({first!r}, then {item!r}); give each key once")
    given[key] = item


def _missing(spec: dict) -> str | None:
    """What every plan and run reads (a section left out, or emptied by `--set batch=null`), else None."""
    for key in ("name", "task"):
        if key not in spec:
            return f"missing {key!r}; a spec names itself and its task (see docs/spec-keys.md)"
    for section in ("batch", "optimizer", "ema"):
        if not isinstance(spec.get(section), dict):
            return (f"{section}: missing or null; every spec needs this section (see docs/spec-keys.md), "
                    f"e.g. {_EXAMPLE[section]}")
    if spec["batch"].get("size") is None:
        return f"batch.size: missing; give the reference batch B of the base values, e.g. {_EXAMPLE['batch']}"
    if spec["ema"].get("momentum") is None and _trains(spec["task"]):
        return (f"ema.momentum: missing; a {spec['task']} run trains with a model EMA, so give its base momentum, "
                f"e.g. {_EXAMPLE['ema']}")
    return None


def _unknown_task(spec: dict, err: str) -> str | None:
    """The task named first where a section failed only because the task it belongs to is unknown."""
    from emarule.config.schema import COMMON
    from emarule.registry import lookup, names

    task, section = spec.get("task"), err.split(":", 1)[0].split(".", 1)[0].split("[", 1)[0]
    if section in COMMON or (isinstance(task, str) and lookup(task) is not None):
        return None
    known = ", ".join(sorted(names()))
    if task is None:
        return f"no task is named, and the {section} section belongs to a task's keys; add task: (one of {known})"
    return (f"task {task!r} is not a known task (known: {known}), so its {section} section cannot be checked; "
            f"fix task: in the spec")


def unregistered_task(task) -> str | None:
    """What is wrong with a `task:` that names no registered task (None when it names one, or is not given)."""
    from emarule.registry import lookup, names

    if task is None or (isinstance(task, str) and lookup(task) is not None):
        return None
    return f"task {task!r} is not a known task (known: {', '.join(sorted(names()))}); fix task: in the spec"


_EXAMPLE = {"batch": "batch: {size: 256}", "optimizer": "optimizer: {name: sgd, lr: 0.1}",
            "ema": "ema: {momentum: 0.99}"}


def _trains(task: str) -> bool:
    """A training task keeps a model EMA (ema.momentum); a study (parabola, precision) sweeps its own."""
    from emarule.registry import lookup

    spec = lookup(task)
    return spec is not None and spec.kind == "training"


def load_spec(
    name: str | None = None,
    path: str | os.PathLike | None = None,
    preset: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
) -> dict:
    """The validated spec as a plain nested dict (presets removed, `preset` recorded)."""
    p = spec_path(name, path)
    spec = read_yaml(p)
    task = spec.get("task")
    schema = schema_for(task if isinstance(task, str) else None)
    err = check_tree("", spec, schema)
    if err:
        raise UserError(f"{p}: {_unknown_task(spec, err) or err}")
    err = unregistered_task(task)
    if err:
        raise UserError(f"{p}: {err}")
    spec = copy.deepcopy(spec)
    presets = spec.pop("presets", {}) or {}
    for name, body in presets.items():
        if not isinstance(name, str) or not re.fullmatch(NAME, name):
            raise UserError(f"{p}: presets: {name!r} is not a preset name; name each preset with letters, digits, "
                            f"'.', '_' or '-' (e.g. cpu, tiny)")
        if body is not None and not isinstance(body, dict):
            raise UserError(f"{p}: presets.{name}: expected a mapping of dotted keys to values, got "
                            f"{type(body).__name__} {body!r}")
    if preset is not None:
        if preset not in presets:
            known = ", ".join(sorted(presets)) or "none"
            raise UserError(f"{p}: no preset {preset!r} (this spec has: {known})")
        for key, value in (presets[preset] or {}).items():
            if get(schema, key) is None:
                raise UserError(f"{p}: presets.{preset}.{key}: unknown key")
            set_dotted(spec, key, value, f"{p}: presets.{preset}")
        err = check_tree("", spec, schema)
        if err:
            raise UserError(f"{p}: preset {preset!r}: {err}")
    given: dict[str, str] = {}
    parsed = [parse_override(item) for item in overrides]
    for (key, _), item in zip(parsed, overrides, strict=True):  # every key first: an overlap is named as one
        _not_given_twice(key, item, given)
        if key == "presets" or key.startswith("presets."):
            raise UserError(f"--set {key}: presets are applied from the spec file before any --set, so this would "
                            f"change nothing; --set the keys themselves (e.g. --set batch.size=2), or edit the "
                            f"presets of a spec of your own (--spec)")
        if get(schema, key) is None:
            raise UserError(f"--set {key}: unknown key for a {task} spec; docs/spec-keys.md lists the keys")
    for (key, value), item in zip(parsed, overrides, strict=True):
        set_dotted(spec, key, value, f"--set {item}")
    err = check_tree("", spec, schema)
    if err:
        raise UserError(f"--set {err}")
    err = _missing(spec)
    if err:
        raise UserError(f"{p}: {err}" if _missing(read_yaml(p)) else err)
    err = check_needs(spec) or constraints.check(spec)
    if err:
        raise UserError(f"{p}: {err}" if not overrides else err)
    spec["preset"] = preset
    spec["source"] = str(p)
    return spec


__all__ = ["get", "load_spec", "experiment_names", "experiments_dir", "spec_path", "read_yaml", "yaml_load"]
