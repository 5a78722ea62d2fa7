"""How every command ends when it cannot finish: bad input, Ctrl-C or termination give one line on stderr and an
exit status, never a traceback.

SIGTERM (what `kill`, job schedulers and container runtimes send) would by default end Python at once, skipping the
cleanup that removes staging directories and temporary files. It is turned into the same exception as Ctrl-C, so
both unwind through that cleanup (`except BaseException` / `finally` blocks) before the command exits.
"""

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .errors import CommandError

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT: what shells report for a command ended by Ctrl-C
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


UNFINISHED_NOT_KEPT = "unfinished outputs were not kept"


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived: `signal_name` says which, `outcome` what became of the command's work. A
    `KeyboardInterrupt`, so code that cleans up after Ctrl-C cleans up after SIGTERM too."""

    def __init__(self, signal_name: str, outcome: str = UNFINISHED_NOT_KEPT):
        super().__init__(signal_name, outcome)
        self.signal_name, self.outcome = signal_name, outcome


def interruption(interrupt: KeyboardInterrupt, outcome: str) -> Interrupted:
    """`interrupt` (Ctrl-C's own, or an `Interrupted`) restated with `outcome`, for a command that knows better
    what became of its work, e.g. how to continue it: `run_command` prints it in place of the default."""
    name = interrupt.signal_name if isinstance(interrupt, Interrupted) else "SIGINT"
    return Interrupted(name, outcome)


class _SignalsReceived:
    """The handler of SIGINT and SIGTERM while a command runs: raises `Interrupted` and remembers the signal.

    The exception is raised in whatever Python code runs when the signal arrives, and that may be a callback from an
    extension (safetensors, in Rust, reading a tensor) that reports it as an error of its own (a `ValueError`):
    remembering the signal lets `run_command` say what really happened."""

    def __init__(self):
        self.first: str | None = None  # the name of the first signal received

    def __call__(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        self.first = self.first or name
        raise Interrupted(name)


def run_command(program: str, command: Callable[[], int | None]) -> int:
    """Run `command` and return the process's exit status: its own (None: 0); for a `CommandError`, its message as
    `"{program}: error: ..."` and its exit code; for SIGINT or SIGTERM, `"{program}: interrupted by SIGINT; ..."`
    with the `Interrupted` outcome, and 130, also when an extension turned the interrupt into an error of its own.
    The signal handlers are installed only while `command` runs, and only in the main thread (the only one Python
    delivers signals to)."""
    previous, received = {}, _SignalsReceived()
    if threading.current_thread() is threading.main_thread():
        previous = {number: signal.signal(number, received) for number in HANDLED_SIGNALS}
    try:
        return command() or 0
    except KeyboardInterrupt as interrupt:
        interrupted = interrupt if isinstance(interrupt, Interrupted) else Interrupted("SIGINT")
        print(f"{program}: interrupted by {interrupted.signal_name}; {interrupted.outcome}", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    except Exception as error:
        if received.first:  # the interrupt, reported by an extension as another error
            print(f"{program}: interrupted by {received.first}; {UNFINISHED_NOT_KEPT}", file=sys.stderr)
            return INTERRUPTED_EXIT_CODE
        if isinstance(error, CommandError):
            print(f"{program}: error: {error}", file=sys.stderr)
            return error.exit_code
        raise
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """SIGINT and SIGTERM wait while the block runs, and are delivered as it ends (to the handlers that were in place:
    `run_command`'s raises `Interrupted`): for the few steps that must not stop half-way, such as removing what an
    interrupted write left, or the renames that put an output in place. Only the main thread receives signals;
    elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {number: signal.signal(number, lambda signum, frame: received.append(signum))
                for number in HANDLED_SIGNALS}  # fmt: skip
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        for number in dict.fromkeys(received):
            signal.raise_signal(number)
