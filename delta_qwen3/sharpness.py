"""How sharply a model routes over depth, as one figure: the mean over routing points of each point's mean (over
tokens) largest routing weight. 1 means every token reads one source; 1/n, uniform weights over n sources.

It comes in two variants, named for the points they average over:

- `mean_max_weight`: every routing point;
- `mean_max_weight_multi_source`: only the points with more than one source. A point with one source (the first
  point of every mode, and in the block modes every point before the first block boundary) weighs 1 whatever the
  model learned, so this variant measures only the choices the model makes. It is the figure the training log,
  the demo and the depth study lead with.

Training logs, `delta-qwen3 routing`, the demo and the depth study all compute it here.
"""

from collections.abc import Sequence

import torch


def point_max_weights(routing_weights: Sequence[torch.Tensor]) -> torch.Tensor:
    """`[num_points]` (float32): each point's mean over tokens of the largest weight, from the model's
    `routing_weights` (one `[..., n_sources]` tensor per point)."""
    return torch.stack([weights.max(-1).values.float().mean() for weights in routing_weights])


def mean_max_weights(point_means: torch.Tensor, num_sources: Sequence[int]) -> dict[str, torch.Tensor | None]:
    """Both variants from the points' mean largest weights `[num_points]` and their source counts; the
    multi-source variant is None when no point has two sources."""
    multi = torch.tensor([n > 1 for n in num_sources], device=point_means.device)
    return {
        "mean_max_weight": point_means.mean(),
        "mean_max_weight_multi_source": point_means[multi].mean() if multi.any() else None,
    }
