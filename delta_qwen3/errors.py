"""The one exception type that commands raise for bad input."""


class CommandError(Exception):
    """Bad input or an unusable resource: the message names the problem, the command exits non-zero."""

    exit_code = 2


class RunError(CommandError):
    """Work that started and could not finish (a run that diverged or failed part-way): exit status 1, as for any
    failure that is not a usage error."""

    exit_code = 1
