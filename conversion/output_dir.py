"""Write a directory completely or not at all: into a temporary sibling, renamed into place when complete."""

import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from delta_qwen3.atomic import replace_directory
from delta_qwen3.errors import CommandError
from delta_qwen3.output_paths import check_output_dir


def check_target(target: Path, overwrite: bool) -> None:
    """Refuse a target that is a file or lies under one, or a non-empty directory unless `overwrite`."""
    check_output_dir(target, "OUT", overwrite=overwrite)


def check_not_nested(src: Path, target: Path) -> None:
    """Refuse a target inside the source (the source is never written to) or containing it (replacing the target
    would delete the source)."""
    src, target = src.resolve(), target.resolve()
    if target == src or target.is_relative_to(src):
        raise CommandError(f"OUT {target} is inside SRC {src}; the source is never written to, choose another OUT")
    if src.is_relative_to(target):
        raise CommandError(f"SRC {src} is inside OUT {target}; replacing OUT would delete it, choose another OUT")


@contextmanager
def staged_directory(target: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty directory next to `target`; when the block completes, it replaces `target` (which
    `check_target` allowed). On any error or interrupt it is removed and `target` is left as it was."""
    check_target(target, overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.partial-{uuid.uuid4().hex[:8]}")
    staging.mkdir()
    try:
        yield staging
        replace_directory(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
