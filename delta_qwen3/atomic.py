"""Outputs are written to a temporary path next to their target and moved into place only when complete, so an
interrupted command never leaves a half-written file or directory behind."""

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_output(target: Path) -> Iterator[Path]:
    """Yield a temporary path beside `target`; rename it onto `target` when the block succeeds, remove it if not."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        yield temporary
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def write_json(target: Path, value) -> None:
    """Write `value` as indented JSON, atomically."""
    with atomic_output(target) as temporary:
        temporary.write_text(json.dumps(value, indent=2) + "\n")


def replace_directory(completed: Path, target: Path) -> None:
    """Move the completed directory `completed` to `target`, replacing an older `target`; if the move fails, the
    older `target` is put back."""
    if not target.exists():
        completed.rename(target)
        return
    retired = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    target.rename(retired)
    try:
        completed.rename(target)
    except BaseException:
        retired.rename(target)
        raise
    shutil.rmtree(retired)
