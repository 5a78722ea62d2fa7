"""The benchmarks without Hub access: one JSON-lines file per task in a data directory (SPEC section 6).

Each line is one document with the fields of the Hub split that the task evaluates. `task_config` turns a task's
YAML into an lm-eval task configuration that reads that file instead of the Hub; `export_data` writes the
directory from the Hub on a machine that has it.
"""

from pathlib import Path

import datasets
from lm_eval.tasks._yaml_loader import load_yaml

from delta_qwen3.errors import CommandError
from delta_qwen3.jsonl import json_text, read_json_lines

from .benchmarks import Benchmark
from delta_qwen3.atomic import atomic_output


def evaluated_split(config: dict) -> str:
    """The split lm-eval scores: the test split when the task has one, else the validation split."""
    return config.get("test_split") or config["validation_split"]


def task_config(benchmark: Benchmark, data_dir: Path | None = None) -> dict:
    """The task's lm-eval configuration (YAML with includes and functions resolved); with `data_dir`, its
    documents come from `data_dir/<name>.jsonl`, which must have been checked with `check_data_file`."""
    config = load_yaml(benchmark.yaml_path, resolve_func=True, recursive=True)
    if data_dir is not None:
        data_file = str(Path(data_dir).resolve() / benchmark.data_file)
        config.update(
            dataset_path="json",
            dataset_name=None,
            dataset_kwargs={"data_files": {evaluated_split(config): data_file}},
        )
    return config


def _has_field(document: dict, dotted: str) -> bool:
    value = document
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return False
        value = value[key]
    return True


def check_data_file(benchmark: Benchmark, data_dir: Path) -> int:
    """Check that `data_dir` has the benchmark's file and that every line is a document with the task's fields;
    return the number of documents. Raises `CommandError` naming the file, line and field."""
    path = Path(data_dir) / benchmark.data_file
    if not path.is_file():
        raise CommandError(f"data file {path} is missing (task {benchmark.name} reads it)")
    count = 0
    for number, document in read_json_lines(path):
        for field in benchmark.fields:
            if not _has_field(document, field):
                raise CommandError(f"{path} line {number} lacks field {field!r}, which task {benchmark.name} needs")
        count += 1
    if count == 0:
        raise CommandError(f"data file {path} has no documents")
    return count


def export_data(out_dir: Path, benchmarks: list[Benchmark]) -> dict[str, int]:
    """Download each benchmark's evaluated split from the Hub into `out_dir/<name>.jsonl`; return the document
    counts."""
    counts = {}
    for benchmark in benchmarks:
        config = task_config(benchmark)
        split = evaluated_split(config)
        documents = datasets.load_dataset(config["dataset_path"], config.get("dataset_name"), split=split)
        with atomic_output(Path(out_dir) / benchmark.data_file) as temporary:
            with temporary.open("w", encoding="utf-8") as out:
                for document in documents:
                    out.write(json_text(document, ensure_ascii=False) + "\n")
        counts[benchmark.name] = len(documents)
    return counts
