"""The training loop: optimiser steps over micro-batches, logging, periodic validation and checkpoints."""

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from delta_qwen3.jsonl import json_text

from .config import FinetuneConfig
from .data import TrainingData
from .evaluation import loss_and_perplexity, mean_max_routing_weight, validation_nll
from .outputs import log_path, save_checkpoint


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
    sharpness = None
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
            sharpness = mean_max_routing_weight(output.routing_weights)
    metrics = {"loss": loss_sum / config.grad_accum}
    if config.max_grad_norm > 0:
        metrics["grad_norm"] = accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
    if sharpness is not None:
        metrics["mean_max_routing_weight"] = sharpness.detach()
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
    """Train from `start_step` to `config.max_steps`. Returns False when stopped early by `--stop-after-step`."""
    log = MetricsLog(log_path(config.output_dir), accelerator)
    reports_routing = hasattr(accelerator.unwrap_model(model).config, "routing_mode")
    tokens_per_step = config.batch_size * config.grad_accum * accelerator.num_processes * config.seq_len
    # Each process resumes its data stream after the blocks it consumed before the checkpoint.
    consumed = start_step * config.grad_accum * config.batch_size
    batches = data.batches(config.batch_size, accelerator.process_index, accelerator.num_processes, consumed)
    progress = tqdm(
        total=config.max_steps, initial=start_step, desc="training", disable=not accelerator.is_local_main_process
    )

    def run_validation(step: int) -> None:
        values = validate(model, data, config, accelerator)
        log.write(step, values)
        progress.write(f"step {step}: validation loss {values['val_loss']:.4f}, perplexity {values['val_ppl']:.2f}")

    model.train()
    if start_step == 0:
        run_validation(0)
    interval_start, interval_steps = time.perf_counter(), 0
    for step in range(start_step + 1, config.max_steps + 1):
        log_now = step % config.log_every == 0 or step == config.max_steps
        rates = learning_rates(optimizer)  # the rates this step uses; the schedule moves on inside train_step
        metrics = train_step(model, optimizer, scheduler, accelerator, batches, config, reports_routing and log_now)
        interval_steps += 1
        progress.update()
        if log_now:
            # Every process reaches this line at the same steps: reduce is a collective operation.
            values = {
                name: accelerator.reduce(value.float(), reduction="mean").item() for name, value in metrics.items()
            }
            values["tokens_per_s"] = interval_steps * tokens_per_step / (time.perf_counter() - interval_start)
            log.write(step, {**values, **rates})
            progress.set_postfix(loss=f"{values['loss']:.4f}")
        validating = step % config.eval_every == 0 or step == config.max_steps
        if validating:
            run_validation(step)
        saving = config.save_every and step % config.save_every == 0
        if saving:
            save_checkpoint(accelerator, config.output_dir, step, config.keep_checkpoints)
        if log_now or validating or saving:  # tokens/s counts training time only
            interval_start, interval_steps = time.perf_counter(), 0
        if step == config.stop_after_step:
            progress.close()
            return False
    progress.close()
    return True
