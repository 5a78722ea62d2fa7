"""Training data that mixes: batches draw from many documents, validation is whole documents training never reads,
and the stream still resumes exactly and shares out across processes."""

import itertools
import json
import re
from pathlib import Path

import pytest
import torch
from helpers.training import tiny_run_args

from delta_qwen3.corpus import python_docs_texts
from delta_qwen3.errors import CommandError
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


# --- data of one document: the end of its tokens is held out ---------------------------------------------------


@pytest.fixture(scope="module")
def one_text() -> str:
    """Ten help topics of Python's documentation as one text (about 18,000 tokens)."""
    return "\n\n".join(python_docs_texts()[:10])


def write_one_document(directory: Path, form: str, text: str) -> Path:
    """The text as a .txt file, as the only line of a .jsonl file, or as the only file of a directory."""
    if form == "jsonl":
        return write_documents(directory / "one.jsonl", [text])
    path = directory / "texts" / "one.txt" if form == "directory" else directory / "one.txt"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path.parent if form == "directory" else path


@pytest.mark.parametrize("form", ["txt", "jsonl", "directory"])
def test_one_document_holds_out_the_end_of_its_tokens_and_trains_on_the_blocks_before(tmp_path, tokenizer,
                                                                                      one_text, form):
    data = training_data(tokenizer, write_one_document(tmp_path, form, one_text), tmp_path, "--val-blocks", "4")
    (ids,) = document_token_ids(tokenizer, [one_text])
    held = 4 * SEQ_LEN
    assert data.validation.flatten().tolist() == ids[-held:] and ids[-1] == tokenizer.eos_token_id
    # Training blocks are the whole blocks from the start that end before the held-out tokens, each once an epoch.
    blocks = {tuple(ids[start : start + SEQ_LEN]): start for start in range(0, len(ids) - held - SEQ_LEN + 1, SEQ_LEN)}
    epoch = [tuple(block.tolist()) for block in itertools.islice(data.training_blocks(0, 1), len(blocks))]
    assert sorted(blocks[block] for block in epoch) == sorted(blocks.values())
    mixed = [tuple(block.tolist()) for block in itertools.islice(data.blocks(0, 1), 3 * len(blocks))]
    assert set(mixed) <= blocks.keys() and mixed[: len(blocks)] != epoch  # never the held-out tokens; shuffled

    data.save_validation_texts(tmp_path / "validation.jsonl")
    (saved,) = [json.loads(line)["text"] for line in (tmp_path / "validation.jsonl").read_text().splitlines()]
    assert one_text.endswith(saved)  # the held-out end, as `ppl` reads it: its tokens again (for this text)
    assert list(document_token_ids(tokenizer, [saved])) == [ids[-held:]]


def test_one_document_is_shared_out_by_block_and_a_resumed_stream_continues_exactly(tmp_path, tokenizer, one_text):
    data = training_data(tokenizer, write_one_document(tmp_path, "txt", one_text), tmp_path, world_size=2)
    count = len(data.training)
    shares = [[tuple(b.tolist()) for b in itertools.islice(data.training_blocks(rank, 2), (count + 1 - rank) // 2)]
              for rank in (0, 1)]  # fmt: skip
    assert sorted(shares[0] + shares[1]) == sorted(tuple(block.tolist()) for block in data.training)
    batches = list(itertools.islice(data.batches(4, 0, 2), 6))
    resumed = list(itertools.islice(data.batches(4, 0, 2, skip_blocks=8), 4))
    assert all(torch.equal(a, b) for a, b in zip(resumed, batches[2:], strict=True))


# --- data too small: the advice works ------------------------------------------------------------------------------

ADVICE = re.compile(r"set (--val-blocks|--val-interval|--batch-size)(?: x --grad-accum)? to (?:at most )?(\d+)"
                    r"|use at most (\d+) process")  # fmt: skip


def advised(message: str) -> list[tuple[str, int]]:
    """Each change of options the error message advises, as (option, value); `processes` for the process count."""
    return [(option or "processes", int(value or processes)) for option, value, processes in ADVICE.findall(message)]


def build(tokenizer, texts: list[str], tmp_path: Path, *extra: str, world_size: int = 1):
    """`build_training_data` on `texts`: one text is written as a .txt file, several as JSON lines."""
    path = tmp_path / "one.txt" if len(texts) == 1 else tmp_path / "docs.jsonl"
    if len(texts) == 1:
        path.write_text(texts[0])
    else:
        write_documents(path, texts)
    return training_data(tokenizer, path, tmp_path, *extra, world_size=world_size)


def build_changed(tokenizer, texts: list[str], tmp_path: Path, extra: tuple, world_size: int, option: str,
                  value: int):  # fmt: skip
    """`build` with one option changed (`processes`: the number of processes)."""
    if option == "processes":
        return build(tokenizer, texts, tmp_path, *extra, world_size=value)
    return build(tokenizer, texts, tmp_path, *extra, option, str(value), world_size=world_size)


@pytest.mark.parametrize(
    "case, extra, world_size, advice",
    [
        # 545 tokens: 17 blocks, 8 held out, 9 left, and a step of 16 blocks
        ("one document", (), 1, ["--val-blocks", "--batch-size"]),
        # 40 documents of 74 to 106 tokens: the every-10th hold 381 tokens, 20 blocks need 640
        ("validation", ("--val-blocks", "20"), 1, ["--val-blocks", "--val-interval"]),
        # 3 documents of 135, 136 and 146 tokens: the first two held out, one left for two processes
        ("training", ("--val-interval", "1", "--val-blocks", "5", "--batch-size", "4"), 2,
         ["--val-blocks", "processes"]),
    ],
)  # fmt: skip
def test_too_small_data_advises_the_changes_that_are_enough_and_no_others(tmp_path, tokenizer, case, extra,
                                                                          world_size, advice):
    topics = python_docs_texts()
    texts = {"one document": topics[:1], "validation": [t[:200] for t in topics[:40]],
             "training": [t[:300] for t in topics[:3]]}[case]  # fmt: skip
    with pytest.raises(CommandError, match="is too small") as error:
        build(tokenizer, texts, tmp_path, *extra, world_size=world_size)
    changes = advised(str(error.value))
    assert [option for option, _ in changes] == advice
    for option, value in changes:
        build_changed(tokenizer, texts, tmp_path, extra, world_size, option, value)
        if option != "processes":  # and the advised value is the largest that is enough
            with pytest.raises(CommandError, match="is too small"):
                build_changed(tokenizer, texts, tmp_path, extra, world_size, option, value + 1)
