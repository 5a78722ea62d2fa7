"""JSON text as this project writes it, and JSON-lines files: one JSON object per line, as the data and benchmark
files of this project are written."""

import json
import math
from collections.abc import Iterator
from pathlib import Path

from .errors import CommandError


def finite_or_null(value):
    """`value` with every non-finite float (NaN, infinity) replaced by None, in nested dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(item) for item in value]
    return value


def json_text(value, *, indent: int | None = None, ensure_ascii: bool = True) -> str:
    """`value` as JSON, with `null` for a non-finite float. Python's `json` writes those as bare `NaN` and
    `Infinity`, which are not JSON: other readers (browsers, `jq`, most languages' parsers) reject the whole file.
    A diverged loss or an undefined perplexity is written as `null` ("no value") instead."""
    return json.dumps(finite_or_null(value), indent=indent, ensure_ascii=ensure_ascii, allow_nan=False)


def not_utf8(path: Path, data: bytes, error: UnicodeDecodeError, first_line: int = 1, offset: int = 0
             ) -> CommandError:  # fmt: skip
    """The error for `data` (read from `path` from line `first_line`, byte `offset`) that `error` found not to be
    UTF-8: the file, and the line and byte where it goes wrong."""
    line = first_line + data.count(b"\n", 0, error.start)
    return CommandError(f"{path} line {line} is not UTF-8 text ({error.reason} at byte {offset + error.start})")


def read_json_lines(path: Path) -> Iterator[tuple[int, dict]]:
    """`(line number, object)` for each non-blank line; a line that is not UTF-8, or not a JSON object, raises
    `CommandError` naming the file and line. Read a line at a time: data files may be larger than memory."""
    offset = 0
    with Path(path).open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise not_utf8(path, raw, error, number, offset) from None
            offset += len(raw)
            if not line.strip():
                continue
            try:
                document = json.loads(line)
            except json.JSONDecodeError as error:
                raise CommandError(f"{path} line {number} is not valid JSON: {error}") from None
            if not isinstance(document, dict):
                raise CommandError(f"{path} line {number} is not a JSON object")
            yield number, document
