"""The probe check's references (emarule/analysis/offline_probe.py): raw pixels beside the teacher at init."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emarule.cli.main import app
from emarule.analysis import offline_probe as PC


def stats(v):
    return {"mean": v, "std": None, "values": [v]}


@pytest.mark.parametrize("trained, init, pixels, margin, met", [
    (60.0, 30.0, 40.0, 20.0, True),   # the better reference (pixels) sets the margin
    (60.0, 50.0, 20.0, 10.0, False),  # beats the pixels by 40 but its initialization by only 10
    (45.0, 30.0, 30.0, 15.0, True),   # exactly the bar
])
def test_bar_takes_the_better_of_init_and_pixels(trained, init, pixels, margin, met):
    b = PC.bar({"offline": stats(trained), "init": stats(init), "pixels": stats(pixels)})
    assert b["margin"] == pytest.approx(margin) and b["met"] is met and b["required"] == PC.BAR


def tiny_run(tmp_path, name, *sets, seed=0):
    args = ["run", "byol-r18", "--preset", "tiny", "--out", str(tmp_path / name), "--seed", str(seed)]
    for s in sets:
        args += ["--set", s]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return tmp_path / name


@pytest.mark.slow
def test_pixel_probe_reads_digits_but_not_shapes(tmp_path, monkeypatch):
    monkeypatch.setenv("EMARULE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(PC, "_PIXELS", {})
    # More samples than pixels (8×8×3), so that neither fit is a separable one that runs to its iteration cap.
    sets = ("schedule.epochs=1", "data.train_samples=1000", "data.eval_samples=300")
    digits = PC.pixel_probe(tiny_run(tmp_path, "digits", *sets))
    shapes = PC.pixel_probe(tiny_run(tmp_path, "shapes", *sets, "data.source=shapes"))
    # digits: the pixels separate the classes; shapes: position, colour and clutter hide them
    assert digits["pixels_probe_top1"] > 70 and shapes["pixels_probe_top1"] < 35
    assert (shapes["train_size"], shapes["test_size"], shapes["features"]) == (1000, 300, 3 * 8 * 8)
    cached = json.loads((tmp_path / "shapes" / PC.CACHE_PIXELS).read_text())
    assert cached == shapes and PC.pixel_probe(tmp_path / "shapes") == shapes


def test_probe_check_reports_all_three_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr(PC, "_PIXELS", {})
    path = tiny_run(tmp_path, "k1", "schedule.epochs=1")

    class Run:
        is_baseline, kappa, rule_label = True, 1.0, "with"

    Run.path = path
    check = PC.probe_check([Run(), Run()])
    base = check["settings"]["baseline"]
    assert {"offline", "init", "pixels", "tracking"} <= set(base)
    # each number is its probe's, fitted again here from the run directory (the caches removed)
    for cache in (PC.CACHE, PC.CACHE_INIT, PC.CACHE_PIXELS):
        (path / cache).unlink()
    monkeypatch.setattr(PC, "_PIXELS", {})
    want = {"offline": PC.offline_probe(path)["offline_probe_top1"],
            "init": PC.offline_probe(path, at_init=True)["offline_probe_top1"],
            "pixels": PC.pixel_probe(path)["pixels_probe_top1"]}
    for k, v in want.items():
        assert base[k]["values"] == [v, v] and 0 <= v <= 100, k
    assert want["offline"] != want["init"]  # the trained teacher and its initialization are two fits
    assert check["bar"]["pixels"] == want["pixels"] and check["bar"]["init"] == want["init"]
    assert check["bar"]["margin"] == pytest.approx(want["offline"] - max(want["init"], want["pixels"]))
    assert "raw pixels" in check["summary"] and "-point bar" in check["summary"]


def test_probes_fitted_side_by_side_equal_those_fitted_one_after_another(tmp_path, monkeypatch):
    import shutil

    monkeypatch.setattr(PC, "_PIXELS", {})
    paths = [tiny_run(tmp_path / "a", f"s{s}", "schedule.epochs=1", seed=s) for s in (0, 1)]
    shutil.copytree(tmp_path / "a", tmp_path / "b")

    def runs(root):
        out = []
        for p in paths:
            run = type("Run", (), {"is_baseline": True, "kappa": 1.0, "rule_label": "with"})()
            run.path = root / p.name
            out.append(run)
        return out

    one = PC.probe_check(runs(tmp_path / "a"), jobs=1)
    monkeypatch.setattr(PC, "_PIXELS", {})  # the second check must fit its own pixels, in a worker
    two = PC.probe_check(runs(tmp_path / "b"), jobs=2)
    caches = (PC.CACHE, PC.CACHE_INIT, PC.CACHE_PIXELS)
    assert all((tmp_path / "b" / p.name / c).is_file() for p in paths for c in caches)
    assert two["settings"] == one["settings"] and two["bar"] == one["bar"]


def test_probe_fits_with_one_blas_thread_whatever_the_caller_allows(monkeypatch):
    """The fit's path, and so its top-1 in the last digit, depends on the BLAS thread count: pinned to one,
    the probe reads the same on any machine, and side-by-side fits do not oversubscribe the cores."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_info, threadpool_limits

    seen = []
    fit = LogisticRegression.fit

    def recording_fit(self, x, y):
        seen.extend(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")
        return fit(self, x, y)

    monkeypatch.setattr(LogisticRegression, "fit", recording_fit)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(200, 8)), rng.integers(0, 3, 200)
    with threadpool_limits(limits=2, user_api="blas"):
        top1 = PC.fit_and_score(x, y, x, y)
    assert seen and set(seen) == {1}
    assert 0.0 <= top1 <= 100.0




