"""The `"fla"` routing implementation: flash-linear-attention's `fused_attnres`, which computes `mix_p` (RMS-normalised
sources scored against the query, softmax over sources, weighted sum) in fused kernels, forward and backward. It
needs CUDA and the package (`pip install 'flash-linear-attention>=0.6,<0.7'`), and runs only when asked for by name."""

import torch

from .routing_math import gated_residual
from .routing_sources import SourceList

try:
    from fla.ops.attnres import fused_attnres
except ImportError:
    fused_attnres = None


def fla_unavailable(x: torch.Tensor) -> str | None:
    """Why the kernel cannot route sources like `x`, or None when it can."""
    if fused_attnres is None:
        return "flash-linear-attention is not installed (pip install 'flash-linear-attention>=0.6,<0.7')"
    if not x.is_cuda:
        return f"its kernels run on CUDA only, and the model runs on {x.device.type}"
    return None


def fla_depth_mix(
    sources: list[torch.Tensor],
    w: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`residual + gate * mix_p` over `sources` kept apart, and the routing weights `[tokens, n]`, through the fused
    kernel; the residual and gate are applied around it. The kernel takes a query and a norm weight: `w` already
    holds both, so its norm weight is ones."""
    mix, weights = fused_attnres(w, sources, torch.ones_like(w), rms_eps=eps, return_weights=True)
    return gated_residual(mix, residual, gate), weights.reshape(len(sources), -1).T


class FlaSources(SourceList):
    """The sources as separate tensors, each routing point one call of the fused kernel."""

    def route(self, point, residual=None, own_source=None) -> tuple[torch.Tensor, torch.Tensor]:
        """See `routing_sources.Sources.route`."""
        tensors = self.tensors if own_source is None else [*self.tensors, own_source]
        return fla_depth_mix(tensors, point.w, self.eps, residual=residual, gate=point.gate)
