"""The layers point one way: each part of the package imports only the parts below it (LAYERS, one table), no
module takes part in an import cycle, tasks import the engine, never the reverse, and a run imports only its own
task."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


PACKAGE = ROOT / "emarule"

# Each part of emarule (a subpackage, or a module at the top) and the parts it may import, at module level or
# inside a function. `emarule` is the package's own __init__ (the public API, imported on first use).
BELOW_ENGINE = {"errors", "registry", "config", "scaling"}
LAYERS = {
    "errors": set(),
    "extras": {"errors"},  # the pip extras and the check a command makes for them: torch-free
    "registry": set(),  # every task family's record and spec sections: pure Python, importing nothing of emarule
    "config": {"errors", "registry"},
    "scaling": {"errors", "config"},
    "api": {"errors", "config", "scaling"},
    "engine": {"errors", "config", "scaling"},
    "emarule": {"errors", "api", "scaling", "engine"},
    "console": {"engine"},
    "speech": {"errors", "engine"},
    "vision": BELOW_ENGINE | {"engine"},
    "tasks": BELOW_ENGINE | {"engine", "vision", "speech"},
    "studies": BELOW_ENGINE | {"engine", "console"},
    "request": BELOW_ENGINE | {"engine", "console", "extras"},
    "integrations": {"emarule", "engine"},
    "analysis": BELOW_ENGINE | {"engine", "console", "extras", "request", "tasks", "vision"},
    "cli": BELOW_ENGINE | {"emarule", "engine", "console", "extras", "request", "tasks", "analysis"},
    "__main__": {"cli"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def emarule_imports(path: Path) -> set[str]:
    """The modules of emarule that `path` imports: `from pkg import name` counts pkg.name where that is a module,
    else pkg."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                     for a in node.names]
        else:
            continue
        out |= {n for n in names if n in MODULES}
    return out


def part(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def import_graph() -> dict[str, set[str]]:
    return {name: emarule_imports(path) - {name} for name, path in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_part_of_the_package_is_in_the_layer_table():
    assert {part(m) for m in MODULES} == set(LAYERS)


def test_each_part_imports_only_the_parts_below_it():
    offenders = {}
    for name, deps in import_graph().items():
        bad = sorted(d for d in deps if part(d) != part(name) and part(d) not in LAYERS[part(name)])
        if bad:
            offenders[name] = bad
    assert not offenders, f"an import against the layers (tests/engine/test_layers.py, LAYERS): {offenders}"


def test_no_module_takes_part_in_an_import_cycle():
    assert not cycles(import_graph()), "modules that import each other, directly or in a ring"


def test_the_cycle_check_finds_a_ring():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert not cycles({"a": {"b"}, "b": set()})


# What builds on the engine: the engine imports none of it, at module level or inside a function.
ABOVE = [["emarule", p] for p in ("tasks", "cli", "analysis", "studies", "vision", "speech", "integrations")]


def test_no_engine_module_imports_a_task():
    offenders = {}
    for f in sorted((ROOT / "emarule" / "engine").rglob("*.py")):
        bad = sorted(m for m in imported_modules(f) if m.split(".")[:2] in ABOVE)
        if bad:
            offenders[str(f.relative_to(ROOT))] = bad
    assert not offenders, f"the engine imports a layer above it (pass what it needs in instead): {offenders}"


def test_a_run_imports_its_own_task_only(tmp_path):
    code = (
        "import sys; sys.path.insert(0, 'tests')\n"
        "from engine_util import run_toy, toy_spec\n"
        f"run_toy({str(tmp_path)!r}, toy_spec(**{{'schedule.epochs': 1}}))\n"
        "print(sorted(m for m in sys.modules if m.startswith(('emarule.tasks.', 'emarule.studies', 'sklearn'))))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "['emarule.tasks.toy']"


def test_the_sweep_runs_through_the_runner_not_the_loops_internals():
    imported = imported_modules(ROOT / "emarule" / "analysis" / "sweep.py")
    assert not {m for m in imported if m == "emarule.engine.loop" or m.startswith("emarule.engine.loop.")}
    assert "emarule.engine.preflight" in imported
