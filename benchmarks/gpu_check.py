"""Does DeltaQwen3 work on this GPU? A self-check in the spirit of `accelerate test`, one command:

    python -m benchmarks.gpu_check --out DIR               # on one CUDA GPU, in under 12 minutes (`make gpu-check`)
    python -m benchmarks.gpu_check --out DIR --rehearsal   # the same code on the CPU at tiny shapes, in a minute
    python -m benchmarks.gpu_check --out DIR --sections performance --budget-scale 1.35  # performance alone, 8 min

Six sections, each with its own time budget, pass/fail, figures and tolerances:
  implementations  every routing implementation (reference, buffer, compiled, fused, fla where installed, and fused
                   with its points in groups) against the reference, forward and backward, in every routing mode,
                   in float32 (TF32 off) and bfloat16;
  attention        sdpa (and flash-attention 2 where installed) against eager attention in the model, on a
                   left-padded batch;
  compile          `torch.compile(fullgraph=True)`: a training step's loss and gradients, and generation, against
                   eager;
  performance      at the Qwen3-0.6B shape in bfloat16, as ratios to Qwen3 of the same shape in the same run, the
                   routing implementations buffer and fused side by side: memory and eager training at 4 x 512 and
                   8 x 4096 tokens, the routing operation's bytes/s against the memory bandwidth, kernels and
                   GPU-busy time of a training step, eager decoding, decoding under CUDA graphs and compiled
                   training; each ratio beside its goal (benchmarks/README.md), reported, not failed on;
  learning         a short pre-training of plain Qwen3 and Delta Block on the demo's data: both losses fall;
  serving          where vLLM is installed (here, or in the interpreter of `--vllm-python`): its greedy tokens equal
                   `generate`'s, in vLLM's default (compiled) and eager modes; else skipped, saying why.

A section that fails, raises or runs out of its budget is recorded as such and the others still run. DIR/gpu_check.json
is written before the first section and again after each (to a temporary file, then renamed), so a killed run leaves
what it had; DIR/gpu_check.md holds the table printed at the end, and DIR/gpu_check.log what the sections printed.
Exit status: 0 when no section failed, 1 when one did, 2 for bad options. Nothing is installed.
"""

import argparse
import contextlib
import copy
import gc
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from delta_qwen3.atomic import write_json

SECTIONS = ("implementations", "attention", "compile", "performance", "learning", "serving")
FAILED = ("fail", "error", "timeout")

# Relative errors: the largest absolute difference over the largest absolute expected value, per compared group
# (logits, routing weights, loss, routing parameters' gradients, the other gradients).
# float32 without TF32: summation order alone moves results by about 2e-6, and by up to 2e-5 in the AttnRes modes,
# whose replacement routing amplifies rounding through depth (measured on the CPU at the GPU profile's shape).
FLOAT32_TOLERANCE = 2e-4
# In bfloat16, a candidate is compared with float32's result and may be off by at most this many times what the
# reference implementation (or eager attention) in bfloat16 is off by, plus the floor: rounding to bfloat16 at other
# places moves a result by as much as that rounding itself, while a wrong computation is off by far more.
BFLOAT16_FACTOR, BFLOAT16_FLOOR = 3.0, 0.05


@dataclass(frozen=True)
class Profile:
    """Shapes, sizes and time budgets of one kind of run: on a GPU, or the CPU rehearsal."""

    device: str
    budgets: dict  # seconds per section
    check_shape: dict  # the small model of the correctness sections
    check_tokens: tuple[int, int]  # batch, sequence
    perf_shape: dict
    perf_tokens: tuple[int, int]  # batch, sequence: training and memory
    long_tokens: tuple[int, int]  # training where the GPU's work, not launching it, takes the time
    training_pairs: int  # timed rounds of a training step of each model
    long_training_pairs: int
    decode: tuple[int, int, int]  # prompt, new tokens, rounds: eager decoding
    graph_decode: tuple[int, int, int]  # prompt, new tokens, timed rounds: `generate` under CUDA graphs
    op_calls: int  # timed calls of the routing operation
    compile_backend: str
    compile_modes: tuple[str, ...]  # compiled training in each, generation in the first
    learning: dict  # pre-training steps, warm-up steps, learning rate, batch size, sequence length, model
    threads: int | None = None  # PyTorch's CPU threads, when not its default
    perf_variants: tuple[str, ...] = ("delta_block", "delta")
    compiled_variants: tuple[str, ...] = ("delta_block", "delta")  # in order: compiling takes minutes per model


CHECK_SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=256, initializer_range=0.02,
                   tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2)  # fmt: skip

GPU = Profile(
    device="cuda",
    # Measured on an H200: fla's kernels autotune for a minute per dtype on first use (implementations); compiling
    # a training step of the 0.6B shape takes one to two minutes per model (performance).
    budgets=dict(implementations=150, attention=20, compile=85, performance=330, learning=60, serving=30),
    check_shape=CHECK_SHAPE | dict(hidden_size=256, intermediate_size=512, head_dim=64, num_hidden_layers=6),
    check_tokens=(2, 64),
    perf_shape={},  # the Qwen3-0.6B shape, from benchmarks/routing_overhead.py (see `performance_settings`)
    perf_tokens=(4, 512),
    long_tokens=(8, 4096),
    training_pairs=10,
    long_training_pairs=3,
    decode=(128, 32, 2),
    graph_decode=(128, 128, 5),  # enough steps that the prompt's eager forward pass weighs little
    op_calls=10,
    compile_backend="inductor",
    compile_modes=("delta_block", "delta"),
    learning=dict(steps=200, warmup=20, lr=3e-3, batch=16, seq_len=128, model={}),  # the demo's base model
)
REHEARSAL = Profile(
    device="cpu",
    budgets=dict(implementations=30, attention=15, compile=60, performance=60, learning=60, serving=30),
    check_shape=CHECK_SHAPE | dict(num_hidden_layers=3),  # blocks of two layers and of one
    check_tokens=(2, 11),
    perf_shape=CHECK_SHAPE | dict(num_hidden_layers=2),
    perf_tokens=(2, 32),
    long_tokens=(1, 64),
    training_pairs=1,
    long_training_pairs=1,
    decode=(8, 3, 1),
    graph_decode=(8, 3, 1),
    op_calls=1,
    # Dynamo's tracing of the whole graph (fullgraph) alone: on 2 CPU cores AOTAutograd and inductor take a minute.
    compile_backend="eager",
    compile_modes=("delta_block",),
    learning=dict(steps=20, warmup=2, lr=1e-2, batch=4, seq_len=32,
                  model=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, head_dim=16)),
    # Tiny operations on a loaded machine: a second thread costs waiting for it (seven times slower on 2 cores).
    threads=1,
    compiled_variants=("delta_block",),
)


