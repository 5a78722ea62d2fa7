"""Run the paper's benchmarks through lm-eval for one or more models and lay the results out like the paper's
table: one row per model, one column per benchmark, then the average."""

import logging
from pathlib import Path

import lm_eval
from lm_eval.models import huggingface
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager

from .benchmarks import BY_NAME, Benchmark, resolve_benchmarks
from .local_data import check_data_file, task_config
from .models import check_models, load_causal_lm


def load_lm(model: str, *, batch_size: int | str, device: str, dtype: str = "auto",
            trust_remote_code: bool = False) -> HFLM:  # fmt: skip
    """lm-eval's Hugging Face wrapper around the model and tokenizer that `load_causal_lm` loads.

    Given a loaded model, the wrapper warns that other arguments may be ignored and that it must not run under
    accelerate: none is passed that it ignores, and evaluation runs in one process, so those warnings are muted.
    """
    causal_lm, tokenizer = load_causal_lm(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    level = huggingface.eval_logger.level
    huggingface.eval_logger.setLevel(logging.ERROR)
    try:
        return HFLM(pretrained=causal_lm, tokenizer=tokenizer, batch_size=batch_size)
    finally:
        huggingface.eval_logger.setLevel(level)


def _task_results(raw: dict, benchmark: Benchmark) -> dict:
    metrics = raw["results"][benchmark.task]
    stderr = metrics.get(f"{benchmark.metric}_stderr,none")
    return {
        "metric": benchmark.metric,
        "value": metrics[f"{benchmark.metric},none"],
        "stderr": stderr if isinstance(stderr, float) else None,  # lm-eval writes "N/A" for a single document
        "documents": raw["n-samples"][benchmark.task]["effective"],
    }


def evaluate_model(
    model: str,
    benchmarks: list[Benchmark],
    *,
    data_dir: Path | None,
    limit: int | None,
    batch_size: int | str,
    device: str,
    dtype: str = "auto",
    trust_remote_code: bool = False,
) -> dict:
    """Per benchmark the reported metric, its standard error and the number of documents; and their average."""
    lm = load_lm(model, batch_size=batch_size, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    raw = lm_eval.simple_evaluate(
        model=lm,
        tasks=[task_config(benchmark, data_dir) for benchmark in benchmarks],
        task_manager=TaskManager(include_defaults=False),  # our task configs are complete; skip indexing lm-eval's
        limit=limit,
        log_samples=False,
    )
    tasks = {benchmark.name: _task_results(raw, benchmark) for benchmark in benchmarks}
    return {"tasks": tasks, "average": sum(task["value"] for task in tasks.values()) / len(tasks)}


def run_benchmarks(
    models: list[str],
    *,
    tasks: str | list[str] = "paper",
    data_dir: str | Path | None = None,
    limit: int | None = None,
    batch_size: int | str = 8,
    device: str = "cpu",
    dtype: str = "auto",
    trust_remote_code: bool = False,
) -> dict:
    """Evaluate each model (Hub id or directory) on `tasks` ("paper" for all eight, or benchmark names).

    With `data_dir`, documents come from its JSON-lines files (checked before any model is loaded) instead of the
    Hub. `dtype` is "auto" (the checkpoint's) or a torch dtype name. Code that a checkpoint ships runs only with
    `trust_remote_code` (`eval.models`). Returns:

        {"tasks", "metrics", "data", "limit", "lm_eval",
         "models": {model: {"tasks": {name: {"metric", "value", "stderr", "documents"}}, "average"}}}

    Values are fractions; "average" is the unweighted mean over the tasks, like the paper's "Avg" column.
    """
    benchmarks = resolve_benchmarks(tasks)
    if data_dir is not None:
        data_dir = Path(data_dir)
        for benchmark in benchmarks:
            check_data_file(benchmark, data_dir)
    check_models(models, trust_remote_code)
    results = {
        "tasks": [benchmark.name for benchmark in benchmarks],
        "metrics": {benchmark.name: benchmark.metric for benchmark in benchmarks},
        "data": str(data_dir) if data_dir is not None else "hub",
        "limit": limit,
        "lm_eval": lm_eval.__version__,
        "models": {
            model: evaluate_model(
                model, benchmarks, data_dir=data_dir, limit=limit, batch_size=batch_size, device=device, dtype=dtype,
                trust_remote_code=trust_remote_code,
            )
            for model in models
        },
    }
    return results


def format_table(results: dict) -> str:
    """A text table like the paper's: a row per model, accuracy in percent per benchmark, then the average."""
    benchmarks = [BY_NAME[name] for name in results["tasks"]]
    header = ["Model", *(benchmark.title for benchmark in benchmarks), "Avg"]
    metric_row = ["metric", *(benchmark.metric for benchmark in benchmarks), "mean"]
    rows = [header, metric_row]
    for model, scores in results["models"].items():
        values = [scores["tasks"][benchmark.name]["value"] for benchmark in benchmarks] + [scores["average"]]
        rows.append([model, *(f"{100 * value:.1f}" for value in values)])
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = [_aligned(row, widths) for row in rows]
    lines.insert(2, "-" * len(lines[0]))
    return "\n".join(lines)


def _aligned(row: list[str], widths: list[int]) -> str:
    """The model name left-aligned, numbers right-aligned."""
    cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
    return "  ".join(cells)
