"""A study's results: per group (mode, block count, depth) the mean and spread over seeds, as one JSON, a printed
table and pictures (perplexity and routing sharpness against depth, validation loss curves)."""

import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from delta_qwen3.atomic import atomic_output  # noqa: E402

FIGURES = ("val_ppl", "mean_max_weight_multi_source", "mean_max_weight", "tokens_per_s")


def _spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "values": values}  # fmt: skip


def summarise(results: list[dict]) -> dict[str, dict]:
    """group -> {mode, num_blocks, layers, seeds, and the spread of each figure over the group's seeds}."""
    groups: dict[str, list[dict]] = {}
    for result in results:
        groups.setdefault(result["group"], []).append(result)
    summary = {}
    for group, members in groups.items():
        first = members[0]
        entry = {"mode": first["mode"], "num_blocks": first["num_blocks"], "layers": first["layers"],
                 "seeds": [m["seed"] for m in members]}  # fmt: skip
        for figure in FIGURES:
            values = [m[figure] for m in members if m.get(figure) is not None]
            if values:
                entry[figure] = _spread(values)
        summary[group] = entry
    return summary


def paired_with_baseline(results: list[dict]) -> dict[str, dict]:
    """group -> its validation perplexity relative to the baseline's of the same depth and seed, `ppl / ppl_baseline
    - 1` per seed the two share (negative: better), with their mean and how many are below zero. Seeds fix the
    initialisation and the data order alike, so a pair differs in its routing only and the seed spread, larger than
    the modes' differences at small budgets, cancels."""
    baseline = {(r["layers"], r["seed"]): r["val_ppl"] for r in results if r["mode"] == "baseline"}
    paired: dict[str, list[float]] = {}
    for result in results:
        key = (result["layers"], result["seed"])
        if result["mode"] != "baseline" and key in baseline:
            paired.setdefault(result["group"], []).append(result["val_ppl"] / baseline[key] - 1)
    return {group: {"relative_differences": values, "mean": statistics.fmean(values),
                    "below_baseline": sum(value < 0 for value in values), "pairs": len(values)}
            for group, values in paired.items()}  # fmt: skip


def format_table(summary: dict[str, dict], paired: dict[str, dict]) -> str:
    """One row per group: perplexity mean ± std over seeds, the mean paired difference from the baseline (and in how
    many seeds it is below), routing sharpness, tokens/s."""
    rows = [["mode", "layers", "seeds", "val ppl", "vs baseline, paired", "mean max weight (multi-source)",
             "tokens/s"]]  # fmt: skip
    for group, entry in sorted(summary.items(), key=lambda e: (e[1]["layers"], e[1]["mode"], e[1]["num_blocks"] or 0)):
        mode = entry["mode"] + (f" ({entry['num_blocks']} blocks)" if entry["num_blocks"] else "")
        sharp, pair = entry.get("mean_max_weight_multi_source"), paired.get(group)
        versus = "-" if pair is None else f"{100 * pair['mean']:+.1f} % ({pair['below_baseline']}/{pair['pairs']} below)"
        rows.append([mode, str(entry["layers"]), str(len(entry["seeds"])),
                     f"{entry['val_ppl']['mean']:.2f} ± {entry['val_ppl']['std']:.2f}", versus,
                     "-" if sharp is None else f"{sharp['mean']:.3f} ± {sharp['std']:.3f}",
                     f"{entry['tokens_per_s']['mean']:.0f}"])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(" | ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows)


def _series(summary: dict[str, dict], figure: str) -> dict[str, list[tuple[int, dict]]]:
    """label -> [(layers, spread)] sorted by depth, for the groups that have `figure`."""
    lines: dict[str, list] = {}
    for entry in summary.values():
        if figure in entry:
            label = entry["mode"] + (f" ({entry['num_blocks']} blocks)" if entry["num_blocks"] else "")
            lines.setdefault(label, []).append((entry["layers"], entry[figure]))
    return {label: sorted(points, key=lambda p: p[0]) for label, points in sorted(lines.items())}


def _save(figure, path: Path) -> Path:
    with atomic_output(path) as temporary:
        figure.savefig(temporary, format="png", dpi=120, bbox_inches="tight")
    plt.close(figure)
    return path


def plot_against_depth(summary: dict[str, dict], figure_name: str, ylabel: str, path: Path) -> Path:
    """One line per mode: the seeds' mean against depth, the bars spanning their min to max."""
    figure, axis = plt.subplots(figsize=(6.5, 4), constrained_layout=True)
    for label, points in _series(summary, figure_name).items():
        depths = [layers for layers, _ in points]
        means = [spread["mean"] for _, spread in points]
        low = [spread["mean"] - spread["min"] for _, spread in points]
        high = [spread["max"] - spread["mean"] for _, spread in points]
        axis.errorbar(depths, means, yerr=[low, high], marker="o", capsize=3, label=label)
    axis.set_xlabel("layers")
    axis.set_xticks(sorted({entry["layers"] for entry in summary.values()}))
    axis.set_ylabel(ylabel)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return _save(figure, path)


def plot_loss_curves(results: list[dict], path: Path) -> Path:
    """Validation loss against step, one panel per depth, one line per group (the mean over its seeds)."""
    depths = sorted({r["layers"] for r in results})
    figure, axes = plt.subplots(1, len(depths), figsize=(4.5 * len(depths), 3.8), squeeze=False, sharey=True,
                                constrained_layout=True)  # fmt: skip
    for axis, layers in zip(axes[0], depths):
        groups: dict[str, list[dict]] = {}
        for result in results:
            if result["layers"] == layers:
                groups.setdefault(result["group"], []).append(result)
        for group, members in sorted(groups.items()):
            steps = [step for step, _ in members[0]["val_loss_curve"]]
            losses = [statistics.fmean(m["val_loss_curve"][i][1] for m in members) for i in range(len(steps))]
            axis.plot(steps[1:], losses[1:], marker=".", label=group.rsplit("-L", 1)[0])  # step 0 is the init
        axis.set_title(f"{layers} layers", fontsize=10)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("validation loss")
    axes[0][-1].legend(fontsize=8)
    return _save(figure, path)


def write_pictures(summary: dict[str, dict], results: list[dict], out: Path) -> list[Path]:
    return [
        plot_against_depth(summary, "val_ppl", "validation perplexity", out / "ppl_vs_depth.png"),
        plot_against_depth(summary, "mean_max_weight_multi_source", "mean max routing weight (multi-source)",
                           out / "routing_sharpness_vs_depth.png"),  # fmt: skip
        plot_loss_curves(results, out / "val_loss_curves.png"),
    ]
