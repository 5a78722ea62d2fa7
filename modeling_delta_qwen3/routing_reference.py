"""SPEC section 2's routing point in plain PyTorch: the oracle that every other routing implementation is tested
against, forward and backward (`tests/modeling_delta_qwen3/routing/test_routing_implementations.py`).

`route` has the signature of the fast path's operation, `routing_op.route` (without the arguments of its grouped
reads), so that a test can run either on the same inputs. It RMS-normalises the sources, scores them against the
query, takes the softmax over sources and sums the weighted sources, in the order the spec writes it, and shares no
maths with the fast implementations. Autograd saves a stacked and a normalised copy of the sources at every point,
so its training memory grows with the square of the depth: it is for checking, not for training large models.
"""

import torch

from .routing_sources import SourceList


def route(
    sources: torch.Tensor,
    count: int,
    own_source: torch.Tensor | None,
    w: torch.Tensor,
    gate: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`residual + gate * mix_p` (the residual 0 and the gate 1 when None) over the first `count` sources of
    `sources` `[>= count, *tokens, D]` and `own_source` `[*tokens, D]`, a source this point alone reads (or None),
    for a point whose query `q` times RMSNorm weight `g` is `w` (`[D]`: `q . RMSNorm_g(x) = w . x / RMS(x)`):
    computed in float32 like Qwen3's RMSNorm (float64 for float64 sources), returned in the sources' dtype, with the
    routing weights `[*tokens, n]`."""
    compute = torch.promote_types(sources.dtype, torch.float32)
    x = sources[:count] if own_source is None else torch.cat([sources[:count], own_source[None]])
    x = x.to(compute)  # [n, *tokens, D]
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    logits = normed @ w.to(compute)  # [n, *tokens]
    alpha = torch.softmax(logits, dim=0)
    mix = (alpha.unsqueeze(-1) * x).sum(0)  # [*tokens, D]
    if gate is not None:
        mix = gate.to(compute) * mix
    if residual is not None:
        mix = residual.to(compute) + mix
    return mix.to(sources.dtype), alpha.movedim(0, -1)


class ReferenceSources(SourceList):
    """The reference implementation: `route` at every routing point, over the sources kept as a list."""

    def route(self, point, residual=None, own_source=None) -> tuple[torch.Tensor, torch.Tensor]:
        """See `routing_sources.Sources.route`."""
        sources = torch.stack(self.tensors)
        routed, weights = route(sources, len(self.tensors), own_source, point.w, point.gate, residual, self.eps)
        return routed, weights.reshape(-1, weights.shape[-1])
