"""Framework callbacks, installed as extras and imported only by name (`import emarule` imports none):

- `emarule.integrations.lightning.EmaCallback` (`pip install 'emarule[lightning]'`)
- `emarule.integrations.hf.EmaCallback` (`pip install 'emarule[hf]'`)

Both read the global batch from the framework (per-device batch × processes × gradient accumulation),
count samples seen as optimizer steps × that batch, and update an `emarule.ModelEma` once per optimizer
step, so ρ is raised to global batch / base batch whatever the number of devices or accumulation steps.
"""


def global_batch(per_device: int, world_size: int, accumulation: int) -> int:
    """Samples behind one optimizer step."""
    for name, v in (("per-device batch", per_device), ("world size", world_size), ("accumulation", accumulation)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number ≥ 1, got {v!r}")
    return per_device * world_size * accumulation
