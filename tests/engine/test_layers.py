"""The layers point one way: tasks import the engine, never the reverse; a run imports only its own task."""

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
    assert r.stdout.strip().splitlines()[-1] == "['emarule.tasks.registry', 'emarule.tasks.toy']"


def test_the_sweep_runs_through_the_runner_not_the_loops_internals():
    imported = imported_modules(ROOT / "emarule" / "analysis" / "sweep.py")
    assert not {m for m in imported if m == "emarule.engine.loop" or m.startswith("emarule.engine.loop.")}
    assert "emarule.engine.preflight" in imported
