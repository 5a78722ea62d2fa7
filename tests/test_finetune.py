"""The fine-tuning script's parts (schedule, parameter groups, data, metrics) and its errors for bad input."""

import itertools
import json
import math

import pytest
import torch
from conftest import save_tiny_qwen3
from finetune_fixtures import save_tiny_delta, tiny_run_args, write_corpus
from transformers import Qwen3Config, Qwen3ForCausalLM

import finetune
import finetune.data
from delta_qwen3.errors import CommandError
from finetune.config import parse_args
from finetune.data import build_training_data, load_documents, pack, token_ids
from finetune.evaluation import mean_max_routing_weight, validation_nll
from finetune.optim import lr_factor, parameter_groups
from finetune.presets import preset_fields
from modeling_delta_qwen3 import DeltaQwen3ForCausalLM


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "python_docs.txt")


@pytest.fixture(scope="module")
def delta_checkpoint(tmp_path_factory, tokenizer):
    return save_tiny_delta(tmp_path_factory.mktemp("delta") / "tiny-delta", tokenizer, routing_gate=True)


# --- schedule and parameter groups -------------------------------------------------------------------------------


def test_schedule_warms_up_linearly_then_follows_a_cosine_to_the_floor():
    factors = [lr_factor(step, warmup_steps=4, max_steps=12, min_lr_ratio=0.1) for step in range(13)]
    assert factors[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert factors[8] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert factors[12] == pytest.approx(0.1)


def test_parameter_groups_exempt_norms_and_routing_from_weight_decay(delta_checkpoint):
    model = DeltaQwen3ForCausalLM.from_pretrained(delta_checkpoint)
    model.lm_head.weight.requires_grad_(False)
    groups = {group["name"]: group for group in parameter_groups(model, lr=1e-3, lr_routing=1e-2, weight_decay=0.1)}
    names = {id(p): name for name, p in model.named_parameters()}
    members = {key: {names[id(p)] for p in group["params"]} for key, group in groups.items()}

    routing = {name for name in names.values() if "_route." in name}
    assert members["routing"] == routing and any(name.endswith(".gate") for name in routing)
    assert members["no_decay"] == {n for n, p in model.named_parameters() if p.ndim == 1 and n not in routing}
    assert members["decay"] == {n for n, p in model.named_parameters() if p.ndim == 2} - {"lm_head.weight"}
    assert [(groups[k]["lr"], groups[k]["weight_decay"]) for k in ("decay", "no_decay", "routing")] == [
        (1e-3, 0.1), (1e-3, 0.0), (1e-2, 0.0)
    ]  # fmt: skip


@pytest.mark.parametrize(
    "preset, parameters",
    [("220M", 220e6), ("533M", 533e6), ("1044M", 1044e6), ("qwen3-0.6b", 596e6), ("qwen3-8b", 8.19e9)],
)
def test_paper_presets_have_the_parameter_counts_of_their_names(preset, parameters):
    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(vocab_size=151_936, **preset_fields(preset)))
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(parameters, rel=0.015)


# --- data --------------------------------------------------------------------------------------------------------


def test_pack_concatenates_documents_and_drops_the_incomplete_tail():
    blocks = list(pack([[1, 2, 3], [], [4, 5], [6, 7, 8, 9, 10]], seq_len=4))
    assert [block.tolist() for block in blocks] == [[1, 2, 3, 4], [5, 6, 7, 8]]


def test_token_ids_end_each_document_and_stay_aligned_over_blank_ones(tokenizer):
    documents = [{"text": "import os"}, {"text": "  \n"}, {"text": "x = 1"}]
    expected = [tokenizer("import os")["input_ids"] + [tokenizer.eos_token_id], [],
                tokenizer("x = 1")["input_ids"] + [tokenizer.eos_token_id]]  # fmt: skip
    assert list(token_ids(documents, tokenizer)) == expected


def test_text_files_are_split_into_paragraphs_and_json_lines_read_the_text_field(tmp_path):
    (tmp_path / "notes.txt").write_text("first paragraph\nstill first\n\nsecond\n")
    assert [d["text"] for d in load_documents(str(tmp_path / "notes.txt"), None, "train", "text")] == [
        "first paragraph\nstill first", "second\n"
    ]  # fmt: skip
    (tmp_path / "docs.jsonl").write_text('{"body": "one", "id": 1}\n{"body": "two", "id": 2}\n')
    assert [d["text"] for d in load_documents(str(tmp_path / "docs.jsonl"), None, "train", "body")] == ["one", "two"]


