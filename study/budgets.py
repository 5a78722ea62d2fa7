"""One comparison of the depth study across training budgets: studies alike but for their number of steps, and in
each the same two modes (by default Delta Block against Block AttnRes, 4 blocks) paired by seed. Per budget, each
seed's perplexity relative to the other mode's with their mean and 95 % interval, and the paired gap in validation
loss at every evaluated step; one picture of that gap against step, a line per budget, so that a gap which closes
with longer training shows as lines that fall towards zero and end lower the longer the budget.

    python -m study.budgets --out DIR [LABEL=]STUDY_DIR ...   ->  DIR/budgets.json, DIR/gap_vs_step.png
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

from delta_qwen3.atomic import write_json
from delta_qwen3.errors import CommandError
from delta_qwen3.interrupts import run_command
from finetune.config import MODES

from .report import mean_interval_95, plt, save_figure

RESULTS_NAME = "results.json"


def read_study(source: str) -> tuple[str, list[dict]]:
    """`[LABEL=]DIR` as its label (default: the directory's name) and the runs of DIR's results.json."""
    label, _, directory = source.rpartition("=")
    path = Path(directory) / RESULTS_NAME
    if not path.is_file():
        raise CommandError(f"{directory}: no {RESULTS_NAME} (run `delta-qwen3 study --report-only` on it first)")
    return label or Path(directory).name, json.loads(path.read_text())["runs"]


def paired_runs(
    runs: list[dict], mode: str, against: str, num_blocks: int | None, seeds: list[int] | None = None
) -> dict[int, tuple[dict, dict]]:
    """seed -> (the run of `mode`, the run of `against`) for the seeds that have both (block modes: of
    `num_blocks` blocks), among `seeds` if given."""

    def of(name: str) -> dict[int, dict]:
        return {run["seed"]: run for run in runs if run["mode"] == name and run["num_blocks"] in (num_blocks, None)
                and (seeds is None or run["seed"] in seeds)}  # fmt: skip

    first, second = of(mode), of(against)
    return {seed: (first[seed], second[seed]) for seed in sorted(first.keys() & second.keys())}


def loss_gap(pairs: dict[int, tuple[dict, dict]]) -> dict:
    """The validation-loss gap (`mode` minus `against`; positive: `mode` is behind) at each step evaluated in every
    run: per seed, and its mean, min and max over seeds."""
    curves = {seed: [dict(run["val_loss_curve"]) for run in pair] for seed, pair in pairs.items()}
    steps = sorted(set.intersection(*(set(c) for pair in curves.values() for c in pair)) - {0})
    per_seed = {seed: [first[step] - second[step] for step in steps] for seed, (first, second) in curves.items()}
    columns = list(zip(*per_seed.values()))
    return {"steps": steps, "per_seed": per_seed, "mean": [statistics.fmean(c) for c in columns],
            "min": [min(c) for c in columns], "max": [max(c) for c in columns]}  # fmt: skip


def budget_entry(label: str, pairs: dict[int, tuple[dict, dict]]) -> dict:
    differences = [first["val_ppl"] / second["val_ppl"] - 1 for first, second in pairs.values()]
    gap = loss_gap(pairs)
    return {"label": label, "steps": gap["steps"][-1], "seeds": list(pairs), "relative_differences": differences,
            "mean": statistics.fmean(differences), "interval95": mean_interval_95(differences),
            "below": sum(d < 0 for d in differences), "loss_gap": gap}  # fmt: skip


def compare_budgets(
    studies: list[tuple[str, list[dict]]], mode: str, against: str, num_blocks: int, seeds: list[int] | None = None
) -> list[dict]:
    """One entry per study, in the order of their budgets (steps)."""
    entries = []
    for label, runs in studies:
        pairs = paired_runs(runs, mode, against, num_blocks, seeds)
        if not pairs:
            raise CommandError(f"{label}: no seed has runs of both {mode} and {against} ({num_blocks} blocks)")
        entries.append(budget_entry(label, pairs))
    return sorted(entries, key=lambda entry: entry["steps"])


def format_budgets(entries: list[dict], mode: str, against: str) -> str:
    """A line per budget: the paired perplexity differences per seed, their mean with its interval and sign count,
    and the mean validation-loss gap a tenth of the way, half way and at the end."""
    lines = [f"{mode} vs {against}, paired by seed (negative: {mode} is better)"]
    for entry in entries:
        seeds = " / ".join(f"{100 * d:+.1f}" for d in entry["relative_differences"])
        interval = "" if entry["interval95"] is None else " [{:+.1f}, {:+.1f}]".format(
            *(100 * v for v in entry["interval95"]))  # fmt: skip
        gap = entry["loss_gap"]
        at = [min(range(len(gap["steps"])), key=lambda i: abs(gap["steps"][i] - fraction * entry["steps"]))
              for fraction in (0.1, 0.5, 1.0)]  # fmt: skip
        gaps = ", ".join(f"{gap['mean'][i]:+.3f} at step {gap['steps'][i]}" for i in at)
        lines.append(f"{entry['label']} ({entry['steps']} steps): seeds {seeds} %; mean {100 * entry['mean']:+.1f} %"
                     f"{interval}, {entry['below']}/{len(entry['seeds'])} below; validation-loss gap {gaps}")  # fmt: skip
    return "\n".join(lines)


def plot_gap_against_step(entries: list[dict], mode: str, against: str, path: Path) -> Path:
    """The mean paired validation-loss gap against step, a line per budget, shaded from the seeds' least to their
    greatest."""
    figure, axis = plt.subplots(figsize=(7, 4), constrained_layout=True)
    for entry in entries:
        gap = entry["loss_gap"]
        line = axis.plot(gap["steps"], gap["mean"], label=f"{entry['label']} ({len(entry['seeds'])} seeds)")[0]
        axis.fill_between(gap["steps"], gap["min"], gap["max"], color=line.get_color(), alpha=0.15)
    axis.axhline(0, color="black", linewidth=0.8)
    axis.set_xlabel("step")
    axis.set_ylabel(f"validation loss, {mode} minus {against}")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return save_figure(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m study.budgets", description=__doc__.split("\n\n")[0])
    parser.add_argument("studies", nargs="+", metavar="[LABEL=]STUDY_DIR", help="study directories with results.json")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--mode", choices=MODES, default="delta_block")
    parser.add_argument("--against", choices=MODES, default="attnres_block")
    parser.add_argument("--num-blocks", type=int, default=4, help="block count of the block modes compared")
    parser.add_argument("--seeds", type=int, nargs="+", help="only these seeds (default: every seed paired)")
    args = parser.parse_args(argv)

    def compare() -> None:
        studies = [read_study(source) for source in args.studies]
        entries = compare_budgets(studies, args.mode, args.against, args.num_blocks, args.seeds)
        print(format_budgets(entries, args.mode, args.against))
        args.out.mkdir(parents=True, exist_ok=True)
        write_json(args.out / "budgets.json", {"mode": args.mode, "against": args.against,
                                               "num_blocks": args.num_blocks, "budgets": entries})  # fmt: skip
        print(f"wrote {plot_gap_against_step(entries, args.mode, args.against, args.out / 'gap_vs_step.png')}",
              file=sys.stderr)

    return run_command("study.budgets", compare)


if __name__ == "__main__":
    sys.exit(main())
