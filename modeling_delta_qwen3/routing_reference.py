"""SPEC section 2's routing point in plain PyTorch: the oracle that every other routing implementation is tested
against, forward and backward (`tests/routing/test_routing_implementations.py`).

It stacks the sources, RMS-normalises them, scores them against the query, takes the softmax over sources and sums
the weighted sources, in the order the spec writes it, and shares no maths with the fast implementations. Autograd
saves a stacked and a normalised copy of the sources at every point, so its training memory grows with the square
of the depth: it is for checking, not for training large models.
"""

import torch

from .routing_sources import SourceList


def depth_mix(
    sources: list[torch.Tensor],
    w: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`residual + gate * mix_p` (the residual 0 and the gate 1 when None) over `sources`, each
    `[..., D]`, for a point whose query `q` times RMSNorm weight `g` is `w` (`[D]`: `q . RMSNorm_g(x) = w . x /
    RMS(x)`): computed in float32 like Qwen3's RMSNorm (float64 for float64 sources), returned in the sources'
    dtype, with the routing weights `[tokens, n]`."""
    compute = torch.promote_types(sources[0].dtype, torch.float32)
    x = torch.stack(sources).to(compute)  # [n, ..., D]
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    logits = normed @ w.to(compute)  # [n, ...]
    alpha = torch.softmax(logits, dim=0)
    mix = (alpha.unsqueeze(-1) * x).sum(0)  # [..., D]
    if gate is not None:
        mix = gate.to(compute) * mix
    if residual is not None:
        mix = residual.to(compute) + mix
    return mix.to(sources[0].dtype), alpha.reshape(len(sources), -1).T


class ReferenceSources(SourceList):
    """The reference implementation: `depth_mix` at every routing point, over the sources kept as a list."""

    mixture = staticmethod(depth_mix)
