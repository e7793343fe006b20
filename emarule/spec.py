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

from emarule.errors import UserError
from emarule.schema import check_needs, check_tree, get, schema_for

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


def yaml_load(text: str):
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


EXPERIMENTS_DIR = Path(os.environ.get("EMARULE_EXPERIMENTS", Path(__file__).resolve().parent.parent / "experiments"))


def experiment_names() -> list[str]:
    return sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.yaml"))


def spec_path(name: str | None, path: str | os.PathLike | None) -> Path:
    if path is not None and name:
        raise UserError(f"give an experiment name ({name!r}) or --spec {path}, not both")
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise UserError(f"spec file not found: {p}; pass --spec PATH to an existing YAML file")
        return p
    if not name:
        raise UserError("no experiment given; name one (see `emarule list`) or pass --spec PATH")
    p = EXPERIMENTS_DIR / f"{name}.yaml"
    if not p.is_file():
        known = ", ".join(experiment_names()) or "(none found)"
        raise UserError(f"unknown experiment {name!r}; choose one of: {known} (or pass --spec PATH)")
    return p


def read_yaml(p: Path) -> dict:
    try:
        data = yaml_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(f"{p}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); "
                        f"save the spec as a UTF-8 YAML file") from None
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
    except yaml.YAMLError:
        raise UserError(f"--set {item!r}: cannot parse the value {raw!r}") from None
    return key, value


def set_dotted(tree: dict, key: str, value: Any, where: str) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise UserError(f"{where}: {key}: {part} is not a section")
        node = nxt
    node[parts[-1]] = value


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
        raise UserError(f"{p}: {err}")
    spec = copy.deepcopy(spec)
    presets = spec.pop("presets", {}) or {}
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
    for item in overrides:
        key, value = parse_override(item)
        if get(schema, key) is None:
            raise UserError(f"--set {key}: unknown key for a {task} spec; see `emarule plan` for the keys")
        set_dotted(spec, key, value, f"--set {item}")
    err = check_tree("", spec, schema)
    if err:
        raise UserError(f"--set {err}")
    err = check_needs(spec)
    if err:
        raise UserError(f"{p}: {err}" if not overrides else err)
    for required in ("name", "task", "batch", "optimizer", "ema"):
        if required not in spec:
            raise UserError(f"{p}: missing section {required!r}")
    spec["preset"] = preset
    spec["source"] = str(p)
    return spec


__all__ = ["get", "load_spec", "experiment_names", "spec_path", "read_yaml", "yaml_load"]
