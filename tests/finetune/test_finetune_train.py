"""End-to-end fine-tuning and pre-training runs of tiny models on Python's documentation: learning, saving,
resuming, two processes, frozen base, LoRA, pre-training a baseline."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from helpers.running import run_without_project
from helpers.training import log_lines, run_env, save_tiny_delta, tiny_run_args, weights, write_0d_gate_run_checkpoint
from huggingface_hub import HfApi
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3ForCausalLM

import finetune
from finetune.config import parse_args
from finetune.data import build_training_data
from finetune.evaluation import loss_and_perplexity, validation_nll
from finetune.model import add_lora, is_routing_parameter, merge_lora
from modeling_delta_qwen3 import DeltaQwen3ForCausalLM


def reevaluate(model_dir, argv: list[str]) -> float:
    """Validation loss of the saved model over the run's held-out blocks, computed here in one process."""
    config = parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    blocks = build_training_data(config, tokenizer, world_size=1).validation
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    return loss_and_perplexity(validation_nll(model, blocks, config.batch_size, 0, 1, "cpu"))["val_loss"]


@pytest.mark.slow
def test_python_m_finetune_learns_moves_routing_and_reloads(tmp_path, jsonl_corpus, delta_checkpoint):
    out = tmp_path / "run"
    argv = tiny_run_args(
        jsonl_corpus, out, "--model", str(delta_checkpoint), "--max-steps", "25", "--lr-routing", "3e-2", "--eval-every", "25"
    )
    subprocess.run([sys.executable, "-m", "finetune", *argv], env=run_env(), check=True, timeout=300)

    lines = log_lines(out)
    validations = [line for line in lines if "val_loss" in line]
    assert [line["step"] for line in validations] == [0, 25]
    assert validations[-1]["val_loss"] < validations[0]["val_loss"] - 0.5
    steps = [line for line in lines if "loss" in line]
    assert [line["step"] for line in steps] == list(range(1, 26))
    assert set(steps[-1]) == {
        "step",
        "loss",
        "grad_norm",
        "mean_max_weight",
        "mean_max_weight_multi_source",
        "lr",
        "lr_routing",
        "tokens_per_s",
    }
    assert steps[0]["lr_routing"] == pytest.approx(10 * steps[0]["lr"])

    before, after = weights(delta_checkpoint), weights(out / "model")
    assert after.keys() == before.keys()
    routing = [name for name in before if is_routing_parameter(name)]
    assert routing and all(not torch.equal(before[name], after[name]) for name in routing)

    assert reevaluate(out / "model", argv) == pytest.approx(validations[-1]["val_loss"], rel=1e-6)


@pytest.mark.parametrize("saved_with_0d_gates", [False, True], ids=["ungated", "gated-run-saved-with-0d-gates"])
def test_resume_after_interruption_ends_with_the_same_parameters(
    tmp_path, jsonl_corpus, delta_checkpoint, tokenizer, saved_with_0d_gates
):
    """Also a gated run whose checkpoint is as runs saved it before the gates became `[1]`: it resumes, and saves
    `[1]` gates (as the uninterrupted run's)."""
    model = delta_checkpoint
    if saved_with_0d_gates:
        model = save_tiny_delta(tmp_path / "gated", tokenizer, routing_gate=True)
    common = ("--max-steps", "6", "--save-every", "3", "--grad-accum", "2", "--eval-every", "100")
    assert finetune.main(tiny_run_args(jsonl_corpus, tmp_path / "straight", "--model", str(model), *common)) == 0

    interrupted = tmp_path / "interrupted"
    argv = tiny_run_args(jsonl_corpus, interrupted, "--model", str(model), *common)
    assert finetune.main([*argv, "--stop-after-step", "4"]) == 0
    assert not (interrupted / "model").exists()
    assert sorted(p.name for p in (interrupted / "checkpoints").iterdir()) == ["step_00000003"]
    if saved_with_0d_gates:
        write_0d_gate_run_checkpoint(interrupted / "checkpoints" / "step_00000003")
    assert finetune.main([*argv, "--resume"]) == 0

    straight, resumed = weights(tmp_path / "straight" / "model"), weights(interrupted / "model")
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)
    # Step 4 ran twice, before the interruption and after resuming from step 3; its first log line was dropped on
    # resuming, so the log is the uninterrupted run's.
    losses = [(line["step"], line["loss"]) for line in log_lines(interrupted) if "loss" in line]
    assert losses == [(line["step"], line["loss"]) for line in log_lines(tmp_path / "straight") if "loss" in line]
    assert [step for step, _ in losses] == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_accelerate_launch_two_processes(tmp_path, jsonl_corpus, delta_checkpoint):
    out = tmp_path / "ddp"
    argv = tiny_run_args(
        jsonl_corpus, out, "--model", str(delta_checkpoint), "--max-steps", "3", "--save-every", "3", "--val-blocks", "7"
    )
    # `accelerate launch --cpu` starts a single process whatever --num_processes says; two CPU processes are started
    # like GPU ones and told to use the CPU (gloo) through the environment.
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]  # fmt: skip
    env = {**run_env(), "ACCELERATE_USE_CPU": "1"}
    subprocess.run([*launch, "-m", "finetune", *argv], env=env, check=True, timeout=300)

    checkpoint = out / "checkpoints" / "step_00000003"
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= {p.name for p in checkpoint.iterdir()}
    lines = log_lines(out)
    assert [line["step"] for line in lines if "loss" in line] == [1, 2, 3]  # logged by the main process only
    final = [line for line in lines if "val_loss" in line][-1]
    assert final["step"] == 3
    # Seven held-out blocks over two processes: the gathered loss covers each block once.
    assert reevaluate(out / "model", argv) == pytest.approx(final["val_loss"], rel=1e-5)
    assert weights(out / "model").keys() == weights(delta_checkpoint).keys()


