"""Pictures of routing statistics (from `eval.routing.routing_statistics`), one or several models at once, and the
report that `delta-qwen3 routing` writes: the statistics as JSON plus both pictures.

- Heatmap: for each model, rows are routing points in depth order, columns are sources in the order they were
  created (0 = the embedding; then sublayer outputs, block deltas or block sums, by mode); the colour is the mean
  routing weight. Sources that do not exist yet at a point are blank.
- Max weight per depth: the mean largest routing weight at each sublayer, one line per model.
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import numpy as np  # noqa: E402

from delta_qwen3.atomic import atomic_output, write_json  # noqa: E402

REPORT_FILES = ("routing.json", "routing_heatmap.png", "routing_max_weight.png")


def _save(figure, path: Path) -> None:
    with atomic_output(path) as temporary:
        figure.savefig(temporary, format="png", dpi=120, bbox_inches="tight")
    plt.close(figure)


def sharpness_label(stats: dict) -> str:
    """Both mean-max-weight variants, named, for a title or legend."""
    multi = stats["mean_max_weight_multi_source"]
    return f"mean max weight {stats['mean_max_weight']:.2f} (all points)" + (
        f", {multi:.2f} (multi-source points)" if multi is not None else ""
    )


def _weight_matrix(stats: dict) -> np.ndarray:
    """[routing points, most sources] of mean weights, NaN where a source does not exist at a point."""
    points = stats["points"]
    matrix = np.full((len(points), max(point["num_sources"] for point in points)), np.nan)
    for row, point in enumerate(points):
        matrix[row, : point["num_sources"]] = point["mean_weights"]
    return matrix


def plot_weight_heatmaps(runs: dict[str, dict], path: Path) -> None:
    """One heatmap per model (label -> statistics), side by side, with a shared 0-1 colour scale."""
    figure, axes = plt.subplots(
        1, len(runs), figsize=(4.5 * len(runs) + 1, 6), squeeze=False, constrained_layout=True
    )
    for axis, (label, stats) in zip(axes[0], runs.items()):
        image = axis.imshow(_weight_matrix(stats), aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0)
        names = [point["name"] for point in stats["points"]]
        axis.set_yticks(range(len(names)), names, fontsize=7 if len(names) <= 64 else 4)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # sources are counted, not measured
        axis.set_xlabel("source (0 = embedding)")
        axis.set_ylabel("routing point (layer.sublayer)")
        axis.set_title(f"{label}\n{stats['routing_mode']}, {sharpness_label(stats)}", fontsize=9)
    figure.colorbar(image, ax=axes[0].tolist(), label="mean routing weight")
    _save(figure, path)


def plot_max_weight_by_depth(runs: dict[str, dict], path: Path) -> None:
    """The mean largest routing weight per sublayer, one line per model (label -> statistics)."""
    figure, axis = plt.subplots(figsize=(7, 4), constrained_layout=True)
    for label, stats in runs.items():
        sublayers = [point["sublayer"] for point in stats["points"]]
        values = [point["mean_max_weight"] for point in stats["points"]]
        axis.plot(sublayers, values, marker="o", markersize=3, label=f"{label} ({sharpness_label(stats)})")
    axis.set_ylim(0.0, 1.05)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlabel("sublayer (2i = layer i attention, 2i+1 = layer i MLP)")
    axis.set_ylabel("mean max routing weight")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    _save(figure, path)


def write_routing_report(runs: dict[str, dict], out_dir: Path, **details) -> list[Path]:
    """`routing.json` (`details` plus `models`: label -> statistics) and both pictures in `out_dir`."""
    out_dir = Path(out_dir)
    paths = [out_dir / name for name in REPORT_FILES]
    write_json(paths[0], {**details, "models": runs})
    plot_weight_heatmaps(runs, paths[1])
    plot_max_weight_by_depth(runs, paths[2])
    return paths
