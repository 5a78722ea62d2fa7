"""How sharply a model routes over depth, as one figure: the mean over routing points of each point's mean (over
tokens) largest routing weight. 1 means every token reads one source; 1/n, uniform weights over n sources.

It comes in two variants, named for the points they average over:

- `mean_max_weight`: every routing point;
- `mean_max_weight_multi_source`: only the points with more than one source. A point with one source (the first
  point of every mode, and in the block modes every point before the first block boundary) weighs 1 whatever the
  model learned, so this variant measures only the choices the model makes. It is the figure the training log,
  the demo and the depth study lead with.

Neither is comparable across points with different numbers of sources: uniform weights over 5 sources have a max
weight of 0.2, over 32 sources 0.03. Two figures that are, per point with `n > 1` sources, both 0 for uniform weights
and 1 when one source takes all the weight (`normalised_sharpness`):

- `max_above_uniform = (n * max - 1) / (n - 1)`: the mean largest weight, rescaled between uniform and one-hot;
- `entropy_sharpness = 1 - entropy / log n`: one minus the mean entropy of the weights relative to uniform's.

`depth_bands` averages these (and the raw max weight) over the early, middle and late thirds of a model's
multi-source points, the view the paper's comparison of Delta and Full AttnRes takes.

Training logs, `delta-qwen3 routing`, the demo and the depth study all compute it here.
"""

import math
from collections.abc import Sequence

import torch

DEPTH_BANDS = ("early", "middle", "late")
BAND_FIGURES = ("mean_max_weight", "max_above_uniform", "entropy_sharpness")


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


def normalised_sharpness(mean_max_weight: float, mean_entropy: float, num_sources: int) -> dict[str, float | None]:
    """A point's two figures comparable across source counts (see above); None for a point with one source, which
    chooses nothing."""
    n = num_sources
    if n < 2:
        return {"max_above_uniform": None, "entropy_sharpness": None}
    return {
        "max_above_uniform": (n * mean_max_weight - 1) / (n - 1),
        "entropy_sharpness": 1 - mean_entropy / math.log(n),
    }


def depth_bands(points: Sequence[dict]) -> dict[str, dict[str, float]]:
    """band -> the mean of each of `BAND_FIGURES` and of the source count over the band's points: the multi-source
    points in depth order, split into three consecutive parts as equal as possible (the earlier parts take the
    remainder). `points` are dicts with `num_sources` and the figures, as `eval.routing.routing_statistics` gives
    them. Bands are left out when there are fewer than three multi-source points."""
    multi = [point for point in points if point["num_sources"] > 1]
    if len(multi) < len(DEPTH_BANDS):
        return {}
    size, extra = divmod(len(multi), len(DEPTH_BANDS))
    bands, begin = {}, 0
    for index, band in enumerate(DEPTH_BANDS):
        members = multi[begin : begin + size + (index < extra)]
        begin += len(members)
        figures = (*BAND_FIGURES, "num_sources")
        bands[band] = {figure: sum(p[figure] for p in members) / len(members) for figure in figures}
    return bands
