"""Outputs are written to a temporary path next to their target and renamed into place when complete."""

import json
import os
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
