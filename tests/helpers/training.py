"""Small builders shared by the fine-tuning tests: a real text corpus on disk, a tiny DeltaQwen3 checkpoint, and
the options of a tiny run (the module fixtures made of them are in `tests/finetune/conftest.py`)."""

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file

from delta_qwen3.corpus import python_docs_texts
from modeling_delta_qwen3 import DeltaQwen3Config, DeltaQwen3ForCausalLM

from .models import tiny_qwen3_config, write_scalar_gates
from .paths import REPO_ROOT

# Small enough that a training step takes milliseconds on one CPU core.
TINY_SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16)  # fmt: skip


def write_corpus(path: Path) -> Path:
    """Python's documentation as JSON lines (one document per line) when `path` ends in `.jsonl`, else as a
    directory of text files (one document each)."""
    texts = python_docs_texts()
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
        return path
    path.mkdir()
    for number, text in enumerate(texts):
        (path / f"{number:03d}.txt").write_text(text)
    return path


def save_tiny_delta(path: Path, tokenizer, seed: int = 0, **overrides) -> Path:
    """A freshly initialised tiny DeltaQwen3 checkpoint with its tokenizer (routing queries 0, norms 1)."""
    fields = {
        **tiny_qwen3_config(**TINY_SHAPE).to_dict(),
        "routing_mode": "delta",
        "routing_num_blocks": 2,
        **overrides,
    }
    torch.manual_seed(seed)
    DeltaQwen3ForCausalLM(DeltaQwen3Config(**fields)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny_run_args(data: Path, output_dir: Path, *extra: str) -> list[str]:
    """Command-line options of a few-step run of a tiny model on 32-token blocks (the model is in `extra`)."""
    return [
        "--data", str(data), "--output-dir", str(output_dir),
        "--seq-len", "32", "--batch-size", "4", "--val-blocks", "8", "--warmup-steps", "2", "--lr", "3e-3",
        "--log-every", "1", *extra,
    ]  # fmt: skip


def write_0d_gate_run_checkpoint(checkpoint: Path) -> None:
    """Rewrite a run's checkpoint as runs saved it before the routing gates became `[1]` (SPEC section 4): the
    gates 0-d, and so their moments in the optimizer's state (the tiny model's only one-element parameters)."""
    assert write_scalar_gates(checkpoint)
    optimizer = torch.load(checkpoint / "optimizer.bin", weights_only=False)
    for state in optimizer["state"].values():
        for moment in ("exp_avg", "exp_avg_sq"):
            state[moment] = state[moment].reshape(()) if state[moment].shape == (1,) else state[moment]
    torch.save(optimizer, checkpoint / "optimizer.bin")


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a (single-file) safetensors checkpoint."""
    return load_file(model_dir / "model.safetensors")


def log_lines(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "train_log.jsonl").read_text().splitlines()]


def run_env() -> dict:
    """The environment of a training subprocess: this project importable, offline, one thread."""
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
