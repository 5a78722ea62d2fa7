"""Files on disk as they were: what a failed or interrupted command must leave unchanged."""

import hashlib
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
