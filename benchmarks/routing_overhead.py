"""What routing costs: DeltaQwen3 against Hugging Face's `Qwen3ForCausalLM` of the same shape, in one run.

Six figures, each as a ratio to Qwen3 measured in the same process:
- autograd saved-activation bytes of one training forward (unique storages, parameters excluded): noise-free;
- the operations PyTorch dispatches in a training forward and backward pass and in a decoding step: noise-free, and
  what bounds a step's time where each operation's dispatch costs more than its work (small shapes on a GPU);
- the bytes those operations read and write per token, forward and backward, at the 0.6B model's width and depth
  (`traffic`, counted operation by operation): what bounds a step's time where the work is large (long batches on a
  GPU), and, less Qwen3's, what the routing itself moves; beside them, on the meta device too, the saved activations
  at that shape, attention keeping what a GPU's keeps;
- training-step tokens/s (forward + backward + AdamW, fused on CUDA);
- the same with both models under `torch.compile(fullgraph=True)`, and the seconds of each one's first step (its
  compilation);
- greedy decoding tokens/s with the KV cache;
the speeds timed for one variant at a time against Qwen3, in pairs so that drift on a shared machine cancels: a training
step of each back to back, and a decoding model's forward passes alternating with Qwen3's one token at a time
(the two sharing their common weights); medians over the pairs, and the geometric mean of that over both orders
of building the two models (the order moves their speeds: benchmarks/README.md, "Spread between runs", says by how
much). On the CPU, glibc is told to keep freed memory for reuse (`keep_freed_memory`;
`--system-allocator` leaves its defaults).

    python benchmarks/routing_overhead.py --training-pairs 30  # the README's table (CPU, float32)
    python benchmarks/routing_overhead.py --device cuda --dtype bfloat16 --decode-shape qwen3-0.6b
    python benchmarks/routing_overhead.py --quick             # a smoke run
    python benchmarks/routing_overhead.py --figures decoding --variants delta,delta+gate   # a part of the table
    python benchmarks/routing_overhead.py --figures compiled_training --variants delta_block,delta --training-pairs 20
    python benchmarks/routing_overhead.py --figures operations --variants delta_block,delta
    python benchmarks/routing_overhead.py --figures traffic --dtype bfloat16 --routing-implementation fused
    python benchmarks/routing_overhead.py --device cuda --dtype bfloat16 --figures training --variants delta_block \
        --routing-implementation fla     # a routing implementation other than the model's default

Targets, checked and printed at the end: memory <= 1.05 (Delta Block) / 1.15 (Delta AttnRes), at 28 layers no
more than 0.03 above 12 layers; training >= 0.95 / 0.85; compiled training >= 0.97 / 0.90; decoding >= 0.95 for
both.
"""

import argparse
import ctypes
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AttentionInterface, DynamicCache, Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3.modeling_qwen3 import repeat_kv

from delta_qwen3.jsonl import json_text
from finetune.presets import preset_fields
from modeling_delta_qwen3 import DeltaQwen3Config, DeltaQwen3ForCausalLM
from modeling_delta_qwen3.modeling_delta_qwen3 import CACHE_NAME
from modeling_delta_qwen3.routing import IMPLEMENTATIONS
from modeling_delta_qwen3.routing_modes import ROUTING_MODES

# (label, routing mode or None for Qwen3, gated): Qwen3, and every mode, gated too where it may be.
VARIANTS = [("qwen3", None, False)] + [
    (name + ("+gate" if gated else ""), name, gated)
    for name, mode in ROUTING_MODES.items()
    for gated in ((False, True) if mode.gateable else (False,))
]
FIGURES = ("memory", "operations", "traffic", "training", "compiled_training", "decoding")
MAX_MEMORY = {"delta_block": 1.05, "delta": 1.15}
MIN_SPEED = {  # figure: mode: the least ratio to Qwen3
    "training": {"delta_block": 0.95, "delta": 0.85},
    "compiled_training": {"delta_block": 0.97, "delta": 0.90},
    "decoding": {"delta_block": 0.95, "delta": 0.95},
}

