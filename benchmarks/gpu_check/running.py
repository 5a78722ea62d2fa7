"""Running the sections: each within its time budget, its output into the log; what it finds recorded as it goes
(`SectionRecord`) in the report, which is written after every change of a section's status (`Run`), so that a
section that fails, raises or runs out of time leaves what it had and the others still run."""

import contextlib
import gc
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks.gpu_check.report import write_table
from delta_qwen3.atomic import write_json

FAILED = ("fail", "error", "timeout")


class Skipped(Exception):
    """The section cannot run here; the message says why."""


class SectionTimeout(BaseException):
    """The section's time budget ran out (a BaseException, so that no `except Exception` on the way swallows it)."""


class SectionRecord:
    """What a section found: its checks (each a value against a limit, passing or not), figures, and what it did not
    run and why; kept in `data`, the section's part of the JSON, as it goes, so that a section that stops part-way
    keeps what it measured."""

    def __init__(self, data: dict):
        self.data = data
        self.started = time.monotonic()
        data.setdefault("checks", [])

    def check(self, name: str, value: float, limit: float, at_least: bool = False) -> bool:
        passed = math.isfinite(value) and (value >= limit if at_least else value <= limit)
        self.data["checks"].append({"name": name, "value": value, "limit": limit,
                                    "passes_if": "value >= limit" if at_least else "value <= limit", "pass": passed,
                                    "at_seconds": round(time.monotonic() - self.started, 1)})  # which part was slow
        return passed

    def figure(self, name: str, value) -> None:
        self.data.setdefault("figures", {})[name] = value

    def not_run(self, name: str, reason: str) -> None:
        self.data.setdefault("not_run", {})[name] = reason


def run_parts(section: SectionRecord, parts: dict[str, Callable[[], None]]) -> None:
    """Runs `parts` in order. One that raises is recorded (its error, and a failed check) and the next one runs.
    Once the section's time budget runs out, the part it ran out in and those after it are recorded as not run,
    and the section ends with what it measured: a budget too short for every part is not a failure."""
    names = list(parts)
    for index, name in enumerate(names):
        try:
            parts[name]()
        except SectionTimeout:
            section.not_run(name, "the section's time budget ran out during it")
            for later in names[index + 1:]:
                section.not_run(later, "the section's time budget ran out before it")
            return
        except Exception as error:
            section.data.setdefault("errors", {})[name] = f"{type(error).__name__}: {error}"[:2000]
            section.data.setdefault("tracebacks", {})[name] = traceback.format_exc()[-4000:]
            section.check(f"{name}: errors", 1, 0)
        finally:
            release_memory()


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raises `SectionTimeout` in the main thread after `seconds` (SIGALRM: Python code, or a call into native code
    once it returns)."""

    def expire(signum, frame):
        raise SectionTimeout(f"ran out of its {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class Run:
    """One run of the check: the report as it grows, written to `out`/gpu_check.json after every change of a
    section's status (under a lock: the watchdog writes it too)."""

    out: Path
    report: dict
    lock: threading.Lock = field(default_factory=threading.Lock)

    def save(self) -> None:
        with self.lock:
            write_json(self.out / "gpu_check.json", self.report)

    def sections(self) -> dict:
        return self.report["sections"]


def finish_status(data: dict) -> str:
    return "pass" if data["checks"] and all(check["pass"] for check in data["checks"]) else "fail"


def run_section(run: Run, name: str, function: Callable, budget: float, log) -> None:
    """Run one section within `budget` seconds, its output into `log`; record its status, time and any error."""
    data = run.sections()[name] = {"status": "running", "budget_seconds": budget}
    run.save()
    start = time.monotonic()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), time_limit(budget):
            function(SectionRecord(data))
        data["status"] = finish_status(data)
    except Skipped as skipped:
        data["status"], data["reason"] = "skipped", str(skipped)
    except SectionTimeout as timeout:
        data["status"], data["reason"] = "timeout", str(timeout)
    except (Exception, SystemExit) as error:  # SystemExit: benchmarks/serving.py's way to report vLLM's failure
        data["status"], data["reason"] = "error", f"{type(error).__name__}: {error}"[:2000]
        data["traceback"] = traceback.format_exc()[-4000:]
    finally:
        data["seconds"] = round(time.monotonic() - start, 1)
        torch._dynamo.reset()
        release_memory()
        run.save()
        print(f"{name}: {data['status']} ({data['seconds']} s)", file=sys.__stdout__, flush=True)


def watchdog(run: Run, seconds: float) -> threading.Thread:
    """A thread that, should the run outlast `seconds` (a section stuck in native code, where the time limit cannot
    interrupt it), records the running section as timed out, writes the report and the table, and ends the
    process with status 1."""

    def expire() -> None:
        time.sleep(seconds)
        for data in run.sections().values():
            if data["status"] == "running":
                data["status"], data["reason"] = "timeout", "stuck past the whole run's time; the process was ended"
        run.save()
        write_table(run)
        os._exit(1)

    thread = threading.Thread(target=expire, name="gpu_check watchdog", daemon=True)
    thread.start()
    return thread


def run_sections(run: Run, functions: dict[str, Callable], budgets: dict[str, float], log) -> None:
    for name in functions:
        run.sections()[name] = {"status": "waiting", "budget_seconds": budgets[name]}
    for name, function in functions.items():
        run_section(run, name, function, budgets[name], log)
    run.report["passed"] = not any(data["status"] in FAILED for data in run.sections().values())
    run.save()
