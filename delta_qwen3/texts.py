"""Documents and their tokens, with one meaning for every command: training, `ppl`, `routing` and the demo.

A source is a local file, a local directory of files, or a Hub dataset id:

- `.txt`: the whole file is one document (UTF-8);
- `.jsonl` / `.json`: one document per line, its text in `text_field`;
- `.parquet`: one document per row, its text in column `text_field`;
- a directory: every such file below it (one file type), in sorted path order;
- anything else: a Hub dataset, streamed (`config`, `split`, `text_field`).

A row whose text is missing or null is skipped, and the count is reported once per source; a text that is not a
string, a line that is not JSON and a file that is not UTF-8 are errors naming the file and line. Local files are
read through once when opened, so that such errors show before any work starts.

Each document is tokenised without special tokens and followed by the tokenizer's end-of-text token, as in packed
pre-training: the same token stream whether it is trained on or scored.
"""

import hashlib
import itertools
import random
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from .errors import CommandError
from .jsonl import not_utf8, read_json_lines

LOCAL_SUFFIXES = (".txt", ".jsonl", ".json", ".parquet")
TOKENIZE_CHUNK = 64  # documents per tokenizer call: batching lets the fast tokenizer use its threads


class Documents:
    """A stream of document texts that can be read again from the start; blank documents are kept, so that a
    document's position in the stream does not depend on its content."""

    name: str

    def __iter__(self) -> Iterator[str]:
        raise NotImplementedError

    def shuffled(self, seed: int, buffer_size: int) -> Iterator[str]:
        """The documents in an order drawn from `seed`, through a shuffle buffer of `buffer_size` documents."""
        return shuffle_buffer(iter(self), buffer_size, random.Random(seed))


class LocalDocuments(Documents):
    def __init__(self, name: str, files: list[Path], text_field: str):
        self.name, self.files, self.text_field = name, files, text_field
        rows = skipped = 0
        for file in files:  # read once now: bad lines stop the command before it starts its work
            for text in _file_texts(file, text_field):
                rows, skipped = rows + 1, skipped + (text is None)
        if rows == 0:
            raise CommandError(f"{name} is empty")
        if skipped == rows:
            raise CommandError(f"{name} has no text in field {text_field!r} in any of its {rows} documents")
        if skipped:
            print(f"{name}: {skipped} of {rows} documents have no {text_field!r} field (or it is null); skipped",
                  file=sys.stderr)  # fmt: skip

    def __iter__(self) -> Iterator[str]:
        for file in self.files:
            yield from (text for text in _file_texts(file, self.text_field) if text is not None)


class HubDocuments(Documents):
    def __init__(self, name: str, dataset, text_field: str):
        self.name, self.dataset, self.text_field = name, dataset, text_field
        columns = dataset.column_names
        if columns is not None and text_field not in columns:
            raise CommandError(f"dataset {name!r} has no field {text_field!r}; its fields: {', '.join(columns)}")

    def __iter__(self) -> Iterator[str]:
        return self._texts(self.dataset)

    def shuffled(self, seed: int, buffer_size: int) -> Iterator[str]:
        # The dataset's own shuffle also shuffles the order of its shards, which a buffer alone cannot.
        return self._texts(self.dataset.shuffle(seed=seed, buffer_size=buffer_size))

    def _texts(self, rows) -> Iterator[str]:
        for index, row in enumerate(rows):
            text = row.get(self.text_field)
            if text is not None:
                yield _checked_text(text, f"dataset {self.name!r} row {index}", self.text_field)


def open_documents(source: str, *, text_field: str = "text", split: str = "train", config: str | None = None,
                   option: str = "--data") -> Documents:  # fmt: skip
    """The documents of `source` (see the module docstring). Bad or empty sources raise `CommandError` naming
    `option`."""
    path = _local_path(source, option)
    if path is not None:
        return LocalDocuments(f"{option} {source}", _local_files(path, option), text_field)
    from datasets import load_dataset  # imported here: it is slow to import and only the Hub path needs it

    try:
        dataset = load_dataset(source, name=config, split=split, streaming=True)
    except Exception as error:  # `datasets` raises many types for an unknown or unreachable dataset
        raise CommandError(
            f"{option} {source}: not a local file or directory, and not loadable from the Hub: {error}"
        ) from error
    return HubDocuments(source, dataset, text_field)


def read_texts(source: str, *, text_field: str = "text", split: str = "validation", config: str | None = None,
               limit: int | None = None, option: str = "--data") -> list[str]:  # fmt: skip
    """The first `limit` non-blank documents of `source` as a list (for evaluation)."""
    texts = list(itertools.islice((t for t in open_documents(source, text_field=text_field, split=split,
                                                                 config=config, option=option) if t.strip()), limit))  # fmt: skip
    if not texts:
        raise CommandError(f"{option} {source} has no non-empty documents")
    return texts


