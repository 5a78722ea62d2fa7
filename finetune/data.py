"""Training data: documents (`delta_qwen3.texts`) tokenised, packed into blocks of `--seq-len` tokens, and mixed
across documents before batching; whole held-out documents for validation.

    documents --(every --val-interval-th, until --val-blocks blocks)--> validation blocks
    the other documents --shuffle (--shuffle-buffer documents, new order each epoch)--> share of process `rank`
        --tokenise, end-of-text after each--> pack into blocks --shuffle (--block-shuffle-buffer blocks)--> batches

Everything is a stream, so a Hub dataset far larger than memory works the same way as a small local file. Packing
alone would fill a batch with the consecutive blocks of one or two long documents, and each step's gradient would
see one document; the block shuffle buffer is what makes a batch mix many. A block may span documents, as in the
paper's pre-training. Every order is drawn from `--seed` (and the process index), so a resumed run re-reads the
same stream and skips what it trained on.
"""

import hashlib
import itertools
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from delta_qwen3.atomic import atomic_output
from delta_qwen3.errors import CommandError
from delta_qwen3.texts import Documents, chunks, document_token_ids, open_documents, shuffle_buffer


def pack(documents: Iterator[list[int]], seq_len: int) -> Iterator[torch.Tensor]:
    """Concatenate token ids and cut them into `[seq_len]` blocks; the incomplete tail is dropped."""
    buffer: list[int] = []
    for ids in documents:
        buffer.extend(ids)
        while len(buffer) >= seq_len:
            yield torch.tensor(buffer[:seq_len], dtype=torch.long)
            del buffer[:seq_len]


def digest(text: str) -> bytes:
    """A document's identity: training skips every document whose text equals a held-out one."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


@dataclass
class TrainingData:
    """The held-out validation blocks and the stream of training documents."""

    validation: torch.Tensor  # [val_blocks, seq_len]
    validation_texts: list[str]  # the held-out documents, whole
    documents: Documents  # all documents; training skips the held-out ones
    tokenizer: object
    seq_len: int
    seed: int
    shuffle_buffer: int
    block_shuffle_buffer: int

    def training_texts(self, epoch: int) -> Iterator[str]:
        """The documents that are not held out, in epoch `epoch`'s order."""
        held_out = {digest(text) for text in self.validation_texts}
        for text in self.documents.shuffled(self.seed + epoch, self.shuffle_buffer):
            if digest(text) not in held_out:
                yield text

    def process_texts(self, epoch: int, rank: int, world_size: int) -> Iterator[str]:
        """Process `rank`'s share of epoch `epoch`: every `world_size`-th training document."""
        return itertools.islice(self.training_texts(epoch), rank, None, world_size)

    def _token_ids(self, rank: int, world_size: int) -> Iterator[list[int]]:
        """Process `rank`'s documents, epoch after epoch, as token ids."""
        for epoch in itertools.count():
            tokens = 0
            for ids in document_token_ids(self.tokenizer, self.process_texts(epoch, rank, world_size)):
                tokens += len(ids)
                yield ids
            if tokens == 0:
                raise CommandError(f"the training data is too small: process {rank} of {world_size} got no text")

    def blocks(self, rank: int, world_size: int) -> Iterator[torch.Tensor]:
        """Process `rank`'s endless stream of `[seq_len]` blocks, mixed across documents."""
        rng = random.Random(f"blocks {self.seed} {rank}")  # a string seed: the same on every platform
        return shuffle_buffer(pack(self._token_ids(rank, world_size), self.seq_len), self.block_shuffle_buffer, rng)

    def batches(self, batch_size: int, rank: int, world_size: int, skip_blocks: int = 0) -> Iterator[torch.Tensor]:
        """Endless `[batch_size, seq_len]` batches for process `rank`, after its first `skip_blocks` blocks (what
        it trained on before a checkpoint: skipping re-reads the stream, so resuming costs tokenising time)."""
        blocks = itertools.islice(self.blocks(rank, world_size), skip_blocks, None)
        for batch in chunks(blocks, batch_size):
            yield torch.stack(batch)

    def save_validation_texts(self, path: Path) -> None:
        """The held-out documents as JSON lines, for evaluating the run on exactly them (`delta-qwen3 ppl`)."""
        with atomic_output(path) as temporary:
            temporary.write_text("".join(json.dumps({"text": text}) + "\n" for text in self.validation_texts))


def build_training_data(config, tokenizer, world_size: int) -> TrainingData:
    """Load `config.data`, hold out the validation documents, and check that enough remains for one optimiser
    step on `world_size` processes. Raises `CommandError` for empty or too small data."""
    if tokenizer.eos_token_id is None:
        raise CommandError("the tokenizer has no end-of-text token, which separates the packed documents")
    documents = open_documents(config.data, text_field=config.text_field, split=config.data_split,
                               config=config.data_config)  # fmt: skip
    validation, validation_texts = _hold_out(documents, tokenizer, config)
    data = TrainingData(validation, validation_texts, documents, tokenizer, config.seq_len, config.seed,
                        config.shuffle_buffer, config.block_shuffle_buffer)  # fmt: skip
    needed = world_size * config.batch_size * config.grad_accum * config.seq_len
    tokens, count = 0, 0
    for ids in document_token_ids(tokenizer, data.training_texts(0)):
        tokens, count = tokens + len(ids), count + bool(ids)
        if tokens >= needed and count >= world_size:
            return data
    raise CommandError(
        f"--data {config.data} is too small: besides the {len(validation_texts)} held-out documents, {tokens} "
        f"tokens in {count} documents remain, and one optimiser step on {world_size} process(es) needs {needed} "
        f"tokens (--batch-size x --grad-accum x --seq-len per process) and a document per process"
    )


def _hold_out(documents: Documents, tokenizer, config) -> tuple[torch.Tensor, list[str]]:
    """Every `val_interval`-th document from the first, until they fill `val_blocks` blocks (the last one's
    remainder is dropped, and the last one is held out whole all the same): the blocks and the documents."""
    needed = config.val_blocks * config.seq_len
    buffer: list[int] = []
    texts: list[str] = []
    for text in itertools.islice(documents, 0, None, config.val_interval):
        (ids,) = document_token_ids(tokenizer, [text])
        if not ids:
            continue
        texts.append(text)
        buffer.extend(ids)
        if len(buffer) >= needed:
            return torch.tensor(buffer[:needed]).view(config.val_blocks, config.seq_len), texts
    if not buffer:
        raise CommandError(f"--data {config.data} is empty: it has no text in field {config.text_field!r}")
    raise CommandError(
        f"--data {config.data} is too small: its held-out documents (every --val-interval {config.val_interval}"
        f"th) have {len(buffer)} tokens, and --val-blocks {config.val_blocks} of --seq-len {config.seq_len} need "
        f"{needed}; lower --val-blocks or --val-interval"
    )