class Skipped(Exception):
    """The section cannot run here; the message says why."""


class SectionTimeout(BaseException):
    """The section's time budget ran out (a BaseException, so that no `except Exception` on the way swallows it)."""


class SectionRecord:
    """What a section found: its checks (each a value against a limit, passing or not), figures, and what it did not
    run and why; kept in `data`, the section's part of the JSON, as it goes, so that a section that stops part-way
    keeps what it measured."""

    def __init__(self, data: dict):
        self.data = data
        self.started = time.monotonic()
        data.setdefault("checks", [])

    def check(self, name: str, value: float, limit: float, at_least: bool = False) -> bool:
        passed = math.isfinite(value) and (value >= limit if at_least else value <= limit)
        self.data["checks"].append({"name": name, "value": value, "limit": limit,
                                    "passes_if": "value >= limit" if at_least else "value <= limit", "pass": passed,
                                    "at_seconds": round(time.monotonic() - self.started, 1)})  # which part was slow
        return passed

    def figure(self, name: str, value) -> None:
        self.data.setdefault("figures", {})[name] = value

    def not_run(self, name: str, reason: str) -> None:
        self.data.setdefault("not_run", {})[name] = reason


# --- comparing results --------------------------------------------------------------------------------------------


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    expected = expected.detach().double()
    difference = (got.detach().double() - expected).abs().max()
    scale = expected.abs().max()
    return (difference / scale).item() if scale > 0 else difference.item()


