"""Checks of the conversion's output directory, made before anything is read or written (the directory itself is
written by `delta_qwen3.atomic.staged_directory`)."""

from pathlib import Path

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
