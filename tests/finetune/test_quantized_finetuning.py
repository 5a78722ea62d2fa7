"""`finetune --quantize 4bit|8bit --lora` (QLoRA, bitsandbytes' CPU backend here): the base loaded quantised, LoRA
adapters and the routing parameters (in float32) trained, the adapters saved as PEFT saves them and loaded back
onto a quantised or a full-precision base, a run resumed to the same adapters; and the demo's model learns."""

import json

import pytest
import torch
from accelerate import Accelerator
from helpers.training import log_lines, save_tiny_delta, tiny_run_args
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

import finetune
from conversion import convert
from delta_qwen3.corpus import SMALL_BASE_CONFIG, pretraining_inputs, split_python_docs
from demo.journey import DemoSettings, finetune_command
from finetune.config import parse_args
from finetune.data import build_training_data
from finetune.evaluation import loss_and_perplexity, validation_nll
from finetune.model import build_model_config
from finetune.quantization import build_quantized_model, quantization_config

BITS = ("4bit", "8bit")
# bitsandbytes' CPU kernel for 4-bit inference takes layers whose inputs are whole blocks of 64 (Qwen3's are): the
# tiny training shape with twice the width.
WIDER = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture(scope="module")
def qlora_checkpoint(tmp_path_factory, tokenizer):
    """A tiny ungated delta-mode checkpoint that bitsandbytes quantises to 4 bits on the CPU."""
    return save_tiny_delta(tmp_path_factory.mktemp("qlora") / "tiny-delta", tokenizer, **WIDER)


def quantized(path, bits: str):
    """`path` loaded as `finetune --quantize bits` loads it (no mixed precision)."""
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, quantization_config=quantization_config(bits, "no"))


def adapters(run_dir) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "adapter" / "adapter_model.safetensors")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--quantize", "4bit"], "--quantize 4bit trains LoRA adapters on --model loaded quantised: it needs --lora"),
        (["--quantize", "8bit", "--freeze-base"], "--quantize 8bit trains LoRA adapters"),
    ],
)
def test_quantize_without_lora_is_refused_in_one_line(tmp_path, jsonl_corpus, delta_checkpoint, capsys, extra, message):
    argv = tiny_run_args(jsonl_corpus, tmp_path / "run", "--model", str(delta_checkpoint), *extra)
    assert finetune.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err
    assert not (tmp_path / "run").exists()


def test_quantize_from_scratch_is_refused(tmp_path, jsonl_corpus, capsys):
    argv = tiny_run_args(jsonl_corpus, tmp_path / "run", "--from-scratch", "--preset", "tiny", "--mode", "delta",
                         "--tokenizer", "t", "--lora", "--quantize", "4bit")  # fmt: skip
    assert finetune.main(argv) == 2
    assert "it needs --lora and --model (not --from-scratch)" in capsys.readouterr().err


def validation_loss(model, argv: list[str]) -> float:
    """`model`'s loss over the held-out blocks of the run that `argv` describes."""
    config = parse_args(argv)
    blocks = build_training_data(config, AutoTokenizer.from_pretrained(config.model), world_size=1).validation
    return loss_and_perplexity(validation_nll(model.eval(), blocks, config.batch_size, 0, 1, "cpu"))["val_loss"]


@pytest.mark.both_ends  # Transformers 5.5 and PEFT, PyTorch 2.6 and 2.15 too
@pytest.mark.parametrize("bits", BITS)
def test_validation_leaves_the_quantised_model_training_as_before(qlora_checkpoint, jsonl_corpus, tmp_path, bits):
    """A validation pass (eval mode, no gradients) between two training steps changes none of the gradients: on the
    CPU, bitsandbytes would otherwise repack the 4-bit weights for a kernel that has no backward pass."""
    config = parse_args(tiny_run_args(jsonl_corpus, tmp_path, "--model", str(qlora_checkpoint), "--lora",
                                      "--quantize", bits))  # fmt: skip
    torch.manual_seed(0)
    model = build_quantized_model(config, build_model_config(config, AutoTokenizer.from_pretrained(qlora_checkpoint)),
                                  Accelerator(cpu=True))  # fmt: skip
    ids = torch.randint(3, 500, (2, 16), generator=torch.Generator().manual_seed(0))

    def gradients() -> dict[str, torch.Tensor]:
        model.train()
        model.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}

    before = gradients()
    with torch.no_grad():
        model.eval()(input_ids=ids)
    after = gradients()
    differ = [name for name in before if not torch.equal(before[name], after[name])]
    assert not differ, differ[:3]
    assert all(gradient.abs().sum() > 0 for name, gradient in before.items() if "lora_B" in name)


