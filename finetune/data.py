"""Training data: documents (`delta_qwen3.texts`) tokenised, packed into blocks of `--seq-len` tokens, and mixed
across documents before batching; held-out blocks for validation.

Data of several documents holds out whole documents:

    documents --(every --val-interval-th, until --val-blocks blocks)--> validation blocks
    the other documents --shuffle (--shuffle-buffer documents, new order each epoch)--> share of process `rank`
        --tokenise, end-of-text after each--> pack into blocks --shuffle (--block-shuffle-buffer blocks)--> batches

Data of one document (a `.txt` file is one) has no whole document to spare, so it is split within its tokens:

    the document's tokens, end-of-text last --(the last --val-blocks x --seq-len)--> validation blocks
        the whole --seq-len blocks before them --every world_size-th, from block `rank`--> share of process `rank`
        --shuffle (--block-shuffle-buffer blocks)--> batches

Everything but the one document is a stream, so a Hub dataset far larger than memory works the same way as a small
local file. Packing alone would fill a batch with the consecutive blocks of one or two long documents, and each
step's gradient would see one document; the block shuffle buffer is what makes a batch mix many. A block may span
documents, as in the paper's pre-training. Every order is drawn from `--seed` (and the process index), so a resumed
run re-reads the same stream and skips what it trained on.
"""

import hashlib
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from delta_qwen3.atomic import write_json_lines
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
    """The held-out validation blocks and the training blocks, mixed and batched; `DocumentsData` and
    `OneDocumentData` say which blocks train."""

    validation: torch.Tensor  # [val_blocks, seq_len]
    validation_texts: list[str]  # the text validation reads: the held-out documents whole, or the document's end
    tokenizer: object
    seq_len: int
    seed: int
    block_shuffle_buffer: int

    def training_blocks(self, rank: int, world_size: int) -> Iterator[torch.Tensor]:
        """Process `rank`'s endless stream of `[seq_len]` training blocks, in reading order."""
        raise NotImplementedError

    def blocks(self, rank: int, world_size: int) -> Iterator[torch.Tensor]:
        """Process `rank`'s endless stream of `[seq_len]` blocks, mixed across documents."""
        rng = random.Random(f"blocks {self.seed} {rank}")  # a string seed: the same on every platform
        return shuffle_buffer(self.training_blocks(rank, world_size), self.block_shuffle_buffer, rng)

    def batches(self, batch_size: int, rank: int, world_size: int, skip_blocks: int = 0) -> Iterator[torch.Tensor]:
        """Endless `[batch_size, seq_len]` batches for process `rank`, after its first `skip_blocks` blocks (what
        it trained on before a checkpoint: skipping re-reads the stream, so resuming costs tokenising time)."""
        blocks = itertools.islice(self.blocks(rank, world_size), skip_blocks, None)
        for batch in chunks(blocks, batch_size):
            yield torch.stack(batch)

    def save_validation_texts(self, path: Path) -> None:
        """The held-out text as JSON lines, for evaluating the run on exactly it (`delta-qwen3 ppl`)."""
        write_json_lines(path, ({"text": text} for text in self.validation_texts))


@dataclass
class DocumentsData(TrainingData):
    """Data of several documents: validation is whole held-out documents, and training the others."""

    documents: Documents  # all documents; training skips the held-out ones
    shuffle_buffer: int

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

    def training_blocks(self, rank: int, world_size: int) -> Iterator[torch.Tensor]:
        return pack(self._token_ids(rank, world_size), self.seq_len)


@dataclass
class OneDocumentData(TrainingData):
    """Data of one document: validation is the end of its tokens, and training the whole blocks before it."""

    training: torch.Tensor  # [blocks, seq_len]: the document's tokens from its start, before the held-out end

    def training_blocks(self, rank: int, world_size: int) -> Iterator[torch.Tensor]:
        # Shared out by block: one document cannot be shared out by document. `build_training_data` checked that
        # every process gets at least one block.
        return itertools.cycle(self.training[rank::world_size])


