"""Framework callbacks, installed as extras and imported only by name (`import emarule` imports none):

- `emarule.integrations.lightning.EmaCallback` (`pip install 'emarule[lightning]'`)
- `emarule.integrations.hf.EmaCallback` (`pip install 'emarule[hf]'`)

Both update an `emarule.ModelEma` once per optimizer step and charge that step the samples trained since
the previous one (batches × processes; docs/integrations.md says where a framework hides a short last
batch), so ρ is raised to those samples / base batch whatever the number of devices or accumulation
steps, and a run resumed with another global batch goes on from the EMA's own clock.
"""


def global_batch(per_device: int, world_size: int, accumulation: int) -> int:
    """Samples behind one optimizer step."""
    for name, v in (("per-device batch", per_device), ("world size", world_size), ("accumulation", accumulation)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number ≥ 1, got {v!r}")
    return per_device * world_size * accumulation


def check_ema_args(momentum, base_batch_size, ema_kwargs: dict) -> None:
    """Every argument a callback passes to ModelEma, checked when the callback is made rather than mid-fit: an
    EMA of an empty module refuses what the model's would (`exclude` alone needs the model's names)."""
    from torch import nn

    from emarule.engine.ema import ModelEma, _excluder

    if base_batch_size is None:
        raise ValueError("base_batch_size is the global batch ρ was tuned at; give it (your batch, if you do not "
                         "scale)")
    _excluder(ema_kwargs.get("exclude"))
    ModelEma(nn.Module(), momentum, base_batch_size=base_batch_size,
             **{k: v for k, v in ema_kwargs.items() if k != "exclude"})


def bound_model(bound: int | None, model) -> int:
    """The identity of the model a callback's EMA averages: a callback fitted on one model refuses another,
    whose weights its EMA would otherwise carry on from the first model's."""
    from emarule.engine.ema import unwrap

    ident = id(unwrap(model))
    if bound is not None and bound != ident:
        raise ValueError("this EmaCallback already averages another model (one it was fitted on before); give "
                         "each model its own EmaCallback")
    return ident
