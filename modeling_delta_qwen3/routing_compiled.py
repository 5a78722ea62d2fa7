"""The `"compiled"` routing implementation, the default under `torch.compile`: routing in operations Dynamo traces
(no autograd functions with state, no buffers written in place), so that `torch.compile(model, fullgraph=True)`
compiles the whole forward and backward pass into one graph.

Training memory stays linear in depth: each routing point is an activation checkpoint that saves only its inputs,
the sources (which exist anyway) and its parameters, and recomputes its normalised sources in backward
(`MUST_RECOMPUTE`: the partitioner would otherwise keep the stacked logits' inputs of every point, a copy of the
sources per point). The sources are scored and summed one by one, never stacked, so that nothing of their size is
made per point; the compiler fuses the per-source operations.
"""

from functools import partial

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from .routing_math import (
    as_dtype,
    compute_dtype,
    inverse_rms,
    logits,
    mixture_of,
    point_query,
    routing_weights,
)
from .routing_reference import SourceList


def _recompute_everything(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_RECOMPUTE


def _gated_mixture(query, norm_weight, gate, eps: float, *sources: torch.Tensor):
    """`gamma * mix_p` (`mix_p` without a gate) in the sources' dtype and the routing weights `[tokens, n]`."""
    acc = compute_dtype(sources[0].dtype)
    w = point_query(query, norm_weight, acc)
    x = [as_dtype(source, acc) for source in sources]
    eps_tensor = x[0].new_full((), eps)
    alpha = routing_weights(torch.stack([logits(s, w, inverse_rms(s, eps_tensor)) for s in x]), sources_dim=0)
    mix = mixture_of(x, alpha)
    if gate is not None:
        mix = mix * as_dtype(gate, acc)
    return as_dtype(mix, sources[0].dtype), alpha.reshape(len(sources), -1).T.detach()


def compiled_depth_mix(
    sources: list[torch.Tensor],
    query: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`routing_reference.depth_mix`, its routing inside an activation checkpoint when autograd records it."""
    if torch.is_grad_enabled():
        mix, weights = checkpoint(
            _gated_mixture, query, norm_weight, gate, eps, *sources,
            use_reentrant=False, context_fn=partial(create_selective_checkpoint_contexts, _recompute_everything),
        )
    else:
        mix, weights = _gated_mixture(query, norm_weight, gate, eps, *sources)
    return (mix if residual is None else residual + mix), weights


class CompiledSources(SourceList):
    mixture = staticmethod(compiled_depth_mix)


def new_sources(h0: torch.Tensor, eps: float, capacity: int, points: list, scratch) -> CompiledSources:
    return CompiledSources(eps)
