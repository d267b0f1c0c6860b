"""The one error family a stage reports without a traceback: bad input from the user."""


class InputError(ValueError):
    """Bad config or data. The message names the file, the key or row, and what was expected."""
