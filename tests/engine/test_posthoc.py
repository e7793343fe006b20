"""emarule.engine.posthoc: power-function EMAs snapshotted in samples, any EMA reconstructed after training."""

import math
import re

import numpy as np
import pytest
import torch
from torch import nn

import emarule
from emarule.engine.posthoc import PowerEma, gamma_of, load_snapshots, reconstruct, solve

BASE, RHO, TOTAL, EVERY = 8, 0.99, 16000, 800  # ρ = 0.99 at batch 8: a horizon of 800 samples, σ_rel ≈ 0.05


def theta(samples: float) -> torch.Tensor:
    """The weights after `samples` samples: a known function of the samples seen, whatever the batch."""
    g = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    return torch.sin(samples / 900.0 * (1 + g)) + 0.3 * torch.cos(samples / 250.0 + g) + samples / 4000


def train(kappa: int, snapshot_dir=None, momenta=(RHO,), sigma_rels=(0.05, 0.10)):
    """A 'model' whose weights are set to θ(S) at each step of κ·BASE samples; returns the PowerEma,
    the directly tracked ModelEmas (ρ at BASE) and the model."""
    model = nn.Linear(3, 2, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(theta(0.0))
    tracker = PowerEma(model, sigma_rels, snapshot_every=EVERY, snapshot_dir=snapshot_dir, dtype=torch.float64)
    direct = [emarule.ModelEma(model, m, base_batch_size=BASE, dtype=torch.float64) for m in momenta]
    batch = kappa * BASE
    for step in range(1, TOTAL // batch + 1):
        with torch.no_grad():
            model.weight.copy_(theta(float(step * batch)))
        tracker.update(model, samples_seen=step * batch)
        for ema in direct:
            ema.update(model, samples_seen=step * batch)
    return tracker, direct, model


def test_gamma_of_inverts_the_relative_width():
    assert emarule.PowerEma is PowerEma
    for sigma in (0.01, 0.05, 0.1, 0.2, 1 / math.sqrt(12)):
        g = gamma_of(sigma)
        assert g >= -1e-9
        assert math.sqrt((g + 1) / ((g + 2) ** 2 * (g + 3))) == pytest.approx(sigma, rel=1e-9)
    assert gamma_of(1 / math.sqrt(12)) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("kappa", [1, 4])
def test_an_exponential_ema_is_reconstructed_at_any_batch(kappa):
    """ρ at batch 8 reconstructed from σ_rel 0.05 and 0.10 snapshots equals the ModelEma that applied
    ρ^κ at every step of batch 8κ, to 1% of that EMA's distance from the final weights."""
    tracker, (direct,), model = train(kappa)
    assert len(tracker.snapshots) == 2 * TOTAL // EVERY
    coef, error, _ = solve(tracker.snapshots, momentum=RHO, base_batch_size=BASE)
    assert error < 0.01
    rebuilt = reconstruct(tracker.snapshots, momentum=RHO, base_batch_size=BASE)["weight"]
    target = direct.module.weight
    assert (rebuilt - target).abs().max() < 0.01 * (target - model.weight).abs().max()
    # the profile is in samples: the same ρ without the rule (ρ per step of 8κ) is another, farther EMA
    if kappa == 4:
        plain = reconstruct(tracker.snapshots, momentum=RHO, base_batch_size=BASE * kappa, max_error=1)["weight"]
        assert (plain - target).abs().max() > 20 * (rebuilt - target).abs().max()


def test_a_power_profile_between_the_tracked_ones_matches_one_tracked_directly():
    tracker, _, model = train(4, sigma_rels=(0.05, 0.07, 0.10))
    outer = [s for s in tracker.snapshots if s["sigma_rel"] != 0.07]
    tracked = next(s for s in reversed(tracker.snapshots) if s["sigma_rel"] == 0.07)["state"]["weight"]
    coef, error, _ = solve(outer, sigma_rel=0.07)
    assert error < 0.01
    rebuilt = reconstruct(outer, sigma_rel=0.07)["weight"]
    assert (rebuilt - tracked).abs().max() < 0.01 * (tracked - model.weight).abs().max()
    # a tracked profile is its own snapshot, also at an earlier time
    coef, error, used = solve(tracker.snapshots, sigma_rel=0.10, at=TOTAL / 2)
    assert error < 1e-9 and len(used) == 3 * TOTAL // EVERY // 2
    mid = next(s for s in used if s["sigma_rel"] == 0.10 and s["samples_seen"] == TOTAL / 2)
    torch.testing.assert_close(reconstruct(tracker.snapshots, sigma_rel=0.10, at=TOTAL / 2)["weight"],
                               mid["state"]["weight"])


def test_snapshots_written_to_a_folder_give_the_same_reconstruction(tmp_path):
    tracker, _, _ = train(4, snapshot_dir=tmp_path)
    assert tracker.snapshots == [] and sorted(p.suffix for p in tmp_path.iterdir()) == [".pt"] * (TOTAL // EVERY)
    in_memory, _, _ = train(4)
    assert len(load_snapshots(tmp_path)) == len(in_memory.snapshots)
    torch.testing.assert_close(reconstruct(tmp_path, momentum=RHO, base_batch_size=BASE),
                               reconstruct(in_memory.snapshots, momentum=RHO, base_batch_size=BASE))


def test_state_dict_restores_the_clock():
    tracker, _, model = train(4)
    again = PowerEma(model, (0.05, 0.10), snapshot_every=EVERY, dtype=torch.float64)
    again.load_state_dict(tracker.state_dict())
    assert again.times == tracker.times and again.samples_seen == TOTAL
    torch.testing.assert_close(again.emas[0].module.weight, tracker.emas[0].module.weight)
    with pytest.raises(ValueError, match="sigma_rels"):
        PowerEma(model, (0.05,), snapshot_every=EVERY).load_state_dict(tracker.state_dict())


def test_targets_the_snapshots_cannot_express_are_refused():
    tracker, _, _ = train(4)
    snaps = tracker.snapshots
    with pytest.raises(ValueError, match=r"relative error of .* \(> max_error=0.02\): track a σ_rel closer"):
        reconstruct(snaps, momentum=0.9, base_batch_size=BASE)  # a horizon of 80 samples: far too narrow
    with pytest.raises(ValueError, match="no snapshots: train with a PowerEma"):
        reconstruct([], sigma_rel=0.05)
    with pytest.raises(ValueError, match="outside the snapshots"):
        reconstruct(snaps, sigma_rel=0.05, at=TOTAL + 1)
    with pytest.raises(ValueError, match="exactly one of"):
        solve(snaps, sigma_rel=0.05, momentum=RHO, base_batch_size=BASE)
    with pytest.raises(ValueError, match="needs base_batch_size"):
        solve(snaps, momentum=RHO)
    with pytest.raises(ValueError, match="not a usable EMA momentum"):
        solve(snaps, momentum=1.0, base_batch_size=BASE)
    with pytest.raises(ValueError, match=r"sigma_rel must be in \(0, 0.2887\]"):
        solve(snaps, sigma_rel=0.5)
    with pytest.raises(ValueError, match="not a time the tracker updated at"):
        solve(snaps, sigma_rel=0.05, at=TOTAL - 1)
    other = [dict(s, times=list(np.asarray(s["times"]) + 1.0)) for s in snaps[:2]]
    with pytest.raises(ValueError, match="different runs"):
        solve(snaps + other, sigma_rel=0.05)


def test_bad_tracker_settings_and_clock_are_named(tmp_path):
    model = nn.Linear(3, 2)
    for kwargs, message in (({"sigma_rels": []}, "sigma_rels is empty"), ({"sigma_rels": "0.05"}, "a list"),
                            ({"sigma_rels": (True,)}, "sigma_rel must be a finite number"),
                            ({"snapshot_every": 0}, "snapshot_every must be"),
                            ({"snapshot_dir": tmp_path / "missing"}, "is not a directory")):
        with pytest.raises(ValueError, match=message):
            PowerEma(model, **{"snapshot_every": 10, **kwargs})
    tracker = PowerEma(model, snapshot_every=10)
    with pytest.raises(ValueError, match="needs the clock"):
        tracker.update(model)
    tracker.update(model, samples_seen=4)
    with pytest.raises(ValueError, match="must grow"):
        tracker.update(model, samples_seen=4)
    with pytest.raises(ValueError, match="both must count the global batch"):
        tracker.update(model, samples_seen=12, batch_size=4)
    assert tracker.times == [0.0, 4.0] and tracker.snapshots == []


@pytest.mark.parametrize("damage", ["cut", "foreign", "not-a-list", "other-model"])
def test_a_snapshot_folder_with_a_damaged_or_foreign_file_is_refused_by_its_name(tmp_path, damage):
    tracker, _, _ = train(8, snapshot_dir=tmp_path)
    first = sorted(tmp_path.glob("phema-*.pt"))[0]
    if damage == "cut":
        first.write_bytes(first.read_bytes()[: first.stat().st_size // 3])
    elif damage == "foreign":
        first.write_bytes(b"not a snapshot")
    elif damage == "not-a-list":
        torch.save({"weights": torch.zeros(2)}, first)
    else:
        other = PowerEma(nn.Linear(5, 1), snapshot_every=EVERY)
        other.update(nn.Linear(5, 1), samples_seen=EVERY)
        torch.save(other.snapshots, first)
    name = "the snapshots are of different models" if damage == "other-model" else re.escape(str(first))
    with pytest.raises(ValueError, match=name):
        reconstruct(tmp_path, sigma_rel=0.07)


def test_snapshots_that_are_not_a_trackers_are_refused_in_memory():
    tracker, _, _ = train(8)
    with pytest.raises(ValueError, match=r"snapshots\[1\]: a snapshot's 'state' is missing"):
        solve([tracker.snapshots[0], {"samples_seen": 1.0, "sigma_rel": 0.05, "gamma": 1.0, "times": [0.0],
                                      "params": []}], sigma_rel=0.07)
    with pytest.raises(TypeError, match="snapshots must be a list"):
        solve("snapshots", sigma_rel=0.07)


@pytest.mark.parametrize("damage", [lambda s: s.pop("_extra_state"),
                                    lambda s: s["_extra_state"].update(times=["x"]),
                                    lambda s: s["_extra_state"].update(times=[8.0, 4.0]),
                                    lambda s: s.update({"emas.0.module.weight": torch.zeros(7)}),
                                    lambda s: s["emas.1._extra_state"].update(samples_seen="a lot")])
def test_a_bad_tracker_state_is_refused_and_changes_nothing(damage):
    tracker, _, model = train(8)
    state = tracker.state_dict()
    state["_extra_state"] = dict(state["_extra_state"])
    state["emas.1._extra_state"] = dict(state["emas.1._extra_state"])
    damage(state)
    fresh = PowerEma(model, (0.05, 0.10), snapshot_every=EVERY, dtype=torch.float64)
    before = [e.module.weight.clone() for e in fresh.emas]
    with pytest.raises(ValueError, match="state"):
        fresh.load_state_dict(state)
    assert fresh.times == [0.0]
    assert all(torch.equal(b, e.module.weight) for b, e in zip(before, fresh.emas, strict=True))
