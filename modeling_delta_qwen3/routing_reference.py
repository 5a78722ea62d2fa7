"""SPEC section 2's routing point in plain PyTorch: the oracle that every other routing implementation is tested
against, forward and backward (`tests/routing/test_routing_implementations.py`).

It stacks the sources, RMS-normalises them, scores them against the query, takes the softmax over sources and sums
the weighted sources, in the order the spec writes it, and shares no code with the fast implementations. Autograd
saves a stacked and a normalised copy of the sources at every point, so its training memory grows with the square
of the depth: it is for checking, not for training large models.
"""

import copy
from collections.abc import Iterator

import torch


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
    acc = torch.promote_types(sources[0].dtype, torch.float32)
    x = torch.stack(sources).to(acc)  # [n, ..., D]
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    logits = normed @ w.to(acc)  # [n, ...]
    alpha = torch.softmax(logits, dim=0)
    mix = (alpha.unsqueeze(-1) * x).sum(0)  # [..., D]
    if gate is not None:
        mix = gate.to(acc) * mix
    if residual is not None:
        mix = residual.to(acc) + mix
    return mix.to(sources[0].dtype), alpha.reshape(len(sources), -1).T


class SourceList:
    """The sources of one forward pass as a list of tensors, each routing point calling `mixture` over them (and
    over `extra`, a source that point alone reads): `depth_mix` here, another kernel of the same signature in
    subclasses."""

    mixture = staticmethod(depth_mix)

    def __init__(self, h0: torch.Tensor, plan, table):
        self.eps = plan.eps
        self.tensors: list[torch.Tensor] = []

    def append(self, x: torch.Tensor) -> None:
        self.tensors.append(x)

    def route(self, point, residual=None, extra=None) -> tuple[torch.Tensor, torch.Tensor]:
        """`residual + gamma * mix` (see `routing.Sources.route`) and the routing weights `[tokens, n_sources]`."""
        tensors = self.tensors if extra is None else [*self.tensors, extra]
        return self.mixture(tensors, point.w, self.eps, residual=residual, gate=point.gate)

    def carried(self) -> list[torch.Tensor]:
        """The tensors routed over (see `DepthState.carried`)."""
        return list(self.tensors)

    def with_carried(self, tensors: Iterator[torch.Tensor], table) -> "SourceList":
        """A copy holding the next `len(self.tensors)` of `tensors` in place of its own."""
        copied = copy.copy(self)
        copied.tensors = [next(tensors) for _ in self.tensors]
        return copied

    def to(self, *args, **kwargs) -> "SourceList":
        moved = copy.copy(self)
        moved.tensors = [t.to(*args, **kwargs) for t in self.tensors]
        return moved
