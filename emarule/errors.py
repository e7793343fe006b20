"""Errors that reach the user as one line and exit code 2, never as a traceback."""


class UserError(ValueError):
    """Bad input: the message names the problem and the fix, on one line. A ValueError, so that the Python API's
    callers catch it as they would any bad argument."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class UserTypeError(UserError, TypeError):
    """An argument of the wrong type (a dict where a Plan belongs): a TypeError as well as a UserError."""


class TrainingDiverged(UserError):
    """A non-finite loss or gradient: the run stops and the last good checkpoint is kept. Here, not in the loop,
    so that what runs many runs (a sweep) can tell it apart without reaching into the loop."""


class ScalingError(UserError):
    """A scaling rule produced a value outside its valid range (e.g. a beta below 0)."""
