"""The run directory: training-state checkpoints, the log, and the final model; each written to a temporary
directory beside its target and renamed into place when complete (`delta_qwen3.atomic.staged_directory`), so a
killed run never leaves half a checkpoint.

    OUT/checkpoints/step_00000500/   accelerate state: model, optimiser, schedule, random generators
    OUT/train_log.jsonl              one JSON object per log line or validation
    OUT/model/                       the final model (`save_pretrained`, remote code included) and tokenizer
"""

import contextlib
import json
import shutil
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

from conversion import hub
from delta_qwen3.atomic import staged_directory
from delta_qwen3.errors import CommandError
from modeling_delta_qwen3 import DeltaQwen3Config

from .config import FinetuneConfig
from .model import gates_as_scalars, merge_lora

CHECKPOINT_PREFIX = "step_"
LOG_NAME = "train_log.jsonl"
MODEL_NAME = "model"


def checkpoints_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def log_path(output_dir: str | Path) -> Path:
    return Path(output_dir) / LOG_NAME


def model_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / MODEL_NAME


def latest_checkpoint(output_dir: str | Path) -> tuple[Path, int] | None:
    """The most recent complete checkpoint and its step (temporary directories of interrupted saves are ignored)."""
    found = [
        (int(p.name[len(CHECKPOINT_PREFIX) :]), p) for p in checkpoints_dir(output_dir).glob(f"{CHECKPOINT_PREFIX}*")
    ]
    if not found:
        return None
    step, path = max(found)
    return path, step


def prepare_output_dir(config: FinetuneConfig, accelerator: Accelerator) -> None:
    """Create the run directory. Refuse to mix a new run with an earlier one's outputs unless told to resume, or
    to overwrite: then the earlier checkpoints and log are removed (its model is replaced at the end)."""
    output_dir = Path(config.output_dir)
    if not (config.resume or config.overwrite):
        if model_dir(output_dir).exists():
            raise CommandError(f"--output-dir {output_dir} already holds a final model; pass --overwrite to replace it")
        if latest_checkpoint(output_dir) is not None:
            raise CommandError(
                f"--output-dir {output_dir} already holds checkpoints; pass --resume to continue that run "
                "or --overwrite to start again"
            )
    accelerator.wait_for_everyone()  # every process has checked before the main one changes anything
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        if config.overwrite:
            shutil.rmtree(checkpoints_dir(output_dir), ignore_errors=True)
            log_path(output_dir).unlink(missing_ok=True)
    accelerator.wait_for_everyone()


def save_checkpoint(accelerator: Accelerator, output_dir: str | Path, step: int, keep: int) -> Path:
    """Save the training state after `step`, keeping the `keep` most recent (0: all). All processes call this and
    write into the main process's staging directory, which it renames into place once every process is done."""
    root = checkpoints_dir(output_dir)
    target = root / f"{CHECKPOINT_PREFIX}{step:08d}"
    with staged_directory(target) if accelerator.is_main_process else contextlib.nullcontext() as staging:
        [staging] = broadcast_object_list([staging])
        accelerator.save_state(str(staging))
        accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        checkpoints = sorted(root.glob(f"{CHECKPOINT_PREFIX}*"))
        for old in checkpoints[: -keep if keep else 0]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return target


def save_final_model(accelerator: Accelerator, model, tokenizer, output_dir: str | Path, dtype: str) -> Path:
    """Save the trained model as an ordinary checkpoint (LoRA merged) with its tokenizer; all processes call
    this (sharded training gathers the weights)."""
    unwrapped = accelerator.unwrap_model(model)
    final = merge_lora(unwrapped)
    # LoRA runs are never sharded, so their merged weights are complete in every process.
    state_dict = gates_as_scalars(final.state_dict() if final is not unwrapped else accelerator.get_state_dict(model))
    target = model_dir(output_dir)
    if accelerator.is_main_process:
        final.config.dtype = dtype
        with staged_directory(target) as staging:
            final.save_pretrained(staging, state_dict=_cast(state_dict, getattr(torch, dtype)))
            tokenizer.save_pretrained(staging)
    accelerator.wait_for_everyone()
    return target


def _cast(state_dict: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Floating-point tensors in `dtype`; tensors that shared storage (tied embeddings) still share it, which is
    how `save_pretrained` recognises tied weights."""
    cast: dict[tuple, torch.Tensor] = {}
    result = {}
    for name, tensor in state_dict.items():
        if tensor.is_floating_point():
            key = (tensor.data_ptr(), tuple(tensor.shape))
            if key not in cast:
                cast[key] = tensor.detach().to(dtype)
            tensor = cast[key]
        result[name] = tensor
    return result


def push_to_hub(folder: Path, repo_id: str) -> str:
    """Publish the final model directory to the Hub repository `repo_id` (created if missing); returns the commit
    URL. A DeltaQwen3 model goes through the checked upload with its model card (`conversion.hub.push_to_hub`, as
    `delta-qwen3 push` does); the Qwen3 baseline, which has no routing to describe, is uploaded as it is."""
    model_type = json.loads((Path(folder) / "config.json").read_text()).get("model_type")
    if model_type == DeltaQwen3Config.model_type:
        return hub.push_to_hub(folder, repo_id)
    return hub.upload_folder(Path(folder), repo_id, commit_message="Upload Qwen3 baseline trained with finetune")
