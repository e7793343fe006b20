"""What start-up imports: the table, plan and limits commands no task, no matplotlib and no torch; a parabola
run (numpy) no torch; a figure's module matplotlib only when a figure is drawn."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "PATH": "/usr/bin:/bin"}


def modules_after(code: str, tmp_path) -> list[str]:
    probe = (f"{code}\nimport sys\n"
             "print(sorted(m for m in ('torch', 'matplotlib', 'sklearn', 'pandas') if m in sys.modules), "
             "sorted(m for m in sys.modules if m.startswith(('emarule.tasks.', 'emarule.studies.')) "
             "and m != 'emarule.tasks.registry'))")
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