def build_training_data(config, tokenizer, world_size: int) -> TrainingData:
    """Load `config.data`, hold out the validation blocks, and check that enough remains for one optimiser step on
    `world_size` processes. Raises `CommandError` for empty or too small data."""
    if tokenizer.eos_token_id is None:
        raise CommandError("the tokenizer has no end-of-text token, which separates the packed documents")
    documents = open_documents(config.data, text_field=config.text_field, split=config.data_split,
                               config=config.data_config)  # fmt: skip
    shared = dict(tokenizer=tokenizer, seq_len=config.seq_len, seed=config.seed,
                  block_shuffle_buffer=config.block_shuffle_buffer)  # fmt: skip
    first = list(itertools.islice((text for text in documents if text.strip()), 2))
    if len(first) == 1:  # no whole document to spare for validation
        return _hold_out_end(first[0], config, world_size, shared)
    return _hold_out_documents(documents, config, world_size, shared)


def _hold_out_end(text: str, config, world_size: int, shared: dict) -> OneDocumentData:
    """The last `val_blocks` blocks of the document's tokens for validation; the whole blocks before them, from the
    document's start, for training."""
    (ids,) = document_token_ids(shared["tokenizer"], [text])
    held = config.val_blocks * config.seq_len
    training_blocks = (len(ids) - held) // config.seq_len
    step_blocks = world_size * config.batch_size * config.grad_accum
    if training_blocks < step_blocks:
        raise CommandError(_one_document_too_small(len(ids), config, world_size))
    ids = torch.tensor(ids, dtype=torch.long)
    # The end-of-text token that ends the document is not part of its text.
    text_end = shared["tokenizer"].decode(ids[-held:-1], clean_up_tokenization_spaces=False)
    return OneDocumentData(validation=ids[-held:].view(config.val_blocks, config.seq_len),
                           validation_texts=[text_end],
                           training=ids[: training_blocks * config.seq_len].view(training_blocks, config.seq_len),
                           **shared)  # fmt: skip


