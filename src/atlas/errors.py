"""The one error family a stage reports without a traceback: bad input from the user."""


class InputError(ValueError):
    """Bad config or data. The message names the file, the key or row, and what was expected."""


class CheckFailed(InputError):
    """A check found what it exists to catch; the message names the file and the tensor. (Here,
    not beside the checks, so that a stage raising it does not run, in its code inputs, the
    checks it does not run.)"""
