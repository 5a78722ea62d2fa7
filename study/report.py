"""A study's results: per group (mode, block count, depth) the mean and spread over seeds, as one JSON, a printed
table and pictures (perplexity and routing sharpness per depth band against depth, paired differences between
modes, validation loss curves)."""

import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from delta_qwen3.atomic import atomic_output  # noqa: E402
from delta_qwen3.sharpness import BAND_FIGURES, DEPTH_BANDS  # noqa: E402

FIGURES = ("val_ppl", "mean_max_weight_multi_source", "mean_max_weight", "tokens_per_s")
# Each delta mode's AttnRes counterpart: the same sources' routing without the residual stream, the paper's
# comparison.
COUNTERPARTS = {"delta": "attnres_full", "delta_block": "attnres_block"}
# Student's t two-sided 95 % quantiles by degrees of freedom (pairs - 1), for the paired differences' intervals;
# past 30 the normal's 1.960, within 2 % of t's.
T_QUANTILES_95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
                  2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
                  2.045, 2.042)  # fmt: skip


def _spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "values": values}  # fmt: skip


def summarise(results: list[dict]) -> dict[str, dict]:
    """group -> {mode, num_blocks, layers, seeds, the spread of each figure over the group's seeds, and `bands`:
    band -> figure -> spread, for the routing sharpness per depth band}."""
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
        bands = {band: {figure: _spread([m["bands"][band][figure] for m in members]) for figure in BAND_FIGURES}
                 for band in DEPTH_BANDS if all(band in m.get("bands", {}) for m in members)}  # fmt: skip
        if bands:
            entry["bands"] = bands
        summary[group] = entry
    return summary


def _against(result: dict) -> list[tuple[str, int | None]]:
    """The (mode, block count) each run is compared with: the baseline, and its AttnRes counterpart if it has one."""
    if result["mode"] == "baseline":
        return []
    counterpart = COUNTERPARTS.get(result["mode"])
    return [("baseline", None)] + ([(counterpart, result["num_blocks"])] if counterpart else [])


def mean_interval_95(differences: list[float]) -> list[float] | None:
    """The 95 % confidence interval of the mean of paired differences (Student's t over the pairs); None for one."""
    if len(differences) < 2:
        return None
    mean = statistics.fmean(differences)
    degrees = len(differences) - 1
    quantile = T_QUANTILES_95[degrees - 1] if degrees <= len(T_QUANTILES_95) else 1.960
    half = quantile * statistics.stdev(differences) / len(differences) ** 0.5
    return [mean - half, mean + half]


def paired_comparisons(results: list[dict]) -> dict[str, dict]:
    """"GROUP vs GROUP" -> each mode against the baseline and against its AttnRes counterpart of the same depth
    (and block count): per seed the two share, `ppl / ppl_other - 1` (negative: the first is better), their mean
    with its 95 % interval over the seeds, and how many are below zero. Seeds fix the initialisation and the data
    order alike, so a pair differs in its routing only and the seed spread, larger than the modes' differences at
    small budgets, cancels."""
    ppl = {(r["mode"], r["num_blocks"], r["layers"], r["seed"]): r["val_ppl"] for r in results}
    groups = {(r["mode"], r["num_blocks"], r["layers"]): r["group"] for r in results}
    paired: dict[str, dict] = {}
    for result in sorted(results, key=lambda r: r["seed"]):
        for mode, blocks in _against(result):
            other = ppl.get((mode, blocks, result["layers"], result["seed"]))
            if other is None:
                continue
            name = f"{result['group']} vs {groups[mode, blocks, result['layers']]}"
            entry = paired.setdefault(name, {"mode": result["mode"], "against": mode,
                                             "num_blocks": result["num_blocks"], "layers": result["layers"],
                                             "seeds": [], "relative_differences": []})  # fmt: skip
            entry["seeds"].append(result["seed"])
            entry["relative_differences"].append(result["val_ppl"] / other - 1)
    for entry in paired.values():
        differences = entry["relative_differences"]
        entry |= {"mean": statistics.fmean(differences), "interval95": mean_interval_95(differences),
                  "below": sum(d < 0 for d in differences), "pairs": len(differences)}  # fmt: skip
    return paired


def _label(entry: dict) -> str:
    return entry["mode"] + (f" ({entry['num_blocks']} blocks)" if entry["num_blocks"] else "")


