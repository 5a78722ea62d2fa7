"""The training loop: optimiser steps over micro-batches, logging, periodic validation and checkpoints."""

import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from delta_qwen3.errors import RunError
from delta_qwen3.interrupts import interruption
from delta_qwen3.jsonl import json_text
from delta_qwen3.output_paths import is_write_failure, write_failure
from delta_qwen3.sharpness import mean_max_weights, point_max_weights

from .config import FinetuneConfig
from .data import TrainingData
from .evaluation import loss_and_perplexity, validation_nll
from .outputs import log_path, save_checkpoint, stopped_at

NO_STEP = 2**62  # `DivergenceWatch`'s "no non-finite step yet"


class DivergenceWatch:
    """Notes, on the device and without waiting for it, the first step whose loss or gradient norm is not finite.
    `check` runs at every step where the run writes anything (a log line, a validation, a checkpoint, the final
    model): from the first non-finite step on, nothing is validated or saved, so the checkpoints before it are kept
    (their rotation only runs when a checkpoint is saved).

    Under fp16 loss scaling, an infinite gradient norm is the scaler's signal to skip the step and lower the scale,
    not divergence: there only the loss is watched."""

    def __init__(self, accelerator: Accelerator):
        self.accelerator = accelerator
        self.watched = ("loss",) if accelerator.scaler is not None else ("loss", "grad_norm")
        self.first_step = torch.full((1,), NO_STEP, dtype=torch.long, device=accelerator.device)

    def observe(self, step: int, metrics: dict[str, torch.Tensor]) -> None:
        finite = torch.stack([metrics[name].float() for name in self.watched]).isfinite().all()
        self.first_step = torch.where(finite, self.first_step, self.first_step.clamp(max=step))

    def check(self) -> None:
        """Raise `RunError` in every process if any process saw a non-finite value (a collective
        operation: every process calls it at the same steps)."""
        first = self.accelerator.gather(self.first_step).min().item()
        if first != NO_STEP:
            raise RunError(
                f"training diverged: the loss or gradient norm is not finite at step {first}; nothing from that step "
                "on was validated or saved (a lower --lr may help)"
            )


class MetricsLog:
    """Appends `{"step": ..., **values}` lines to OUT/train_log.jsonl (main process) and hands the values to the
    accelerate trackers."""

    def __init__(self, path: Path, accelerator: Accelerator):
        self.path = path
        self.accelerator = accelerator

    def write(self, step: int, values: dict) -> None:
        self.accelerator.log(values, step=step)
        if self.accelerator.is_main_process:
            with self.path.open("a") as file:
                file.write(json_text({"step": step, **values}) + "\n")


def validate(model, data: TrainingData, config: FinetuneConfig, accelerator: Accelerator) -> dict[str, float]:
    """Validation loss and perplexity over all held-out blocks, summed over processes."""
    model.eval()
    batch_size = config.eval_batch_size or config.batch_size
    totals = validation_nll(
        model, data.validation, batch_size, accelerator.process_index, accelerator.num_processes, accelerator.device
    )
    model.train()
    return loss_and_perplexity(accelerator.reduce(totals, reduction="sum"))


def train_step(
    model, optimizer, scheduler, accelerator: Accelerator, batches: Iterator[torch.Tensor], config: FinetuneConfig,
    with_routing: bool,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """One optimiser step over `config.grad_accum` micro-batches. Returns this process's mean `loss`, the
    `grad_norm` before clipping, and (when `with_routing`) the routing sharpness of the last micro-batch."""
    loss_sum = torch.zeros((), device=accelerator.device)
    sharpness = {}
    for micro_step in range(config.grad_accum):
        last = micro_step == config.grad_accum - 1
        input_ids = next(batches).to(accelerator.device)
        extra = {"output_routing_weights": True} if with_routing and last else {}
        # Gradients are all-reduced once per optimiser step, after the last micro-batch.
        with contextlib.nullcontext() if last else accelerator.no_sync(model):
            output = model(input_ids=input_ids, labels=input_ids, use_cache=False, **extra)
            accelerator.backward(output.loss / config.grad_accum)
        loss_sum += output.loss.detach()
        if extra:
            weights = output.routing_weights
            sharpness = mean_max_weights(point_max_weights(weights), [w.shape[-1] for w in weights])
    metrics = {"loss": loss_sum / config.grad_accum}
    # Without clipping, the infinite bound leaves the gradients as they are and still gives their norm.
    metrics["grad_norm"] = accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm or math.inf)
    metrics.update({name: value.detach() for name, value in sharpness.items() if value is not None})
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return metrics


