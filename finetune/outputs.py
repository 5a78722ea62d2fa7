"""The run directory: training-state checkpoints, the log, and the final model; each written to a temporary
directory beside its target and renamed into place when complete (`delta_qwen3.atomic.staged_directory`), so a
killed run never leaves half a checkpoint.

    OUT/checkpoints/step_00000500/   accelerate state: model, optimiser, schedule, random generators
    OUT/train_log.jsonl              one JSON object per log line or validation
    OUT/run_config.json              the run's settings, which a --resume must keep (`RESUMABLE_OPTIONS` aside)
    OUT/validation_documents.jsonl   the text validation reads: held-out documents, or a single one's end
    OUT/model/                       the final model (`save_pretrained`, remote code included) and tokenizer
"""

import contextlib
import json
import math
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import accelerate.checkpointing
import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

from conversion import hub
from delta_qwen3.atomic import atomic_output, staged_directory, write_json
from delta_qwen3.checkpoints import loading
from delta_qwen3.errors import CommandError
from delta_qwen3.output_paths import check_not_an_input, output_lock, refused_growth, reporting_write_failure
from delta_qwen3.output_paths import check_output_dir as check_output_path
from modeling_delta_qwen3 import DeltaQwen3Config

from .config import FinetuneConfig
from .model import merge_lora

CHECKPOINT_PREFIX = "step_"
CHECKPOINT_NAME = re.compile(rf"{CHECKPOINT_PREFIX}(\d+)")
LOG_NAME = "train_log.jsonl"
RUN_CONFIG_NAME = "run_config.json"
VALIDATION_NAME = "validation_documents.jsonl"
MODEL_NAME = "model"


def checkpoints_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def log_path(output_dir: str | Path) -> Path:
    return Path(output_dir) / LOG_NAME


def validation_documents_path(output_dir: str | Path) -> Path:
    return Path(output_dir) / VALIDATION_NAME


def model_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / MODEL_NAME


def run_config_path(output_dir: str | Path) -> Path:
    return Path(output_dir) / RUN_CONFIG_NAME


def checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """The complete checkpoints in `output_dir` as (step, path), oldest first: the directories named `step_` and a
    number only, so that neither an interrupted save's temporary directory nor anything else put there (a copy
    named `step_00000002.bak`) is taken for one, or rotated away as one."""
    found = []
    for path in checkpoints_dir(output_dir).glob(f"{CHECKPOINT_PREFIX}*"):
        match = CHECKPOINT_NAME.fullmatch(path.name)
        if match and path.is_dir():
            found.append((int(match[1]), path))
    return sorted(found)


def latest_checkpoint(output_dir: str | Path) -> tuple[Path, int] | None:
    """The most recent complete checkpoint and its step."""
    found = checkpoints(output_dir)
    if not found:
        return None
    step, path = found[-1]
    return path, step


def load_checkpoint(accelerator: Accelerator, output_dir: str | Path, path: Path, step: int) -> None:
    """Load the training state of the checkpoint `path` (of `step`); one that cannot load is refused in one line
    naming it and the checkpoint before it, which a damaged one leaves to resume from."""
    earlier = [(number, older) for number, older in checkpoints(output_dir) if number < step]
    then = (f"continues from the checkpoint of step {earlier[-1][0]} ({earlier[-1][1]})" if earlier
            else "starts again from step 0")  # fmt: skip
    advice = (f"either the run started with another model (resume with the options it started with), or the "
              f"checkpoint is damaged (truncated?): moved out of {checkpoints_dir(output_dir)}, --resume then {then}")
    with loading(f"the checkpoint to resume, {path}", advice), weights_only_state_files():
        accelerator.load_state(str(path), load_kwargs={"weights_only": True})


@contextlib.contextmanager
def weights_only_state_files():
    """While a checkpoint loads, every state file accelerate reads back (optimizer, schedule, random generators,
    sampler, scaler, and the objects registered for checkpointing, which accelerate itself unpickles in full) is read
    with `torch.load(weights_only=True)`: tensors, numbers, strings and containers of them, and the numpy arrays of
    the random generators' state, never an object whose unpickling runs code. Transformers' Trainer reads its state
    the same way. The model's weights are safetensors. A file that holds anything else is refused by the loader."""
    original = accelerate.checkpointing.load

    def weights_only(*args, **kwargs):
        return original(*args, **{**kwargs, "weights_only": True})

    accelerate.checkpointing.load = weights_only
    try:
        yield
    finally:
        accelerate.checkpointing.load = original


def stopped_at(step: int, output_dir: str | Path) -> str:
    """What a run that stopped after `step` leaves, and how to continue it: for the message of an interrupted or
    failed run."""
    return f"stopped at step {step}; {resume_hint(output_dir)}"


def resume_hint(output_dir: str | Path) -> str:
    """How to continue the run in `output_dir` now, for the message of an interrupted run."""
    checkpoint = latest_checkpoint(output_dir)
    if checkpoint is None:
        return "no checkpoint was saved, so --resume starts again from step 0"
    return f"continue with --resume (from the checkpoint of step {checkpoint[1]})"


def check_output_dir(config: FinetuneConfig) -> tuple[Path, int] | None:
    """Check the run directory before anything is loaded, writing nothing; return the checkpoint to resume from
    (None: the run starts at step 0). Refuse to mix a new run with an earlier one's outputs unless told to resume,
    or to overwrite them."""
    output_dir = Path(config.output_dir)
    check_output_path(output_dir, "--output-dir", overwrite=True)  # a directory, or creatable; contents below
    if not (config.resume or config.overwrite):
        if model_dir(output_dir).exists():
            raise CommandError(f"--output-dir {output_dir} already holds a final model; pass --overwrite to replace it")
        if latest_checkpoint(output_dir) is not None:
            raise CommandError(
                f"--output-dir {output_dir} already holds checkpoints; pass --resume to continue that run "
                "or --overwrite to start again"
            )
    return latest_checkpoint(output_dir) if config.resume else None