def training_pass(model, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """One forward and backward pass of `model` on `ids`: the groups that `errors` compares, flattened. Padding
    (where `attention_mask` has zeros) is neither compared nor scored, nor is the prediction made at a padded
    position (of the token after it): attention backends fill padded positions each their own way."""
    real = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    scored = real & torch.cat([real[:, :1], real[:, :-1]], dim=1)  # labels are shifted onto the position before
    model.zero_grad(set_to_none=True)
    out = model(ids, attention_mask=attention_mask, labels=ids.masked_fill(~scored, -100), output_routing_weights=True)
    out.loss.backward()
    gradients = [(name, p.grad.flatten()) for name, p in model.named_parameters() if p.grad is not None]
    return {
        "logits": out.logits[real].detach(),
        "routing_weights": torch.cat([weights[real].flatten() for weights in out.routing_weights]).detach(),
        "loss": out.loss.detach(),
        "routing_gradients": torch.cat([g for name, g in gradients if "_route." in name]),
        "other_gradients": torch.cat([g for name, g in gradients if "_route." not in name]),
    }


def errors(got: dict, expected: dict) -> dict[str, float]:
    return {name: relative_error(got[name], expected[name]) for name in expected}


def bfloat16_limits(yardstick: dict[str, float]) -> dict[str, float]:
    return {name: BFLOAT16_FACTOR * error + BFLOAT16_FLOOR for name, error in yardstick.items()}


def check_groups(section: SectionRecord, label: str, found: dict[str, float], limits: dict[str, float]) -> None:
    """One check per compared group; the errors and limits are kept in full under the label too."""
    for name, error in found.items():
        section.check(f"{label}: {name}", error, limits[name])


@contextlib.contextmanager
def float32_without_tf32() -> Iterator[None]:
    """Full float32 matrix products (no TF32 on GPUs that have it), restored afterwards."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def random_delta(profile: Profile, mode: str, **overrides):
    """A DeltaQwen3 of the check shape in `mode` (gated in the delta modes), its routing parameters random so
    that routing changes what it computes, on the profile's device in float32."""
    from modeling_delta_qwen3 import DeltaQwen3Config, DeltaQwen3ForCausalLM
    from modeling_delta_qwen3.routing_modes import ROUTING_MODES
    from benchmarks.routing_parameters import randomize_routing

    torch.manual_seed(0)
    fields = profile.check_shape | overrides
    gated = ROUTING_MODES[mode].gateable
    config = DeltaQwen3Config(**fields, routing_mode=mode, routing_gate=gated, routing_num_blocks=2)
    model = DeltaQwen3ForCausalLM(config)
    randomize_routing(model)
    return model.to(profile.device)


def check_ids(profile: Profile, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, profile.check_shape["vocab_size"], profile.check_tokens, generator=generator).to(
        profile.device)


# --- implementations ----------------------------------------------------------------------------------------------


def routing_implementations(profile: Profile, section: SectionRecord) -> list[str]:
    """The implementations to compare with the reference: every other one that runs here (fla's kernel only on
    CUDA with the package)."""
    from modeling_delta_qwen3.routing import IMPLEMENTATIONS

    names = []
    for name, implementation in IMPLEMENTATIONS.items():
        if name == "reference":
            continue
        if (reason := implementation.unavailable(torch.zeros(1, device=profile.device))) is None:
            names.append(name)
        else:
            section.not_run(name, reason)
    return names


@contextlib.contextmanager
def routing_as(model: torch.nn.Module, variant: str) -> Iterator[None]:
    """Route `model` with `variant`: an implementation's name, or "fused grouped", the fused implementation with
    its points in groups (grouped reads, which only long batches get otherwise)."""
    from modeling_delta_qwen3 import routing_fused

    name, _, grouped = variant.partition(" ")
    model.set_routing_implementation(name)
    threshold = routing_fused.GROUP_OPERATIONS_BYTES
    if grouped:
        routing_fused.GROUP_OPERATIONS_BYTES = -(2**62)
    try:
        yield
    finally:
        routing_fused.GROUP_OPERATIONS_BYTES = threshold


def check_implementations(profile: Profile, section: SectionRecord) -> None:
    """Per mode and dtype, each implementation's training pass (and the fused one's with grouped reads) against the
    reference implementation's: in float32 against the float32 reference; in bfloat16 against the float32
    reference, within what the bfloat16 reference is off by itself (`bfloat16_limits`)."""
    from modeling_delta_qwen3.routing_modes import ROUTING_MODES

    names = routing_implementations(profile, section)
    variants = [*names, *(["fused grouped"] if "fused" in names else [])]
    ids = check_ids(profile)
    for mode in ROUTING_MODES:
        model = random_delta(profile, mode).train()
        with float32_without_tf32():
            model.set_routing_implementation("reference")
            exact = training_pass(model, ids)
            for variant in variants:
                with routing_as(model, variant):
                    check_groups(section, f"{mode} float32 {variant}", errors(training_pass(model, ids), exact),
                                 dict.fromkeys(exact, FLOAT32_TOLERANCE))
        model.to(torch.bfloat16).set_routing_implementation("reference")
        yardstick = errors(training_pass(model, ids), exact)
        section.figure(f"{mode} bfloat16 reference", yardstick)
        for variant in variants:
            with routing_as(model, variant):
                check_groups(section, f"{mode} bfloat16 {variant}", errors(training_pass(model, ids), exact),
                             bfloat16_limits(yardstick))


# --- attention ----------------------------------------------------------------------------------------------------


def left_padded(ids: torch.Tensor) -> torch.Tensor:
    """An attention mask that left-pads the second row by a quarter of its length."""
    mask = torch.ones_like(ids)
    mask[1, : ids.shape[1] // 4] = 0
    return mask


def attention_backends(profile: Profile, section: SectionRecord) -> dict[str, torch.dtype]:
    """The attention implementations to compare with eager, each in the dtype it is run in: sdpa in both,
    flash-attention 2 (CUDA, half precision only) where installed."""
    from transformers.utils import is_flash_attn_2_available

    backends = {"sdpa float32": torch.float32, "sdpa bfloat16": torch.bfloat16}
    if profile.device == "cuda" and is_flash_attn_2_available():
        backends["flash_attention_2 bfloat16"] = torch.bfloat16
    else:
        section.not_run("flash_attention_2", "flash-attention 2 is not installed" if profile.device == "cuda"
                        else "flash-attention 2 runs on CUDA only")
    return backends


def check_attention(profile: Profile, section: SectionRecord) -> None:
    """Per mode, each backend's training pass on a left-padded batch against eager attention's: in float32 within
    float32's tolerance, in bfloat16 within what eager attention in bfloat16 is off by (`bfloat16_limits`)."""
    from modeling_delta_qwen3.routing_modes import ROUTING_MODES

    backends = attention_backends(profile, section)
    ids = check_ids(profile)
    mask = left_padded(ids)
    for mode in ROUTING_MODES:
        model = random_delta(profile, mode, routing_implementation="buffer").train()  # no kernel autotuning here
        models = {torch.float32: model, torch.bfloat16: copy.deepcopy(model).to(torch.bfloat16)}
        results = {}
        for dtype, model in models.items():
            model.set_attn_implementation("eager")
            with float32_without_tf32():
                results[dtype] = training_pass(model, ids, mask)
        yardstick = errors(results[torch.bfloat16], results[torch.float32])
        section.figure(f"{mode} bfloat16 eager", yardstick)
        for label, dtype in backends.items():
            models[dtype].set_attn_implementation(label.split()[0])
            with float32_without_tf32():
                found = errors(training_pass(models[dtype], ids, mask), results[torch.float32])
            limits = dict.fromkeys(found, FLOAT32_TOLERANCE) if dtype == torch.float32 else bfloat16_limits(yardstick)
            check_groups(section, f"{mode} {label}", found, limits)
            if not all(map(math.isfinite, found.values())):
                section.figure(f"qwen3 {label}: gradients finite", plain_qwen3_gradients_finite(profile, label, ids, mask))


def plain_qwen3_gradients_finite(profile: Profile, label: str, ids: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether Hugging Face's Qwen3 of the check shape, through the same attention backend on the same batch, gets
    finite gradients: False says a non-finite result is the backend's (PyTorch's or the GPU library's), not
    routing's."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    backend, dtype = label.split()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**profile.check_shape, attn_implementation=backend))
    model = model.to(profile.device, getattr(torch, dtype)).train()
    model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
    return all(p.grad.isfinite().all().item() for p in model.parameters() if p.grad is not None)


# --- compile ------------------------------------------------------------------------------------------------------


def greedy(model, ids: torch.Tensor, **kwargs):
    return model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=2, eos_token_id=None,
                          output_logits=True, return_dict_in_generate=True, **kwargs)


# Compiling takes time in proportion to the layers: three, in two blocks of two layers and one, have each mechanism
# of every mode, and a block of several layers (vLLM's compilation on the CPU got that wrong: docs/SERVING.md).
COMPILED_LAYERS = 3


def check_compiled_training(profile: Profile, section: SectionRecord, mode: str) -> None:
    model = random_delta(profile, mode, num_hidden_layers=COMPILED_LAYERS).train()
    ids = check_ids(profile)
    with float32_without_tf32():
        eager = training_pass(model, ids)
        compiled = torch.compile(model, backend=profile.compile_backend, fullgraph=True)
        check_groups(section, f"{mode} training", errors(training_pass(compiled, ids), eager),
                     dict.fromkeys(eager, FLOAT32_TOLERANCE))


def check_compiled_generation(profile: Profile, section: SectionRecord, mode: str) -> None:
    """Greedy generation with the model's forward compiled: the same tokens, and logits within float32's
    tolerance."""
    model = random_delta(profile, mode, num_hidden_layers=COMPILED_LAYERS).eval()
    ids = check_ids(profile)[:1, :8]
    with float32_without_tf32(), torch.no_grad():
        eager = greedy(model, ids, disable_compile=True)
        model.forward = torch.compile(model.forward, backend=profile.compile_backend, fullgraph=True)
        compiled = greedy(model, ids)
    section.check(f"{mode} generation: tokens that differ", (compiled.sequences != eager.sequences).sum().item(), 0)
    section.check(f"{mode} generation: logits", relative_error(torch.stack(compiled.logits), torch.stack(eager.logits)),
                  FLOAT32_TOLERANCE)


def check_compile(profile: Profile, section: SectionRecord) -> None:
    """Training in the profile's modes and generation in the first: each compilation takes tens of seconds."""
    section.figure("backend", profile.compile_backend)
    for mode in profile.compile_modes:
        torch._dynamo.reset()
        check_compiled_training(profile, section, mode)
    torch._dynamo.reset()
    check_compiled_generation(profile, section, profile.compile_modes[0])


# --- performance --------------------------------------------------------------------------------------------------

# The routing implementations timed in eager mode: the GPU's default, one registered operation per routing point, and
# the buffer that routed by default before it. Under torch.compile `buffer` cannot be traced whole (it routes between
# graphs), so the compiled parts time `fused`.
EAGER_IMPLEMENTATIONS = ("buffer", "fused")
COMPILED_IMPLEMENTATIONS = ("fused",)
# Goals on one H200 as ratios to Qwen3, per variant, and whether a figure meets its goal at least or at most there:
# reported beside the figures, never failed on (benchmarks/README.md says where each comes from).
GOALS = {
    "saved_activations": (False, {"delta_block": 1.05, "delta": 1.15}),
    "saved_activations_long": (False, {"delta_block": 1.05, "delta": 1.15}),
    "training": (True, {"delta_block": 0.93, "delta": 0.85}),
    "training_long": (True, {"delta_block": 0.97, "delta": 0.90}),
    "decoding": (True, {"delta_block": 0.95, "delta": 0.95}),
    "decoding_cuda_graphs": (True, {"delta_block": 0.95, "delta": 0.90}),
    "compiled_training": (True, {"delta_block": 0.97, "delta": 0.90}),
}
NOT_ON_CPU = "not measured on cpu"
PROFILED_STEP = "gpu_check training step"  # torch.profiler's name for the range of the step it measures


def performance_settings(profile: Profile, variants: tuple[str, ...]):
    """benchmarks/routing_overhead.py's settings for this profile and `variants`, in bfloat16 on its device."""
    from benchmarks import routing_overhead

    shape = profile.perf_shape or routing_overhead.QWEN3_06B
    prompt, new_tokens, rounds = profile.decode
    return routing_overhead.Settings(
        device=profile.device, dtype=torch.bfloat16, batch=profile.perf_tokens[0], seq=profile.perf_tokens[1],
        depths=[], train_layers=shape["num_hidden_layers"], training_pairs=profile.training_pairs, decode_shape=shape,
        prompt=prompt, new_tokens=new_tokens, decode_runs=rounds, keep_freed_memory=False,
        variants=[variant for variant in routing_overhead.VARIANTS if variant[0] in ("qwen3", *variants)],
        train_shape=shape, compile_backend=profile.compile_backend,
        routing_implementation="buffer")  # fmt: skip  # fla autotunes per source count: minutes at 28 layers


def record_goal(section: SectionRecord, figure: str, label: str, name: str, value: float) -> None:
    """A measured ratio, checked only for having been measured, and reported beside its goal where it has one."""
    section.check(f"{name}: measured", value, 0.0, at_least=True)
    if figure in GOALS:
        at_least, goals = GOALS[figure]
        goal = goals[label]
        section.data.setdefault("goals", []).append(
            {"name": name, "value": value, "goal": goal, "passes_if": "value >= goal" if at_least else "value <= goal",
             "met": value >= goal if at_least else value <= goal})  # fmt: skip


def figure_data(section: SectionRecord, figure: str) -> dict:
    """The figure's dictionary in the section's data, made on first use, so that each value lands as measured."""
    return section.data.setdefault("figures", {}).setdefault(figure, {})


def peak_training_memory(model, ids: torch.Tensor) -> int:
    """`torch.cuda.max_memory_allocated` over a training step after a first one (which creates AdamW's state)."""
    from benchmarks.routing_overhead import training_step

    step = training_step(model, ids)
    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def check_memory(settings, section: SectionRecord, ids: torch.Tensor, figure: str = "memory") -> None:
    """Per variant and implementation, autograd's saved-activation bytes of a training forward and (CUDA) the peak
    memory of a training step on `ids`, as ratios to Qwen3's; one model alive at a time. In the long batch (figure
    "memory_long") the fused implementation reads its sources in groups of points, and keeps each group's partial
    mixtures for the backward pass."""
    from benchmarks.routing_overhead import build, saved_activation_bytes

    def sizes(model) -> dict[str, int]:
        found = {"saved_activations": saved_activation_bytes(model, ids)}
        if settings.device == "cuda":
            found["peak_cuda_memory"] = peak_training_memory(model, ids)
        return found

    qwen3 = sizes(build(settings.train_shape, None, False, settings))
    memory = figure_data(section, figure)
    goal = "saved_activations" + figure.removeprefix("memory")
    for label, mode, gated in settings.variants[1:]:
        model = build(settings.train_shape, mode, gated, settings)
        for implementation in EAGER_IMPLEMENTATIONS:
            model.set_routing_implementation(implementation)
            for kind, size in sizes(model).items():
                memory.setdefault(kind, {}).setdefault(label, {})[implementation] = size / qwen3[kind]
            record_goal(section, goal, label, f"{goal}: {label} {implementation} / qwen3",
                        memory["saved_activations"][label][implementation])
        del model
        release_memory()


def time_against_qwen3(section: SectionRecord, figure: str, settings, shape: dict, prepare: Callable,
                       measure: Callable, implementations: tuple[str, ...], tokens: int,
                       share_weights: bool = False) -> None:
    """Per variant and routing implementation, the run that `prepare(model)` makes, timed against Qwen3's by
    `measure(qwen3_run, run)` (Qwen3's time over the variant's, and Qwen3's seconds per run; the two runs
    interleaved). One Qwen3 serves every variant: built first, then each variant, with only the two alive (their
    common weights shared where `share_weights`: in decoding, where the weights lie moves the speed). Each ratio is
    recorded as soon as measured; so is every run's first call, in seconds (compilation, where anything compiles)."""
    from benchmarks.routing_overhead import _seconds, _share_base_weights, build

    results = figure_data(section, figure)
    first_calls = results.setdefault("first_call_seconds", {})

    def prepared(name: str, model) -> Callable[[], None]:
        run = prepare(model)
        first_calls[name] = round(_seconds(run, settings.device), 2)
        return run

    qwen3 = build(shape, None, False, settings)
    qwen3_run = prepared("qwen3", qwen3)
    for label, mode, gated in settings.variants[1:]:
        model = build(shape, mode, gated, settings)
        if share_weights:
            _share_base_weights(qwen3, model)
        for implementation in implementations:
            model.set_routing_implementation(implementation)
            ratio, qwen3_seconds = measure(qwen3_run, prepared(f"{label} {implementation}", model))
            results.setdefault(label, {})[implementation] = ratio
            results["qwen3_tokens_per_s"] = tokens / qwen3_seconds
            record_goal(section, figure, label, f"{figure}: {label} {implementation} / qwen3", ratio)
        del model
        release_memory()


def paired_runs(repeats: int, warmup: int, device: str) -> Callable:
    """A `measure` for `time_against_qwen3`: routing_overhead's rounds of one run of each, back to back."""
    from benchmarks.routing_overhead import _paired_ratio

    return lambda qwen3_run, run: _paired_ratio({"qwen3": qwen3_run, "variant": run}, repeats, warmup, device)


def paired_decoders(settings) -> Callable:
    """A `measure` for `time_against_qwen3`: routing_overhead's decoding, the two models' forward passes alternating
    one token at a time."""
    from benchmarks.routing_overhead import paired_decoding

    def measure(qwen3_decoder, decoder) -> tuple[float, float]:
        result = paired_decoding({"qwen3": qwen3_decoder, "variant": decoder}, settings.new_tokens,
                                 settings.decode_runs, settings.device)  # fmt: skip
        return result["ratio"], result["qwen3_seconds"]

    return measure


def decoding_under_cuda_graphs(profile: Profile, settings, section: SectionRecord) -> None:
    """`generate` with the static cache, whose decoding steps Transformers compiles on a GPU with the model's
    `generation_config.compile_config`, here `CompileConfig(mode="reduce-overhead", fullgraph=True)`: CUDA graphs
    (the prompt's forward pass stays eager). On the CPU Transformers compiles nothing, so the rehearsal times the
    same calls with the static cache, eagerly, under another figure's name."""
    from transformers import CompileConfig

    prompt_length, new_tokens, rounds = profile.graph_decode
    prompt = torch.randint(3, settings.decode_shape["vocab_size"], (1, prompt_length), device=profile.device)
    cuda = profile.device == "cuda"
    if not cuda:
        section.not_run("decoding_cuda_graphs", f"{NOT_ON_CPU}: CUDA graphs need CUDA; decoding_static_cache_eager "
                                                "times the same generate calls without them")  # fmt: skip

    def prepare(model) -> Callable[[], None]:
        if cuda:
            model.generation_config.compile_config = CompileConfig(mode="reduce-overhead", fullgraph=True)
        return lambda: model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                                      eos_token_id=None, cache_implementation="static")  # fmt: skip

    # Two calls after the first before timing: CUDA graphs are recorded on the second and replayed from the third.
    time_against_qwen3(section, "decoding_cuda_graphs" if cuda else "decoding_static_cache_eager", settings,
                       settings.decode_shape, prepare, paired_runs(rounds, 2, profile.device),
                       COMPILED_IMPLEMENTATIONS, new_tokens, share_weights=True)  # fmt: skip


def tensor_bytes(*tensors: torch.Tensor) -> int:
    return sum(tensor.nbytes for tensor in tensors)


def memory_bandwidth() -> float | None:
    """The GPU's nominal memory bandwidth in bytes/s (two transfers per memory clock across its bus), or None where
    PyTorch does not report its memory clock and bus width."""
    properties = torch.cuda.get_device_properties()
    clock_khz, bus_bits = getattr(properties, "memory_clock_rate", None), getattr(properties, "memory_bus_width", None)
    return None if not clock_khz or not bus_bits else 2 * clock_khz * 1000 * bus_bits / 8


def routing_op_bandwidth(profile: Profile, settings, section: SectionRecord) -> None:
    """`torch.ops.delta_qwen3.route` and `route_backward` over the long training batch's tokens, each reading as
    many sources as the deepest routing point of a variant at this depth (Delta Block, 4 blocks: h_0 and three
    finished blocks' changes; Delta AttnRes: h_0 and every sublayer's output but the last), with a residual and no
    gate: the bytes each must move (its inputs read once, its outputs written once) per second, beside a plain copy
    of the sources, and both as fractions of the GPU's nominal memory bandwidth."""
    import modeling_delta_qwen3  # noqa: F401  (registers the operations)
    from benchmarks.routing_overhead import _seconds

    shape, device, calls = settings.train_shape, profile.device, profile.op_calls
    layers, hidden = shape["num_hidden_layers"], shape["hidden_size"]
    counts = {"delta_block": min(4, layers), "delta": 2 * layers}  # routing_overhead.build's blocks: at most 4
    results = figure_data(section, "routing_op_bandwidth")
    nominal = memory_bandwidth() if device == "cuda" else None
    unknown = "PyTorch reports no memory clock or bus width" if device == "cuda" else NOT_ON_CPU
    results["memory_bandwidth_bytes_per_s"] = nominal or unknown

    def rate(call: Callable, moved: int) -> dict:
        call()  # the first call compiles the kernel
        seconds = _seconds(lambda: [call() for _ in range(calls)], device) / calls
        return {"bytes": moved, "seconds": seconds, "bytes_per_s": moved / seconds,
                "of_memory_bandwidth": moved / seconds / nominal if nominal else unknown}  # fmt: skip

    for label in profile.perf_variants:
        count = counts[label]
        sources = torch.randn(count, *profile.long_tokens, hidden, device=device, dtype=torch.bfloat16)
        residual = torch.randn_like(sources[0])
        w = torch.randn(hidden, device=device)  # the compute dtype of a bfloat16 model's routing: float32
        out, weights = torch.ops.delta_qwen3.route(sources, count, None, w, None, residual, 1e-6)
        grad_out = torch.randn_like(out)
        gradients = torch.ops.delta_qwen3.route_backward(grad_out, sources, count, None, w, None, weights, 1e-6)
        copy_target = torch.empty_like(sources)
        results[label] = {
            "sources": count,
            "route": rate(lambda: torch.ops.delta_qwen3.route(sources, count, None, w, None, residual, 1e-6),
                          tensor_bytes(sources, residual, w, out, weights)),
            "route_backward": rate(lambda: torch.ops.delta_qwen3.route_backward(grad_out, sources, count, None, w,
                                                                                None, weights, 1e-6),
                                   tensor_bytes(grad_out, sources, w, weights, *gradients)),
            "copy": rate(lambda: copy_target.copy_(sources), 2 * sources.nbytes),
        }  # fmt: skip
        del sources, residual, out, weights, grad_out, gradients, copy_target
        release_memory()


def gpu_activity(events, window: str) -> dict:
    """From torch.profiler's events (`profile.events()`): the kernels the GPU ran during the CPU range named
    `window`, and the fraction of that range in which the GPU was busy (running kernels, copies or fills: the union
    of their intervals). Annotations the profiler marks on the GPU's timeline are not activities."""
    from torch.autograd import DeviceType

    (span,) = [event.time_range for event in events if event.name == window and event.device_type == DeviceType.CPU]
    activities = [event for event in events
                  if event.device_type == DeviceType.CUDA and not event.is_user_annotation and event.name != window
                  and event.time_range.start < span.end and event.time_range.end > span.start]  # fmt: skip
    busy, covered_to = 0.0, span.start
    for start, end in sorted((event.time_range.start, event.time_range.end) for event in activities):
        if end > covered_to:
            busy += min(end, span.end) - max(start, covered_to)
            covered_to = end
    kernels = sum(not event.name.startswith(("Memcpy", "Memset")) for event in activities)
    return {"kernels": kernels, "gpu_busy": busy / (span.end - span.start)}


def kernels_and_gpu_busy(profile: Profile, settings, section: SectionRecord, ids: torch.Tensor) -> None:
    """Per model and implementation, `torch.profiler` over one eager training step (after two that warm it up):
    the kernels it launches, as a count and as a ratio to Qwen3's, and the fraction of the step the GPU is busy."""
    from benchmarks.routing_overhead import build, training_step

    if profile.device != "cuda":
        section.not_run("kernels", f"{NOT_ON_CPU}: kernels and the GPU's busy time are CUDA's (torch.profiler)")
        return
    results = figure_data(section, "kernels")

    def record(name: str, model) -> None:
        step = training_step(model, ids)
        step()
        step()
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as profiler:
            with torch.profiler.record_function(PROFILED_STEP):
                step()
                torch.cuda.synchronize()
        results[name] = gpu_activity(profiler.events(), PROFILED_STEP)
        results[name]["kernels_vs_qwen3"] = results[name]["kernels"] / results["qwen3"]["kernels"]

    record("qwen3", build(settings.train_shape, None, False, settings))
    for label, mode, gated in settings.variants[1:]:
        model = build(settings.train_shape, mode, gated, settings)
        for implementation in EAGER_IMPLEMENTATIONS:
            model.set_routing_implementation(implementation)
            record(f"{label} {implementation}", model)
        del model
        release_memory()


def run_parts(section: SectionRecord, parts: dict[str, Callable[[], None]]) -> None:
    """Runs `parts` in order. One that raises is recorded (its error, and a failed check) and the next one runs.
    Once the section's time budget runs out, the part it ran out in and those after it are recorded as not run,
    and the section ends with what it measured: a budget too short for every part is not a failure."""
    names = list(parts)
    for index, name in enumerate(names):
        try:
            parts[name]()
        except SectionTimeout:
            section.not_run(name, "the section's time budget ran out during it")
            for later in names[index + 1:]:
                section.not_run(later, "the section's time budget ran out before it")
            return
        except Exception as error:
            section.data.setdefault("errors", {})[name] = f"{type(error).__name__}: {error}"[:2000]
            section.data.setdefault("tracebacks", {})[name] = traceback.format_exc()[-4000:]
            section.check(f"{name}: errors", 1, 0)
        finally:
            release_memory()


def performance_parts(profile: Profile, section: SectionRecord) -> dict[str, Callable[[], None]]:
    """The performance section's parts, cheapest and most wanted first, so that what is measured before the budget
    runs out is what matters most: memory at both batch sizes; eager training at both; the routing operation's
    bandwidth; kernels and GPU-busy time; eager decoding; decoding under CUDA graphs; compiled training, whose
    compilation takes minutes at the 0.6B shape."""
    from benchmarks.routing_overhead import GreedyDecoder, training_step

    settings = performance_settings(profile, profile.perf_variants)
    compiled = performance_settings(profile, profile.compiled_variants)
    shape, device = settings.train_shape, profile.device

    def batch(tokens: tuple[int, int]) -> torch.Tensor:
        return torch.randint(0, shape["vocab_size"], tokens, device=device)

    short, long = batch(profile.perf_tokens), batch(profile.long_tokens)
    prompt = batch((1, settings.prompt))
    section.figure("shape", {"layers": shape["num_hidden_layers"], "hidden": shape["hidden_size"],
                             "dtype": "bfloat16", "training_tokens": list(profile.perf_tokens),
                             "training_long_tokens": list(profile.long_tokens),
                             "decoding": {"prompt": settings.prompt, "new_tokens": settings.new_tokens},
                             "decoding_cuda_graphs": dict(zip(("prompt", "new_tokens"), profile.graph_decode))})

    def compiled_step(model) -> Callable[[], None]:
        return training_step(torch.compile(model, backend=profile.compile_backend, fullgraph=True), short)

    return {
        "memory": lambda: check_memory(settings, section, short),
        "memory_long": lambda: check_memory(settings, section, long, "memory_long"),
        "training": lambda: time_against_qwen3(
            section, "training", settings, shape, lambda model: training_step(model, short),
            paired_runs(profile.training_pairs, 1, device), EAGER_IMPLEMENTATIONS, short.numel()),
        "training_long": lambda: time_against_qwen3(
            section, "training_long", settings, shape, lambda model: training_step(model, long),
            paired_runs(profile.long_training_pairs, 1, device), EAGER_IMPLEMENTATIONS, long.numel()),
        "routing_op_bandwidth": lambda: routing_op_bandwidth(profile, settings, section),
        "kernels": lambda: kernels_and_gpu_busy(profile, settings, section, short),
        "decoding": lambda: time_against_qwen3(
            section, "decoding", settings, shape, lambda model: GreedyDecoder(model, prompt),
            paired_decoders(settings), EAGER_IMPLEMENTATIONS, settings.new_tokens, share_weights=True),
        "decoding_cuda_graphs": lambda: decoding_under_cuda_graphs(profile, settings, section),
        "compiled_training": lambda: time_against_qwen3(
            section, "compiled_training", compiled, shape, compiled_step,
            paired_runs(profile.training_pairs, 1, device), COMPILED_IMPLEMENTATIONS, short.numel()),
    }  # fmt: skip


def check_performance(profile: Profile, section: SectionRecord) -> None:
    """Ratios to Qwen3 of the same shape in the same run, each beside its goal; checked only for having been
    measured (see `run_parts`)."""
    with torch.device(profile.device):  # the models are built on the device, not built on the CPU and moved
        run_parts(section, performance_parts(profile, section))


# --- learning -----------------------------------------------------------------------------------------------------


def falling(losses: list[float]) -> float:
    """The mean loss of the last fifth of the steps over that of the first fifth."""
    fifth = max(1, len(losses) // 5)
    return (sum(losses[-fifth:]) / fifth) / (sum(losses[:fifth]) / fifth)


def pretrain(profile: Profile, work: Path, mode: str, corpus: dict, inputs) -> list[float]:
    """Pre-train a model of the demo's base shape in `mode` with `finetune`, in this process; its loss at every
    step."""
    import finetune
    from demo.journey import DEMO_BASE_CONFIG, DemoSettings, pretraining_command

    learning = profile.learning
    settings = DemoSettings(out=work, base=None, data=None, steps=0, pretrain_steps=learning["steps"],
                            device=profile.device, seq_len=learning["seq_len"], num_blocks=2)
    run_dir = work / mode
    command = pretraining_command(settings, corpus, inputs, run_dir, mode=mode, launcher=())
    assert command[:2] == ["-m", "finetune"], command[:2]
    options = ["--warmup-steps", str(learning["warmup"]), "--lr", str(learning["lr"]),
               "--batch-size", str(learning["batch"]), "--log-every", "1"]
    if learning["model"]:  # the demo's base model, smaller
        config_file = work / "model-config.json"
        config_file.write_text(json.dumps({**DEMO_BASE_CONFIG, **learning["model"]}))
        options += ["--model-config", str(config_file)]
    if finetune.main([*command[2:], *options] + (["--num-blocks", "2"] if mode != "baseline" else [])) != 0:
        raise RuntimeError(f"finetune failed for {mode} (its message is in gpu_check.log)")
    log = (run_dir / "train_log.jsonl").read_text().splitlines()
    return [entry["loss"] for entry in map(json.loads, log) if "loss" in entry]


def check_learning(profile: Profile, section: SectionRecord) -> None:
    """Plain Qwen3 (baseline) and Delta Block pre-trained alike on the demo's pre-training split: each one's last
    fifth of losses at most 0.95 of its first fifth (a few hundred steps on a GPU take it well below: about 0.7)."""
    from demo.journey import DemoSettings, pretraining_inputs, split_corpus

    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        corpus = split_corpus(work)
        settings = DemoSettings(out=work, base=None, data=None, steps=0, pretrain_steps=0, device=profile.device,
                                seq_len=profile.learning["seq_len"], num_blocks=2)
        inputs = pretraining_inputs(settings, corpus)
        for mode in ("baseline", "delta_block"):
            losses = pretrain(profile, work, mode, corpus, inputs)
            section.figure(f"{mode} losses", losses)
            section.check(f"{mode}: last fifth of losses / first fifth", falling(losses), 0.95)


# --- serving ------------------------------------------------------------------------------------------------------


def vllm_interpreter(requested: Path | None) -> Path:
    if requested is not None:
        return requested
    if importlib.util.find_spec("vllm") is None:
        raise Skipped("vLLM is not installed in this interpreter (--vllm-python names one that has it)")
    return Path(sys.executable)


def save_serving_models(profile: Profile, root: Path, modes: list[str]) -> dict:
    """Per mode, a random DeltaQwen3 of the shape vLLM's serving tests use, saved with its code."""
    from benchmarks.serving import SHAPES

    shape = {**SHAPES["tiny"], "num_hidden_layers": 4}
    made = {}
    for mode in modes:
        model = random_delta(profile, mode, **shape).eval()
        model.save_pretrained(root / mode)
        made[mode] = (root / mode, model)
    return made


def vllm_job(models: dict, prompts: list[list[int]], enforce_eager: bool, device: str) -> dict:
    engine = dict(max_model_len=256, max_num_seqs=len(prompts), kv_cache_memory_bytes=256 << 20, seed=0,
                  trust_remote_code=True, enforce_eager=enforce_eager, skip_tokenizer_init=True)
    if device == "cuda":
        engine["gpu_memory_utilization"] = 0.3  # this process holds some GPU memory too
    runs = [{"name": mode, "model": str(path), "dtype": "float32", "model_impl": "transformers", "prompts": prompts,
             "max_tokens": 8} for mode, (path, _) in models.items()]  # fmt: skip
    return {"engine": engine, "runs": runs}


def check_serving(profile: Profile, section: SectionRecord, vllm_python: Path | None) -> None:
    """Greedy tokens from vLLM (its Transformers backend, the model code loaded as remote code) against
    `generate`'s, in both delta modes, in vLLM's eager and default modes (on the CPU delta_block refuses the
    latter: docs/SERVING.md)."""
    from modeling_delta_qwen3.routing_modes import ROUTING_MODES
    from benchmarks.serving import fixed_prompts, run_vllm

    python = vllm_interpreter(vllm_python)
    prompts = fixed_prompts(4, 4, 16, 512)
    with tempfile.TemporaryDirectory() as work:
        models = save_serving_models(profile, Path(work), ["delta_block", "delta"])
        expected = {mode: [greedy(model, torch.tensor([p], device=profile.device)).sequences[0, len(p):].tolist()
                           for p in prompts] for mode, (_, model) in models.items()}  # fmt: skip
        for enforce_eager in (True, False):
            engine_mode = "eager" if enforce_eager else "default"
            refused = profile.device == "cpu" and not enforce_eager
            served = {m: v for m, v in models.items()
                      if not (refused and ROUTING_MODES[m].miscompiled_on_cpu_before_torch_2_14)}
            if served != models:
                section.not_run(f"delta_block {engine_mode}", "refused on the CPU (docs/SERVING.md)")
            results = run_vllm(python, vllm_job(served, prompts, enforce_eager, profile.device), Path(work))
            for mode in served:
                differing = sum(got != want for got, want in zip(results[mode]["tokens"], expected[mode], strict=True))
                section.check(f"{mode} vLLM {engine_mode}: prompts whose tokens differ", differing, 0)


# --- running the sections -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raises `SectionTimeout` in the main thread after `seconds` (SIGALRM: Python code, or a call into native code
    once it returns)."""

    def expire(signum, frame):
        raise SectionTimeout(f"ran out of its {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class Run:
    """One run of the check: the report as it grows, written to `out`/gpu_check.json after every change of a
    section's status (under a lock: the watchdog writes it too)."""

    out: Path
    report: dict
    lock: threading.Lock = field(default_factory=threading.Lock)

    def save(self) -> None:
        with self.lock:
            write_json(self.out / "gpu_check.json", self.report)

    def sections(self) -> dict:
        return self.report["sections"]


def finish_status(data: dict) -> str:
    return "pass" if data["checks"] and all(check["pass"] for check in data["checks"]) else "fail"


def run_section(run: Run, name: str, function: Callable, budget: float, log) -> None:
    """Run one section within `budget` seconds, its output into `log`; record its status, time and any error."""
    data = run.sections()[name] = {"status": "running", "budget_seconds": budget}
    run.save()
    start = time.monotonic()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), time_limit(budget):
            function(SectionRecord(data))
        data["status"] = finish_status(data)
    except Skipped as skipped:
        data["status"], data["reason"] = "skipped", str(skipped)
    except SectionTimeout as timeout:
        data["status"], data["reason"] = "timeout", str(timeout)
    except (Exception, SystemExit) as error:  # SystemExit: benchmarks/serving.py's way to report vLLM's failure
        data["status"], data["reason"] = "error", f"{type(error).__name__}: {error}"[:2000]
        data["traceback"] = traceback.format_exc()[-4000:]
    finally:
        data["seconds"] = round(time.monotonic() - start, 1)
        torch._dynamo.reset()
        release_memory()
        run.save()
        print(f"{name}: {data['status']} ({data['seconds']} s)", file=sys.__stdout__, flush=True)


