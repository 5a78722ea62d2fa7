"""Output paths checked before any work, and write failures at the end reported in one line: a long evaluation or
conversion must not end in a traceback that loses its results because of where they were to be written.

Every command also checks its outputs against its inputs (`check_not_an_input`: nothing is written over, into or
around a file or directory the command reads), and holds a lock on each output for as long as it runs
(`output_lock`), so that two commands started at once into one output cannot interleave their logs, checkpoints or
results.
"""

import errno
import fcntl
import os
import re
import socket
import sys
import time
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


def _real(path: str | Path) -> Path:
    """`path` absolute, with every symbolic link along it resolved (as far as it exists)."""
    return Path(os.path.realpath(Path(path).expanduser()))


def check_not_an_input(option: str, output: str | Path, written: Iterable[str | Path],
                       inputs: Iterable[tuple[str, str | Path | None]]) -> None:  # fmt: skip
    """Refuse an output that would change an input of the command: any path in `written` (the files and directories
    the command writes for `option`'s `output`, created or replaced) that is an input, lies inside an input
    directory, or holds an input. `inputs` are (name, path) pairs as the command line names them; those that are
    not local paths (Hub ids, None) cannot be written to and are skipped. Symbolic and hard links are followed."""
    local = [(name, source, _real(source)) for name, source in inputs
             if source is not None and Path(source).expanduser().exists()]  # fmt: skip
    for path in written:
        target = _real(path)
        for name, source, real in local:
            same = target == real or (target.exists() and os.path.samefile(target, real))
            if same or (real.is_dir() and target.is_relative_to(real)):
                where = "is" if same else "would be written inside"
                raise CommandError(
                    f"{option} {output}: {path} {where} {name} {source}, which this command reads; choose another "
                    f"{option}, so that no input is overwritten"
                )
            if real.is_relative_to(target):
                raise CommandError(
                    f"{option} {output}: {path}, which this command writes, holds {name} {source}, which it reads; "
                    f"choose another {option}, so that no input is overwritten"
                )


LOCK_NAME = ".delta-qwen3.lock"  # inside an output directory that commands write into
LOCK_MARK = ".lock"  # beside an output that is written whole and renamed into place: `.{name}.lock`


def lock_path(target: str | Path, inside: bool) -> Path:
    """The lock file of output `target` (its real path, so that every name of one output shares one lock): inside
    it for a directory that the command writes files into, beside it for an output written elsewhere and renamed
    into place (a converted checkpoint, a results file), which would replace a lock inside it."""
    target = _real(target)
    return target / LOCK_NAME if inside else target.with_name(f".{target.name}{LOCK_MARK}")


def _owner_line() -> str:
    return f"process {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}"


def _owner_alive(owner: str) -> bool:
    """Whether the process an `_owner_line` names still runs (on this host; one on another host is taken to)."""
    parts = owner.split()
    if len(parts) < 4 or parts[0] != "process" or not parts[1].isdigit():
        return False
    if parts[3] != socket.gethostname():
        return True
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return int(parts[1]) != os.getpid()


def _missing_parents(path: Path) -> list[Path]:
    """The ancestors of `path` that do not exist, deepest first."""
    return [parent for parent in path.parents if not parent.exists()]


@contextmanager
def output_lock(option: str, target: str | Path, *, inside: bool = False) -> Iterator[None]:
    """Hold the lock of output `target` while the block runs (`lock_path`; `inside` for a directory that the command
    writes into, which is created for it); another command holding it is refused in one line naming it. The lock
    is `fcntl.flock` on the lock file, which records its owner (process, host, time): the system releases it when
    its process ends in any way, and the file that a killed process left behind is taken over with a one-line
    notice. On a file system without `flock`, an owner that no longer runs (on this host) makes the lock stale. The
    lock file, and the directories made for it while they hold nothing else, are removed when the block ends,
    however it ends."""
    target = Path(target)
    _check_parents(target, option)
    if inside and target.exists() and not target.is_dir():
        raise CommandError(f"{option} {target} exists and is not a directory")
    path = lock_path(target, inside)
    made = _missing_parents(path)
    descriptor = None
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            descriptor = _acquire(path, option, target)
        except OSError as error:  # no permission, a full disk: the command could not have written its output
            raise write_failure(option, target, error, f"its lock {path} could not be made; nothing was done") \
                from None
        yield
    finally:
        if descriptor is not None:
            _release(path, descriptor)
        for parent in made:  # deepest first; one that holds anything now is kept, and so are those above it
            try:
                parent.rmdir()
            except OSError:
                break


def _acquire(path: Path, option: str, target: str | Path) -> int:
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            owner = os.read(descriptor, 4096).decode(errors="replace").strip()
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):  # no flock here: see the owner
                    if _owner_alive(owner):
                        raise _in_use(option, target, owner, path) from None
                else:
                    holder = os.pread(descriptor, 4096, 0).decode(errors="replace").strip() or owner
                    raise _in_use(option, target, holder, path) from None
            try:
                current = os.stat(path).st_ino
            except FileNotFoundError:
                current = None
            if current != os.fstat(descriptor).st_ino:  # its holder removed it meanwhile: lock the new one
                os.close(descriptor)
                continue
            if owner:
                print(f"{option} {target}: taking over the lock of {owner}, which ended without releasing it",
                      file=sys.stderr)  # fmt: skip
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, (_owner_line() + "\n").encode(), 0)
            return descriptor
        except BaseException:
            os.close(descriptor)
            raise


def _release(path: Path, descriptor: int) -> None:
    try:
        if os.stat(path).st_ino == os.fstat(descriptor).st_ino:
            path.unlink()
    except OSError:
        pass  # gone already, or not removable: the next command takes it over
    finally:
        os.close(descriptor)  # releases the flock


def _in_use(option: str, target: str | Path, owner: str, path: Path) -> CommandError:
    return CommandError(f"{option} {target} is in use by another command ({owner or 'another process'}; its lock is "
                        f"{path}): wait for it to end, or choose another {option}")  # fmt: skip
