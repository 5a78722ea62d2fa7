"""`run_command`, which every command runs under: one line and an exit status for bad input and interrupts."""

import os
import signal
import time

import pytest

from delta_qwen3.errors import CommandError
from delta_qwen3.interrupts import Interrupted, run_command


def signalled(signal_number: int) -> None:
    """Send this process `signal_number` and wait for its handler to raise."""
    os.kill(os.getpid(), signal_number)
    time.sleep(5)
    raise AssertionError("the signal's handler did not raise")


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_is_one_line_and_exit_130(capsys, signal_number):
    assert run_command("prog", lambda: signalled(signal_number)) == 130
    name = signal.Signals(signal_number).name
    assert capsys.readouterr().err == f"prog: interrupted by {name}; unfinished outputs were not kept\n"


def test_an_interrupt_that_an_extension_reports_as_its_own_error_is_still_an_interrupt(capsys):
    """safetensors' Rust reader, interrupted in a callback, raises a `ValueError` of its own in place of the
    interrupt; a `CommandError` wrapping such an error would hide it too."""

    def reading_a_tensor():
        try:
            signalled(signal.SIGTERM)
        except Interrupted:
            raise ValueError("could not determine the shape of object type 'torch.storage.UntypedStorage'") from None

    assert run_command("prog", reading_a_tensor) == 130
    assert capsys.readouterr().err == "prog: interrupted by SIGTERM; unfinished outputs were not kept\n"


def test_errors_without_a_signal_keep_their_own_ending(capsys):
    def bad_input():
        raise CommandError("no such file: x")

    assert run_command("prog", bad_input) == 2
    assert capsys.readouterr().err == "prog: error: no such file: x\n"
    with pytest.raises(ZeroDivisionError):  # a bug stays a traceback
        run_command("prog", lambda: 1 / 0)


def test_handlers_are_restored_afterwards():
    before = [signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)]
    run_command("prog", lambda: None)
    assert [signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)] == before
