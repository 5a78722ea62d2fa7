"""Values never reach PyTorch, accelerate or lm-eval unchecked: an option out of range, a device that is not there,
a tokenizer with more tokens than the model's embedding has rows, and a configuration that cannot build a model are
each refused in one line naming the option or the file, with exit code 2, before any work starts."""

import json
import shutil

import pytest
from helpers.models import save_tiny_qwen3
from helpers.running import run_cli
from helpers.training import tiny_run_args

import demo.__main__
import finetune
from delta_qwen3.cli import build_parser
from eval.benchmarks import FIXTURES_DIR

TINY_SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, max_position_embeddings=256)  # fmt: skip


def refused(argv: list[str]) -> str:
    """`delta-qwen3 ARGV` exits 2 with nothing on stdout and one line on stderr: that line."""
    code, stdout, stderr = run_cli(argv)
    assert (code, stdout) == (2, "")
    assert len(stderr.strip().splitlines()) == 1, stderr
    return stderr.strip()


def finetune_refused(argv: list[str], capsys) -> str:
    capsys.readouterr()
    assert finetune.main(argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("finetune:")]
    assert len(lines) == 1
    return lines[0]


# --- devices ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "device, message",
    [
        ("gpu", "--device 'gpu' is not a device PyTorch knows (e.g. cpu, cuda, cuda:1, mps)"),
        ("meta", "--device meta: the meta device holds no values to compute with; give cpu, cuda, ..."),
        ("cuda:7", "--device cuda:7: this machine has "),
    ],
)
def test_a_device_that_is_not_there_is_refused_first(device, message, routed_model, corpus, tmp_path,
                                                     nothing_started, capsys):
    commands = {
        "eval": ["eval", str(routed_model), "--tasks", "boolq", "--data-dir", str(FIXTURES_DIR), "--output",
                 str(tmp_path / "results.json")],
        "ppl": ["ppl", str(routed_model), "--data", str(corpus)],
        "routing": ["routing", str(routed_model), "--data", str(corpus), "--out", str(tmp_path / "report")],
        "study": ["study", "--out", str(tmp_path / "study"), "--device", device, "--", "--data", str(corpus),
                  "--tokenizer", str(routed_model)],
    }  # fmt: skip
    for command, argv in commands.items():
        assert message in refused(argv if command == "study" else [*argv, "--device", device]), command
    assert demo.__main__.main(["--device", device, "--out", str(tmp_path / "demo")]) == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# --- options out of range -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, message",
    [
        (["--lora", "--lora-dropout", "2"], "--lora-dropout must be at least 0 and below 1 (a probability), got 2.0"),
        (["--lora", "--lora-dropout", "-0.1"], "--lora-dropout must be at least 0 and below 1 (a probability), got -0.1"),
        (["--lora", "--lora-alpha", "0"], "--lora-alpha must be positive (the update is scaled by alpha / rank), got 0.0"),
        (["--eval-batch-size", "-2"], "--eval-batch-size must be at least 1, got -2"),
        (["--eval-batch-size", "0"], "--eval-batch-size must be at least 1, got 0"),
        (["--stop-after-step", "-1"], "--stop-after-step must be at least 1, got -1"),
        (["--seed", "-1"], "--seed must be between 0 and 4294967295, got -1"),
        (["--seed", str(2**32)], "--seed must be between 0 and 4294967295, got 4294967296"),
    ],
)  # fmt: skip
def test_finetune_options_out_of_range_are_refused_first(options, message, corpus, delta_checkpoint, tmp_path, capsys,
                                                         nothing_started):
    argv = tiny_run_args(corpus, tmp_path / "out", "--model", str(delta_checkpoint), *options)
    assert finetune_refused(argv, capsys) == f"finetune: error: {message}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "options, message",
    [
        (["--seeds", "-1"], "--seeds must be between 0 and 4294967295, got -1"),
        (["--num-blocks", "0", "--modes", "delta"], "--num-blocks must be at least 1, got [0]"),
    ],
)
def test_study_options_out_of_range_are_refused_first(options, message, corpus, routed_model, tmp_path):
    line = refused(["study", "--out", str(tmp_path / "study"), *options, "--", "--data", str(corpus), "--tokenizer",
                    str(routed_model)])  # fmt: skip
    assert line == f"delta-qwen3 study: error: {message}"
    assert not (tmp_path / "study").exists()