KIND = {PC.CACHE: "final", PC.CACHE_INIT: "init", PC.CACHE_PIXELS: "pixels"}


def cached(d: Path, name: str, method: str = PC.METHOD, seal: bool = True) -> None:
    """Writes cache `name` in run directory `d`: a reading fitted by `method`, sealed as the probes seal it
    (for what `d` holds) unless `seal` is False."""
    reading = {"offline_probe_top1": 50.0, "pixels_probe_top1": 60.0, "method": method}
    (d / name).write_text(json.dumps(PC._sealed(reading, PC._source(d, KIND[name])) if seal else reading))


def test_follow_up_gives_each_finished_run_its_fits_once(tmp_path):
    """The fits a sweep's idle workers do as runs finish: the final teacher of every run (an arm's only
    where a claim on the final teachers may compare arms), the initial teacher of each baseline, the pixels
    on the first baseline only; none already cached."""
    from emarule.analysis.sweep import SweepRun

    runs = [SweepRun(1.0, "exponential", 0, True), SweepRun(4.0, None, 0, False),
            SweepRun(4.0, "exponential", 0, False, arm=object()), SweepRun(1.0, "exponential", 1, True)]
    work = PC.follow_up(runs)

    def kinds(i):
        d = tmp_path / str(i)
        d.mkdir(exist_ok=True)
        got = work(i, d)
        assert all(fn is PC._warm and args[0] == d for _, fn, args in got)
        return [args[1] for _, _, args in got]

    assert [kinds(i) for i in range(4)] == [["final", "init", "pixels"], ["final"], [], ["final", "init"]]
    arm = tmp_path / "2"
    assert PC.follow_up(runs, arms=True)(2, arm) == [("probe 2 (final)", PC._warm, (arm, "final"))]
    cached(tmp_path / "0", PC.CACHE)
    assert kinds(0) == ["init", "pixels"]
    cached(tmp_path / "0", PC.CACHE_INIT, PC.METHOD_INIT)
    assert kinds(0) == ["pixels"]
    (tmp_path / "0" / PC.CACHE_INIT).write_text(json.dumps({"offline_probe_top1": 50.0, "method": PC.METHOD}))
    assert kinds(0) == ["init", "pixels"]  # an initialization probed without BatchNorm statistics is fitted again
    (tmp_path / "0" / PC.CACHE).write_text("{")  # a damaged cache is fitted again
    assert kinds(0) == ["final", "init", "pixels"]


def test_warm_caches_starts_no_worker_when_every_fit_is_cached(tmp_path, monkeypatch):
    import concurrent.futures

    def no_pool(*a, **k):
        raise AssertionError("a worker pool was started with nothing to fit")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", no_pool)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for c in (PC.CACHE, PC.CACHE_INIT, PC.CACHE_PIXELS):
            cached(tmp_path / name, c, PC.METHOD_INIT if c == PC.CACHE_INIT else PC.METHOD)
    runs = [type("Run", (), {"is_baseline": True, "path": tmp_path / n})() for n in ("a", "b")]
    PC.warm_caches(runs, jobs=2)


