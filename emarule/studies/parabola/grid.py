"""All (ρ_B, D) configurations of a spec, the long Monte Carlo ones in worker processes.

Configurations are independent, so worker processes use every core of a small machine. Each
keeps BLAS to one thread: the work is many small products on chunks that fit in cache, and
competing BLAS threads slow it down several-fold on a busy machine.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import nullcontext
from dataclasses import replace
from multiprocessing import get_context
from queue import Empty

from emarule.studies.parabola.problem import Problem
from emarule.studies.parabola.study import Outcome, Settings, study


def configurations(rho_bases, dims, rho_main: float) -> list[tuple[float, int]]:
    """(ρ_B, 1) for every base momentum, and (ρ_main, D) for every dimension (Appendix F.1)."""
    out = [(float(r), 1) for r in rho_bases]
    out += [(float(rho_main), int(d)) for d in dims if (float(rho_main), int(d)) not in out]
    return out


def settings_for(base: Settings, dim: int, seed_dim_product: int) -> Settings:
    if dim == 1:
        return base
    return replace(base, method="montecarlo", seeds=max(2, math.ceil(seed_dim_product / dim)))


def one_thread_blas():
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        return nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _run(problem: Problem, rho_base: float, dim: int, st: Settings, ticks=None) -> Outcome:
    """One configuration, its figures included, so that plotting overlaps the other workers' numerics."""
    from emarule.studies.parabola import figures  # matplotlib: imported where a figure is drawn

    start = time.time()
    with one_thread_blas():
        o = study(problem, rho_base, dim, st, ticks.put if ticks is not None else (lambda msg: None))
    o.info["window"] = (start, time.time())  # wall-clock, comparable across the worker processes
    tag = f"rho{rho_base:g}_D{dim}"
    o.figures = {
        f"fig1a_{tag}.png": figures.trajectories(o.curves, rho_base, dim, st.conventions, st.figure_kappas,
                                                 problem.lr),
        f"fig1b_{tag}.png": figures.momenta_and_errors(o.records, rho_base, dim, st.conventions),
    }
    return o


def run_all(problem: Problem, configs, base: Settings, seed_dim_product: int, workers: int,
            tick=lambda msg: None, done=lambda key, outcome: None) -> dict:
    """{(ρ_B, D): Outcome}. `tick(message)` reports progress inside a configuration (see
    `study.steps_of`), `done(key, outcome)` each finished configuration.

    The Monte Carlo configurations go to `workers` processes (not capped at the core count: three
    equal jobs on two cores end sooner as three processes than as two jobs and then one); the
    exact D=1 ones, a second or two each, run here meanwhile.
    """
    jobs = {(r, d): settings_for(base, d, seed_dim_product) for r, d in configs}
    remote = [k for k in jobs if jobs[k].method == "montecarlo"] if workers > 1 else []
    local = [k for k in jobs if k not in remote]
    results = {}
    if not remote:
        for key in local:
            results[key] = _run(problem, *key, jobs[key], _Ticks(tick))
            done(key, results[key])
        return results
    # spawn, not fork: the parent may hold torch's thread pools from other tasks' imports.
    ctx = get_context("spawn")
    # The workers allocate and free arrays of hundreds of MB per κ. glibc would map each afresh
    # and fault in every page again (~10 % of their time); keeping them on the heap reuses them.
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(2**30))
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(2**30))
    with ctx.Manager() as manager, ProcessPoolExecutor(min(workers, len(remote)), mp_context=ctx) as pool:
        ticks = manager.Queue()
        futures = {pool.submit(_run, problem, *key, jobs[key], ticks): key for key in remote}
        for key in local:
            results[key] = _run(problem, *key, jobs[key], _Ticks(tick))
            done(key, results[key])
            _drain(ticks, tick)
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            _drain(ticks, tick)
            for fut in finished:
                results[futures[fut]] = fut.result()
                done(futures[fut], results[futures[fut]])
        _drain(ticks, tick)
    return results


class _Ticks:
    """The `put` of a queue, for the in-process path."""

    def __init__(self, tick):
        self.put = tick


def _drain(queue, tick) -> None:
    while True:
        try:
            tick(queue.get_nowait())
        except Empty:
            return
