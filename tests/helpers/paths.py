"""Where the project, its model code and the environments `make test` builds beside the main one are."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = ("modeling_delta_qwen3", "conversion", "finetune", "eval", "delta_qwen3", "demo")
# The model's code as a checkpoint ships it: every module of the package but its `__init__`.
MODEL_CODE_FILES = sorted(p.name for p in (REPO_ROOT / "modeling_delta_qwen3").glob("*.py") if p.name != "__init__.py")
# vLLM's CPU build in its own environment, without this project: `make test` creates it.
VLLM_PATH = REPO_ROOT / ".venv-vllm"
VLLM_PYTHON = VLLM_PATH / "bin" / "python"
# flash-linear-attention's core and Triton, installed beside the main environment for the Triton interpreter:
# `make test` creates it.
FLA_PATH = REPO_ROOT / ".venv-fla"
# The oldest and the newest supported PyTorch (with Transformers, at the oldest), each with the Triton its CUDA wheels
# pin: `make test` creates them.
OLDEST_PATH = REPO_ROOT / ".venv-oldest"
NEWEST_TORCH_PATH = REPO_ROOT / ".venv-torch-2.15"