def test_a_stride_longer_than_the_window_is_refused_before_the_model_loads(routed_model, corpus, nothing_started):
    line = refused(["ppl", str(routed_model), "--data", str(corpus), "--max-length", "20", "--stride", "40"])
    assert line == (
        "delta-qwen3 ppl: error: --stride 40 is longer than the window (--max-length 20): the tokens between two "
        "windows would be scored by neither; give a --stride of at most the window"
    )
    line = refused(["ppl", str(routed_model), "--data", str(corpus), "--stride", "300"])
    assert line.endswith(f"--stride 300 is longer than the window (the default window of {routed_model}, 256 "
                         "tokens): the tokens between two windows would be scored by neither; give a --stride of at "
                         "most the window")  # fmt: skip


@pytest.mark.parametrize("batch_size", ["auto:x", "auto:0", "automatic", "0", "many"])
def test_eval_batch_sizes_lm_eval_cannot_read_are_refused(batch_size, routed_model, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["eval", str(routed_model), "--batch-size", batch_size])
    assert exit_.value.code == 2
    assert "argument --batch-size: must be a positive integer" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# --- a tokenizer larger than the embedding --------------------------------------------------------------------------


def test_a_tokenizer_with_more_tokens_than_the_embedding_is_refused_first(tokenizer, corpus, tmp_path, capsys,
                                                                          nothing_started):
    small = save_tiny_qwen3(tmp_path / "small-vocab", tokenizer, vocab_size=256)
    line = refused(["ppl", str(small), "--data", str(corpus)])
    assert line == (
        f"delta-qwen3 ppl: error: the tokenizer of MODEL {small} has {len(tokenizer)} tokens, more than the 256 rows "
        f"of model {small}'s embedding (vocab_size): the ids beyond them cannot be embedded"
    )
    argv = tiny_run_args(corpus, tmp_path / "out", "--model", str(small))
    assert finetune_refused(argv, capsys) == (
        f"finetune: error: the tokenizer of --model {small} has {len(tokenizer)} tokens, more than the 256 rows of "
        f"--model {small}'s embedding (vocab_size): the ids beyond them cannot be embedded"
    )
    assert not (tmp_path / "out").exists()


# --- configurations that cannot build a model -----------------------------------------------------------------------

BAD_SHAPES = [
    ({"num_key_value_heads": 3}, "num_attention_heads (2) must be a multiple of num_key_value_heads (3): each key-value "
     "head serves a whole group of attention heads"),
    ({"hidden_size": 0}, "hidden_size must be a positive whole number, got 0"),
    ({"num_hidden_layers": -2}, "num_hidden_layers must be a positive whole number, got -2"),
    ({"rms_norm_eps": -1.0}, "rms_norm_eps must be a positive number, got -1.0"),
]  # fmt: skip


@pytest.mark.parametrize("fields, message", BAD_SHAPES)
def test_a_model_configuration_that_cannot_build_a_model_is_refused_naming_it(fields, message, tokenizer, corpus,
                                                                            qwen3_checkpoint, tmp_path, capsys,
                                                                            nothing_started):
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    shape = tmp_path / "shape.json"
    shape.write_text(json.dumps({**TINY_SHAPE, **fields}))
    argv = tiny_run_args(corpus, tmp_path / "out", "--from-scratch", "--mode", "baseline", "--tokenizer",
                         str(tmp_path / "tokenizer"), "--model-config", str(shape))  # fmt: skip
    assert finetune_refused(argv, capsys) == f"finetune: error: --model-config {shape}: {message}"
    assert not (tmp_path / "out").exists()

    model = shutil.copytree(qwen3_checkpoint, tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    config.pop("layer_types")  # one per layer: made for the new depth
    (model / "config.json").write_text(json.dumps({**config, **TINY_SHAPE, **fields}))
    assert refused(["ppl", str(model), "--data", str(corpus)]) == (
        f"delta-qwen3 ppl: error: MODEL {model} (its config.json): {message}"
    )
    assert refused(["convert", str(model), str(tmp_path / "converted"), "--num-blocks", "1"]) == (
        f"delta-qwen3 convert: error: cannot convert to DeltaQwen3: the source's config.json: {message}"
    )
    assert finetune_refused(tiny_run_args(corpus, tmp_path / "out", "--model", str(model)), capsys) == (
        f"finetune: error: --model {model} (its config.json): {message}"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "shape.json", "tokenizer"]