def test_batchnorm_statistics_are_those_of_the_data_with_everything_else_in_eval_mode():
    """The teacher at initialization normalizes as its first training step would: BatchNorm holds the mean and
    variance of the data passed (averaged over its batches), dropout stays off during that pass, and the model
    comes back in eval mode with its BatchNorm momentum as it was."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    seen = []

    class Spy(nn.Module):
        def forward(self, x):
            seen.append(self.training)
            return x

    net = nn.Sequential(nn.Conv2d(3, 4, 1), Spy(), nn.BatchNorm2d(4, momentum=0.3), nn.Dropout(0.5))
    batches = [torch.randn(8, 3, 5, 5) * 3 + 2 for _ in range(3)]
    PC.batchnorm_statistics(net, lambda: [net(b) for b in batches])
    bn = net[2]
    with torch.no_grad():
        acts = [net[0](b) for b in batches]
    want_mean = torch.stack([a.mean((0, 2, 3)) for a in acts]).mean(0)
    want_var = torch.stack([a.var((0, 2, 3), unbiased=True) for a in acts]).mean(0)
    torch.testing.assert_close(bn.running_mean, want_mean)
    torch.testing.assert_close(bn.running_var, want_var)
    assert seen == [False] * 3 and not net.training and not bn.training and bn.momentum == 0.3
    assert int(bn.num_batches_tracked) == 3


def test_the_teacher_at_initialization_is_probed_with_its_batchnorm_statistics(tmp_path, monkeypatch):
    """As built, BatchNorm holds mean 0 and variance 1 and passes activations through unnormalized; the probe
    of the initial teacher must read the network its statistics make, not that one."""
    import copy
    import torch

    monkeypatch.setattr(PC, "_PIXELS", {})
    path = tiny_run(tmp_path, "k1", "schedule.epochs=1")
    got = PC.offline_probe(path, at_init=True)
    assert got["method"] == PC.METHOD_INIT and got["tracking_probe_top1"] is None and got["step"] == 0

    from emarule.vision.probe import EvalImages

    parts, evaluation = PC._build(path)
    built = copy.deepcopy(parts.ema_source).eval()
    train = EvalImages(parts.train_set.source, evaluation.data.size)

    def top1(teacher):
        xtr, ytr = PC._features(evaluation, teacher, train)
        xte, yte = PC._features(evaluation, teacher, evaluation.data)
        return PC.fit_and_score(xtr.numpy(), ytr.numpy(), xte.numpy(), yte.numpy())

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the probe reads them, so that the features agree to the last bit
    try:
        as_built = top1(built)
        PC.batchnorm_statistics(built, lambda: PC._features(evaluation, built, train))
        estimated = top1(built)
    finally:
        torch.set_num_threads(threads)
    assert got["offline_probe_top1"] == estimated != as_built
    # an old cache, fitted without the statistics, is fitted again rather than read
    (path / PC.CACHE_INIT).write_text(json.dumps({**got, "offline_probe_top1": 99.0, "method": PC.METHOD}))
    assert PC.offline_probe(path, at_init=True) == got


def test_a_cache_fitted_by_another_method_is_fitted_again_for_every_teacher(tmp_path):
    cached(tmp_path, PC.CACHE, PC.METHOD_INIT)  # a final teacher's cache with another method
    cached(tmp_path, PC.CACHE_INIT, PC.METHOD_INIT)
    cached(tmp_path, PC.CACHE_PIXELS, "any")
    assert [k for _, k in PC._work(tmp_path, True, True)] == ["final"]


@pytest.mark.parametrize("n, want", [(513, [(0, 256), (256, 513)]), (512, [(0, 256), (256, 512)]),
                                     (1, [(0, 1)]), (258, [(0, 256), (256, 258)]), (0, [])])
def test_no_batch_of_one_reaches_batchnorm_in_train_mode(n, want):
    """BatchNorm in train mode refuses a batch of one (a train split of 256k + 1 views): it joins the batch
    before it."""
    assert PC._chunks(n, 256) == want
