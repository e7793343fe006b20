"""emarule as `pip install` leaves it: the wheel is built from this tree, installed into fresh virtual
environments, and run from a folder outside the source tree, with the source tree on no path.

Two environments, both made without a download: the wheel goes in with `pip install --no-deps --no-index`,
and its dependencies are the ones this interpreter already has, reached through a `.pth` file (a folder on
sys.path, whose own .pth files, this tree's editable install among them, are not run).
- "full": every installed package (the extras included): list, plan, run and sweep of tiny presets, scale;
- "core": only the distributions the wheel's core requirements pull in (torch, numpy, pyyaml, typer, rich and
  what they require), linked one by one: ModelEma, scale, plan_at, plan, table, limits and list run; an
  experiment's run is refused in one line naming the extra to install.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path, PurePosixPath

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from emarule.extras import EXTRAS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CORE = {"torch", "numpy", "pyyaml", "typer", "rich"}
EXTRA_MODULES = tuple(m for modules in EXTRAS.values() for m in modules)


def sh(args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kw)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the package (a build writes build/ and *.egg-info beside its source)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "emarule", src / "emarule", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path_factory.mktemp("dist")
    done = sh([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
               "-w", dist, src])
    assert done.returncode == 0, done.stderr
    (found,) = dist.glob("emarule-*.whl")
    return found


def make_venv(where: Path, wheel: Path, deps: list[Path]) -> Path:
    """A virtual environment holding the wheel, with `deps` on its path; its bin/ folder."""
    assert sh([sys.executable, "-m", "venv", "--without-pip", where]).returncode == 0
    python = where / "bin" / "python"
    done = sh([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel])
    assert done.returncode == 0, done.stderr
    site = Path(sh([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    (site / "_emarule_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    return where / "bin"


def core_closure() -> dict[str, metadata.Distribution]:
    """The installed distributions that the core requirements pull in, markers evaluated without extras."""
    seen: dict[str, metadata.Distribution] = {}
    todo = sorted(CORE)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:  # a requirement for another platform or Python
            continue
        seen[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def link_core(folder: Path) -> Path:
    """A folder holding links to the core closure's top-level files and folders, and nothing else."""
    folder.mkdir()
    for dist in core_closure().values():
        for f in dist.files or []:
            top = PurePosixPath(f).parts[0]
            target = Path(dist.locate_file(top))
            if top in ("..", "__pycache__") or (folder / top).exists() or not target.exists():
                continue
            (folder / top).symlink_to(target)
    return folder


