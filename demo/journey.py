"""The whole journey of a DeltaQwen3 user, each step through the project's public commands and functions:
base model -> convert to Delta Block (exact) -> fine-tune baseline and Delta Block with `accelerate launch` ->
evaluate both (perplexity, the eight benchmarks, routing sharpness) -> one table."""

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from conversion import convert, verify
from delta_qwen3.atomic import write_json
from delta_qwen3.corpus import SMALL_BASE_CONFIG, SMALL_VOCAB_SIZE, pretraining_inputs, split_python_docs
from delta_qwen3.errors import RunError
from eval.models import load_causal_lm
from eval.perplexity import perplexity
from eval.routing import routing_statistics
from eval.routing_plots import write_routing_report
from delta_qwen3.texts import read_texts

FIXTURES = Path(__file__).resolve().parents[1] / "eval" / "fixtures"


@dataclass
class DemoSettings:
    out: Path
    base: str | None  # a Qwen3 checkpoint (Hub id or directory); None pre-trains SMALL_BASE_CONFIG
    data: str | None  # fine-tuning data (Hub dataset id or file); None uses Python's documentation
    steps: int
    pretrain_steps: int
    device: str
    seq_len: int
    num_blocks: int
    vocab_size: int = SMALL_VOCAB_SIZE


def step(number: int, title: str) -> None:
    print(f"\n=== [{number}/5] {title}", flush=True)


def run(command: list[str]) -> None:
    """Run one of the project's commands as a user would, its progress bars on this terminal; a failure ends the
    demo with the command's own message above."""
    print("$ " + " ".join(command), flush=True)
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    if (code := subprocess.run(command, env=env).returncode) != 0:
        raise RunError(f"`{' '.join(command[:4])} ...` exited with status {code} (its message is above)")


def finetune_command(settings: DemoSettings, launcher: list[str], model_args: list[str], data: str, out: Path):
    return [
        *launcher,
        "-m",
        "finetune",
        *model_args,
        "--data",
        data,
        "--output-dir",
        str(out),
        "--seq-len",
        str(settings.seq_len),
        "--batch-size",
        "16",
        "--val-blocks",
        "16",
        # Python's documentation topics are few and of very different lengths: every 5th document, not every 10th,
        # so that the held-out ones fill the validation blocks.
        "--val-interval",
        "5",
        "--eval-every",
        "100",
        "--log-every",
        "10",
        "--save-every",
        "0",
        "--overwrite",
    ]


def pretrain_base(settings: DemoSettings, corpus: dict[str, Path]) -> Path:
    """A byte-level BPE tokenizer and a small Qwen3, both trained from scratch on the pre-training split."""
    run_dir = settings.out / "pretrain"
    tokenizer_dir, config_file = pretraining_inputs(settings.out, corpus["pretrain"], SMALL_BASE_CONFIG,
                                                    settings.vocab_size)
    model_args = ["--from-scratch", "--mode", "baseline", "--model-config", str(config_file),
                  "--tokenizer", str(tokenizer_dir)]
    command = finetune_command(settings, [sys.executable], model_args, str(corpus["pretrain"]), run_dir)
    run(command + ["--max-steps", str(settings.pretrain_steps), "--lr", "3e-3", "--warmup-steps", "30"])
    return run_dir / "model"


def convert_base(settings: DemoSettings, base: str) -> tuple[Path, float]:
    converted = convert(base, settings.out / "delta-block", mode="delta_block", num_blocks=settings.num_blocks, overwrite=True)
    return converted, verify(base, converted, device=settings.device)


