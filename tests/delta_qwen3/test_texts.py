"""The one text loader (`delta_qwen3.texts`): what a document is in each file type, what is skipped and said, what
is refused; its tokenisation; and the routing-sharpness figure shared by every command."""

import json
import math
import random

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from delta_qwen3.errors import CommandError
from delta_qwen3.sharpness import depth_bands, mean_max_weights, normalised_sharpness, point_max_weights
from delta_qwen3.texts import (
    document_token_ids,
    documents_content,
    open_documents,
    read_texts,
    shuffle_buffer,
    token_stream,
)


def test_a_text_file_is_one_document_with_its_paragraphs(tmp_path):
    (tmp_path / "notes.txt").write_text("first paragraph\nstill first\n\nsecond\n")
    assert list(open_documents(str(tmp_path / "notes.txt"))) == ["first paragraph\nstill first\n\nsecond\n"]


def test_json_lines_and_parquet_hold_one_document_per_row(tmp_path):
    (tmp_path / "docs.jsonl").write_text('{"body": "one", "id": 1}\n\n{"body": "two", "id": 2}\n')
    assert list(open_documents(str(tmp_path / "docs.jsonl"), text_field="body")) == ["one", "two"]
    pq.write_table(pa.table({"body": ["three", "four"], "id": [3, 4]}), tmp_path / "docs.parquet")
    assert list(open_documents(str(tmp_path / "docs.parquet"), text_field="body")) == ["three", "four"]


def test_a_directory_reads_its_files_in_path_order_and_refuses_mixed_types(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text("second")
    (tmp_path / "a.txt").write_text("first")
    assert list(open_documents(str(tmp_path))) == ["first", "second"]
    (tmp_path / "c.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(CommandError, match=r"mixes file types \(.json, .txt\); use one"):
        open_documents(str(tmp_path))


def test_rows_without_text_are_counted_and_said_and_none_at_all_is_refused(tmp_path, capsys):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "a"}\n{"title": "no text"}\n{"text": null}\n{"text": "b"}\n')
    assert list(open_documents(str(path))) == ["a", "b"]
    assert capsys.readouterr().err == f"--data {path}: 2 of 4 documents have no 'text' field (or it is null); skipped\n"
    path.write_text('{"title": "no text"}\n{"text": null}\n')
    with pytest.raises(CommandError, match=r"has no text in field 'text' in any of its 2 documents"):
        open_documents(str(path))


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("docs.jsonl", b'{"text": "a"}\n{"text": oops}\n', "docs.jsonl line 2 is not valid JSON"),
        ("docs.jsonl", b'{"text": "a"}\n{"text": 7}\n', "docs.jsonl line 2: field 'text' is a int, not a string"),
        ("notes.txt", b"caf\xc3\xa9\nna\xefve\n", "notes.txt line 2 is not UTF-8 text"),
        ("docs.parquet", b"PAR1 truncated", "docs.parquet is not a readable parquet file"),
    ],
)
def test_bad_files_are_named_with_the_line(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(CommandError, match=message):
        open_documents(str(tmp_path / name))


@pytest.mark.parametrize("name", ["docs.jsonl", "docs.json"])
def test_json_lines_that_are_not_utf8_are_named_with_the_line_and_byte(tmp_path, name):
    (tmp_path / name).write_bytes(b'{"text": "a"}\n{"text": "na\xefve"}\n')
    with pytest.raises(CommandError) as raised:
        open_documents(str(tmp_path / name))
    assert str(raised.value) == f"{tmp_path / name} line 2 is not UTF-8 text (invalid continuation byte at byte 26)"


def test_a_missing_local_path_is_not_sent_to_the_hub(tmp_path):
    with pytest.raises(CommandError, match=r"--data .*nowhere.jsonl does not exist$"):
        open_documents(str(tmp_path / "nowhere.jsonl"))


def test_a_hub_dataset_is_streamed_by_its_id(tmp_path, monkeypatch):
    (tmp_path / "shard.jsonl").write_text('{"content": "one"}\n{"content": null}\n{"content": "two"}\n')
    load_local = datasets.load_dataset
    calls = []

    def load_from_hub(path, **kwargs):  # stands in for the download: the same call, served from a local file
        calls.append((path, kwargs))
        return load_local("json", data_files=str(tmp_path / "shard.jsonl"), split="train", streaming=True)

    monkeypatch.setattr(datasets, "load_dataset", load_from_hub)
    documents = open_documents("HuggingFaceFW/fineweb-edu", config="sample-10BT", text_field="content")
    assert list(documents) == ["one", "two"]
    assert sorted(documents.shuffled(seed=0, buffer_size=10)) == ["one", "two"]
    assert calls == [("HuggingFaceFW/fineweb-edu", dict(name="sample-10BT", split="train", streaming=True))]
    with pytest.raises(CommandError, match="dataset 'someone/data' has no field 'text'; its fields: content"):
        open_documents("someone/data")

    def unreachable(path, **kwargs):
        raise ConnectionError("the Hub cannot be reached")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(CommandError, match="not loadable from the Hub: the Hub cannot be reached"):
        open_documents("someone/missing")


def test_what_data_holds_is_its_files_contents_and_order_wherever_it_is(tmp_path):
    """What a training run records of its data, to refuse a resume on other data: the same for a copy elsewhere,
    different for an edited file or for files whose paths (and so the order of their documents) differ."""
    for folder in ("here", "there"):
        (tmp_path / folder / "b").mkdir(parents=True)
        (tmp_path / folder / "a.jsonl").write_text('{"text": "one"}\n')
        (tmp_path / folder / "b" / "c.jsonl").write_text('{"text": "two"}\n')
    here = documents_content(str(tmp_path / "here"))
    assert here == documents_content(str(tmp_path / "there"))
    assert here.startswith("2 files of 32 bytes, blake2b ")
    (tmp_path / "there" / "b" / "c.jsonl").rename(tmp_path / "there" / "b" / "0.jsonl")
    assert documents_content(str(tmp_path / "there")) != here
    one_file = documents_content(str(tmp_path / "here" / "a.jsonl"))
    assert one_file == documents_content(str(tmp_path / "there" / "a.jsonl"))
    (tmp_path / "here" / "a.jsonl").write_text('{"text": "One"}\n')
    assert documents_content(str(tmp_path / "here" / "a.jsonl")) != one_file
    assert documents_content("HuggingFaceFW/fineweb-edu") == "Hub dataset HuggingFaceFW/fineweb-edu"


def test_read_texts_drops_blank_documents_and_keeps_the_first_limit(tmp_path):
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in ["a", " \n", "b", "c"]))
    assert read_texts(str(tmp_path / "docs.jsonl"), limit=2) == ["a", "b"]
    (tmp_path / "blank.jsonl").write_text('{"text": "  "}\n')
    with pytest.raises(CommandError, match="has no non-empty documents"):
        read_texts(str(tmp_path / "blank.jsonl"))


