"""The fine-tuning script's parts (schedule, parameter groups, data, metrics) and its errors for bad input."""

import json
import math

import pytest
import torch
from helpers.models import save_tiny_qwen3
from helpers.training import log_lines, save_tiny_delta, tiny_run_args, weights, write_corpus
from transformers import Qwen3Config, Qwen3ForCausalLM

import finetune
from delta_qwen3.corpus import python_docs_texts
from delta_qwen3.texts import document_token_ids
from finetune.config import parse_args
from finetune.evaluation import validation_nll
from finetune.model import build_model, build_model_config
from finetune.optim import build_optimizer, lr_factor, parameter_groups
from finetune.presets import preset_fields
from modeling_delta_qwen3 import DeltaQwen3ForCausalLM


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "python_docs")


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
    groups = parameter_groups(model, lr=1e-3, lr_routing=1e-2, weight_decay=0.1, routing_weight_decay=0.0)
    groups = {group["name"]: group for group in groups}
    names = {id(p): name for name, p in model.named_parameters()}
    members = {key: {names[id(p)] for p in group["params"]} for key, group in groups.items()}

    routing = {name for name in names.values() if "_route." in name}
    assert members["routing"] == routing and any(name.endswith(".gate") for name in routing)
    assert members["no_decay"] == {n for n, p in model.named_parameters() if p.ndim == 1 and n not in routing}
    assert members["decay"] == {n for n, p in model.named_parameters() if p.ndim == 2} - {"lm_head.weight"}
    assert [(groups[k]["lr"], groups[k]["weight_decay"]) for k in ("decay", "no_decay", "routing")] == [
        (1e-3, 0.1), (1e-3, 0.0), (1e-2, 0.0)
    ]  # fmt: skip


@pytest.mark.parametrize("routing_init", ["zero", "released"])
def test_released_routing_initialisation_draws_the_queries_and_decays_routing(tmp_path, tokenizer, routing_init):
    new_model = ("--from-scratch", "--preset", "tiny", "--mode", "delta_block", "--tokenizer", "t")
    config = parse_args(tiny_run_args(tmp_path / "data", tmp_path / "out", *new_model, "--routing-init", routing_init))
    torch.manual_seed(0)
    model = build_model(config, build_model_config(config, tokenizer))
    queries = torch.stack([p for name, p in model.named_parameters() if name.endswith("_route.query")])
    decay = {group["name"]: group["weight_decay"] for group in build_optimizer(model, config).param_groups}
    if routing_init == "zero":
        assert torch.count_nonzero(queries) == 0 and decay == {"decay": 0.1, "no_decay": 0.0, "routing": 0.0}
    else:
        assert queries.std().item() == pytest.approx(0.02, rel=0.05) and abs(queries.mean().item()) < 2e-3
        assert decay == {"decay": 0.1, "no_decay": 0.0, "routing": 0.1}
    norms = [p for name, p in model.named_parameters() if name.endswith("_route.norm.weight")]
    assert all(torch.equal(norm, torch.ones_like(norm)) for norm in norms)  # only the queries are drawn


@pytest.mark.parametrize(
    "preset, parameters",
    [("220M", 220e6), ("533M", 533e6), ("1044M", 1044e6), ("qwen3-0.6b", 596e6), ("qwen3-8b", 8.19e9)],
)
def test_paper_presets_have_the_parameter_counts_of_their_names(preset, parameters):
    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(vocab_size=151_936, **preset_fields(preset)))
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(parameters, rel=0.015)


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


# --- a single text file ------------------------------------------------------------------------------------------