def _versus(paired: dict[str, dict], group: str, against: str) -> str:
    pair = next((p for name, p in paired.items() if name.startswith(f"{group} vs ") and p["against"] == against), None)
    if pair is None:
        return "-"
    interval = ""
    if pair["interval95"] is not None:
        interval = " [{:+.1f}, {:+.1f}]".format(*(100 * v for v in pair["interval95"]))
    return f"{100 * pair['mean']:+.1f} %{interval} ({pair['below']}/{pair['pairs']} below)"


def _order(entry: dict) -> tuple:
    return entry["layers"], entry["mode"], entry["num_blocks"] or 0


def _in_order(summary: dict[str, dict]) -> list[tuple[str, dict]]:
    return sorted(summary.items(), key=lambda e: _order(e[1]))


def _columns(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(" | ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows)


def format_table(summary: dict[str, dict], paired: dict[str, dict]) -> str:
    """One row per group: perplexity mean ± std over seeds, the mean paired difference from the baseline and from
    the AttnRes counterpart (and in how many seeds it is below), routing sharpness, tokens/s."""
    rows = [["mode", "layers", "seeds", "val ppl", "vs baseline, paired", "vs AttnRes counterpart, paired",
             "mean max weight (multi-source)", "tokens/s"]]  # fmt: skip
    for group, entry in _in_order(summary):
        sharp = entry.get("mean_max_weight_multi_source")
        rows.append([_label(entry), str(entry["layers"]), str(len(entry["seeds"])),
                     f"{entry['val_ppl']['mean']:.2f} ± {entry['val_ppl']['std']:.2f}",
                     _versus(paired, group, "baseline"), _versus(paired, group, COUNTERPARTS.get(entry["mode"], "")),
                     "-" if sharp is None else f"{sharp['mean']:.3f} ± {sharp['std']:.3f}",
                     f"{entry['tokens_per_s']['mean']:.0f}"])  # fmt: skip
    return _columns(rows)


def early_loss(curve: list[list[float]]) -> tuple[int, float]:
    """The validation loss evaluated nearest a tenth of the run (step 0 aside), and its step: how long the run stayed
    on the loss plateau that training starts on, which a seed's perplexity at the end can still show."""
    step, loss = min(curve[1:] or curve, key=lambda point: abs(point[0] - curve[-1][0] / 10))
    return int(step), loss


def format_seed_table(results: list[dict]) -> str:
    """One row per group and one column per seed: the final validation perplexity, and in brackets the validation
    loss a tenth of the way through (`early_loss`)."""
    seeds = sorted({r["seed"] for r in results})
    by_group: dict[str, dict[int, dict]] = {}
    for result in results:
        by_group.setdefault(result["group"], {})[result["seed"]] = result

    def cell(run: dict | None) -> str:
        return "-" if run is None else f"{run['val_ppl']:.1f} ({early_loss(run['val_loss_curve'])[1]:.2f})"

    rows = [["mode", "layers"] + [f"seed {seed}" for seed in seeds]]
    for members in sorted(by_group.values(), key=lambda members: _order(next(iter(members.values())))):
        first = next(iter(members.values()))
        rows.append([_label(first), str(first["layers"])] + [cell(members.get(seed)) for seed in seeds])
    return _columns(rows)


def format_band_table(summary: dict[str, dict]) -> str:
    """One row per routed group: per depth band, the raw mean max weight and the two figures comparable across
    source counts (`delta_qwen3.sharpness`), means over seeds."""
    rows = [["mode", "layers", *(f"{band}: max / max above uniform / 1 - H/log n" for band in DEPTH_BANDS)]]
    for _, entry in _in_order(summary):
        if "bands" in entry:
            cells = [" / ".join(f"{entry['bands'][band][figure]['mean']:.3f}" for figure in BAND_FIGURES)
                     for band in DEPTH_BANDS]  # fmt: skip
            rows.append([_label(entry), str(entry["layers"]), *cells])
    return _columns(rows)


def _series(summary: dict[str, dict], pick) -> dict[str, list[tuple[int, dict]]]:
    """label -> [(layers, spread)] sorted by depth, for the groups where `pick(entry)` gives a spread."""
    lines: dict[str, list] = {}
    for entry in summary.values():
        if (spread := pick(entry)) is not None:
            lines.setdefault(_label(entry), []).append((entry["layers"], spread))
    return {label: sorted(points, key=lambda p: p[0]) for label, points in sorted(lines.items())}


def save_figure(figure, path: Path) -> Path:
    with atomic_output(path) as temporary:
        figure.savefig(temporary, format="png", dpi=120, bbox_inches="tight")
    plt.close(figure)
    return path


def _draw_against_depth(axis, summary: dict[str, dict], pick, ylabel: str) -> None:
    """One line per mode: the seeds' mean against depth, the bars spanning their min to max."""
    for label, points in _series(summary, pick).items():
        depths = [layers for layers, _ in points]
        means = [spread["mean"] for _, spread in points]
        low = [spread["mean"] - spread["min"] for _, spread in points]
        high = [spread["max"] - spread["mean"] for _, spread in points]
        axis.errorbar(depths, means, yerr=[low, high], marker="o", capsize=3, label=label)
    axis.set_xlabel("layers")
    axis.set_xticks(sorted({entry["layers"] for entry in summary.values()}))
    axis.set_ylabel(ylabel)
    axis.grid(alpha=0.3)


def plot_perplexity(summary: dict[str, dict], path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(6.5, 4), constrained_layout=True)
    _draw_against_depth(axis, summary, lambda entry: entry["val_ppl"], "validation perplexity")
    axis.legend(fontsize=8)
    return save_figure(figure, path)


def plot_sharpness_by_band(summary: dict[str, dict], path: Path) -> Path:
    """Routing sharpness against depth, one column per depth band: the raw mean max weight above, below
    `1 - entropy / log n`, which is comparable across source counts (0 uniform, 1 one source)."""
    rows = (("mean_max_weight", "mean max weight"), ("entropy_sharpness", "1 - entropy / log n"))
    figure, axes = plt.subplots(len(rows), len(DEPTH_BANDS), figsize=(12, 7), sharey="row", constrained_layout=True)
    for row, (name, ylabel) in zip(axes, rows):
        for axis, band in zip(row, DEPTH_BANDS):
            _draw_against_depth(axis, summary, lambda entry: entry.get("bands", {}).get(band, {}).get(name), ylabel)
            axis.set_title(f"{band} routing points", fontsize=10)
    if axes[0][-1].get_legend_handles_labels()[0]:  # none where no group routes (baselines only)
        axes[0][-1].legend(fontsize=8)
    return save_figure(figure, path)


def plot_paired_differences(paired: dict[str, dict], path: Path) -> Path:
    """One panel per comparison: each seed's relative perplexity difference (a dot) and their mean (a line) with
    its 95 % interval (a bar) against depth; below zero, the first mode is better."""
    comparisons: dict[str, list[dict]] = {}
    for entry in paired.values():
        comparisons.setdefault(f"{_label(entry)} vs {entry['against']}", []).append(entry)
    figure, axes = plt.subplots(1, len(comparisons), figsize=(3.6 * len(comparisons), 3.6), squeeze=False,
                                sharey=True, constrained_layout=True)  # fmt: skip
    for axis, (title, entries) in zip(axes[0], sorted(comparisons.items())):
        entries = sorted(entries, key=lambda e: e["layers"])
        for entry in entries:
            axis.scatter([entry["layers"]] * entry["pairs"], [100 * d for d in entry["relative_differences"]],
                         color="tab:blue", alpha=0.6, s=18)  # fmt: skip
        axis.plot([e["layers"] for e in entries], [100 * e["mean"] for e in entries], color="tab:blue", marker="_")
        for entry in entries:
            if entry["interval95"] is not None:
                axis.vlines(entry["layers"], *(100 * v for v in entry["interval95"]), color="tab:blue", linewidth=2)
        axis.axhline(0, color="black", linewidth=0.8)
        axis.set_xticks(sorted({e["layers"] for e in entries}))
        axis.set_title(title, fontsize=9)
        axis.set_xlabel("layers")
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("validation perplexity difference, % (paired by seed)")
    return save_figure(figure, path)


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
    if axes[0][-1].get_legend_handles_labels()[0]:  # none where no group routes (baselines only)
        axes[0][-1].legend(fontsize=8)
    return save_figure(figure, path)


PICTURE_NAMES = ("ppl_vs_depth.png", "routing_sharpness_by_band.png", "paired_differences.png", "val_loss_curves.png")


def write_pictures(summary: dict[str, dict], paired: dict[str, dict], results: list[dict], out: Path) -> list[Path]:
    """The pictures, but the paired differences' when no two modes share a depth and seed."""
    return [
        plot_perplexity(summary, out / "ppl_vs_depth.png"),
        plot_sharpness_by_band(summary, out / "routing_sharpness_by_band.png"),
        *([plot_paired_differences(paired, out / "paired_differences.png")] if paired else []),
        plot_loss_curves(results, out / "val_loss_curves.png"),
    ]