def test_each_document_is_its_tokens_without_special_tokens_then_end_of_text(tokenizer):
    texts = ["import os", "  \n", "x = 1"]
    expected = [tokenizer("import os", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id], [],
                tokenizer("x = 1", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]]  # fmt: skip
    assert list(document_token_ids(tokenizer, texts)) == expected
    assert token_stream(tokenizer, texts).tolist() == expected[0] + expected[2]


def test_the_shuffle_buffer_permutes_within_its_reach_and_size_one_keeps_the_order():
    items = list(range(100))
    shuffled = list(shuffle_buffer(items, 10, random.Random(0)))
    assert sorted(shuffled) == items and shuffled != items
    # Item i enters the buffer at draw i - size, so it cannot leave before: the stream is never read ahead.
    assert all(index <= position + 10 for position, index in enumerate(shuffled))
    assert list(shuffle_buffer(items, 1, random.Random(0))) == items


def test_both_sharpness_variants_are_named_for_the_points_they_average():
    single = torch.ones(1, 2, 1)
    two = torch.tensor([[[0.7, 0.3], [0.4, 0.6]]])
    three = torch.tensor([[[0.2, 0.5, 0.3], [0.1, 0.1, 0.8]]])
    weights = (single, two, three)
    means = point_max_weights(weights)
    assert means.tolist() == pytest.approx([1.0, 0.65, 0.65])
    figures = mean_max_weights(means, [w.shape[-1] for w in weights])
    assert figures["mean_max_weight"].item() == pytest.approx((1 + 0.65 + 0.65) / 3)
    assert figures["mean_max_weight_multi_source"].item() == pytest.approx(0.65)
    assert mean_max_weights(point_max_weights((single,)), [1])["mean_max_weight_multi_source"] is None


def test_the_normalised_sharpness_is_0_for_uniform_weights_and_1_for_one_source_whatever_the_count():
    for n in (2, 5, 32):
        assert normalised_sharpness(1 / n, math.log(n), n) == pytest.approx({"max_above_uniform": 0.0,
                                                                             "entropy_sharpness": 0.0})  # fmt: skip
        assert normalised_sharpness(1.0, 0.0, n) == {"max_above_uniform": 1.0, "entropy_sharpness": 1.0}
    # Half the weight on one of 5 sources, the rest spread evenly: the max is 0.5, between uniform and one-hot.
    weights = torch.tensor([0.5, 0.125, 0.125, 0.125, 0.125])
    figures = normalised_sharpness(0.5, torch.special.entr(weights).sum().item(), 5)
    assert figures["max_above_uniform"] == pytest.approx(1.5 / 4)
    assert figures["entropy_sharpness"] == pytest.approx(1 - (0.5 * math.log(2) + 0.5 * math.log(8)) / math.log(5))
    assert normalised_sharpness(1.0, 0.0, 1) == {"max_above_uniform": None, "entropy_sharpness": None}


def test_depth_bands_split_the_multi_source_points_in_order_into_thirds():
    def point(n, value):
        return {"num_sources": n, "mean_max_weight": value, "max_above_uniform": value, "entropy_sharpness": value}

    # One single-source point (left out), then seven: thirds of 3, 2 and 2.
    points = [point(1, 100.0)] + [point(n, float(n)) for n in range(2, 9)]
    bands = depth_bands(points)
    assert list(bands) == ["early", "middle", "late"]
    assert bands["early"] == {"mean_max_weight": 3.0, "max_above_uniform": 3.0, "entropy_sharpness": 3.0,
                              "num_sources": 3.0}  # fmt: skip
    assert bands["middle"]["mean_max_weight"] == 5.5 and bands["late"]["num_sources"] == 7.5
    assert depth_bands([point(1, 1.0), point(2, 1.0), point(3, 1.0)]) == {}