def finetune_both(settings: DemoSettings, base: str, converted: Path, data: str) -> dict[str, Path]:
    """The baseline (plain Qwen3) and the converted model, fine-tuned alike through `accelerate launch`."""
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1"]
    # Stated, so that accelerate does not warn about defaults.
    launcher += ["--mixed_precision", "no", "--dynamo_backend", "no", "--num_cpu_threads_per_process", str(os.cpu_count())]
    if settings.device == "cpu":
        launcher.append("--cpu")
    runs = {}
    for name, model in [("baseline", base), ("delta_block", str(converted))]:
        out = settings.out / f"finetune-{name}"
        command = finetune_command(settings, launcher, ["--model", model], data, out)
        run(command + ["--max-steps", str(settings.steps), "--lr", "1e-3", "--lr-routing", "1e-2", "--warmup-steps", "10"])
        runs[name] = out / "model"
    return runs


def evaluate(settings: DemoSettings, models: dict[str, str], validation: Path) -> tuple[dict, list[Path]]:
    """Per model: validation perplexity, the benchmark average and (DeltaQwen3) routing sharpness; and the
    routing report's files."""
    texts = read_texts(str(validation))
    summary = {name: {"path": str(path)} for name, path in models.items()}
    routing = {}
    for name, path in models.items():
        model, tokenizer = load_causal_lm(str(path), device=settings.device)
        summary[name]["perplexity"] = perplexity(model, tokenizer, texts, max_length=settings.seq_len)
        if getattr(model.config, "routing_mode", None):
            routing[name] = routing_statistics(model, tokenizer, texts, max_length=settings.seq_len)
            summary[name]["mean_max_weight_multi_source"] = routing[name]["mean_max_weight_multi_source"]
    from eval.runner import format_table, run_benchmarks  # lm-eval: imported here, where the demo needs it

    eval_dir = settings.out / "eval"
    benchmarks = run_benchmarks(
        [str(path) for path in models.values()],
        data_dir=None if settings.base else FIXTURES,
        device=settings.device,
    )
    print(format_table(benchmarks))
    write_json(eval_dir / "benchmarks.json", benchmarks)
    for name, path in models.items():
        summary[name]["benchmark_average"] = benchmarks["models"][str(path)]["average"]
    return summary, write_routing_report(routing, eval_dir / "routing")


def summary_table(summary: dict) -> str:
    rows = [["model", "validation ppl", "benchmarks avg %", "mean max routing weight (multi-source points)"]]
    for name, values in summary.items():
        weight = values.get("mean_max_weight_multi_source")
        rows.append(
            [
                name,
                f"{values['perplexity']:.2f}",
                f"{100 * values['benchmark_average']:.1f}",
                "-" if weight is None else f"{weight:.3f}",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(" | ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows)


def run_journey(settings: DemoSettings) -> dict:
    settings.out.mkdir(parents=True, exist_ok=True)
    corpus = split_python_docs(settings.out)
    step(1, "base model")
    base = settings.base or str(pretrain_base(settings, corpus))
    print(f"base model: {base}")

    step(2, "convert to Delta Block")
    converted, difference = convert_base(settings, base)
    print(f"converted model: {converted}\nlargest logit difference from the base: {difference:.3e}")

    step(3, f"fine-tune baseline and Delta Block, {settings.steps} steps each")
    finetuned = finetune_both(settings, base, converted, settings.data or str(corpus["finetune"]))

    step(4, "evaluate: validation perplexity, eight benchmarks, routing sharpness")
    models = {"base": base, "baseline fine-tuned": finetuned["baseline"], "delta_block fine-tuned": finetuned["delta_block"]}
    summary, report = evaluate(settings, models, corpus["validation"])
    summary_file = settings.out / "summary.json"
    write_json(summary_file, {"conversion_max_logit_difference": difference, "models": summary})

    step(5, "results")
    print(summary_table(summary))
    print(f"\nconversion: largest logit difference {difference:.3e} (exact conversion gives 0)")
    print(f"checkpoints: {', '.join(str(path) for path in [converted, *finetuned.values()])}")
    print(f"routing report and pictures: {', '.join(str(path) for path in report)}")
    print(f"results: {summary_file}, {settings.out / 'eval' / 'benchmarks.json'}")
    return summary