def clean_env(tmp: Path) -> dict:
    """This environment without what would reach the source tree or another specs folder."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EMARULE_EXPERIMENTS", "COLUMNS")}
    return env | {"WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "EMARULE_CACHE": str(tmp / "cache"),
                  "NO_COLOR": "1", "COLUMNS": "250"}


@pytest.fixture(scope="module")
def full(wheel, tmp_path_factory) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp("full")
    deps = sorted({Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")})
    work = tmp / "work"
    work.mkdir()
    return make_venv(tmp / "venv", wheel, deps), work, clean_env(tmp)


@pytest.fixture(scope="module")
def core(wheel, tmp_path_factory) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp("core")
    work = tmp / "work"
    work.mkdir()
    return make_venv(tmp / "venv", wheel, [link_core(tmp / "deps")]), work, clean_env(tmp)


def test_the_wheel_holds_the_specs_and_requires_only_the_core(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = Parser().parsestr(z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode())
    specs = {Path(n).stem for n in names if re.fullmatch(r"emarule/experiments/[^/]+\.yaml", n)}
    assert specs == {p.stem for p in (ROOT / "emarule" / "experiments").glob("*.yaml")} and len(specs) == 9
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    assert {canonicalize_name(r.name) for r in reqs if r.marker is None} == CORE
    assert {"vision", "speech", "plots", "wandb", "all"} <= set(meta.get_all("Provides-Extra"))


def test_an_installed_emarule_lists_plans_runs_and_sweeps_from_any_folder(full):
    bin_, work, env = full

    def emarule(*args):
        done = sh([bin_ / "emarule", *args], cwd=work, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    listed = emarule("list")
    for name in ("byol-vit", "ctc-polyak", "parabola", "polyak-r50"):
        assert re.search(rf"│ {name} +│.*│ yes +│", listed), listed
    assert "byol-vit at κ=6" in emarule("plan", "byol-vit", "--kappa", "6")

    probe = ("import json, emarule; p = emarule.scale('byol-vit', 4); "
             "print(json.dumps({'file': emarule.__file__, 'rho': p['ema.momentum']}))")
    out = json.loads(sh([bin_ / "python", "-c", probe], cwd=work, env=env).stdout)
    assert Path(out["file"]).is_relative_to(bin_.parent) and out["rho"] == pytest.approx(0.99 ** 4)

    emarule("run", "parabola", "--preset", "tiny", "--out", "par")
    assert json.loads((work / "par" / "results.json").read_text()) and list((work / "par" / "figures").glob("*.png"))

    # the generated speech corpus is built by child processes, which must import the installed emarule too
    emarule("sweep", "ctc-polyak", "--preset", "tiny", "--kappas", "2", "--rule", "with", "--out", "sw")
    runs = sorted((work / "sw" / "ctc-polyak").glob("*/hparams.json"))
    assert [p.parent.name for p in runs] == ["tiny-k1-rule-s0", "tiny-k2-rule-s0"]
    for p in runs:
        assert Path(json.loads(p.read_text())["spec"]["source"]).is_relative_to(bin_.parent)  # the wheel's spec
        assert (p.parent / "metrics.jsonl").read_text().count("\n") > 1
    assert list((work / "sw" / "ctc-polyak").glob("compare-*.png"))


# parabola's tiny run and ctc-polyak's tiny sweep are above; every other experiment's tiny preset runs here
OTHER_TINY = sorted(p.stem for p in (ROOT / "emarule" / "experiments").glob("*.yaml")
                    if p.stem not in ("parabola", "ctc-polyak"))


def test_an_installed_emarule_runs_every_other_tiny_preset(full):
    bin_, work, env = full
    assert len(OTHER_TINY) == 7, OTHER_TINY
    for name in OTHER_TINY:
        out = work / f"tiny-{name}"
        done = sh([bin_ / "emarule", "run", name, "--preset", "tiny", "--out", out.name], cwd=work, env=env)
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"
        # a trained run's record and rows, or a study's results
        written = {p.name for p in out.iterdir()}
        assert {"hparams.json", "metrics.jsonl"} <= written or "results.json" in written, f"{name}: {written}"


def test_the_core_alone_runs_the_api_and_the_scaling_commands(core):
    bin_, work, env = core
    script = f"""
import importlib.util, json, sys
import torch, emarule
lacking = [m for m in {EXTRA_MODULES!r} if importlib.util.find_spec(m) is None]
model = torch.nn.Linear(3, 1)
ema = emarule.ModelEma(model, 0.99, base_batch_size=4)
rho = ema.update(model, batch_size=8)
plan = emarule.scale("byol-vit", 4)
now = emarule.plan_at(emarule.scale("byol-vit", 4, progressive="step:30"), 0, 1000)
print(json.dumps({{"file": emarule.__file__, "lacking": lacking, "rho": rho, "scaled": plan["ema.momentum"],
                   "now": now["batch_size"], "imported": sorted(m for m in {EXTRA_MODULES!r} if m in sys.modules)}}))
"""
    done = sh([bin_ / "python", "-c", script], cwd=work, env=env)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["lacking"] == list(EXTRA_MODULES), "the core environment holds an extra's module"
    assert Path(out["file"]).is_relative_to(bin_.parent) and out["imported"] == []
    assert out["rho"] == pytest.approx(0.99 ** 2) and out["scaled"] == pytest.approx(0.99 ** 4)
    assert out["now"] == 4096  # the first stage of step:30 trains at the base batch

    for args, shown in ((["plan", "byol-vit", "--kappa", "6"], "byol-vit at κ=6"),
                        (["table", "momenta"], "0.9999"), (["limits", "--momentum", "0.996", "--batch-size", "4096"],
                                                           "meaningful"),
                        (["list"], "with emarule[vision,plots]")):
        done = sh([bin_ / "emarule", *args], cwd=work, env=env)
        assert done.returncode == 0 and shown in done.stdout, (args, done.stdout, done.stderr)

    done = sh([bin_ / "emarule", "run", "parabola", "--preset", "tiny", "--out", "par"], cwd=work, env=env)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.strip().splitlines() == ["error: parabola needs emarule's plots extra (matplotlib: not "
                                                "installed); pip install 'emarule[plots]'"]
    assert list(work.iterdir()) == []
