"""Training data: documents streamed from the Hub or from local files, tokenised, and packed into blocks of
`--seq-len` tokens; the first `--val-blocks` blocks are held out for validation.

Everything is a stream, so a Hub dataset far larger than memory works the same way as a small local file. The
held-out documents are the first ones of the data in its stored order; training reads the documents after them,
shuffled through a buffer with a new seed each epoch, and each process tokenises only every `world`-th document.
Documents are separated by the tokenizer's end-of-text token; a block may span documents, as in the paper's
pre-training.
"""

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from datasets import IterableDataset, load_dataset

from delta_qwen3.errors import CommandError

# Local file suffix -> `datasets` builder. A text file's documents are its paragraphs (separated by blank lines).
LOCAL_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
TOKENIZE_CHUNK = 64  # documents per tokenizer call: batching lets the fast tokenizer use its threads


def load_documents(source: str, config_name: str | None, split: str, text_field: str) -> IterableDataset:
    """A stream of documents with their text in column `text`: a local file or directory, else a Hub dataset."""
    path = Path(source)
    if path.exists():
        documents = _load_local(path)
    else:
        try:
            documents = load_dataset(source, name=config_name, split=split, streaming=True)
        except Exception as error:  # `datasets` raises many types for an unknown or unreachable dataset
            raise CommandError(
                f"--data {source}: not a local file or directory, and not loadable from the Hub: {error}"
            ) from error
    if text_field == "text" or path.suffix == ".txt":
        return documents
    return documents.map(lambda example: {"text": _text_of(example, text_field)})


def _load_local(path: Path) -> IterableDataset:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in LOCAL_BUILDERS)
    if not files:
        raise CommandError(f"--data {path}: no {', '.join(LOCAL_BUILDERS)} files in this directory")
    files = [p for p in files if p.stat().st_size > 0]  # `datasets` cannot read an empty JSON-lines file
    if not files:
        raise CommandError(f"--data {path} is empty")
    builders = {LOCAL_BUILDERS.get(p.suffix) for p in files}
    if None in builders:
        raise CommandError(f"--data {path}: unsupported file type; use one of {', '.join(LOCAL_BUILDERS)}")
    if len(builders) > 1:
        raise CommandError(f"--data {path}: mixes file types ({', '.join(sorted(builders))}); use one")
    builder = builders.pop()
    options = {"sample_by": "paragraph"} if builder == "text" else {}
    return load_dataset(builder, data_files=[str(p) for p in files], split="train", streaming=True, **options)


def _text_of(example: dict, text_field: str) -> str:
    if text_field not in example:
        raise CommandError(
            f"the data has no field {text_field!r} (its fields: {', '.join(example)}); choose one with --text-field"
        )
    return example[text_field]


def token_ids(documents: Iterable[dict], tokenizer) -> Iterator[list[int]]:
    """Each document's token ids followed by the end-of-text token; `[]` for a blank document, so that the
    output stays aligned with the documents."""
    for chunk in _chunks(documents, TOKENIZE_CHUNK):
        texts = [_text_of(example, "text") or "" for example in chunk]
        encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
        for text, ids in zip(texts, encoded, strict=True):
            yield ids + [tokenizer.eos_token_id] if text.strip() else []


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    """Consecutive lists of `size` items, the last one possibly shorter (`itertools.batched` from Python 3.12)."""
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def pack(documents: Iterable[list[int]], seq_len: int) -> Iterator[torch.Tensor]:
    """Concatenate token ids and cut them into `[seq_len]` blocks; the incomplete tail is dropped."""
    buffer: list[int] = []
    for ids in documents:
        buffer.extend(ids)
        while len(buffer) >= seq_len:
            yield torch.tensor(buffer[:seq_len], dtype=torch.long)
            del buffer[:seq_len]


@dataclass
class TrainingData:
    """The held-out validation blocks and the stream of training documents that follows them."""

    validation: torch.Tensor  # [val_blocks, seq_len]
    documents: IterableDataset  # the training documents: the data after the held-out ones
    tokenizer: object
    seq_len: int
    seed: int
    shuffle_buffer: int

    def _epoch_token_ids(self, rank: int, world_size: int) -> Iterator[list[int]]:
        for epoch in itertools.count():
            shuffled = self.documents.shuffle(seed=self.seed + epoch, buffer_size=self.shuffle_buffer)
            tokens = 0
            for ids in token_ids(itertools.islice(shuffled, rank, None, world_size), self.tokenizer):
                tokens += len(ids)
                yield ids
            if tokens == 0:
                raise CommandError(f"the training data is too small: process {rank} of {world_size} got no text")

    def batches(self, batch_size: int, rank: int, world_size: int, skip_blocks: int = 0) -> Iterator[torch.Tensor]:
        """Endless `[batch_size, seq_len]` batches for process `rank`, after its first `skip_blocks` blocks (what
        it trained on before a checkpoint: skipping re-reads the stream, so resuming costs tokenising time)."""
        blocks = itertools.islice(pack(self._epoch_token_ids(rank, world_size), self.seq_len), skip_blocks, None)
        for batch in _chunks(blocks, batch_size):  # endless: epochs follow each other
            yield torch.stack(batch)


def build_training_data(config, tokenizer, world_size: int) -> TrainingData:
    """Load `config.data`, hold out the validation blocks, and check that enough remains for one optimiser step
    on `world_size` processes. Raises `CommandError` for empty or too small data."""
    if tokenizer.eos_token_id is None:
        raise CommandError("the tokenizer has no end-of-text token, which separates the packed documents")
    documents = load_documents(config.data, config.data_config, config.data_split, config.text_field)
    validation, held_out_documents = _hold_out(documents, tokenizer, config)
    training = documents.skip(held_out_documents)
    needed = world_size * config.batch_size * config.grad_accum * config.seq_len
    tokens, count = 0, 0
    for ids in token_ids(training, tokenizer):
        tokens, count = tokens + len(ids), count + bool(ids)
        if tokens >= needed and count >= world_size:
            break
    else:
        raise CommandError(
            f"--data {config.data} is too small: after the {config.val_blocks} validation blocks, {tokens} tokens "
            f"in {count} documents remain, and one optimiser step on {world_size} process(es) needs {needed} tokens "
            f"(--batch-size x --grad-accum x --seq-len per process) and a document per process"
        )
    return TrainingData(validation, training, tokenizer, config.seq_len, config.seed, config.shuffle_buffer)


def _hold_out(documents: IterableDataset, tokenizer, config) -> tuple[torch.Tensor, int]:
    """The first `val_blocks` blocks and how many documents they used (the last one's remainder is dropped)."""
    needed = config.val_blocks * config.seq_len
    buffer: list[int] = []
    for index, ids in enumerate(token_ids(documents, tokenizer)):
        buffer.extend(ids)
        if len(buffer) >= needed:
            return torch.tensor(buffer[:needed]).view(config.val_blocks, config.seq_len), index + 1
    if not buffer:
        raise CommandError(f"--data {config.data} is empty: it has no text in field {config.text_field!r}")
    raise CommandError(
        f"--data {config.data} is too small: it has {len(buffer)} tokens, and holding out --val-blocks "
        f"{config.val_blocks} of --seq-len {config.seq_len} alone needs {needed}"
    )
