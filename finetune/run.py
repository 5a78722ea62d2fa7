"""A run from end to end: options -> tokenizer, model configuration and data (all checked before training) ->
model and optimiser prepared by accelerate -> (resume) -> training loop -> final model -> Hub."""

from accelerate import Accelerator
from accelerate.utils import DistributedType, is_tensorboard_available, is_wandb_available, parse_flag_from_env
from accelerate.utils import set_seed

from conversion.hub import check_publishable

from delta_qwen3.errors import CommandError
from delta_qwen3.interrupts import interruption, run_command
from delta_qwen3.output_paths import reporting_write_failure
from delta_qwen3.texts import documents_content

from .config import (
    DATA_CONTENT,
    INVOCATION_OPTIONS,
    MODEL_CONFIGURATION,
    RESOLVED_SETTINGS,
    TOKENIZER_CONTENT,
    FinetuneConfig,
    parse_args,
    resume_changes,
)
from .data import build_training_data
from .loop import train
from .model import (
    build_model,
    build_model_config,
    load_tokenizer,
    recorded_model_config,
    tokenizer_content,
)
from .optim import build_optimizer, build_schedule
from .outputs import (
    check_inputs_untouched,
    check_output_dir,
    load_checkpoint,
    prepare_output_dir,
    push_to_hub,
    resume_hint,
    run_config_path,
    run_directory_lock,
    save_final_model,
    saved_run_settings,
    validation_documents_path,
)
from .quantization import (
    build_quantized_model,
    check_no_adapters,
    checkpoint_trainable_parameters_only,
    push_adapters,
    save_adapters,
)


def main(argv: list[str] | None = None) -> int:
    """The `finetune` command (`python -m finetune`, `accelerate launch -m finetune`); returns the exit status: 2
    for bad input, 1 when training diverges, 130 on Ctrl-C or SIGTERM (`delta_qwen3.interrupts.run_command`)."""
    return run_command("finetune", lambda: run(parse_args(argv)))


def run_settings(config: FinetuneConfig, accelerator: Accelerator, model_config, tokenizer) -> dict:
    """What a resumed run must keep (`RESUMABLE_OPTIONS` aside): the options (those of one invocation aside), with
    the mixed precision as accelerate resolved it, the number of processes, which shares out the data, and what the
    options resolved to: the model configuration, what the data holds and the tokenizer."""
    options = {name: value for name, value in config.to_dict().items() if name not in INVOCATION_OPTIONS}
    return {**options, "mixed_precision": accelerator.mixed_precision, "num_processes": accelerator.num_processes,
            MODEL_CONFIGURATION: recorded_model_config(model_config), DATA_CONTENT: documents_content(config.data),
            TOKENIZER_CONTENT: tokenizer_content(tokenizer)}  # fmt: skip


def check_resume(config: FinetuneConfig, settings: dict, step: int, accelerator: Accelerator) -> None:
    """Refuse to resume from the checkpoint of `step` with settings that change what is trained or on what; say
    which allowed ones changed."""
    if config.max_steps < step:
        raise CommandError(f"--max-steps {config.max_steps} is before the step of the checkpoint to resume ({step})")
    saved = saved_run_settings(config.output_dir)
    if saved is None:
        accelerator.print(f"{run_config_path(config.output_dir)} is missing: the options cannot be checked")
        return
    for key, what in RESOLVED_SETTINGS.items():
        if key not in saved:
            accelerator.print(f"{run_config_path(config.output_dir)} does not record {what} (the run started with "
                              "an earlier release): it cannot be checked")  # fmt: skip
            saved = {**saved, key: settings[key]}
    refused, allowed = resume_changes(saved, settings)
    if refused:
        raise CommandError(
            f"--resume: these settings differ from those the run in {config.output_dir} started with, and would "
            f"change what is trained or on what: {'; '.join(refused)} (start a new run with another --output-dir, "
            "or with --overwrite)"
        )
    if allowed:
        accelerator.print(f"resuming with changed options: {'; '.join(allowed)}")


def check_sharding(accelerator: Accelerator) -> None:
    """Refuse a launch that asked for FSDP (`--config_file finetune/accelerate_fsdp.yaml`) where accelerate does not
    shard: it uses FSDP on GPUs only, and elsewhere would train unsharded copies, or processes unaware of each other."""
    if parse_flag_from_env("ACCELERATE_USE_FSDP") and accelerator.distributed_type != DistributedType.FSDP:
        raise CommandError(
            f"FSDP was asked for, but accelerate runs this launch as {accelerator.distributed_type.value} with "
            f"{accelerator.num_processes} process(es): it shards with FSDP on GPUs only; on the CPU launch without "
            "the FSDP configuration (accelerate launch --cpu --num_processes 2 -m finetune ...)"
        )