def test_a_hub_dataset_is_streamed_by_its_id(tmp_path, monkeypatch):
    (tmp_path / "shard.jsonl").write_text('{"content": "one"}\n{"content": "two"}\n')
    load_local = finetune.data.load_dataset
    calls = []

    def load_from_hub(path, **kwargs):  # stands in for the download: the same call, served from a local file
        calls.append((path, kwargs))
        return load_local("json", data_files=str(tmp_path / "shard.jsonl"), split="train", streaming=True)

    monkeypatch.setattr(finetune.data, "load_dataset", load_from_hub)
    documents = load_documents("HuggingFaceFW/fineweb-edu", "sample-10BT", "train", "content")
    assert [d["text"] for d in documents] == ["one", "two"]
    assert calls == [("HuggingFaceFW/fineweb-edu", dict(name="sample-10BT", split="train", streaming=True))]

    def unreachable(path, **kwargs):
        raise ConnectionError("the Hub cannot be reached")

    monkeypatch.setattr(finetune.data, "load_dataset", unreachable)
    with pytest.raises(CommandError, match="not loadable from the Hub: the Hub cannot be reached"):
        load_documents("someone/missing", None, "train", "text")


def test_validation_holds_out_the_first_documents_and_training_reads_the_rest(tmp_path, tokenizer):
    texts = [f"document number {i} " * 3 for i in range(40)]
    data_file = tmp_path / "docs.jsonl"
    data_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    config = parse_args(tiny_run_args(data_file, tmp_path / "out", "--model", "m", "--seq-len", "16",
                                      "--val-blocks", "3", "--batch-size", "2"))  # fmt: skip
    data = build_training_data(config, tokenizer, world_size=2)

    ids = [tokenizer(t)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    held_out = next(n for n in itertools.count(1) if sum(map(len, ids[:n])) >= 3 * 16)
    assert data.validation.tolist() == [b.tolist() for b in pack(ids[:held_out], 16)][:3]
    assert [d["text"] for d in data.documents] == texts[held_out:]

    # The two processes share out the documents; a resumed stream continues where it stopped.
    rank0, rank1 = (list(itertools.islice(data.batches(2, rank, 2), 3)) for rank in (0, 1))
    assert not torch.equal(rank0[0], rank1[0])
    resumed = list(itertools.islice(data.batches(2, 0, 2, skip_blocks=2), 2))
    assert all(torch.equal(a, b) for a, b in zip(resumed, rank0[1:], strict=True))


# --- metrics -----------------------------------------------------------------------------------------------------


def test_mean_max_routing_weight_leaves_out_single_source_points():
    single = torch.ones(1, 2, 1)
    two = torch.tensor([[[0.7, 0.3], [0.4, 0.6]]])
    three = torch.tensor([[[0.2, 0.5, 0.3], [0.1, 0.1, 0.8]]])
    assert mean_max_routing_weight((single, two, three)).item() == pytest.approx((0.65 + 0.65) / 2)
    assert mean_max_routing_weight((single,)) is None


def test_validation_shares_blocks_over_processes_and_runs_equal_batches(delta_checkpoint):
    model = DeltaQwen3ForCausalLM.from_pretrained(delta_checkpoint).eval()
    blocks = torch.randint(0, 512, (7, 16), generator=torch.Generator().manual_seed(0))
    calls = []
    model.register_forward_hook(lambda module, args, output: calls.append(len(output.logits)))
    whole = validation_nll(model, blocks, 2, 0, 1, "cpu")
    shares = []
    for rank in range(3):
        calls.clear()
        shares.append(validation_nll(model, blocks, 2, rank, 3, "cpu"))
        assert calls == [2, 1]  # ceil(7 / 3) = 3 blocks, in batches of 2, on every process
    total = torch.stack(shares).sum(0)
    assert total[1].item() == whole[1].item() == 7 * 15
    assert total[0].item() == pytest.approx(whole[0].item(), rel=1e-6)


# --- bad input ---------------------------------------------------------------------------------------------------


def fails_before_training(argv: list[str], capsys, output_dir) -> str:
    """Run the command, expect exit status 2 and nothing trained; return the error message."""
    assert finetune.main([*argv, "--max-steps", "1"]) == 2
    assert not (output_dir / "train_log.jsonl").exists()
    return capsys.readouterr().err


def test_missing_model(tmp_path, corpus, capsys):
    err = fails_before_training(
        tiny_run_args(corpus, tmp_path / "out", "--model", str(tmp_path / "nowhere")), capsys, tmp_path / "out"
    )
    assert f"finetune: error: --model {tmp_path / 'nowhere'} does not exist (and is not a Hub model id" in err


TEN_TOKENS = '{"text": "def f(): pass"}\n'  # nine tokens and the end-of-text token


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "is empty"),
        ('{"text": "  "}\n', "is empty: it has no text in field 'text'"),
        (TEN_TOKENS * 10, "it has 100 tokens, and holding out --val-blocks 8 of --seq-len 32 alone needs 256"),
        (
            TEN_TOKENS * 30,
            "after the 8 validation blocks, 40 tokens in 4 documents remain, and one optimiser step on 1",
        ),
    ],
)
def test_empty_or_too_small_data(tmp_path, delta_checkpoint, capsys, content, message):
    (tmp_path / "data.jsonl").write_text(content)
    argv = tiny_run_args(tmp_path / "data.jsonl", tmp_path / "out", "--model", str(delta_checkpoint))
    assert message in fails_before_training(argv, capsys, tmp_path / "out")