SMALL = dict(
    hidden_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=768,
    vocab_size=4096,
    max_position_embeddings=4096,
)
QWEN3_06B = {**preset_fields("qwen3-0.6b"), "vocab_size": 151936}
# The traffic figure's shape: the 0.6B model's, at the GPU check's two training batches (routing_fused.py reads the
# sources once per group of points only in long batches).
TRAFFIC_SHAPE = QWEN3_06B
TRAFFIC_BATCHES = {"4x512": (4, 512), "8x4096": (8, 4096)}
DECODE_SHAPES = {"qwen3-0.6b": QWEN3_06B, "small": {**SMALL, "num_hidden_layers": 12}}


@dataclass
class Settings:
    device: str
    dtype: torch.dtype
    batch: int
    seq: int
    depths: list[int]
    train_layers: int
    training_pairs: int
    decode_shape: dict
    prompt: int
    new_tokens: int
    decode_runs: int
    keep_freed_memory: bool
    variants: list[tuple[str, str | None, bool]] = field(default_factory=lambda: list(VARIANTS))  # Qwen3 first
    figures: tuple[str, ...] = FIGURES
    train_shape: dict | None = None  # the training figures' shape: by default SMALL with `train_layers` layers
    traffic_shape: dict = field(default_factory=lambda: dict(TRAFFIC_SHAPE))
    build_orders: tuple[str, ...] = ("qwen3_first", "variant_first")  # which of the two to time
    compile_backend: str = "inductor"
    routing_implementation: str | None = None  # None: the model's default

    def training_shape(self) -> dict:
        return self.train_shape or {**SMALL, "num_hidden_layers": self.train_layers}


def build(shape: dict, mode: str | None, gated: bool, settings: Settings, seed: int = 0) -> torch.nn.Module:
    """Qwen3 (`mode` None) or DeltaQwen3 with identical base weights (same seed, same parameter order)."""
    torch.manual_seed(seed)
    if mode is None:
        model = Qwen3ForCausalLM(Qwen3Config(**shape))
    else:
        blocks = min(4, shape["num_hidden_layers"])
        config = DeltaQwen3Config(**shape, routing_mode=mode, routing_gate=gated, routing_num_blocks=blocks,
                                  routing_implementation=settings.routing_implementation)
        model = DeltaQwen3ForCausalLM(config)
    model.config._attn_implementation = "sdpa"
    return model.to(device=settings.device, dtype=settings.dtype)


