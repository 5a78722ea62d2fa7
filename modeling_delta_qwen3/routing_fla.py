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
    """`routing_reference.depth_mix` through the fused kernel; the residual and gate are applied around it. The
    kernel takes a query and a norm weight: `w` already holds both, so its norm weight is ones."""
    mix, weights = fused_attnres(w, sources, torch.ones_like(w), rms_eps=eps, return_weights=True)
    return gated_residual(mix, residual, gate), weights.reshape(len(sources), -1).T


class FlaSources(SourceList):
    """The sources as separate tensors, each routing point one call of the fused kernel."""

    mixture = staticmethod(fla_depth_mix)
