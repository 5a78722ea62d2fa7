"""Stream the source's tensors, shard by shard, into the converted checkpoint and add the routing tensors.

Only one shard's tensors are in memory at a time; the full model is never built (the expected parameter names and
shapes come from a model on the meta device, which allocates nothing)."""

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from delta_qwen3.errors import CommandError
from delta_qwen3.jsonl import json_text
import modeling_delta_qwen3
from modeling_delta_qwen3 import DeltaQwen3Config, DeltaQwen3PreTrainedModel
from modeling_delta_qwen3.routing_points import RoutingPoint

from .source import WEIGHTS_INDEX_NAME, SourceCheckpoint

_TIED_HEAD = "lm_head.weight"


def meta_model(config: DeltaQwen3Config) -> DeltaQwen3PreTrainedModel:
    """The converted model (of the class `config.architectures` names) on the meta device: its parameter names,
    order and shapes, without any memory."""
    with torch.device("meta"):
        return getattr(modeling_delta_qwen3, config.architectures[0])(config)


def routing_tensors(model: DeltaQwen3PreTrainedModel, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every routing parameter of `model` at its initial value (SPEC section 4), taken from fresh routing points."""
    config = model.config
    fresh = {
        gated: RoutingPoint(config.hidden_size, config.rms_norm_eps, gated).to(dtype).state_dict()
        for gated in (False, True)
    }
    return {
        f"{name}.{key}": value.clone()  # a tensor of its own each: safetensors refuses shared memory
        for name, module in model.named_modules()
        if isinstance(module, RoutingPoint)
        for key, value in fresh[module.gate is not None].items()
    }


def check_source_tensors(source: SourceCheckpoint, expected: dict[str, tuple[int, ...]], tied: bool) -> None:
    """Refuse a checkpoint whose tensors are not exactly `expected` (name -> shape); with tied embeddings the
    output head may be absent."""
    found = {name: shape for name, (_, shape) in source.tensors.items()}
    optional = {_TIED_HEAD} if tied else set()
    missing = sorted(expected.keys() - found.keys() - optional)
    unexpected = sorted(found.keys() - expected.keys())
    mismatched = sorted(name for name in found.keys() & expected.keys() if found[name] != expected[name])
    problems = [
        f"{label}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
        for label, names in (("missing", missing), ("unexpected", unexpected), ("wrong shape", mismatched))
        if names
    ]
    if problems:
        raise CommandError(f"SRC {source.path} does not match its own Qwen3 config; tensors " + "; ".join(problems))


def place_routing_tensors(source: SourceCheckpoint, parameter_order: list[str],
                          tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Assign each routing tensor to the shard holding the source tensor just before it in parameter order (its
    layer's weights), so the converted shards stay as balanced as the source's."""
    shard_of = {name: shard for shard, names in source.shards.items() for name in names}
    placed: dict[str, dict[str, torch.Tensor]] = {shard: {} for shard in source.shards}
    current = next(iter(source.shards))
    for name in parameter_order:
        if name in tensors:
            placed[current][name] = tensors[name]
        else:
            current = shard_of.get(name, current)
    return placed


def _load_shard(file: Path, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    try:
        with safe_open(file, framework="pt") as f:
            return {name: f.get_tensor(name) if dtype is None else f.get_tensor(name).to(dtype) for name in f.keys()}
    except SafetensorError as error:
        raise CommandError(f"{file} could not be read (corrupt?): {error}")


def plan_routing_tensors(source: SourceCheckpoint, config: DeltaQwen3Config,
                         dtype: torch.dtype) -> dict[str, dict[str, torch.Tensor]]:
    """Check the source's tensors against `config` and return the routing tensors to add, per output shard."""
    model = meta_model(config)
    new_tensors = routing_tensors(model, dtype)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    source_shapes = {name: shape for name, shape in shapes.items() if name not in new_tensors}
    check_source_tensors(source, source_shapes, config.tie_word_embeddings)
    return place_routing_tensors(source, list(shapes), new_tensors)


def write_weights(source: SourceCheckpoint, additions: dict[str, dict[str, torch.Tensor]], out_dir: Path,
                  dtype: torch.dtype | None) -> None:
    """Write each source shard, cast to `dtype` (None: each tensor keeps its own) and with its `additions`, into
    `out_dir` under the same name, plus the index when the source is sharded. Peak memory is about one shard."""
    weight_map: dict[str, str] = {}
    total_size = 0
    for shard, shard_additions in tqdm(additions.items(), desc="Converting shards", unit="shard",
                                       disable=len(additions) < 2):
        tensors = _load_shard(source.path / shard, dtype) | shard_additions
        save_file(tensors, out_dir / shard, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, shard)
        total_size += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors  # release this shard before reading the next
    if source.sharded:
        index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
        (out_dir / WEIGHTS_INDEX_NAME).write_text(json_text(index, indent=2) + "\n")
