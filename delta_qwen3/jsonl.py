"""JSON-lines files: one JSON object per line, as the data and benchmark files of this project are written."""

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from .errors import CommandError


def read_json_lines(path: Path) -> Iterator[tuple[int, dict]]:
    """`(line number, object)` for each non-blank line; a line that is not a JSON object raises `CommandError`
    naming the file and line."""
    with Path(path).open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                document = json.loads(line)
            except json.JSONDecodeError as error:
                raise CommandError(f"{path} line {number} is not valid JSON: {error}") from None
            if not isinstance(document, dict):
                raise CommandError(f"{path} line {number} is not a JSON object")
            yield number, document


def write_json_lines(path: Path, documents: Iterable[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with Path(path).open("w", encoding="utf-8") as handle:
        for document in documents:
            handle.write(json.dumps(document) + "\n")
    return path
