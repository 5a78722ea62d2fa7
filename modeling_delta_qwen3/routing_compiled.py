"""The `"compiled"` routing implementation, the default under `torch.compile`: routing in operations Dynamo traces
(no autograd functions with state, no buffers written in place), so that `torch.compile(model, fullgraph=True)`
compiles the whole forward and backward pass into one graph.

Each source is scored against every routing point once, when it is appended: `r_j (x_j . w_p)` for all points `p`
in one matrix product, with the points' `w_p = q_p * g_p` stacked in the order they run (`routing_points.PointTable`). A
routing point then only takes the softmax of its column of those logits and sums its sources, one by one, never
stacked: one read of each source per point forward, and autograd saves nothing of a source's size per point (the
sources exist anyway), so training memory stays linear in depth. Where the points' parameters are not
known up front (sharded by FSDP), each point scores its sources itself.
"""

import torch

from .routing_math import (
    as_dtype,
    compute_dtype,
    gated_residual,
    inverse_rms,
    logits,
    logits_against_points,
    weighted_sum_of_list,
    source_softmax,
)
from .routing_sources import SourceList


class CompiledSources(SourceList):
    """The sources as a list, each with its logits against every routing point (`[points, tokens]`, or None where
    the points' parameters are not stacked up front: see `routing_points.PointTable`)."""

    def __init__(self, h0: torch.Tensor, plan, table):
        super().__init__(h0, plan, table)
        self.queries = table.queries  # [points, D] or None
        self.source_logits: list[torch.Tensor | None] = []

    def _rows(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`x` as `[tokens, D]` rows in the compute dtype, and their inverse RMS `[tokens]`."""
        rows = as_dtype(x, compute_dtype(x.dtype)).reshape(-1, x.shape[-1])
        return rows, inverse_rms(rows, rows.new_full((), self.eps))

    def _score(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """One point's logits `[tokens]` for the source `x`, where it was not scored up front."""
        rows, inv_rms = self._rows(x)
        return logits(rows, w, inv_rms)

    def append(self, x: torch.Tensor) -> None:
        super().append(x)
        self.source_logits.append(None if self.queries is None else logits_against_points(self.queries, *self._rows(x)))

    def route(self, point, residual=None, own_source=None) -> tuple[torch.Tensor, torch.Tensor]:
        """See `routing_sources.Sources.route`."""
        tensors = self.tensors if own_source is None else [*self.tensors, own_source]
        scores = [*self.source_logits, None] if own_source is not None else self.source_logits
        scores = [self._score(x, point.w) if s is None else s[point.index] for x, s in zip(tensors, scores)]
        alpha = source_softmax(torch.stack(scores), sources_dim=0)  # [n, tokens]
        like = tensors[0]
        weights = alpha.view(len(tensors), *like.shape[:-1])
        mix = weighted_sum_of_list([as_dtype(t, point.w.dtype) for t in tensors], weights)
        return as_dtype(gated_residual(mix, residual, point.gate), like.dtype), alpha.T.detach()
