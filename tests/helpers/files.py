"""Files on disk as they were: what a failed or interrupted command must leave unchanged; and a disk that fills."""

import hashlib
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def tree_digest(path) -> dict:
    """Every file under `path` with its size, modification time and content hash."""
    return {
        str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def file_hashes(root: Path) -> dict[str, str]:
    """SHA-256 of every file under `root` by its relative path: what a failed command must leave as it was."""
    files = (path for path in root.rglob("*") if path.is_file())
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest() for path in files}


@contextmanager
def disk_full_past(size: int) -> Iterator[None]:
    """Within the block, writing any file of this process past `size` bytes fails with EFBIG ("File too large"),
    as a full disk fails it with ENOSPC, and needs no privileges: the soft RLIMIT_FSIZE, restored afterwards (Python
    ignores the SIGXFSZ that would otherwise end the process)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