@pytest.mark.both_ends  # Transformers 5.5 and PEFT, PyTorch 2.6 and 2.15 too
@pytest.mark.parametrize("bits", BITS)
def test_qlora_trains_adapters_and_routing_in_float32_and_they_load_onto_quantised_and_full_bases(
    tmp_path, jsonl_corpus, tokenizer, bits
):  # fmt: skip
    """A gated checkpoint (its routing as conversion leaves it): LoRA and every routing gate train; the adapters,
    routing included, loaded onto the quantised base give the run's last validation loss, and onto the float32 base
    nearly so (the base's quantisation aside)."""
    model = save_tiny_delta(tmp_path / "gated", tokenizer, routing_gate=True, routing_mode="delta_block", **WIDER)
    out = tmp_path / "run"
    argv = tiny_run_args(jsonl_corpus, out, "--model", str(model), "--lora", "--quantize", bits, "--max-steps", "4",
                         "--lr-routing", "1e-2", "--eval-every", "4", "--save-every", "2")  # fmt: skip
    assert finetune.main(argv) == 0
    assert not (out / "model").exists()
    saved = adapters(out)
    routing = {name: tensor for name, tensor in saved.items() if "_route." in name}
    assert any("lora_A" in name for name in saved) and any("lora_B" in name for name in saved)
    assert routing and all(tensor.dtype == torch.float32 for tensor in routing.values())
    gates = [tensor for name, tensor in routing.items() if name.endswith("gate")]
    assert gates and all(gate.abs().item() > 0 for gate in gates)  # conversion leaves them at 0
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert set(config["modules_to_save"]) == {"attn_route", "mlp_route"}
    # A checkpoint holds the parameters that train, not the quantised base.
    checkpoint = load_file(out / "checkpoints" / "step_00000004" / "model.safetensors")
    assert {name.replace(".modules_to_save.default", "").replace(".default", "") for name in checkpoint} == set(saved)

    validations = [line["val_loss"] for line in log_lines(out) if "val_loss" in line]
    on_quantised = PeftModel.from_pretrained(quantized(model, bits), out / "adapter")
    full = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), out / "adapter")
    assert validation_loss(on_quantised, argv) == pytest.approx(validations[-1], abs=2e-3)
    assert validation_loss(full, argv) == pytest.approx(validations[-1], abs=0.05)
    assert validation_loss(full.merge_and_unload(), argv) == pytest.approx(validation_loss(full, argv), abs=1e-5)


@pytest.mark.both_ends  # Transformers 5.5 and PEFT, PyTorch 2.6 and 2.15 too
def test_qlora_resumes_to_the_same_adapters(tmp_path, jsonl_corpus, qlora_checkpoint):
    common = ("--model", str(qlora_checkpoint), "--lora", "--quantize", "4bit", "--max-steps", "5", "--save-every",
              "2", "--eval-every", "100")  # fmt: skip
    assert finetune.main(tiny_run_args(jsonl_corpus, tmp_path / "straight", *common)) == 0
    interrupted = tmp_path / "interrupted"
    argv = tiny_run_args(jsonl_corpus, interrupted, *common)
    assert finetune.main([*argv, "--stop-after-step", "3"]) == 0
    assert not (interrupted / "adapter").exists()
    assert finetune.main([*argv, "--resume"]) == 0
    straight, resumed = adapters(tmp_path / "straight"), adapters(interrupted)
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)
    losses = [(line["step"], line["loss"]) for line in log_lines(interrupted) if "loss" in line]
    assert losses == [(line["step"], line["loss"]) for line in log_lines(tmp_path / "straight") if "loss" in line]
    # A finished run's adapters are not replaced without --overwrite.
    assert finetune.main(tiny_run_args(jsonl_corpus, tmp_path / "straight", *common, "--save-every", "0")) == 2


@pytest.mark.slow
def test_qlora_on_the_demo_model_learns_and_its_adapters_load(tmp_path):
    """The demo's journey with QLoRA in place of full fine-tuning, at a small budget: its small Qwen3 pre-trained
    briefly on half of Python's documentation, converted to Delta Block, then fine-tuned with `--quantize 4bit
    --lora` on documents held out from pre-training: validation loss falls, and the adapters, loaded onto the
    quantised base or the float32 one, give the run's last validation loss."""
    settings = DemoSettings(out=tmp_path, base=None, data=None, steps=40, pretrain_steps=30, device="cpu",
                            seq_len=128, num_blocks=2)  # fmt: skip
    smaller = ["--batch-size", "8"]  # half the demo's batches: under a minute on one core
    corpus = split_python_docs(tmp_path)
    tokenizer, model_config = pretraining_inputs(tmp_path, corpus["pretrain"], SMALL_BASE_CONFIG)
    model_args = ["--from-scratch", "--mode", "baseline", "--model-config", str(model_config), "--tokenizer",
                  str(tokenizer)]  # fmt: skip
    pretraining = finetune_command(settings, [], model_args, str(corpus["pretrain"]), tmp_path / "pretrain")[2:]
    assert finetune.main([*pretraining, *smaller, "--max-steps", str(settings.pretrain_steps), "--lr", "3e-3",
                          "--warmup-steps", "10"]) == 0
    converted = convert(tmp_path / "pretrain" / "model", tmp_path / "delta-block", mode="delta_block", num_blocks=2)

    out = tmp_path / "qlora"
    argv = finetune_command(settings, [], ["--model", str(converted), "--lora", "--quantize", "4bit"],
                            str(corpus["finetune"]), out)[2:]  # fmt: skip
    argv += [*smaller, "--max-steps", str(settings.steps), "--lr", "5e-3", "--lr-routing", "1e-2", "--warmup-steps", "5",
             "--eval-every", str(settings.steps)]  # fmt: skip
    assert finetune.main(argv) == 0
    validations = [line["val_loss"] for line in log_lines(out) if "val_loss" in line]
    assert len(validations) == 2 and validations[1] < validations[0] - 0.03  # 6.344 -> 6.278 here

    on_quantised = PeftModel.from_pretrained(quantized(converted, "4bit"), out / "adapter")
    full = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32),
                                     out / "adapter")  # fmt: skip
    assert validation_loss(on_quantised, argv) == pytest.approx(validations[1], abs=5e-3)
    on_full = validation_loss(full, argv)
    assert on_full < validations[0] - 0.03