def test_a_single_text_file_trains_validates_on_its_end_and_resumes(tmp_path, delta_checkpoint, tokenizer):
    """A .txt file is one document: the run validates on its last --val-blocks x --seq-len tokens (8 x 32), saves
    them as text, trains on the blocks before them, and a resumed run ends where an uninterrupted one does."""
    text_file = tmp_path / "corpus.txt"
    text_file.write_text("\n\n".join(python_docs_texts()[:10]))  # about 18,000 tokens
    options = ["--model", str(delta_checkpoint), "--max-steps", "2", "--eval-every", "2"]
    assert finetune.main(tiny_run_args(text_file, tmp_path / "whole", *options, "--save-every", "0")) == 0
    argv = tiny_run_args(text_file, tmp_path / "out", *options, "--save-every", "1")
    assert finetune.main([*argv, "--stop-after-step", "1"]) == 0
    assert finetune.main([*argv, "--resume"]) == 0

    expected, resumed = weights(tmp_path / "whole" / "model"), weights(tmp_path / "out" / "model")
    assert all(torch.equal(resumed[name], expected[name]) for name in expected)
    (ids,) = document_token_ids(tokenizer, [text_file.read_text()])
    model = DeltaQwen3ForCausalLM.from_pretrained(delta_checkpoint).eval()
    totals = validation_nll(model, torch.tensor(ids[-8 * 32 :]).view(8, 32), 4, 0, 1, "cpu")
    validations = [line for line in log_lines(tmp_path / "whole") if "val_loss" in line]
    assert [line["step"] for line in validations] == [0, 2]
    assert validations[0]["val_loss"] == pytest.approx((totals[0] / totals[1]).item(), rel=1e-6)
    saved = (tmp_path / "whole" / "validation_documents.jsonl").read_text().splitlines()
    assert len(saved) == 1 and text_file.read_text().endswith(json.loads(saved[0])["text"])


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
    "content, extra, message",
    [
        ("", [], "is empty"),
        ('{"text": "  "}\n', [], "is empty: it has no text in field 'text'"),
        (
            TEN_TOKENS * 10,
            [],
            "its held-out documents (every --val-interval 10th) have 10 tokens, and --val-blocks 8 of --seq-len 32 "
            "need 256; to fill them, give more documents",  # no option helps: all 10 documents hold 100 tokens
        ),
        # Training skips every copy of a held-out document: 30 copies of one text leave nothing to train on.
        (
            TEN_TOKENS * 30,
            ["--val-blocks", "1", "--seq-len", "8"],
            "besides the 1 held-out documents, 0 tokens in 0 documents remain, and one optimiser step on 1 "
            "process(es) needs 32 tokens (--batch-size x --grad-accum x --seq-len per process) and a document per "
            "process; to train, give more documents",
        ),
        (
            TEN_TOKENS,
            [],
            "is too small: it is one document, so validation holds out its last --val-blocks 8 x --seq-len 32 "
            "tokens, and of its 10 tokens that leaves 0 block(s) to train on, where one optimiser step on 1 "
            "process(es) needs 4 (--batch-size x --grad-accum per process); to train, give more text (at least 384 "
            "tokens)",
        ),
    ],
)
def test_empty_or_too_small_data(tmp_path, delta_checkpoint, capsys, content, extra, message):
    (tmp_path / "data.jsonl").write_text(content)
    argv = tiny_run_args(tmp_path / "data.jsonl", tmp_path / "out", "--model", str(delta_checkpoint), *extra)
    assert message in fails_before_training(argv, capsys, tmp_path / "out")


def test_missing_text_field(tmp_path, delta_checkpoint, capsys):
    (tmp_path / "data.jsonl").write_text('{"body": "x"}\n')
    argv = tiny_run_args(
        tmp_path / "data.jsonl", tmp_path / "out", "--model", str(delta_checkpoint), "--text-field", "content"
    )
    assert "has no text in field 'content' in any of its 1 documents" in fails_before_training(
        argv, capsys, tmp_path / "out"
    )


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


@pytest.mark.parametrize("mode", ["delta", "attnres_full", "delta_block", "attnres_block"])
def test_every_mode_builds_from_scratch_with_fewer_layers_than_the_default_block_count(tmp_path, tokenizer, mode):
    (tmp_path / "shape.json").write_text(json.dumps({**preset_fields("tiny"), "num_hidden_layers": 2}))
    config = parse_args(["--data", "d", "--output-dir", str(tmp_path / "out"), "--from-scratch", "--mode", mode,
                         "--tokenizer", "t", "--model-config", str(tmp_path / "shape.json")])  # fmt: skip
    model_config = build_model_config(config, tokenizer)
    assert (model_config.routing_mode, model_config.num_hidden_layers, model_config.routing_num_blocks) == (mode, 2, 2)
    config = parse_args(["--data", "d", "--output-dir", str(tmp_path / "out"), "--from-scratch", "--mode", mode,
                         "--tokenizer", "t", "--preset", "tiny"])  # fmt: skip
    assert build_model_config(config, tokenizer).routing_num_blocks == 4  # the documented default where it fits


def test_an_earlier_run_is_neither_mixed_nor_silently_replaced(tmp_path, corpus, delta_checkpoint, capsys):
    (tmp_path / "out" / "checkpoints" / "step_00000003").mkdir(parents=True)
    argv = tiny_run_args(corpus, tmp_path / "out", "--model", str(delta_checkpoint))
    assert "already holds checkpoints; pass --resume" in fails_before_training(argv, capsys, tmp_path / "out")
    assert "--resume and --overwrite exclude each other" in fails_before_training(
        [*argv, "--resume", "--overwrite"], capsys, tmp_path / "out"
    )