def test_missing_text_field(tmp_path, delta_checkpoint, capsys):
    (tmp_path / "data.jsonl").write_text('{"body": "x"}\n')
    argv = tiny_run_args(
        tmp_path / "data.jsonl", tmp_path / "out", "--model", str(delta_checkpoint), "--text-field", "content"
    )
    assert "no field 'content' (its fields: body)" in fails_before_training(argv, capsys, tmp_path / "out")


def test_seq_len_beyond_the_models_positions(tmp_path, corpus, delta_checkpoint, capsys):
    argv = tiny_run_args(corpus, tmp_path / "out", "--model", str(delta_checkpoint), "--seq-len", "257")
    assert "--seq-len 257 is beyond the model's max_position_embeddings (256)" in fails_before_training(
        argv, capsys, tmp_path / "out"
    )


def test_unknown_preset(tmp_path, corpus, capsys):
    with pytest.raises(SystemExit) as exit_info:
        finetune.main(tiny_run_args(corpus, tmp_path / "out", "--from-scratch", "--preset", "3B", "--mode", "delta"))
    assert exit_info.value.code == 2
    assert "--preset: invalid choice: '3B'" in capsys.readouterr().err


def test_routing_mode_mismatching_the_checkpoint(tmp_path, corpus, delta_checkpoint, tokenizer, capsys):
    argv = tiny_run_args(corpus, tmp_path / "out", "--model", str(delta_checkpoint), "--mode", "delta_block")
    assert "--mode delta_block does not match" in fails_before_training(argv, capsys, tmp_path / "out")
    qwen3 = save_tiny_qwen3(tmp_path / "qwen3", tokenizer)
    argv = tiny_run_args(corpus, tmp_path / "out", "--model", str(qwen3), "--mode", "delta")
    assert "whose mode is baseline; convert" in fails_before_training(argv, capsys, tmp_path / "out")
    argv = tiny_run_args(corpus, tmp_path / "out", "--model", str(qwen3), "--freeze-base")
    assert "a baseline Qwen3 model has none" in fails_before_training(argv, capsys, tmp_path / "out")


def test_from_scratch_needs_a_tokenizer_and_a_mode(tmp_path, corpus, capsys):
    argv = tiny_run_args(corpus, tmp_path / "out", "--from-scratch", "--preset", "tiny", "--mode", "delta")
    assert "--from-scratch needs --tokenizer" in fails_before_training(argv, capsys, tmp_path / "out")
    argv = tiny_run_args(corpus, tmp_path / "out", "--from-scratch", "--preset", "tiny", "--tokenizer", "t")
    assert "--from-scratch needs --mode" in fails_before_training(argv, capsys, tmp_path / "out")


def test_an_earlier_run_is_neither_mixed_nor_silently_replaced(tmp_path, corpus, delta_checkpoint, capsys):
    (tmp_path / "out" / "checkpoints" / "step_00000003").mkdir(parents=True)
    argv = tiny_run_args(corpus, tmp_path / "out", "--model", str(delta_checkpoint))
    assert "already holds checkpoints; pass --resume" in fails_before_training(argv, capsys, tmp_path / "out")
    assert "--resume and --overwrite exclude each other" in fails_before_training(
        [*argv, "--resume", "--overwrite"], capsys, tmp_path / "out"
    )