def watchdog(run: Run, seconds: float) -> threading.Thread:
    """A thread that, should the run outlast `seconds` (a section stuck in native code, where the time limit cannot
    interrupt it), records the running section as timed out, writes the report and the table, and ends the
    process with status 1."""

    def expire() -> None:
        time.sleep(seconds)
        for data in run.sections().values():
            if data["status"] == "running":
                data["status"], data["reason"] = "timeout", "stuck past the whole run's time; the process was ended"
        run.save()
        write_table(run)
        os._exit(1)

    thread = threading.Thread(target=expire, name="gpu_check watchdog", daemon=True)
    thread.start()
    return thread


def run_sections(run: Run, functions: dict[str, Callable], budgets: dict[str, float], log) -> None:
    for name in functions:
        run.sections()[name] = {"status": "waiting", "budget_seconds": budgets[name]}
    for name, function in functions.items():
        run_section(run, name, function, budgets[name], log)
    run.report["passed"] = not any(data["status"] in FAILED for data in run.sections().values())
    run.save()


# --- the report ---------------------------------------------------------------------------------------------------


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(profile: Profile, rehearsal: bool) -> dict:
    import transformers

    gpu = torch.cuda.get_device_name() if profile.device == "cuda" else None
    packages = ("triton", "fla-core", "flash-attn", "vllm", "accelerate")
    return {"rehearsal": rehearsal, "device": profile.device, "gpu": gpu, "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            **{name: package_version(name) for name in packages}}  # fmt: skip


def worst_check(data: dict) -> str:
    """The check closest to failing, or the first that failed, in words."""
    failed = [check for check in data.get("checks", []) if not check["pass"]]

    def margin(check) -> float:
        value, limit = check["value"], check["limit"]
        if check["passes_if"] == "value >= limit":
            return limit / value if value > 0 else math.inf
        return value / limit if limit > 0 else (0.0 if value == 0 else math.inf)

    checks = failed or sorted(data.get("checks", []), key=margin)[-1:]
    if not checks:
        return ""
    check = checks[0]
    sign = ">=" if check["passes_if"] == "value >= limit" else "<="
    verdict = "failed" if not check["pass"] else "closest"
    return f"{verdict}: {check['name']} = {check['value']:.3g} (needs {sign} {check['limit']:.3g})"


def summary(data: dict) -> str:
    """A section's last column: why it stopped; else, where it has goals and no failed check, how many it met and
    which parts it did not run; else its worst check."""
    goals, checks = data.get("goals", []), data.get("checks", [])
    if data.get("reason") or not goals or not all(check["pass"] for check in checks):
        return data.get("reason") or worst_check(data)
    not_run = f"; not run: {', '.join(data['not_run'])}" if data.get("not_run") else ""
    return f"goals met: {sum(goal['met'] for goal in goals)} of {len(goals)} (below){not_run}"


def markdown_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    return "\n".join(lines)


def goals_table(run: Run) -> str:
    """Every figure that has a goal, beside it (reported, not checked); empty when none was measured."""
    rows = [["figure", "value", "goal", "met"]]
    for data in run.sections().values():
        rows += [[goal["name"], f"{goal['value']:.3f}", f"{goal['passes_if'].split()[1]} {goal['goal']:g}",
                  "yes" if goal["met"] else "no"] for goal in data.get("goals", [])]  # fmt: skip
    return f"\nGoals (reported, not checked):\n\n{markdown_table(rows)}\n" if len(rows) > 1 else ""


def table(run: Run) -> str:
    rows = [["section", "status", "seconds", "budget", "checks", "worst check, or why"]]
    for name, data in run.sections().items():
        checks = data.get("checks", [])
        passed = sum(check["pass"] for check in checks)
        rows.append([name, data["status"], str(data.get("seconds", "")), f"{data['budget_seconds']:.0f}",
                     f"{passed}/{len(checks)}", summary(data)])  # fmt: skip
    verdict = "all sections passed or were skipped" if run.report.get("passed") else "some sections did not pass"
    return f"{markdown_table(rows)}\n\n{verdict}; details in {run.out / 'gpu_check.json'}\n{goals_table(run)}"


def write_table(run: Run) -> None:
    text = table(run)
    (run.out / "gpu_check.md").write_text(text)
    print(text, file=sys.__stdout__, flush=True)


# --- command line -------------------------------------------------------------------------------------------------


def section_names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SECTIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown section {', '.join(unknown) or '(none)'}: choose from "
                                         f"{', '.join(SECTIONS)}")
    return names


def positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


class OneLineParser(argparse.ArgumentParser):
    """Bad options end the command with one line naming the problem, and status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m benchmarks.gpu_check", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="where gpu_check.json, .md and .log are written")
    parser.add_argument("--rehearsal", action="store_true", help="the same code on the CPU at tiny shapes")
    parser.add_argument("--sections", type=section_names, default=list(SECTIONS), help="comma-separated, in order")
    parser.add_argument("--budget-scale", type=positive, default=1.0, help="multiply every section's time budget")
    parser.add_argument("--vllm-python", type=Path, help="an interpreter that has vLLM (default: this one, if so)")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, checked against this machine: a GPU unless rehearsing, the files they name."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.rehearsal and not torch.cuda.is_available():
        parser.error("no CUDA GPU is visible to PyTorch here: --rehearsal runs the check on the CPU")
    if args.vllm_python is not None and not args.vllm_python.exists():
        parser.error(f"--vllm-python {args.vllm_python} does not exist")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is not a directory")
    return args


def section_functions(profile: Profile, args: argparse.Namespace) -> dict[str, Callable]:
    functions = {
        "implementations": lambda section: check_implementations(profile, section),
        "attention": lambda section: check_attention(profile, section),
        "compile": lambda section: check_compile(profile, section),
        "performance": lambda section: check_performance(profile, section),
        "learning": lambda section: check_learning(profile, section),
        "serving": lambda section: check_serving(profile, section, args.vllm_python),
    }
    return {name: functions[name] for name in args.sections}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    profile = REHEARSAL if args.rehearsal else GPU
    if profile.threads:
        torch.set_num_threads(profile.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    budgets = {name: seconds * args.budget_scale for name, seconds in profile.budgets.items()}
    run = Run(args.out, {"settings": environment(profile, args.rehearsal) | {"budget_scale": args.budget_scale},
                         "sections": {}})  # fmt: skip
    watchdog(run, sum(budgets[name] for name in args.sections) + 30)  # all the budgets: 10.8 minutes on a GPU
    with (args.out / "gpu_check.log").open("w") as log:
        run_sections(run, section_functions(profile, args), budgets, log)
    write_table(run)
    return 0 if run.report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