def documents_content(source: str) -> str:
    """What `source` holds, in a line: for local data the number and bytes of its files and a hash of their contents
    (with their paths within a directory, which order its documents); for a Hub dataset its name. A copy elsewhere
    holds the same; a file changed in place does not."""
    path = _local_path(source, "--data")
    if path is None:
        return f"Hub dataset {source}"
    files = _local_files(path, "--data")
    digest = hashlib.blake2b(digest_size=8)
    for file in files:
        if path.is_dir():
            digest.update(f"{file.relative_to(path).as_posix()}\0".encode())
        with open(file, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
        digest.update(b"\0")
    size = sum(file.stat().st_size for file in files)
    return f"{len(files)} file{'s' if len(files) > 1 else ''} of {size} bytes, blake2b {digest.hexdigest()}"


def _local_path(source: str, option: str) -> Path | None:
    """`source` as a local path, or None for a Hub dataset id; one that looks local but is missing is an error."""
    path = Path(source)
    if path.exists():
        return path
    if path.suffix in LOCAL_SUFFIXES or source.startswith((".", "/", "~")):
        raise CommandError(f"{option} {source} does not exist")
    return None


def _local_files(path: Path, option: str) -> list[Path]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in LOCAL_SUFFIXES)
    if not files:
        raise CommandError(f"{option} {path}: no {', '.join(LOCAL_SUFFIXES)} files in this directory")
    if path.is_file() and path.suffix not in LOCAL_SUFFIXES:
        raise CommandError(f"{option} {path}: unsupported file type; use one of {', '.join(LOCAL_SUFFIXES)}")
    kinds = {".json" if p.suffix == ".jsonl" else p.suffix for p in files}
    if len(kinds) > 1:
        raise CommandError(f"{option} {path}: mixes file types ({', '.join(sorted(kinds))}); use one")
    return files


def _file_texts(file: Path, text_field: str) -> Iterator[str | None]:
    """Each document's text in `file`, or None for a row without one."""
    if file.suffix == ".txt":
        yield _read_utf8(file)
    elif file.suffix == ".parquet":
        yield from _parquet_texts(file, text_field)
    else:
        for number, row in read_json_lines(file):
            text = row.get(text_field)
            yield None if text is None else _checked_text(text, f"{file} line {number}", text_field)


def _read_utf8(file: Path) -> str:
    data = file.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise not_utf8(file, data, error) from None


def _parquet_texts(file: Path, text_field: str) -> Iterator[str | None]:
    import pyarrow.parquet as pq  # a dependency of `datasets`

    try:
        table = pq.ParquetFile(file)
    except Exception as error:  # pyarrow raises ArrowInvalid, OSError, ... for a file it cannot read
        raise CommandError(f"{file} is not a readable parquet file: {error}") from None
    if text_field not in table.schema_arrow.names:
        raise CommandError(f"{file} has no column {text_field!r}; its columns: {', '.join(table.schema_arrow.names)}")
    row = 0
    for batch in table.iter_batches(columns=[text_field]):
        for text in batch.column(0).to_pylist():
            row += 1
            yield None if text is None else _checked_text(text, f"{file} row {row}", text_field)


def _checked_text(text, where: str, text_field: str) -> str:
    if not isinstance(text, str):
        raise CommandError(f"{where}: field {text_field!r} is a {type(text).__name__}, not a string")
    return text


def shuffle_buffer(items: Iterable, size: int, rng: random.Random) -> Iterator:
    """`items` in a random order, drawn through a buffer of `size` items (1: unchanged): each item leaves at a
    uniformly random time within the next `size` draws, so the stream stays a stream."""
    buffer: list = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        index = rng.randrange(size)
        yield buffer[index]
        buffer[index] = item
    rng.shuffle(buffer)
    yield from buffer


def chunks(items: Iterable, size: int) -> Iterator[list]:
    """Consecutive lists of `size` items, the last one possibly shorter (`itertools.batched` from Python 3.12)."""
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def document_token_ids(tokenizer, texts: Iterable[str]) -> Iterator[list[int]]:
    """Each document's token ids followed by the end-of-text token (when the tokenizer has one); `[]` for a blank
    document, so that the output stays aligned with the documents."""
    end = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for chunk in chunks(texts, TOKENIZE_CHUNK):
        encoded = tokenizer(chunk, add_special_tokens=False, verbose=False)["input_ids"]
        for text, ids in zip(chunk, encoded, strict=True):
            yield ids + end if text.strip() else []


def token_stream(tokenizer, texts: Iterable[str]) -> torch.Tensor:
    """All documents' tokens as one 1-D stream (for perplexity and routing analysis)."""
    return torch.tensor(list(itertools.chain.from_iterable(document_token_ids(tokenizer, texts))), dtype=torch.long)