def learning_rates(optimizer) -> dict[str, float]:
    """`lr` of the base parameters and `lr_routing` of the routing parameters (when they train)."""
    return {"lr_routing" if group["name"] == "routing" else "lr": group["lr"] for group in optimizer.param_groups}


def train(
    model, optimizer, scheduler, data: TrainingData, config: FinetuneConfig, accelerator: Accelerator,
    start_step: int = 0,
) -> bool:  # fmt: skip
    """Train from `start_step` to `config.max_steps`. Returns False when stopped early by `--stop-after-step`.
    Raises `RunError` at the first write after a non-finite loss or gradient norm, or when the log or a checkpoint
    cannot be written, and an `Interrupted` that says how to continue on Ctrl-C or SIGTERM."""
    log = MetricsLog(log_path(config.output_dir), accelerator)
    reports_routing = hasattr(accelerator.unwrap_model(model).config, "routing_mode")
    tokens_per_step = config.batch_size * config.grad_accum * accelerator.num_processes * config.seq_len
    # Each process resumes its data stream after the blocks it consumed before the checkpoint.
    consumed = start_step * config.grad_accum * config.batch_size
    batches = data.batches(config.batch_size, accelerator.process_index, accelerator.num_processes, consumed)
    progress = tqdm(
        total=config.max_steps, initial=start_step, desc="training", disable=not accelerator.is_local_main_process
    )
    watch = DivergenceWatch(accelerator)

    def run_validation(step: int) -> None:
        values = validate(model, data, config, accelerator)
        log.write(step, values)
        progress.write(f"step {step}: validation loss {values['val_loss']:.4f}, perplexity {values['val_ppl']:.2f}")

    completed = start_step
    try:
        model.train()
        if start_step == 0:
            run_validation(0)
        interval_start, interval_steps = time.perf_counter(), 0
        for step in range(start_step + 1, config.max_steps + 1):
            log_now = step % config.log_every == 0 or step == config.max_steps
            rates = learning_rates(optimizer)  # the rates this step uses; the schedule moves on inside train_step
            metrics = train_step(model, optimizer, scheduler, accelerator, batches, config, reports_routing and log_now)
            watch.observe(step, metrics)
            completed = step
            interval_steps += 1
            progress.update()
            if log_now:
                # Every process reaches this line at the same steps: reduce is a collective operation.
                values = {name: accelerator.reduce(value.float(), reduction="mean").item()
                          for name, value in metrics.items()}  # fmt: skip
                values["tokens_per_s"] = interval_steps * tokens_per_step / (time.perf_counter() - interval_start)
                log.write(step, {**values, **rates})
                progress.set_postfix(loss=f"{values['loss']:.4f}")
            validating = step % config.eval_every == 0 or step == config.max_steps
            saving = config.save_every and step % config.save_every == 0
            if log_now or validating or saving or step == config.stop_after_step:
                watch.check()  # the last step (a log step) is checked before the final model is saved
            if validating:
                run_validation(step)
            if saving:
                save_checkpoint(accelerator, config.output_dir, step, config.keep_checkpoints)
            if log_now or validating or saving:  # tokens/s counts training time only
                interval_start, interval_steps = time.perf_counter(), 0
            if step == config.stop_after_step:
                return False
        return True
    except KeyboardInterrupt as interrupt:
        raise interruption(interrupt, stopped_at(completed, config.output_dir)) from None
    except Exception as error:
        if not is_write_failure(error):  # a full disk (a checkpoint names itself): what is saved stays resumable
            raise
        outcome = stopped_at(completed, config.output_dir)
        raise write_failure("--output-dir", config.output_dir, error, outcome) from None
    finally:
        progress.close()
