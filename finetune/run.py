"""A run from end to end: options -> tokenizer, model configuration and data (all checked before training) ->
model and optimiser prepared by accelerate -> (resume) -> training loop -> final model -> Hub."""

import sys

from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed

from delta_qwen3.errors import CommandError

from .config import FinetuneConfig, parse_args
from .data import build_training_data
from .loop import train
from .model import build_model, build_model_config, gates_as_vectors, load_tokenizer
from .optim import build_optimizer, build_schedule
from .outputs import latest_checkpoint, prepare_output_dir, push_to_hub, save_final_model


def main(argv: list[str] | None = None) -> int:
    """The `finetune` command (`python -m finetune`, `accelerate launch -m finetune`); returns the exit status."""
    try:
        return run(parse_args(argv))
    except CommandError as error:
        print(f"finetune: error: {error}", file=sys.stderr)
        return error.exit_code


def run(config: FinetuneConfig) -> int:
    """Train as `config` says. Bad input raises `CommandError` before the first training step."""
    trackers = {"none": None, "all": "all"}.get(config.report_to, [config.report_to])
    accelerator = Accelerator(mixed_precision=config.mixed_precision, log_with=trackers, project_dir=config.output_dir)
    prepare_output_dir(config, accelerator)
    if config.lora and accelerator.distributed_type == DistributedType.FSDP:
        raise CommandError("--lora is not supported with FSDP: the adapters are merged into unsharded weights")
    set_seed(config.seed)

    tokenizer = load_tokenizer(config)
    model_config = build_model_config(config, tokenizer)
    data = build_training_data(config, tokenizer, accelerator.num_processes)
    model = build_model(config, model_config)
    if accelerator.distributed_type == DistributedType.FSDP:
        gates_as_vectors(model)
    optimizer = build_optimizer(model, config)
    scheduler = build_schedule(optimizer, config)
    model, optimizer = accelerator.prepare(model, optimizer)
    # Not prepared: accelerate would step a prepared schedule once per process; it is saved with the checkpoints.
    accelerator.register_for_checkpointing(scheduler)

    start_step = 0
    checkpoint = latest_checkpoint(config.output_dir) if config.resume else None
    if checkpoint is not None:
        path, start_step = checkpoint
        accelerator.load_state(str(path))
        accelerator.print(f"resuming from {path} (step {start_step})")
    elif config.resume:
        accelerator.print(f"no checkpoint in {config.output_dir}: starting from step 0")
    if trackers:
        accelerator.init_trackers("finetune", config={k: v for k, v in config.to_dict().items() if v is not None})

    finished = train(model, optimizer, scheduler, data, config, accelerator, start_step)
    if finished:
        saved = save_final_model(accelerator, model, tokenizer, config.output_dir, config.save_dtype)
        accelerator.print(f"saved the model to {saved}")
        if config.push_to_hub and accelerator.is_main_process:
            accelerator.print(f"pushed to {push_to_hub(saved, config.push_to_hub)}")
    else:
        accelerator.print(f"stopped after step {config.stop_after_step}; continue with --resume")
    accelerator.end_training()
    return 0
