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
