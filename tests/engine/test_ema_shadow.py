"""The shadow is the averaged model: swap_into puts all of it in the model, an explicit dtype holds the
buffers too, a saved momentum of 1 loads again, complex tensors are averaged, a reshaped parameter is
named, and the FSDP2 example of docs/model-ema.md keeps the averaged weights on one rank."""

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from emarule.engine.ema import ModelEma

DOC = Path(__file__).resolve().parents[2] / "docs" / "model-ema.md"


def bn_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def train(model: nn.Module, steps: int = 3) -> None:
    """SGD steps in train mode: the weights and BatchNorm's running statistics move."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for _ in range(steps):
        loss = model(torch.randn(32, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def own(model: nn.Module) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


def same(model: nn.Module, state: dict) -> bool:
    return all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_swap_into_puts_the_whole_shadow_in_the_model_and_restores_it():
    """Bug: only the averaged tensors went in; BatchNorm's statistics and excluded tensors stayed the model's."""
    model = bn_net()
    ema = ModelEma(model, 0.9)
    partial = ModelEma(model, 0.9, exclude=["3"])
    train(model)
    ema.update(model)
    partial.update(model)
    train(model)  # the model moves on after the last update
    fresh = bn_net()
    with torch.no_grad():
        fresh[1].running_var.fill_(4.0)
    restored = ModelEma(fresh, 0.5)
    restored.load_state_dict(ema.state_dict())  # an EMA restored for a model that never trained
    x = torch.randn(64, 8)
    for e, target in ((ema, model), (partial, model), (restored, fresh)):
        target.eval()
        before = own(target)
        with e.swap_into(target) as m:
            assert torch.equal(m(x), e(x))
            assert same(target, e.module.state_dict())
        assert same(target, before)
        with pytest.raises(RuntimeError, match="an evaluation that fails"), e.swap_into(target):
            raise RuntimeError("an evaluation that fails")
        assert same(target, before)


def test_an_explicit_low_precision_dtype_holds_the_buffers_too():
    """Bug: dtype="bfloat16" gave bf16 weights over float32 BatchNorm statistics; the average did not run."""
    for name, dt in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        model = bn_net()
        ema = ModelEma(model, 0.999, dtype=name)
        floating = {k: v.dtype for k, v in ema.module.state_dict().items() if v.is_floating_point()}
        assert set(floating.values()) == {dt}, floating
        assert ema.module[1].num_batches_tracked.dtype == torch.int64
        train(model)
        ema.update(model)  # copied statistics stay in the shadow's dtype
        assert ema.module[1].running_mean.dtype == dt
        torch.testing.assert_close(ema.module[1].running_mean, model[1].running_mean.to(dt))
        x = torch.randn(5, 8)
        assert ema(x.to(dt)).dtype == dt
        with torch.autocast("cpu", dtype=dt):
            assert ema(x).shape == (5, 4)
        again = ModelEma(bn_net(), 0.9)  # a default EMA loading that state follows it
        again.load_state_dict(ema.state_dict())
        assert again.module[1].running_var.dtype == dt and again(x.to(dt)).dtype == dt
    # the default dtype still only widens a copied buffer; an explicit one narrows it
    wide = bn_net()
    wide.register_buffer("scale", torch.ones(1, dtype=torch.float64))
    assert ModelEma(wide, 0.9).module.scale.dtype == torch.float64
    assert ModelEma(wide, 0.9, dtype="float32").module.scale.dtype == torch.float32


def test_a_saved_momentum_of_one_loads_again():
    """Bug: set_momentum(1.0) is allowed, but its state_dict() and checkpoint() were refused on loading."""
    model = bn_net()
    ema = ModelEma(model, 0.9, base_batch_size=16)
    ema.set_momentum(1.0)  # a later stage's ρ^κ that rounds to 1
    for state in (ema.state_dict(), ema.checkpoint()):
        restored = ModelEma(bn_net(), 0.5)
        restored.load_state_dict(state)
        assert restored.momentum == 1.0 and restored.base_batch_size == 16
        before = restored.module[0].weight.clone()
        train(model)
        assert restored.update(model, batch_size=32) == 1.0
        assert torch.equal(restored.module[0].weight, before)  # ρ = 1 holds the average
    bad = {**ema.state_dict()}
    bad["_extra_state"] = {**bad["_extra_state"], "momentum": 1.5}
    with pytest.raises(ValueError, match="momentum 1.5 is not a usable EMA momentum"):
        ModelEma(bn_net(), 0.5).load_state_dict(bad)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_complex_parameters_are_averaged():
    """Bug: a complex parameter was copied, not averaged (the test was is_floating_point())."""
    # complex32 is held in complex64: torch has no lerp for it
    for dt, held in ((torch.complex64,) * 2, (torch.complex128,) * 2, (torch.complex32, torch.complex64)):
        model = nn.Module()
        model.w = nn.Parameter(torch.zeros(3, dtype=dt))
        model.lin = nn.Linear(2, 2)
        ema = ModelEma(model, 0.5)
        assert ema.module.w.dtype == held and ema.module.lin.weight.dtype == torch.float32
        with torch.no_grad():
            model.w.fill_(2 + 2j)
        assert ema.update(model) == 0.5
        assert torch.equal(ema.module.w, torch.full((3,), 1 + 1j, dtype=held))


def test_a_parameter_given_data_of_another_shape_is_named():
    """Bug: `p.data = t` kept the pairing; a broadcastable t was spread over the shadow, another raised
    torch's own size error."""
    for shape in ((1, 8), (3, 8)):
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        ema = ModelEma(model, 0.5)
        ema.update(model)
        before = {k: v.clone() for k, v in ema.module.state_dict().items()}
        model[0].weight.data = torch.ones(shape)
        message = rf"parameter '0.weight' has shape {re.escape(str(shape))} in the model but \(16, 8\) in the EMA"
        for call in (ema.update, ema.copy_from):
            with pytest.raises(ValueError, match=message):
                call(model)
        with pytest.raises(ValueError, match=message), ema.swap_into(model):
            pass
        assert same(ema.module, before)  # nothing changed
        model[0].weight.data = torch.zeros(16, 8)  # the right shape again: updates go on
        assert ema.update(model) == 0.5
        torch.testing.assert_close(ema.module[0].weight, 0.5 * before["0.weight"])


