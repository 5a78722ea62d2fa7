"""The whole journey of a DeltaQwen3 user, each step through the project's public commands and functions:
base model -> convert to Delta Block (exact) -> fine-tune baseline and Delta Block with `accelerate launch` ->
evaluate both (perplexity, the eight benchmarks, routing sharpness) -> one table."""

import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from conversion import convert, verify
from delta_qwen3.atomic import write_json, write_json_lines
from delta_qwen3.corpus import python_docs_texts, train_bpe_tokenizer
from delta_qwen3.errors import RunError
from delta_qwen3.jsonl import json_text, read_json_lines
from eval.models import load_causal_lm
from eval.perplexity import perplexity
from eval.routing import routing_statistics
from eval.routing_plots import write_routing_report
from delta_qwen3.texts import read_texts

FIXTURES = Path(__file__).resolve().parents[1] / "eval" / "fixtures"
# The embedded default base: small enough to pre-train on two CPU cores in a few minutes.
DEMO_BASE_CONFIG = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)


@dataclass
class DemoSettings:
    out: Path
    base: str | None  # a Qwen3 checkpoint (Hub id or directory); None pre-trains the embedded default
    data: str | None  # fine-tuning data (Hub dataset id or file); None uses Python's documentation
    steps: int
    pretrain_steps: int
    device: str
    seq_len: int
    num_blocks: int
    vocab_size: int = 2048


def step(number: int, title: str) -> None:
    print(f"\n=== [{number}/5] {title}", flush=True)


def split_corpus(out: Path) -> dict[str, Path]:
    """Python's documentation, split by document: pre-training, fine-tuning (held out from pre-training) and
    validation (held out from both)."""
    texts = python_docs_texts()
    random.Random(0).shuffle(texts)
    n = len(texts)
    parts = {"pretrain": texts[: n // 2], "finetune": texts[n // 2 : 4 * n // 5], "validation": texts[4 * n // 5 :]}
    return {
        name: write_json_lines(out / "data" / f"{name}.jsonl", ({"text": text} for text in part))
        for name, part in parts.items()
    }


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


def pretraining_inputs(settings: DemoSettings, corpus: dict[str, Path]) -> tuple[Path, Path]:
    """A byte-level BPE tokenizer trained on the pre-training split, and the base model's configuration file."""
    tokenizer_dir = settings.out / "tokenizer"
    texts = [document["text"] for _, document in read_json_lines(corpus["pretrain"])]
    train_bpe_tokenizer(texts, settings.vocab_size).save_pretrained(tokenizer_dir)
    config_file = settings.out / "base-config.json"
    config_file.write_text(json_text(DEMO_BASE_CONFIG))
    return tokenizer_dir, config_file


def pretraining_command(settings: DemoSettings, corpus: dict[str, Path], inputs: tuple[Path, Path], run_dir: Path,
                        mode: str = "baseline", launcher: tuple[str, ...] = (sys.executable,)) -> list[str]:
    """The command that pre-trains a model of the base's shape in routing `mode` (baseline: plain Qwen3) on the
    pre-training split with the tokenizer and configuration of `inputs` (`pretraining_inputs`)."""
    tokenizer_dir, config_file = inputs
    model_args = ["--from-scratch", "--mode", mode, "--model-config", str(config_file),
                  "--tokenizer", str(tokenizer_dir)]
    command = finetune_command(settings, list(launcher), model_args, str(corpus["pretrain"]), run_dir)
    return command + ["--max-steps", str(settings.pretrain_steps), "--lr", "3e-3", "--warmup-steps", "30"]


def pretrain_base(settings: DemoSettings, corpus: dict[str, Path]) -> Path:
    """A byte-level BPE tokenizer and a small Qwen3, both trained from scratch on the pre-training split."""
    run_dir = settings.out / "pretrain"
    run(pretraining_command(settings, corpus, pretraining_inputs(settings, corpus), run_dir))
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
    corpus = split_corpus(settings.out)
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
