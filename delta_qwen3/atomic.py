"""Outputs are written to a temporary path next to their target and moved into place only when complete, so an
interrupted command never leaves a half-written file or directory behind.

Before the rename, what was written is flushed to the disk (`_flush_to_disk`), and the rename itself after it: a
rename may otherwise reach the disk before the data it names, and a power loss then leaves a complete-looking target
with empty or short files. A target that is a symbolic link is written where the link points, so the link stays.

The temporary path is `.{target name}.partial-{process id}-{random}`. A process killed outright (SIGKILL, power
loss) cannot remove its own; the next write of the same target removes those whose process is gone, so they do not
pile up. Replacing a directory moves the earlier one aside as `.{target name}.old-{random}` until the new one is in
place (see `replace_directory`).
"""

import errno
import logging
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from glob import escape
from pathlib import Path

from .interrupts import deferred_interrupts
from .jsonl import json_text

logger = logging.getLogger(__name__)

STAGING_MARK = ".partial-"
RETIRED_MARK = ".old-"


def _sibling(target: Path, mark: str, suffix: str) -> Path:
    return target.with_name(f".{target.name}{mark}{suffix}")


def _siblings(target: Path, mark: str) -> list[Path]:
    return sorted(target.parent.glob(f".{escape(target.name)}{mark}*"))


def _writer_is_running(staging: Path) -> bool:
    """Whether the process whose id `staging`'s name carries still runs (a name without one is from an older
    version of this module, whose writer has long finished)."""
    pid = staging.name.rsplit(STAGING_MARK, 1)[-1].split("-")[0]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True


def _remove(path: Path) -> None:
    """Remove a leftover file or directory; one that cannot be removed is reported, not raised: it is in the way
    of nothing, only of disk space."""
    try:
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    except OSError as error:
        logger.warning(f"could not remove {path}, left by an interrupted write: {error.strerror or error}")


def remove_stale_leftovers(target: Path) -> None:
    """Remove what interrupted writes of `target` left beside it: temporary paths of processes that no longer run,
    and an earlier version moved aside once `target` is in place. An earlier version without `target` is the only
    copy of that output (the replacement was killed between its two renames): it is reported, and kept."""
    for staging in _siblings(target, STAGING_MARK):
        if not _writer_is_running(staging):
            _remove(staging)
    for retired in _siblings(target, RETIRED_MARK):
        if target.exists():
            _remove(retired)
        else:
            logger.warning(f"{retired} holds an earlier {target.name} whose replacement was interrupted; "
                           f"rename it to {target} to restore it, or remove it")


def _flush_to_disk(path: Path) -> None:
    """Make `path` durable: each file's data, and each directory's entries, of `path` and all below it."""
    for directory, _, files in os.walk(path) if path.is_dir() else [(None, None, [path])]:
        for name in files:
            with open(Path(directory or "") / name, "rb") as file:
                os.fsync(file.fileno())
        if directory is not None:
            _flush_directory(Path(directory))


def _flush_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _written_path(target: Path) -> Path:
    """Where writing `target` writes: the path a symbolic link points to (replacing the link would cut it off
    from what it names), else `target`."""
    target = Path(target)
    return target.resolve() if target.is_symlink() else target


def staging_path(target: Path) -> Path:
    """A new temporary path beside `target`, after removing stale ones (`remove_stale_leftovers`)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_leftovers(target)
    return _sibling(target, STAGING_MARK, f"{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _missing_parents(target: Path) -> list[Path]:
    """The directories above `target` that do not exist yet, deepest first: made for a write, and removed with
    what it left when it does not finish."""
    return [parent for parent in target.parents if not parent.exists()]


def _discard(path: Path | None, made: list[Path]) -> None:
    """Remove what an unfinished write left: its temporary file or directory `path`, and the directories `made` for
    it while they hold nothing else; a second interrupt waits until this is done."""
    with deferred_interrupts():
        if path is not None:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() and not path.is_symlink() else \
                path.unlink(missing_ok=True)  # fmt: skip
        for parent in made:
            try:
                parent.rmdir()
            except OSError:  # it holds something (or is gone): so do those above it
                break


@contextmanager
def atomic_output(target: Path) -> Iterator[Path]:
    """Yield a temporary file path beside `target`; rename it onto `target` when the block succeeds, remove it (and
    the directories made for it) if not. Everything is inside one `try` from the moment the first directory is
    made, so that an interrupt at any instant leaves nothing behind."""
    target = _written_path(target)
    made, temporary, done = _missing_parents(target), None, False
    try:
        temporary = staging_path(target)
        yield temporary
        _flush_to_disk(temporary)
        with deferred_interrupts():  # the output is in place once renamed: nothing after it undoes that
            os.replace(temporary, target)
            done = True
            _flush_directory(target.parent)
    finally:
        if not done:
            _discard(temporary, made)


@contextmanager
def staged_directory(target: Path, *, replace: bool = True) -> Iterator[Path]:
    """Yield a new empty directory beside `target`; when the block succeeds it replaces `target`
    (`replace_directory`), or, unless `replace`, takes its place only if there is none or an empty directory (see
    `move_into_place`). On any error or interrupt it is removed (with the directories made for it) and `target` is
    left as it was: the directory is made inside the `try` that removes it, so that no instant separates its
    existence from its cleanup, and the renames that put it in place finish before an interrupt is delivered."""
    target = _written_path(target)
    made, staging, done = _missing_parents(target), None, False
    try:
        staging = staging_path(target)
        staging.mkdir()
        yield staging
        _flush_to_disk(staging)
        with deferred_interrupts():
            replace_directory(staging, target) if replace else move_into_place(staging, target)
            done = True
            _flush_directory(target.parent)
    except BaseException:
        if not done:
            _discard(staging, made)
        raise


def write_json(target: Path, value) -> None:
    """Write `value` as indented JSON (`json_text`), atomically."""
    with atomic_output(target) as temporary:
        temporary.write_text(json_text(value, indent=2) + "\n")


def write_json_lines(target: Path, documents: Iterable[dict]) -> Path:
    """Write `documents` as JSON lines, one `json_text` line each, atomically; returns `target`."""
    with atomic_output(target) as temporary, temporary.open("w", encoding="utf-8") as handle:
        for document in documents:
            handle.write(json_text(document) + "\n")
    return target


def replace_directory(completed: Path, target: Path) -> None:
    """Move the completed directory `completed` to `target`, replacing an older `target`; if the move fails, the
    older `target` is put back."""
    if not target.exists():
        completed.rename(target)
        return
    retired = _sibling(target, RETIRED_MARK, uuid.uuid4().hex[:8])
    target.rename(retired)
    try:
        completed.rename(target)
    except BaseException:
        retired.rename(target)
        raise
    _remove(retired)  # the new one is in place: failing to remove the old one only costs disk space


def move_into_place(completed: Path, target: Path) -> None:
    """Move the completed directory `completed` to `target` where nothing is in the way (no `target`, or an empty
    directory); a `target` that another process wrote meanwhile is left as it is, and `FileExistsError` raised."""
    taken = FileExistsError(errno.EEXIST, "it was written by another process meanwhile, and is left as it is",
                            str(target))  # fmt: skip
    if target.exists() and not (target.is_dir() and not any(target.iterdir())):
        raise taken
    try:
        completed.rename(target)  # atomic; refused by the system if `target` is a non-empty directory by now
    except OSError as error:
        if error.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise taken from None
        raise
