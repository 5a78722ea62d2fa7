"""The `"compiled"` routing implementation, the default under `torch.compile`: routing in operations Dynamo traces
(no autograd functions with state, no buffers written in place), so that `torch.compile(model, fullgraph=True)`
compiles the whole forward and backward pass into one graph.

Each source is scored against every routing point once, when it is appended: `r_j (x_j . w_p)` for all points `p`
in one matrix product, with the points' `w_p = q_p * g_p` stacked at the first source (the plan's points, in the
order they run). A routing point then only takes the softmax of its column of those logits and sums its sources,
one by one, never stacked: one read of each source per point forward, and autograd saves nothing of a source's size
per point (the sources exist anyway), so training memory stays linear in depth. Where the points' parameters are not
known up front (sharded by FSDP), each point scores its sources itself.
"""

from collections.abc import Iterator

import torch

from .routing_buffer import upfront_queries
from .routing_math import (
    as_dtype,
    compute_dtype,
    inverse_rms,
    logits,
    logits_against_points,
    mixture_of,
    point_query,
    routing_weights,
)
from .routing_reference import SourceList


class CompiledSources(SourceList):
    """The sources as a list, each with its logits against every routing point (`[points, tokens]`, or None where
    the points' parameters are not known up front); points route in the order of `points`."""

    def __init__(self, eps: float, points: list):
        super().__init__(eps)
        self.points = points
        self.queries: torch.Tensor | None = None  # [points, D], from the first source on
        self.source_logits: list[torch.Tensor | None] = []
        self.routed = 0  # the points routed so far

    def _rows(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`x` as `[tokens, D]` rows in the compute dtype, and their inverse RMS `[tokens]`."""
        rows = as_dtype(x, compute_dtype(x.dtype)).reshape(-1, x.shape[-1])
        return rows, inverse_rms(rows, rows.new_full((), self.eps))

    def _logits_at_point(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """One point's logits `[tokens]` for the source `x`, scored when the point runs."""
        rows, inv_rms = self._rows(x)
        return logits(rows, w, inv_rms)

    def append(self, x: torch.Tensor) -> None:
        if not self.tensors:
            self.queries = upfront_queries(self.points, x)
        super().append(x)
        self.source_logits.append(None if self.queries is None else logits_against_points(self.queries, *self._rows(x)))

    def route(self, point, residual=None, extra=None) -> tuple[torch.Tensor, torch.Tensor]:
        """`residual + gamma * mix` (`mix` without a residual) over the sources and `extra`, a source this point
        alone reads; and the routing weights `[tokens, n_sources]`."""
        p, self.routed = self.routed, self.routed + 1
        tensors = self.tensors if extra is None else [*self.tensors, extra]
        scores = [*self.source_logits, None] if extra is not None else self.source_logits
        like = tensors[0]
        acc = compute_dtype(like.dtype)
        w = point_query(*point.query_and_norm_weight(), acc) if any(s is None for s in scores) else None
        scores = [self._logits_at_point(x, w) if s is None else s[p] for x, s in zip(tensors, scores)]
        alpha = routing_weights(torch.stack(scores), sources_dim=0)  # [n, tokens]
        mix = mixture_of([as_dtype(t, acc) for t in tensors], alpha.view(len(tensors), *like.shape[:-1]))
        if residual is not None:
            mix = as_dtype(residual, acc) + (mix if point.gate is None else as_dtype(point.gate, acc) * mix)
        return as_dtype(mix, like.dtype), alpha.T.detach()

    def carried(self) -> list[torch.Tensor]:
        scores = [s for s in self.source_logits if s is not None]
        return [*super().carried(), *scores, *([] if self.queries is None else [self.queries])]

    def with_carried(self, tensors: Iterator[torch.Tensor]) -> "CompiledSources":
        copied = super().with_carried(tensors)
        copied.source_logits = [None if s is None else next(tensors) for s in self.source_logits]
        copied.queries = None if self.queries is None else next(tensors)
        return copied

    def to(self, *args, **kwargs) -> "CompiledSources":
        moved = CompiledSources(self.eps, self.points)
        moved.tensors = [t.to(*args, **kwargs) for t in self.tensors]
        moved.source_logits = [None if s is None else s.to(*args, **kwargs) for s in self.source_logits]
        moved.queries = None if self.queries is None else self.queries.to(*args, **kwargs)
        moved.routed = self.routed
        return moved


def new_sources(h0: torch.Tensor, eps: float, capacity: int, points: list) -> CompiledSources:
    return CompiledSources(eps, points)