def run_outputs(output_dir: str | Path) -> list[Path]:
    """What a run writes in its directory: checkpoints, the final model (or a quantised run's adapters), the log,
    its settings, the validation text."""
    from .quantization import adapter_dir  # it imports this module's neighbours: imported when needed

    return [checkpoints_dir(output_dir), model_dir(output_dir), adapter_dir(output_dir), log_path(output_dir),
            run_config_path(output_dir), validation_documents_path(output_dir)]  # fmt: skip


def check_inputs_untouched(config: FinetuneConfig) -> None:
    """Refuse a run directory whose outputs would overwrite, or be written into, what the run reads: the model, the
    tokenizer, the data, the model configuration file (`check_not_an_input`)."""
    inputs = [("--model", config.model), ("--tokenizer", config.tokenizer), ("--data", config.data),
              ("--model-config", config.model_config)]  # fmt: skip
    check_not_an_input("--output-dir", config.output_dir, run_outputs(config.output_dir), inputs)


@contextlib.contextmanager
def run_directory_lock(config: FinetuneConfig, accelerator: Accelerator) -> Iterator[None]:
    """The run directory's lock (`output_lock`), held by the main process for the run's life, so that two runs
    started into one directory cannot interleave their logs and checkpoints; every process stops alike when the
    directory is in use."""
    with contextlib.ExitStack() as stack:
        refusal = None
        if accelerator.is_main_process:
            try:
                stack.enter_context(output_lock("--output-dir", config.output_dir, inside=True))
            except CommandError as error:
                refusal = (type(error), str(error))
        if accelerator.num_processes > 1:
            [refusal] = broadcast_object_list([refusal])
        if refusal is not None:
            raise refusal[0](refusal[1])
        yield


def saved_run_settings(output_dir: str | Path) -> dict | None:
    """The settings recorded when the run in `output_dir` started (`prepare_output_dir`); None if not recorded."""
    path = run_config_path(output_dir)
    if not path.exists():
        return None
    try:
        settings = json.loads(path.read_text())
    except ValueError as error:
        raise CommandError(f"{path} is not valid JSON ({error}); the run's settings cannot be compared") from None
    if not isinstance(settings, dict):
        raise CommandError(f"{path} holds a JSON {type(settings).__name__}, not the run's settings (an object); they "
                           "cannot be compared")  # fmt: skip
    return settings


def prepare_output_dir(
    config: FinetuneConfig, accelerator: Accelerator, settings: dict, resumed_step: int | None
) -> None:  # fmt: skip
    """Make the run directory ready once everything is loaded and checked, so that a run that fails before
    training writes nothing: create it; for --overwrite remove the earlier checkpoints (the earlier model is
    replaced at the end); keep the log only up to `resumed_step`, the checkpoint the run resumes from (the steps
    after it are logged again), none of it for a run from step 0; record `settings` for a later --resume."""
    output_dir = Path(config.output_dir)
    accelerator.wait_for_everyone()  # every process has checked everything before the main one changes anything
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        if config.overwrite:
            shutil.rmtree(checkpoints_dir(output_dir), ignore_errors=True)
        _keep_log_until(log_path(output_dir), resumed_step)
        write_json(run_config_path(output_dir), settings)
    accelerator.wait_for_everyone()


def _keep_log_until(path: Path, step: int | None) -> None:
    """Drop the lines of the log at `path` after `step` (every line for None). A line that is not JSON was cut
    short when the run was killed, after its last checkpoint."""
    if step is None or not path.exists():
        path.unlink(missing_ok=True)
        return
    kept = [line for line in path.read_text().splitlines(keepends=True) if _logged_step(line) <= step]
    with atomic_output(path) as temporary:
        temporary.write_text("".join(kept))


def _logged_step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf


def save_checkpoint(accelerator: Accelerator, output_dir: str | Path, step: int, keep: int) -> Path:
    """Save the training state after `step`, keeping the `keep` most recent (0: all). All processes call this and
    write into the main process's staging directory, which it renames into place once every process is done; a
    write that fails is one line naming the checkpoint, and nothing of it is kept."""
    target = checkpoints_dir(output_dir) / f"{CHECKPOINT_PREFIX}{step:08d}"
    with (
        reporting_write_failure("the checkpoint", target, stopped_at(step, output_dir)),
        staged_directory(target) if accelerator.is_main_process else contextlib.nullcontext() as staging,
    ):
        [staging] = broadcast_object_list([staging])
        _save_state(accelerator, Path(staging))
        accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        for _, old in checkpoints(output_dir)[: -keep if keep else 0]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return target


def _save_state(accelerator: Accelerator, staging: Path) -> None:
    try:
        accelerator.save_state(str(staging))
    except RuntimeError as error:
        # PyTorch's file writer (the optimizer state, through torch.save) names no cause for a failed write.
        refusal = refused_growth(staging)
        if refusal is None:
            raise
        raise refusal from error


def save_final_model(accelerator: Accelerator, model, tokenizer, output_dir: str | Path, dtype: str) -> Path:
    """Save the trained model as an ordinary checkpoint (LoRA merged) with its tokenizer; all processes call
    this (sharded training gathers the weights)."""
    unwrapped = accelerator.unwrap_model(model)
    final = merge_lora(unwrapped)
    # LoRA runs are never sharded, so their merged weights are complete in every process.
    state_dict = final.state_dict() if final is not unwrapped else accelerator.get_state_dict(model)
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