def check_needed_at_the_end(config: FinetuneConfig) -> None:
    """What the run needs only after training, checked before it starts: the Hub to publish to, and the experiment
    tracker's package (accelerate would only warn, and track nothing)."""
    if config.push_to_hub:
        check_publishable(config.push_to_hub, "--push-to-hub")
    available = {"tensorboard": is_tensorboard_available, "wandb": is_wandb_available}
    wanted = list(available) if config.report_to == "all" else [name for name in available if name == config.report_to]
    missing = [name for name in wanted if not available[name]()]
    if missing and (config.report_to != "all" or len(missing) == len(available)):
        raise CommandError(f"--report-to {config.report_to}: {' and '.join(missing)} is not installed "
                           f"(pip install {' '.join(missing)})")  # fmt: skip


def start_accelerator(config: FinetuneConfig, trackers) -> Accelerator:
    """accelerate's state for the run; what it refuses of the options (a mixed precision that the device lacks,
    say) is one line naming them, not a traceback from inside accelerate."""
    try:
        return Accelerator(mixed_precision=config.mixed_precision, log_with=trackers, project_dir=config.output_dir)
    except (ValueError, RuntimeError, TypeError) as error:
        reason = " ".join(str(error).split())
        raise CommandError(f"accelerate cannot start the run on this machine: {reason} (--mixed-precision "
                           f"{config.mixed_precision}, and the launch's accelerate configuration)") \
            from None  # fmt: skip


def run(config: FinetuneConfig) -> int:
    """Train as `config` says. Bad input raises `CommandError` before anything is written to --output-dir, which
    the run holds locked for its life (`run_directory_lock`)."""
    check_needed_at_the_end(config)
    trackers = {"none": None, "all": "all"}.get(config.report_to, [config.report_to])
    accelerator = start_accelerator(config, trackers)
    check_sharding(accelerator)
    check_inputs_untouched(config)
    with run_directory_lock(config, accelerator):
        return _run(config, accelerator, trackers)


def _run(config: FinetuneConfig, accelerator: Accelerator, trackers) -> int:
    checkpoint = check_output_dir(config)
    if config.quantize:
        check_no_adapters(config)
    if config.lora and accelerator.distributed_type == DistributedType.FSDP:
        raise CommandError("--lora is not supported with FSDP: the adapters are merged into unsharded weights")
    tokenizer = load_tokenizer(config)
    model_config = build_model_config(config, tokenizer)
    settings = run_settings(config, accelerator, model_config, tokenizer)
    if checkpoint is not None:
        check_resume(config, settings, checkpoint[1], accelerator)
    elif config.resume:
        accelerator.print(f"no checkpoint in {config.output_dir}: starting from step 0")

    set_seed(config.seed)
    data = build_training_data(config, tokenizer, accelerator.num_processes)
    if config.quantize:
        model = build_quantized_model(config, model_config, accelerator)
    else:
        model = build_model(config, model_config)
    optimizer = build_optimizer(model, config)
    scheduler = build_schedule(optimizer, config)
    model, optimizer = accelerator.prepare(model, optimizer)
    # Not prepared: accelerate would step a prepared schedule once per process; it is saved with the checkpoints.
    accelerator.register_for_checkpointing(scheduler)
    if config.quantize:
        checkpoint_trainable_parameters_only(accelerator)

    start_step = 0
    if checkpoint is not None:  # before anything is written: a checkpoint that cannot load leaves the run as it was
        path, start_step = checkpoint
        load_checkpoint(accelerator, config.output_dir, path, start_step)
        accelerator.print(f"resuming from {path} (step {start_step})")
    with reporting_write_failure("--output-dir", config.output_dir, "nothing was trained"):
        prepare_output_dir(config, accelerator, settings, None if checkpoint is None else checkpoint[1])
        if accelerator.is_main_process:  # the documents validation reads, for scoring the run on exactly them later
            data.save_validation_texts(validation_documents_path(config.output_dir))
    if trackers:
        accelerator.init_trackers("finetune", config={k: v for k, v in config.to_dict().items() if v is not None})
    finished = train(model, optimizer, scheduler, data, config, accelerator, start_step)
    if finished:
        outcome = f"the final model was not saved; {resume_hint(config.output_dir)}"
        try:
            with reporting_write_failure("--output-dir", config.output_dir, outcome):
                if config.quantize:  # merged into the quantised base, the adapters would be rounded to its precision
                    saved = save_adapters(accelerator, model, tokenizer, config.output_dir)
                else:
                    saved = save_final_model(accelerator, model, tokenizer, config.output_dir, config.save_dtype)
        except KeyboardInterrupt as interrupt:
            raise interruption(interrupt, outcome) from None
        accelerator.print(f"saved the {'adapters' if config.quantize else 'model'} to {saved}")
        if config.push_to_hub and accelerator.is_main_process:
            push = push_adapters if config.quantize else push_to_hub
            accelerator.print(f"pushed to {push(saved, config.push_to_hub)}")
    else:
        accelerator.print(f"stopped after step {config.stop_after_step}; continue with --resume")
    accelerator.end_training()
    return 0
