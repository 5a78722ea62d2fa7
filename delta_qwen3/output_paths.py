"""Output paths checked before any work, and write failures at the end reported in one line: a long evaluation or
conversion must not end in a traceback that loses its results because of where they were to be written."""

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import CommandError, RunError


def _check_parents(path: Path, option: str) -> None:
    """The nearest existing ancestor of `path` must be a directory, or `path` cannot be created."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise CommandError(f"{option} {path} cannot be created: {parent} is a file, not a directory")
            return


def check_output_file(path: Path, option: str) -> None:
    """Refuse an output file path that is a directory or lies under a file. An existing file is replaced."""
    if path.is_dir():
        raise CommandError(f"{option} {path} is a directory; give the path of a file to write")
    _check_parents(path, option)


def check_output_dir(path: Path, option: str, *, overwrite: bool, files: Iterable[str] | None = None) -> None:
    """Refuse an output directory that is a file or lies under one, or, unless `overwrite`, one that holds earlier
    output: anything at all, or, when the command writes only `files` into it, any of those."""
    if path.exists() and not path.is_dir():
        raise CommandError(f"{option} {path} exists and is not a directory")
    _check_parents(path, option)
    if overwrite or not path.is_dir():
        return
    if files is None:
        if any(path.iterdir()):
            raise CommandError(f"{option} {path} exists and is not empty (pass --overwrite to replace it)")
        return
    earlier = [name for name in files if (path / name).exists()]
    if earlier:
        raise CommandError(
            f"{option} {path} already holds {', '.join(earlier)} from an earlier run (pass --overwrite to replace)"
        )


# Writers in Rust (safetensors, tokenizers) raise errors of their own types for a failed write; the system's error
# is in their message, as Rust's `std::io::Error` shows it.
RUST_IO_ERROR = re.compile(r"\(os error \d+\)")


def is_write_failure(error: BaseException) -> bool:
    """Whether `error`, raised while writing, is the system refusing the write (a full disk, no permission), from
    Python or from a writer in Rust; not a failure already reported in one line, which may quote the Rust error."""
    if isinstance(error, CommandError):
        return False
    return isinstance(error, OSError) or (isinstance(error, Exception) and bool(RUST_IO_ERROR.search(str(error))))


def refused_growth(directory: Path) -> OSError | None:
    """The system's refusal to make a file under `directory` one byte longer (a full disk, a file size limit), or
    None: the cause of a failed write there that a writer did not report. PyTorch's file writer (`torch.save`)
    says only that the write failed ("unexpected pos ...", "file write failed")."""
    for path in directory.rglob("*"):
        if path.is_file():
            try:
                with path.open("ab", buffering=0) as file:
                    file.write(b"\0")
            except OSError as refusal:
                return refusal
    return None


def write_failure(option: str, path: Path, error: Exception, outcome: str) -> RunError:
    """The one line for a failure to write `path` (disk full, permissions, the path taken meanwhile): its cause,
    and `outcome`, what became of the command's work; exit status 1 (the input was not at fault)."""
    reason = error.strerror if isinstance(error, OSError) and error.strerror else " ".join(str(error).split())
    return RunError(f"could not write {option} {path}: {reason} ({outcome})")


@contextmanager
def reporting_write_failure(option: str, path: Path, outcome: str = "the results are printed above"
                            ) -> Iterator[None]:  # fmt: skip
    """Turn a failure to write `path` into one line (`write_failure`). Commands that compute results print them
    before writing them, so they are not lost with it."""
    try:
        yield
    except Exception as error:
        if not is_write_failure(error):
            raise
        raise write_failure(option, path, error, outcome) from None
