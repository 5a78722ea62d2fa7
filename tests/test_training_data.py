"""Training data that mixes: batches draw from many documents, validation is whole documents training never reads,
and the stream still resumes exactly and shares out across processes."""

import itertools
import json
from pathlib import Path

import pytest
import torch
from finetune_fixtures import tiny_run_args

from delta_qwen3.corpus import python_docs_texts
from delta_qwen3.texts import document_token_ids
from finetune.config import parse_args
from finetune.data import build_training_data, digest, pack

SEQ_LEN, BATCH = 32, 16


def write_documents(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    return path


def training_data(tokenizer, data: Path, tmp_path: Path, *extra: str, world_size: int = 1):
    config = parse_args(tiny_run_args(data, tmp_path / "out", "--model", "m", "--seq-len", str(SEQ_LEN),
                                      "--batch-size", str(BATCH), *extra))  # fmt: skip
    return build_training_data(config, tokenizer, world_size)


def documents_of(block: torch.Tensor, documents: list[list[int]]) -> set[int]:
    """Which documents hold the block's first 12 tokens (a block may span two documents; 12 tokens of real text
    belong to one)."""
    needle = "," + ",".join(map(str, block[:12].tolist())) + ","
    return {i for i, ids in enumerate(documents) if needle in "," + ",".join(map(str, ids)) + ","}


def test_pack_concatenates_documents_and_drops_the_incomplete_tail():
    blocks = list(pack([[1, 2, 3], [], [4, 5], [6, 7, 8, 9, 10]], seq_len=4))
    assert [block.tolist() for block in blocks] == [[1, 2, 3, 4], [5, 6, 7, 8]]


@pytest.fixture(scope="module")
def long_documents() -> list[str]:
    """Nine long documents of Python's documentation (the first is held out for validation): packed in order,
    each fills many consecutive batches."""
    return sorted(python_docs_texts(), key=len, reverse=True)[:9]


@pytest.mark.parametrize("buffer, fewest, most", [(None, 6, 9), ("1", 1, 2)])
def test_a_batch_mixes_many_documents(tmp_path, tokenizer, long_documents, buffer, fewest, most):
    """With the default block shuffle buffer, a batch of 16 blocks from 8 long documents draws on most of them;
    in packing order (buffer 1, the old pipeline) it draws on one or two."""
    data_file = write_documents(tmp_path / "long.jsonl", long_documents)
    extra = ["--val-blocks", "1"] + ([] if buffer is None else ["--block-shuffle-buffer", buffer])
    data = training_data(tokenizer, data_file, tmp_path, *extra)
    training = [t for t in long_documents if t not in data.validation_texts]
    ids = list(document_token_ids(tokenizer, training))
    per_batch = []
    for batch in itertools.islice(data.batches(BATCH, 0, 1), 8):
        found = set().union(*(documents_of(block, ids) for block in batch))
        per_batch.append(len(found))
    assert len(training) == 8
    assert fewest <= sum(per_batch) / len(per_batch) <= most, per_batch


def test_validation_is_whole_held_out_documents_that_training_never_reads(tmp_path, tokenizer):
    texts = [f"document number {i}: " + "words of text " * (i % 7 + 2) for i in range(60)]
    data = training_data(tokenizer, write_documents(tmp_path / "docs.jsonl", texts), tmp_path, "--val-blocks", "4")
    held_out = [t for i, t in enumerate(texts) if i % 10 == 0][: len(data.validation_texts)]
    assert data.validation_texts == held_out
    held_ids = list(document_token_ids(tokenizer, held_out))
    assert data.validation.tolist() == [b.tolist() for b in pack(held_ids, SEQ_LEN)][:4]
    assert sum(map(len, held_ids[:-1])) < 4 * SEQ_LEN <= sum(map(len, held_ids))  # just enough documents
    for epoch in range(2):
        read = list(data.training_texts(epoch))
        assert sorted(read) == sorted(set(texts) - set(held_out))
    assert list(data.training_texts(0)) != list(data.training_texts(1))  # a new order each epoch
    data.save_validation_texts(tmp_path / "validation.jsonl")
    saved = [json.loads(line)["text"] for line in (tmp_path / "validation.jsonl").read_text().splitlines()]
    assert saved == held_out


def test_training_skips_copies_of_held_out_documents(tmp_path, tokenizer):
    texts = [f"text {i} " * 20 for i in range(30)]
    data = training_data(tokenizer, write_documents(tmp_path / "docs.jsonl", texts + texts[:1]), tmp_path,
                         "--val-blocks", "1")  # fmt: skip
    assert data.validation_texts == [texts[0]]
    assert digest(texts[0]) not in {digest(t) for t in data.training_texts(0)}


def test_processes_share_out_the_documents_and_a_resumed_stream_continues_exactly(tmp_path, tokenizer):
    texts = python_docs_texts()
    data = training_data(tokenizer, write_documents(tmp_path / "docs.jsonl", texts), tmp_path, world_size=2)
    rank0, rank1 = (list(data.process_texts(0, rank, 2)) for rank in (0, 1))
    assert sorted(rank0 + rank1) == sorted(data.training_texts(0)) and abs(len(rank0) - len(rank1)) <= 1
    batches = list(itertools.islice(data.batches(4, 0, 2), 6))
    resumed = list(itertools.islice(data.batches(4, 0, 2, skip_blocks=8), 4))
    assert all(torch.equal(a, b) for a, b in zip(resumed, batches[2:], strict=True))
    other = list(itertools.islice(data.batches(4, 1, 2), 6))
    assert not any(torch.equal(a, b) for a, b in zip(batches, other, strict=True))