def _one_document_too_small(tokens: int, config, world_size: int) -> str:
    """Why one document is too small, and each change of options that would make it enough."""
    step_blocks = world_size * config.batch_size * config.grad_accum
    training_blocks = max(tokens // config.seq_len - config.val_blocks, 0)
    remedies = []
    fitting_val_blocks = tokens // config.seq_len - step_blocks
    if fitting_val_blocks >= 1:
        remedies.append(f"set --val-blocks to at most {fitting_val_blocks}")
    if training_blocks >= world_size:
        remedies.append(f"set --batch-size x --grad-accum to at most {training_blocks // world_size}")
    remedies.append(f"give more text (at least {(config.val_blocks + step_blocks) * config.seq_len} tokens)")
    return (
        f"--data {config.data} is too small: it is one document, so validation holds out its last --val-blocks "
        f"{config.val_blocks} x --seq-len {config.seq_len} tokens, and of its {tokens} tokens that leaves "
        f"{training_blocks} block(s) to train on, where one optimiser step on {world_size} process(es) needs "
        f"{step_blocks} (--batch-size x --grad-accum per process); to train, {', or '.join(remedies)}"
    )


def _hold_out_documents(documents: Documents, config, world_size: int, shared: dict) -> DocumentsData:
    """Whole documents for validation (`_held_out_documents`); the others for training, checked to be enough for
    one optimiser step and to give every process a document."""
    validation, validation_texts, lengths = _held_out_documents(documents, shared["tokenizer"], config)
    data = DocumentsData(validation=validation, validation_texts=validation_texts, documents=documents,
                         shuffle_buffer=config.shuffle_buffer, **shared)  # fmt: skip
    needed = world_size * config.batch_size * config.grad_accum * config.seq_len
    tokens, count = 0, 0
    for ids in document_token_ids(shared["tokenizer"], data.training_texts(0)):
        tokens, count = tokens + len(ids), count + bool(ids)
        if tokens >= needed and count >= world_size:
            return data
    raise CommandError(
        f"--data {config.data} is too small: besides the {len(validation_texts)} held-out documents, {tokens} "
        f"tokens in {count} documents remain, and one optimiser step on {world_size} process(es) needs {needed} "
        f"tokens (--batch-size x --grad-accum x --seq-len per process) and a document per process; to train, "
        f"{', or '.join(_training_remedies(lengths, tokens, count, config, world_size))}"
    )


def _training_remedies(held_lengths: list[int], tokens: int, count: int, config, world_size: int) -> list[str]:
    """The changes of options after each of which the documents that remain (`tokens` in `count` documents besides
    the held-out ones, of `held_lengths` tokens) are enough for one optimiser step."""
    block_tokens = config.batch_size * config.grad_accum * config.seq_len  # one process's share of a step
    remedies = []
    for kept in range(len(held_lengths) - 1, 0, -1):  # hold out the first `kept` documents only
        freed = held_lengths[kept:]
        val_blocks = sum(held_lengths[:kept]) // config.seq_len
        enough = tokens + sum(freed) >= world_size * block_tokens and count + len(freed) >= world_size
        if val_blocks >= 1 and enough:
            remedies.append(f"set --val-blocks to at most {val_blocks} (fewer documents would be held out)")
            break
    if count >= world_size and tokens >= world_size * config.seq_len:
        remedies.append(f"set --batch-size x --grad-accum to at most {tokens // (world_size * config.seq_len)}")
    processes = min(count, tokens // block_tokens)
    if 1 <= processes < world_size:
        remedies.append(f"use at most {processes} process(es)")
    remedies.append("give more documents")
    return remedies


def _held_out_documents(documents: Documents, tokenizer, config) -> tuple[torch.Tensor, list[str], list[int]]:
    """Every `val_interval`-th document from the first, until they fill `val_blocks` blocks (the last one's
    remainder is dropped, and the last one is held out whole all the same): the blocks, the documents and their
    lengths in tokens."""
    needed = config.val_blocks * config.seq_len
    buffer: list[int] = []
    texts: list[str] = []
    lengths: list[int] = []
    for text in itertools.islice(documents, 0, None, config.val_interval):
        (ids,) = document_token_ids(tokenizer, [text])
        if not ids:
            continue
        texts.append(text)
        lengths.append(len(ids))
        buffer.extend(ids)
        if len(buffer) >= needed:
            return torch.tensor(buffer[:needed]).view(config.val_blocks, config.seq_len), texts, lengths
    if not buffer:
        raise CommandError(f"--data {config.data} is empty: it has no text in field {config.text_field!r}")
    all_lengths = [len(ids) for ids in document_token_ids(tokenizer, documents)]  # only now: the data is small
    raise CommandError(
        f"--data {config.data} is too small: its held-out documents (every --val-interval {config.val_interval}"
        f"th) have {len(buffer)} tokens, and --val-blocks {config.val_blocks} of --seq-len {config.seq_len} need "
        f"{needed}; to fill them, {', or '.join(_validation_remedies(all_lengths, config))}"
    )


def _validation_remedies(lengths: list[int], config) -> list[str]:
    """The changes of options that fill the validation blocks from the documents of `lengths` tokens (all of them,
    in order); only those that do."""
    held = sum(lengths[:: config.val_interval])
    remedies = []
    if held >= config.seq_len:
        remedies.append(f"set --val-blocks to at most {held // config.seq_len}")
    for interval in range(config.val_interval - 1, 0, -1):  # the sets of documents are not nested: try each
        if sum(lengths[::interval]) >= config.val_blocks * config.seq_len:
            remedies.append(f"set --val-interval to {interval}")
            break
    remedies.append("give more documents")
    return remedies
