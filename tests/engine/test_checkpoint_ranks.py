"""Which RNG states a resumed rank takes from its checkpoint: at the world size the checkpoint was written
with, each rank its own (torch, numpy and python), and none at another world size. The ranks are faked
through the torchrun environment (RANK, WORLD_SIZE), which is what the engine reads outside a process group."""

import random

import numpy as np
import pytest
import torch

from emarule.engine import checkpoint as CK
from emarule.engine import distributed


def state_of(seed):
    """The RNG states a rank seeded with `seed` would save: checkpoint.rng_state of that moment."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    return CK.rng_state()


def draws():
    return torch.rand(4).tolist(), np.random.rand(4).tolist(), [random.random() for _ in range(4)]


@pytest.fixture
def keep_rng():
    """Restore the process's generators afterwards: the tests after this one must not see seeds set here."""
    saved = CK.rng_state()
    yield
    CK.set_rng_state(saved)


def expected(seed):
    state_of(seed)
    return draws()


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_each_rank_restores_its_own_rng_states(monkeypatch, keep_rng, rank):
    # Distinct streams per rank: a rank that took rank 0's would draw the same augmentations and dropout.
    ckpt = {"rng": [state_of(100 + r) for r in range(3)]}
    want = [expected(100 + r) for r in range(3)]
    assert want[0] != want[1] != want[2]
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", str(rank))
    assert (distributed.rank(), distributed.world_size()) == (rank, 3)
    state_of(7)  # anything else in the generators before the resume
    assert CK.restore_rng(ckpt) is True
    assert draws() == want[rank]


def test_another_world_size_restores_nothing(monkeypatch, keep_rng):
    # Rank r of 2 is not rank r of 4: its share of every batch differs, so no saved stream is its own.
    ckpt = {"rng": [state_of(100), state_of(101)]}
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "1")
    state_of(7)
    assert CK.restore_rng(ckpt) is False
    assert draws() == expected(7)  # the generators as they were
