"""Errors that reach the user as one line and exit code 2, never as a traceback."""


class UserError(Exception):
    """Bad input: the message names the problem and the fix, on one line."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class ScalingError(UserError):
    """A scaling rule produced a value outside its valid range (e.g. a beta below 0)."""
