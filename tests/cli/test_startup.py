"""What start-up imports: the table, plan and limits commands no task, no matplotlib and no torch; a parabola
run (numpy) no torch; a figure's module matplotlib only when a figure is drawn."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# PYTHONPATH: the package is found without an install (a GPU machine that only has the checkout)
ENV = {"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}


def modules_after(code: str, tmp_path) -> list[str]:
    probe = (f"{code}\nimport sys\n"
             "print(sorted(m for m in ('torch', 'matplotlib', 'sklearn', 'pandas') if m in sys.modules), "
             "sorted(m for m in sys.modules if m.startswith(('emarule.tasks.', 'emarule.studies.'))))")
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, env=ENV,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


def cli(*args: str) -> str:
    return ("from emarule.cli.main import main\n"
            f"try:\n    main({list(args)!r})\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code")


def test_table_plan_and_limits_import_no_task_matplotlib_or_torch(tmp_path):
    for args in (["table", "momenta"], ["plan", "byol-vit", "--kappa", "6"], ["list"],
                 ["limits", "--momentum", "0.999", "--batch-size", "256"]):
        assert modules_after(cli(*args), tmp_path) == "[] []", args


def test_the_parabola_runs_without_torch(tmp_path):
    got = modules_after(cli("run", "parabola", "--preset", "tiny", "--out", str(tmp_path / "p")), tmp_path)
    assert got.startswith("['matplotlib'] ") and "emarule.studies.parabola.run" in got, got
    assert (tmp_path / "p" / "figures" / "summary.png").is_file()


def test_the_parabola_modules_leave_matplotlib_to_the_figures(tmp_path):
    got = modules_after("import emarule.studies.parabola.run, emarule.studies.parabola.grid", tmp_path)
    assert got.startswith("[] "), got


def loaded(code: str, tmp_path, names: tuple[str, ...]) -> list[str]:
    """Which of `names` (modules, or packages and everything under them) `code` leaves in sys.modules."""
    probe = (f"{code}\nimport sys\n"
             f"print(sorted(n for n in {names!r} if any(m == n or m.startswith(n + '.') for m in sys.modules)))")
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, env=ENV,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


# What `emarule table` once imported and never used: the Python API and, through it, the spec loader and
# YAML; the run machinery (emarule.engine) through the renderer; JSON and YAML for formats not asked for.
NOT_FOR_TABLE = ("emarule.api", "emarule.config.load", "emarule.engine", "emarule.request.checks", "emarule.tasks",
                 "yaml", "json")


def test_table_imports_only_what_it_draws(tmp_path):
    assert loaded(cli("table", "momenta"), tmp_path, NOT_FOR_TABLE) == "[]"
    # CSV needs no rich table
    assert loaded(cli("table", "lr", "--format", "csv"), tmp_path, NOT_FOR_TABLE + ("rich.table",)) == "[]"


def test_import_emarule_imports_only_its_errors(tmp_path):
    """The command line imports the package first: `scale`, `Plan`, ... come on first use, and work."""
    assert loaded("import emarule", tmp_path, ("emarule.api", "emarule.scaling", "emarule.config", "yaml")) == "[]"
    code = ("import emarule\nfrom emarule import Plan, scale\n"
            "assert isinstance(scale({'batch': {'size': 256}}, 2), Plan) and emarule.plan_at is not None")
    assert loaded(code, tmp_path, ("torch",)) == "[]"


def test_commands_annotations_are_objects_not_strings():
    """typer reads every command's annotations at each start; strings (`from __future__ import annotations` in
    emarule/cli/main.py) are evaluated one by one and made building the app several times slower."""
    import inspect

    from emarule.cli.main import app

    strings = [(c.callback.__name__, p.name) for c in app.registered_commands
               for p in inspect.signature(c.callback).parameters.values() if isinstance(p.annotation, str)]
    assert app.registered_commands and strings == []
