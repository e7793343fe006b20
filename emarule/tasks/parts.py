"""The README's worked task imports its parts from here; they live in emarule.engine.interface."""

from emarule.engine.interface import Evaluation, Now, TaskParts

__all__ = ["Evaluation", "Now", "TaskParts"]