def keep_freed_memory() -> bool:
    """Has glibc's malloc keep freed memory for the next allocation, as PyTorch's CUDA caching allocator (or
    jemalloc and tcmalloc on CPU) does, instead of returning every block over 32 MB to the system and taking it
    back one zero-filled page fault at a time at the next step. With glibc's defaults those faults take a large
    share of Qwen3's own training step (benchmarks/README.md, "How it is timed"), and any extra buffer adds more:
    the timings would measure the allocator rather than the computation. Returns False where it does not apply
    (not glibc)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3  # malloc.h
    settings = [(m_mmap_threshold, 2**30), (m_trim_threshold, 2**31 - 1), (m_top_pad, 2**29)]
    return all(libc.mallopt(option, value) == 1 for option, value in settings)


def saved_activation_bytes(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves for backward in one training forward, parameters excluded.
    Storages are told apart by their own identity (`_cdata`), not their address: on the meta device every address
    is 0."""
    parameter_storages = {p.untyped_storage()._cdata for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in parameter_storages:
            storages[storage._cdata] = storage.nbytes()
        # Detached: a node that saves its own output would otherwise hold itself through the returned tensor, a
        # cycle that keeps the whole graph alive after the forward pass (gigabytes over the benchmark's runs).
        return tensor.detach()

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(ids, labels=ids).loss
    del loss
    return sum(storages.values())


class _OperationCount(TorchDispatchMode):
    """Counts the operations dispatched below autograd, views included (on a GPU a view launches no kernel, but its
    dispatch costs about as much as a small kernel's)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def dispatched_operations(run: Callable[[], None]) -> int:
    """The operations PyTorch dispatches in a call of `run`, after a first call that builds what later ones reuse."""
    run()
    with _OperationCount() as counter:
        run()
    return counter.count


class _Traffic(TorchDispatchMode):
    """Bytes that the dispatched operations read and write, as kernels that read each operand once and write each
    result once move them: views move nothing; an argument written in place counts as written, and also as read
    unless the operation only overwrites it (`copy_`, `fill_`, `zero_`). The routing operation's sources are counted
    as far as it reads them and as often as its kernels do (`_ROUTING_READS`)."""

    def __init__(self):
        super().__init__()
        self.read = self.written = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view:
            return out
        read, written = _operand_bytes(func, args, kwargs, out)
        self.read += read
        self.written += written
        return out


_OVERWRITES = {"copy_", "fill_", "zero_"}
# The routing operations' arguments `sources`, `count` and `start` (none: 0) by position, and how many times their
# kernels read the sources (routing_triton.py: the backward of `route` twice, for `c` and then the gradients; the
# others once): `sources` may be a whole buffer of which an operation reads slots `start` to `count`.
_ROUTING_READS = {
    "delta_qwen3::route": (0, 1, 7, 1),
    "delta_qwen3::route_backward": (1, 2, 8, 2),
    "delta_qwen3::route_partial": (0, 1, None, 1),
    "delta_qwen3::route_partial_backward": (2, 3, None, 1),
}


def _tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(item) for item in value)
    return 0


def _operand_bytes(func, args, kwargs, out) -> tuple[int, int]:
    """(bytes read, bytes written) by one operation (see `_Traffic`)."""
    schema = func._schema
    read = written = 0
    routing = _ROUTING_READS.get(schema.name)
    for index, argument in enumerate(schema.arguments):
        value = args[index] if index < len(args) else kwargs.get(argument.name)
        size = _tensor_bytes(value)
        if routing is not None and index == routing[0]:
            _, count, start, passes = routing
            start = 0 if start is None or start >= len(args) else args[start]
            size = size // max(1, value.shape[0]) * (args[count] - start) * passes
        elif routing is not None and argument.name == "own_source":
            size *= routing[3]
        if argument.alias_info is not None and argument.alias_info.is_write:
            written += size
            if schema.name.split("::")[-1] not in _OVERWRITES:
                read += size
        else:
            read += size
    if not any(r.alias_info is not None for r in schema.returns):  # in-place results are counted above
        written += _tensor_bytes(out)
    return read, written


def _seconds(run: Callable[[], None], device: str) -> float:
    """Wall time of `run()`, with the device's queued work finished before and after."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    run()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _paired_ratio(runs: dict[str, Callable[[], None]], repeats: int, warmup: int, device: str) -> tuple[float, float]:
    """`runs` holds "qwen3" and one variant: the median over rounds of `t(qwen3) / t(variant)`, each round timing
    both, one right after the other, so that drift on a shared machine cancels in each ratio; and the median
    seconds of Qwen3."""
    rounds = []
    for round_index in range(warmup + repeats):
        times = {}
        for name, run in runs.items():
            times[name] = _seconds(run, device)
        if round_index >= warmup:
            rounds.append(times)
    (variant,) = set(runs) - {"qwen3"}
    return statistics.median(r["qwen3"] / r[variant] for r in rounds), statistics.median(r["qwen3"] for r in rounds)


def _share_base_weights(first: torch.nn.Module, second: torch.nn.Module) -> None:
    """Makes `second` use `first`'s tensors for every weight the two have in common (Qwen3's), so that where the
    weights lie in memory, which moves decoding speed at the 0.6B shape, cannot favour either."""
    weights, names = first.state_dict(), second.state_dict().keys()
    second.load_state_dict({name: weights[name] for name in names & weights.keys()}, strict=False, assign=True)


def _ratios_against_qwen3(
    shape: dict,
    measure_pair: Callable[[dict[str, torch.nn.Module]], tuple[float, float]],
    settings: Settings,
    share_weights: bool = False,
) -> tuple[dict, float]:
    """Speed of every variant relative to Qwen3, each measured by `measure_pair` (models by name -> ratio and
    Qwen3's seconds) with only the two models alive, in both build orders or those of `settings.build_orders`
    (geometric mean; each order's ratio under "by_build_order", so that the spread between builds shows), optionally
    with their common weights shared; also the median seconds of Qwen3."""
    ratios, by_order, qwen3_seconds = {"qwen3": 1.0}, {}, []
    for label, mode, gated in settings.variants[1:]:
        by_order[label] = {}
        variant = (label, mode, gated)
        orders = {"qwen3_first": [VARIANTS[0], variant], "variant_first": [variant, VARIANTS[0]]}
        for order_name in settings.build_orders:
            order = orders[order_name]
            models = {name: build(shape, m, g, settings) for name, m, g in order}
            if share_weights:
                _share_base_weights(*models.values())
            by_order[label][order_name], seconds = measure_pair(models)
            qwen3_seconds.append(seconds)
            del models
        ratios[label] = statistics.geometric_mean(by_order[label].values())
    return ratios | {"by_build_order": by_order}, statistics.median(qwen3_seconds)


def training_step(model: torch.nn.Module, ids: torch.Tensor) -> Callable[[], None]:
    # Fused AdamW on CUDA, as GPU training runs use it: one launch for all parameters, so the optimizer's many
    # small launches do not hide the routing's share of a step.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=ids.is_cuda)
    model.train()

    def step() -> None:
        loss = model(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


class GreedyDecoder:
    """Greedy decoding with a KV cache, one forward pass per call: the prompt first (which gives the first new
    token), then one new token per call; `restart` starts over from the prompt."""

    def __init__(self, model: torch.nn.Module, prompt: torch.Tensor):
        self.model, self.prompt = model.eval(), prompt
        self.restart()

    def restart(self) -> None:
        self.cache, self.token = None, None

    def __call__(self) -> None:
        with torch.no_grad():
            if self.cache is None:
                self.cache, ids = DynamicCache(config=self.model.config), self.prompt
            else:
                ids = self.token
            logits = self.model(ids, use_cache=True, logits_to_keep=1, **{CACHE_NAME: self.cache}).logits
            self.token = logits[:, -1:].argmax(-1)


def paired_decoding(decoders: dict[str, GreedyDecoder], new_tokens: int, rounds: int, device: str) -> dict:
    """`decoders` holds "qwen3" and one variant. Each round decodes `new_tokens` with both, their forward passes
    alternating one by one (who goes first alternating too), so that each pair sees the same machine. Returns the
    medians over pairs of Qwen3's time over the variant's for the prompt and for a step, the whole generation's
    ratio from those (Qwen3's median times as weights), Qwen3's seconds for a generation, and the milliseconds
    the variant adds to the prompt and to a step."""
    names = list(decoders)
    (variant,) = set(names) - {"qwen3"}
    prompt, step = {name: [] for name in names}, {name: [] for name in names}
    for round_index in range(rounds + 1):  # the first round warms up
        for decoder in decoders.values():
            decoder.restart()
        for call in range(new_tokens):
            for name in names[:: 1 if (round_index + call) % 2 else -1]:
                seconds = _seconds(decoders[name], device)
                if round_index:
                    (prompt if call == 0 else step)[name].append(seconds)

    def paired(times: dict, combine: Callable[[float, float], float]) -> float:
        return statistics.median(combine(q, v) for q, v in zip(times["qwen3"], times[variant]))

    prompt_ratio, step_ratio = paired(prompt, lambda q, v: q / v), paired(step, lambda q, v: q / v)
    qwen3_prompt, qwen3_step = statistics.median(prompt["qwen3"]), statistics.median(step["qwen3"])
    qwen3_seconds = qwen3_prompt + (new_tokens - 1) * qwen3_step
    variant_seconds = qwen3_prompt / prompt_ratio + (new_tokens - 1) * qwen3_step / step_ratio
    return {
        "ratio": qwen3_seconds / variant_seconds,
        "qwen3_seconds": qwen3_seconds,
        "prompt_ms_more": 1000 * paired(prompt, lambda q, v: v - q),
        "step_ms_more": 1000 * paired(step, lambda q, v: v - q),
    }


def measure_memory(settings: Settings) -> dict:
    ids = torch.randint(0, SMALL["vocab_size"], (settings.batch, settings.seq), device=settings.device)
    results = {}
    for layers in settings.depths:
        shape = {**SMALL, "num_hidden_layers": layers}
        sizes = {
            label: saved_activation_bytes(build(shape, mode, gated, settings), ids)
            for label, mode, gated in settings.variants
        }
        results[layers] = {label: sizes[label] / sizes["qwen3"] for label in sizes} | {"qwen3_bytes": sizes["qwen3"]}
    return results


def measure_operations(settings: Settings) -> dict:
    """Operations dispatched by a training forward and backward pass (gradients set to None before it, so that none
    are accumulated) and by a decoding step, at each depth of the memory figure."""
    ids = torch.randint(0, SMALL["vocab_size"], (settings.batch, settings.seq), device=settings.device)
    prompt = ids[:1, : settings.prompt]

    def training_pass(model: torch.nn.Module) -> Callable[[], None]:
        model.train()

        def run() -> None:
            model.zero_grad(set_to_none=True)
            model(ids, labels=ids).loss.backward()

        return run

    def decoding_step(model: torch.nn.Module) -> Callable[[], None]:
        decoder = GreedyDecoder(model, prompt)
        decoder()  # the prompt
        return decoder

    results = {}
    for name, make_run in (("training", training_pass), ("decoding", decoding_step)):
        results[name] = {}
        for layers in settings.depths:
            shape = {**SMALL, "num_hidden_layers": layers}
            counts = {
                label: dispatched_operations(make_run(build(shape, mode, gated, settings)))
                for label, mode, gated in settings.variants
            }
            results[name][layers] = {label: counts[label] / counts["qwen3"] for label in counts} | {
                "qwen3_operations": counts["qwen3"]
            }
    return results


def _attention_saving_as_on_a_gpu(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Causal attention through PyTorch's memory-efficient kernel, whose backward pass keeps the output and its
    log-sum-exp as flash attention's does on a GPU, rather than the scores that attention on the CPU and the meta
    device keeps (`--figures traffic`'s saved activations: the same in both models, but the largest part of
    Qwen3's on the meta device otherwise)."""
    groups = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    out = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, None, compute_log_sumexp=True, is_causal=True, scale=scaling
    )[0]
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register("saving_as_on_a_gpu", _attention_saving_as_on_a_gpu)


def measure_traffic(settings: Settings) -> dict:
    """Bytes read and written per token by a training forward pass and by its backward pass at
    `settings.traffic_shape`, for each variant and each batch of `TRAFFIC_BATCHES`, and each variant's excess over
    Qwen3's: what its routing moves. Counted on the meta device, which computes nothing, so any batch costs a
    second or so (the ratios, unlike the excess, depend on the number of tokens: the weights' bytes are shared by
    all of them). Beside them, the saved activations' ratio to Qwen3's at that batch, attention keeping what a GPU's
    keeps."""
    shape = settings.traffic_shape
    results = {"hidden_size": shape["hidden_size"], "layers": shape["num_hidden_layers"]}
    for batch_name, (batch, seq) in TRAFFIC_BATCHES.items():
        tokens = batch * seq
        ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
        moved, saved = {"forward": {}, "backward": {}}, {}
        for label, mode, gated in settings.variants:
            with torch.device("meta"):
                model = build(shape, mode, gated, replace(settings, device="meta")).train()
            with _Traffic() as forward:
                loss = model(ids, labels=ids).loss
            with _Traffic() as backward:
                loss.backward()
            for name, counter in (("forward", forward), ("backward", backward)):
                moved[name][label] = {"read": counter.read / tokens, "written": counter.written / tokens}
            model.config._attn_implementation = "saving_as_on_a_gpu"
            saved[label] = saved_activation_bytes(model, ids)
        for by_variant in moved.values():
            qwen3_total = by_variant["qwen3"]["read"] + by_variant["qwen3"]["written"]
            for counted in by_variant.values():
                total = counted["read"] + counted["written"]
                counted |= {"ratio": total / qwen3_total, "routing_bytes": total - qwen3_total}
        saved_ratios = {label: size / saved["qwen3"] for label, size in saved.items()}
        results[batch_name] = moved | {"saved_activations": saved_ratios}
    return results


def measure_training(settings: Settings) -> dict:
    shape = settings.training_shape()
    ids = torch.randint(0, shape["vocab_size"], (settings.batch, settings.seq), device=settings.device)

    def measure_pair(models: dict) -> tuple[float, float]:
        runs = {name: training_step(model, ids) for name, model in models.items()}
        return _paired_ratio(runs, settings.training_pairs, 2, settings.device)

    ratios, seconds = _ratios_against_qwen3(shape, measure_pair, settings)
    return ratios | {"qwen3_tokens_per_s": ids.numel() / seconds}


def measure_compiled_training(settings: Settings) -> dict:
    """`measure_training` with both models of a pair compiled (`fullgraph=True`, so a graph break fails instead
    of timing eager code), each pair compiled afresh; also each model's first step, its compilation, in seconds
    (the longest over the pairs that built it)."""
    shape = settings.training_shape()
    ids = torch.randint(0, shape["vocab_size"], (settings.batch, settings.seq), device=settings.device)
    compile_seconds: dict[str, float] = {}

    def measure_pair(models: dict) -> tuple[float, float]:
        torch._dynamo.reset()  # nothing compiled for an earlier pair is reused, or counted against the cache limit
        runs = {}
        for name, model in models.items():
            runs[name] = training_step(torch.compile(model, backend=settings.compile_backend, fullgraph=True), ids)
            compile_seconds[name] = max(compile_seconds.get(name, 0.0), _seconds(runs[name], settings.device))
        return _paired_ratio(runs, settings.training_pairs, 2, settings.device)

    # Inductor's on-disk caches in a new directory: a compilation cached by an earlier run would take a fraction of
    # its time, while the second build order may reuse the first's (its compile time is not the one reported).
    with tempfile.TemporaryDirectory() as cache, mock.patch.dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache):
        ratios, seconds = _ratios_against_qwen3(shape, measure_pair, settings)
    return ratios | {"qwen3_tokens_per_s": ids.numel() / seconds, "compile_seconds": compile_seconds}


def measure_decoding(settings: Settings) -> dict:
    prompt = torch.randint(0, settings.decode_shape["vocab_size"], (1, settings.prompt), device=settings.device)

    def measure_pair(models: dict) -> tuple[float, float]:
        decoders = {name: GreedyDecoder(model, prompt) for name, model in models.items()}
        result = paired_decoding(decoders, settings.new_tokens, settings.decode_runs, settings.device)
        return result["ratio"], result["qwen3_seconds"]

    ratios, seconds = _ratios_against_qwen3(settings.decode_shape, measure_pair, settings, share_weights=True)
    return ratios | {"qwen3_tokens_per_s": settings.new_tokens / seconds}


def check_targets(results: dict, labels: list[str]) -> list[str]:
    """Every target that the figures measured for the variants `labels` miss, in words; empty when all are met."""
    missed = []
    memory = results.get("memory", {})
    depths = sorted(memory)
    for label in labels:
        mode = label.split("+")[0]
        if mode not in MAX_MEMORY:
            continue
        for layers in depths:
            if (ratio := memory[layers][label]) > MAX_MEMORY[mode]:
                missed.append(f"{label}: memory ratio {ratio:.3f} > {MAX_MEMORY[mode]} at {layers} layers")
        if len(depths) > 1 and memory[depths[-1]][label] - memory[depths[0]][label] > 0.03:
            missed.append(f"{label}: memory ratio grows with depth by more than 0.03")
        for figure, minima in MIN_SPEED.items():
            if figure in results and results[figure][label] < minima[mode]:
                missed.append(f"{label}: {figure} ratio {results[figure][label]:.3f} < {minima[mode]}")
    return missed


def format_table(results: dict, labels: list[str]) -> str:
    columns = [(f"memory {d}L", results["memory"][d]) for d in sorted(results.get("memory", {}))]
    for step, counts in results.get("operations", {}).items():
        columns += [(f"{step} ops {d}L", counts[d]) for d in sorted(counts)]
    for batch in TRAFFIC_BATCHES if "traffic" in results else ():
        for step in ("forward", "backward"):
            moved = results["traffic"][batch][step].items()
            columns.append((f"{batch} {step} MB/token", {k: v["routing_bytes"] / 1e6 for k, v in moved}))
        columns.append((f"{batch} saved", results["traffic"][batch]["saved_activations"]))
    titles = {"training": "train tok/s", "compiled_training": "compiled train tok/s", "decoding": "decode tok/s"}
    columns += [(title, results[figure]) for figure, title in titles.items() if figure in results]
    header = ["variant"] + [title for title, _ in columns]
    rows = [header] + [[label] + [f"{ratios[label]:.3f}" for _, ratios in columns] for label in labels]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines)


def _names(allowed: list[str]) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated list of names from `allowed`."""

    def parse(text: str) -> list[str]:
        names = text.split(",")
        unknown = [name for name in names if name not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}: choose from {', '.join(allowed)}")
        return names

    return parse


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_settings(argv: list[str] | None = None) -> tuple[Settings, Path | None]:
    labels = [label for label, _, _ in VARIANTS[1:]]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--decode-shape", default="qwen3-0.6b", choices=list(DECODE_SHAPES))
    parser.add_argument(
        "--quick", action="store_true", help="short sequences, few repeats, one build order: a smoke run"
    )
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    parser.add_argument("--variants", type=_names(labels), default=labels, help="comma-separated; Qwen3 always runs")
    parser.add_argument("--figures", type=_names(list(FIGURES)), default=list(FIGURES), help="comma-separated")
    parser.add_argument(
        "--training-pairs",
        type=_at_least_one,
        help="training steps of each model per build order (default 10, 2 with --quick): more on a noisy machine",
    )
    parser.add_argument(
        "--system-allocator", action="store_true", help="keep glibc's default of returning freed memory at once"
    )
    parser.add_argument(
        "--routing-implementation", choices=list(IMPLEMENTATIONS), help="route every variant with this one (default: "
        "the model's own choice, which under torch.compile is the compiled one)"
    )  # fmt: skip
    args = parser.parse_args(argv)
    settings = Settings(
        device=args.device,
        dtype=getattr(torch, args.dtype),
        batch=4,
        seq=128 if args.quick else 512,
        depths=[4, 8] if args.quick else [12, 28],
        train_layers=2 if args.quick else 12,
        training_pairs=args.training_pairs or (2 if args.quick else 10),  # `_at_least_one` rules out 0
        decode_shape=DECODE_SHAPES[args.decode_shape] if not args.quick else {**SMALL, "num_hidden_layers": 4},
        prompt=128,
        new_tokens=8 if args.quick else 32,
        decode_runs=2 if args.quick else 3,
        keep_freed_memory=not args.system_allocator,
        variants=[VARIANTS[0]] + [variant for variant in VARIANTS[1:] if variant[0] in args.variants],
        figures=tuple(figure for figure in FIGURES if figure in args.figures),
        build_orders=("qwen3_first",) if args.quick else ("qwen3_first", "variant_first"),
        traffic_shape={**SMALL, "num_hidden_layers": 4} if args.quick else dict(TRAFFIC_SHAPE),
        routing_implementation=args.routing_implementation,
    )
    if args.routing_implementation is not None:
        probe = torch.empty(0, device=args.device, dtype=settings.dtype)
        if (reason := IMPLEMENTATIONS[args.routing_implementation].unavailable(probe)) is not None:
            parser.error(f"--routing-implementation {args.routing_implementation} cannot run here: {reason}")
    return settings, args.output


def main(argv: list[str] | None = None) -> int:
    settings, output = parse_settings(argv)
    kept = settings.keep_freed_memory and settings.device == "cpu" and keep_freed_memory()
    torch.set_grad_enabled(True)
    results = {
        "settings": {
            "device": settings.device,
            "dtype": str(settings.dtype),
            "batch": settings.batch,
            "seq": settings.seq,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "training_pairs": settings.training_pairs,
            "freed_memory_kept": kept,
            "routing_implementation": settings.routing_implementation,
        },
    }
    measures = {"memory": measure_memory, "operations": measure_operations, "traffic": measure_traffic,
                "training": measure_training,
                "compiled_training": measure_compiled_training, "decoding": measure_decoding}  # fmt: skip
    results |= {figure: measures[figure](settings) for figure in settings.figures}
    labels = [label for label, _, _ in settings.variants]
    missed = check_targets(results, labels[1:])
    results["targets_missed"] = missed
    print(format_table(results, labels))
    if "compiled_training" in results:
        seconds = results["compiled_training"]["compile_seconds"]
        print("\nfirst compiled training step (compilation), seconds: "
              + ", ".join(f"{label} {seconds[label]:.0f}" for label in labels))
    print("\nall targets met" if not missed else "\ntargets missed:\n" + "\n".join(missed))
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json_text(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
