"""The one exception type that commands raise for bad input."""


class CommandError(Exception):
    """Bad input or an unusable resource: the message names the problem, the command exits non-zero."""

    exit_code = 2
