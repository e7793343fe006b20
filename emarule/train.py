"""The README's worked task imports `train` from here; the loop is emarule.engine.loop."""

from emarule.engine.loop import train

__all__ = ["train"]
