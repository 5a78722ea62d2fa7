"""Small builders shared by the fine-tuning tests: a real text corpus on disk, a tiny DeltaQwen3 checkpoint, and
the options of a tiny run; and the module fixtures made of them (import them by name into a test module)."""

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, tiny_qwen3_config
from safetensors.torch import load_file

from delta_qwen3.corpus import python_docs_texts
from modeling_delta_qwen3 import DeltaQwen3Config, DeltaQwen3ForCausalLM

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


@pytest.fixture(scope="module")
def jsonl_corpus(tmp_path_factory) -> Path:
    """Python's documentation as a JSON-lines file."""
    return write_corpus(tmp_path_factory.mktemp("corpus") / "python_docs.jsonl")


@pytest.fixture(scope="module")
def delta_checkpoint(tmp_path_factory, tokenizer) -> Path:
    """A tiny ungated delta-mode checkpoint with its tokenizer."""
    return save_tiny_delta(tmp_path_factory.mktemp("delta") / "tiny-delta", tokenizer)


def tiny_run_args(data: Path, output_dir: Path, *extra: str) -> list[str]:
    """Command-line options of a few-step run of a tiny model on 32-token blocks (the model is in `extra`)."""
    return [
        "--data", str(data), "--output-dir", str(output_dir),
        "--seq-len", "32", "--batch-size", "4", "--val-blocks", "8", "--warmup-steps", "2", "--lr", "3e-3",
        "--log-every", "1", *extra,
    ]  # fmt: skip


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a (single-file) safetensors checkpoint."""
    return load_file(model_dir / "model.safetensors")


def log_lines(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "train_log.jsonl").read_text().splitlines()]


def file_hashes(root: Path) -> dict[str, str]:
    """SHA-256 of every file under `root` by its relative path: what a failed command must leave as it was."""
    files = (path for path in root.rglob("*") if path.is_file())
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest() for path in files}


def run_env() -> dict:
    """The environment of a training subprocess: this project importable, offline, one thread."""
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