def fsdp_example() -> str:
    """The lines of docs/model-ema.md's FSDP2 example from `with ema.swap_into(model):` to its end."""
    block = next(b for b in re.findall(r"^```python torchrun\n(.*?)^```$", DOC.read_text(encoding="utf-8"),
                                       re.S | re.M) if "fully_shard" in b)
    return block[block.index("with ema.swap_into(model):"):]


def test_the_fsdp2_example_keeps_the_averaged_weights_on_one_rank(tmp_path):
    """On one rank full_tensor() shares the model's memory: without a copy, the dict the docs' example
    gathers held the model's own weights once the block ended. The BatchNorm statistics gathered are
    the shadow's too, although the model moved after the update."""
    dist = pytest.importorskip("torch.distributed")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group of another test")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        model = bn_net()
        fully_shard(model[0], mesh=mesh)
        fully_shard(model, mesh=mesh)
        ema = ModelEma(model, 0.5, base_batch_size=32)
        train(model)
        ema.update(model, samples_seen=96)
        train(model)
        shadow = {n.replace("/", "."): t.clone() for n, t in ema.shards.named_buffers()}
        local = {k: (v.to_local() if hasattr(v, "to_local") else v).clone() for k, v in model.state_dict().items()}
        namespace = {"ema": ema, "model": model}
        exec(fsdp_example(), namespace)
        full = namespace["full"]
        assert sorted(full) == sorted(shadow)
        for k, v in full.items():
            assert torch.equal(v, shadow[k]), k
        for k, v in model.state_dict().items():
            assert torch.equal(v.to_local() if hasattr(v, "to_local") else v, local[k]), k
    finally:
        dist.destroy_process_group()