def test_freeze_base_trains_only_routing(tmp_path, jsonl_corpus, delta_checkpoint):
    out = tmp_path / "frozen"
    assert (
        finetune.main(tiny_run_args(jsonl_corpus, out, "--model", str(delta_checkpoint), "--max-steps", "3", "--freeze-base"))
        == 0
    )
    before, after = weights(delta_checkpoint), weights(out / "model")
    base = [name for name in before if not is_routing_parameter(name)]
    assert all(torch.equal(before[name], after[name]) for name in base)
    assert any(not torch.equal(before[name], after[name]) for name in before if is_routing_parameter(name))


def test_lora_run_saves_an_ordinary_merged_checkpoint(tmp_path, jsonl_corpus, delta_checkpoint):
    out = tmp_path / "lora"
    assert (
        finetune.main(tiny_run_args(jsonl_corpus, out, "--model", str(delta_checkpoint), "--max-steps", "3", "--lora")) == 0
    )
    before, after = weights(delta_checkpoint), weights(out / "model")
    assert after.keys() == before.keys()
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    projections = {name for name in before if name.endswith("proj.weight")}
    routing = {name for name in before if is_routing_parameter(name) and name.endswith("query")}
    assert projections | routing <= changed  # LoRA deltas merged into every projection; routing trained in full
    assert not changed & {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"}


def test_merged_lora_checkpoint_reproduces_the_peft_model(tmp_path, tokenizer):
    source = save_tiny_delta(tmp_path / "source", tokenizer)
    peft_model = add_lora(DeltaQwen3ForCausalLM.from_pretrained(source), rank=4, alpha=8, dropout=0.0)
    torch.manual_seed(1)
    with torch.no_grad():  # a trained state: non-zero LoRA updates and routing away from its initial values
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name or is_routing_parameter(name):
                parameter.add_(torch.randn_like(parameter) * 0.1)
    input_ids = torch.tensor([tokenizer("Compound statements contain other statements.")["input_ids"]])
    expected = peft_model.eval()(input_ids=input_ids).logits

    merged = merge_lora(peft_model)
    merged.save_pretrained(tmp_path / "merged")
    assert {name for name, _ in merged.named_parameters()} == set(weights(source))
    torch.save(input_ids, tmp_path / "input_ids.pt")
    run_without_project(
        """
        import torch
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained("merged", trust_remote_code=True).eval()
        torch.save(model(input_ids=torch.load("input_ids.pt")).logits, "logits.pt")
        """,
        cwd=tmp_path,
    )
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), expected, rtol=0, atol=1e-5)


def test_from_scratch_baseline_saves_a_qwen3_checkpoint_and_pushes(tmp_path, jsonl_corpus, tokenizer, monkeypatch):
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    uploads = []
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kwargs: uploads.append(("create", repo_id)))

    def create_commit(self, repo_id, operations, **kwargs):
        uploads.append(("commit", repo_id, sorted(operation.path_in_repo for operation in operations)))
        return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0000")

    monkeypatch.setattr(HfApi, "create_commit", create_commit)
    out = tmp_path / "scratch"
    scratch = ("--from-scratch", "--preset", "tiny", "--mode", "baseline", "--tokenizer", str(tmp_path / "tokenizer"))
    assert (
        finetune.main(
            tiny_run_args(jsonl_corpus, out, *scratch, "--max-steps", "2", "--push-to-hub", "someone/tiny-baseline")
        )
        == 0
    )

    config = json.loads((out / "model" / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["tie_word_embeddings"] and config["vocab_size"] == len(tokenizer)
    assert isinstance(AutoModelForCausalLM.from_pretrained(out / "model"), Qwen3ForCausalLM)
    assert AutoTokenizer.from_pretrained(out / "model")("def f(x):")["input_ids"] == tokenizer("def f(x):")["input_ids"]
    assert uploads[0] == ("create", "someone/tiny-baseline")
    assert uploads[1] == ("commit", "someone/tiny-baseline", sorted(p.name for p in (out / "model").iterdir()))


def test_from_scratch_routing_model_from_a_config_file(tmp_path, jsonl_corpus, tokenizer):
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    shape = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 2,
             "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 64}  # fmt: skip
    (tmp_path / "shape.json").write_text(json.dumps(shape))
    out = tmp_path / "scratch"
    scratch = ("--from-scratch", "--model-config", str(tmp_path / "shape.json"), "--mode", "delta_block",
               "--num-blocks", "2", "--gate", "--tokenizer", str(tmp_path / "tokenizer"))  # fmt: skip
    assert finetune.main(tiny_run_args(jsonl_corpus, out, *scratch, "--max-steps", "2", "--gradient-checkpointing")) == 0
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    assert isinstance(model, DeltaQwen3ForCausalLM)
    assert (model.config.routing_mode, model.config.routing_num_blocks, model.config.routing_gate) == (
        "delta_block",
        2,
        True,
    )
    assert model.config.num_hidden_layers == 4
