"""Shared fixtures: tiny Qwen3 checkpoints with random weights, a tokenizer trained on Python's documentation,
and a way to run code in a fresh interpreter where this project cannot be imported."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from spec_reference import randomize_routing
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from delta_qwen3.corpus import python_docs_texts, train_bpe_tokenizer
from modeling_delta_qwen3 import DeltaQwen3Config, DeltaQwen3ForCausalLM

REPO_ROOT = Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = ("modeling_delta_qwen3", "conversion", "finetune", "eval", "delta_qwen3", "demo")
# The model's code as a checkpoint ships it: every module of the package but its `__init__`.
MODEL_CODE_FILES = sorted(p.name for p in (REPO_ROOT / "modeling_delta_qwen3").glob("*.py") if p.name != "__init__.py")
TINY_VOCAB = 512
# vLLM's CPU build in its own environment, without this project: `make test` creates it.
VLLM_PYTHON = REPO_ROOT / ".venv-vllm" / "bin" / "python"
# flash-linear-attention's core and Triton, installed beside the main environment for the Triton interpreter:
# `make test` creates it.
FLA_PATH = REPO_ROOT / ".venv-fla"


def tiny_qwen3_config(**overrides) -> Qwen3Config:
    """A Qwen3 shape small enough for many CPU forward and backward passes."""
    fields = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    fields.update(overrides)
    return Qwen3Config(**fields)


@pytest.fixture(scope="session")
def tokenizer():
    return train_bpe_tokenizer(python_docs_texts(), vocab_size=TINY_VOCAB)


def save_tiny_qwen3(path: Path, tokenizer, seed: int = 0, max_shard_size: str = "100KB", **overrides) -> Path:
    """Save a random tiny `Qwen3ForCausalLM` as the Hub would serve it: sharded safetensors, tokenizer,
    generation config."""
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(tiny_qwen3_config(**overrides)).eval()
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=2, do_sample=False)
    model.save_pretrained(path, max_shard_size=max_shard_size)
    tokenizer.save_pretrained(path)
    return path


def save_random_delta(path: Path, mode: str, **overrides) -> DeltaQwen3ForCausalLM:
    """Save a tiny DeltaQwen3 in routing `mode` (gated in the delta modes, 2 blocks) whose routing parameters are all
    random and non-zero (`randomize_routing`), so that routing changes what it computes; returns the model.
    `overrides` change the Qwen3 shape."""
    fields = tiny_qwen3_config(initializer_range=0.1, **overrides).to_dict()
    fields.pop("model_type")
    gated = mode.startswith("delta")
    torch.manual_seed(0)
    model = DeltaQwen3ForCausalLM(DeltaQwen3Config(**fields, routing_mode=mode, routing_gate=gated, routing_num_blocks=2))
    randomize_routing(model.eval())
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="session")
def qwen3_checkpoint(tmp_path_factory, tokenizer) -> Path:
    """A sharded tiny Qwen3 checkpoint on disk. Treat it as read-only: it is shared by the session."""
    return save_tiny_qwen3(tmp_path_factory.mktemp("qwen3") / "tiny-qwen3", tokenizer)


def isolated_env() -> dict:
    """The environment for a fresh interpreter: PYTHONPATH without this project, offline, deterministic."""
    env = dict(os.environ)
    entries = [Path(p).resolve() for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    kept = [str(p) for p in entries if p != REPO_ROOT]  # absolute: the subprocess runs elsewhere
    env["PYTHONPATH"] = os.pathsep.join(kept)
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONHASHSEED="0")
    return env


_BLOCK_PROJECT = f"""
import importlib.abc, sys
class _BlockProject(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {PROJECT_PACKAGES!r}:
            raise ImportError(f"{{name}} belongs to the project, which this process must not import")
sys.meta_path.insert(0, _BlockProject())
"""


def run_without_project(
    code: str, cwd: Path, timeout: int = 300, python: str | Path = sys.executable, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (`python`, by default this one; `env` is added to `isolated_env()`) in which
    none of this project's packages can be imported, the way a user who only has Transformers loads a checkpoint with
    `trust_remote_code=True`; with stdin closed, as in a batch job, so a question on the terminal fails instead of
    waiting. Raises with its output on failure."""
    script = _BLOCK_PROJECT + textwrap.dedent(code)
    result = subprocess.run(
        [str(python), "-c", script], cwd=cwd, env=isolated_env() | (env or {}), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(f"subprocess failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def last_json_line(stdout: str):
    """The last line of a subprocess's output, parsed as JSON: how isolated scripts report values."""
    return json.loads(stdout.strip().splitlines()[-1])


def pytest_report_header(config):
    import transformers

    return f"transformers {transformers.__version__} ({Path(transformers.__file__).parent})"
