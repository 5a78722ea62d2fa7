"""One run of a study: pre-train through `finetune` (a subprocess, so `accelerate launch` and GPUs work as for any
run), then score the final model on held-out documents; `result.json` marks a run as finished.

    OUT/runs/NAME/train/         the finetune run directory (checkpoints, train_log.jsonl, model/)
    OUT/runs/NAME/result.json    validation perplexity, routing sharpness, tokens/s

    OUT/runs/NAME/finetune.log  finetune's output, when runs train side by side (`jobs` > 1)

A run without `result.json` is resumed: `finetune --resume` continues from its latest checkpoint (or starts), and a
run whose training finished is only scored. Up to `jobs` runs train side by side, each its own finetune process (on
one GPU, several small runs keep it busier than one); this process scores each run as its training ends.
"""

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from delta_qwen3.atomic import write_json
from delta_qwen3.errors import RunError
from delta_qwen3.texts import read_texts
from eval.models import load_causal_lm
from eval.perplexity import perplexity
from eval.routing import routing_statistics
from finetune.outputs import log_path, model_dir, run_config_path, validation_documents_path

from .grid import Run, write_model_config

RESULT_NAME = "result.json"
LOG_NAME = "finetune.log"
POLL_SECONDS = 0.5  # how often the runs side by side are looked at: far below a run's minutes


@dataclass(frozen=True)
class StudySettings:
    """What every run of a study shares."""

    out: Path
    launcher: list[str]  # how finetune starts, e.g. [python] or [accelerate, launch, --num_processes, 2]
    preset: str
    finetune_args: list[str]  # the options every run passes to finetune
    validation_data: str | None  # scored documents; None: each run's held-out documents
    max_length: int  # scoring windows: the training block length, without overlap
    device: str
    jobs: int = 1  # runs trained side by side


def run_dir(out: Path, run: Run) -> Path:
    return out / "runs" / run.name


def finetune_command(run: Run, settings: StudySettings, directory: Path) -> list[str]:
    """The run's `finetune` command line: the study's shared options plus what makes this run this run."""
    model_config = write_model_config(run, settings.preset, directory)
    own = ["--from-scratch", "--mode", run.mode, "--model-config", str(model_config), "--seed", str(run.seed),
           "--output-dir", str(directory / "train"), "--resume"]  # fmt: skip
    if run.num_blocks is not None:
        own += ["--num-blocks", str(run.num_blocks)]
    return [*settings.launcher, "-m", "finetune", *settings.finetune_args, *own]


def finetune_environment(jobs: int) -> dict[str, str] | None:
    """The environment of each finetune process: with runs side by side, each gets its share of the CPU cores for
    PyTorch's threads (each would otherwise take them all, and they would wait on each other), unless
    OMP_NUM_THREADS says otherwise."""
    if jobs == 1 or "OMP_NUM_THREADS" in os.environ:
        return None
    return {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // jobs))}


def start_training(run: Run, settings: StudySettings, directory: Path) -> subprocess.Popen | None:
    """Start the run's finetune process; None if it has trained already (and was killed while scoring). With runs
    side by side, its output goes to its `finetune.log` (appended to, across resumptions), not to the terminal."""
    if model_dir(directory / "train").is_dir():
        return None
    command = finetune_command(run, settings, directory)
    if settings.jobs == 1:
        print("$ " + " ".join(command), flush=True)
        return _start(command, run)
    with (directory / LOG_NAME).open("a") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        return _start(command, run, stdout=log, stderr=subprocess.STDOUT, env=finetune_environment(settings.jobs))


def _start(command: list[str], run: Run, **options) -> subprocess.Popen:
    """Start a finetune process; a program that cannot start is one line naming it and why (not a failed write)."""
    try:
        return subprocess.Popen(command, **options)
    except OSError as error:
        raise RunError(f"run {run.name}: could not start finetune with {command[0]} (--launcher): "
                       f"{error.strerror or error}") from None  # fmt: skip


def check_trained(run: Run, process: subprocess.Popen | None, settings: StudySettings, directory: Path) -> None:
    """Raise `RunError` for a finetune process that failed or stopped before its last step."""
    output = "above" if settings.jobs == 1 else f"in {directory / LOG_NAME}"
    if process is not None and process.returncode != 0:
        raise RunError(f"run {run.name} failed in finetune (its output is {output}); run the study again to resume it")
    if not model_dir(directory / "train").is_dir():
        raise RunError(f"run {run.name} stopped before its last step (--stop-after-step); run the study again "
                       "without it to continue")  # fmt: skip


def score(run: Run, settings: StudySettings, directory: Path) -> dict:
    """Validation perplexity (windows of the training block length, no overlap) and routing sharpness on the
    held-out documents (the model's figures, per depth band and per routing point), the run's mean training
    tokens/s and its validation loss curve."""
    train_dir = directory / "train"
    texts = read_texts(settings.validation_data or str(validation_documents_path(train_dir)),
                       option="--validation-data")  # fmt: skip
    model, tokenizer = load_causal_lm(str(model_dir(train_dir)), device=settings.device)
    length = settings.max_length
    result = {**run.to_dict(), "group": run.group, "documents": len(texts),
              "val_ppl": perplexity(model, tokenizer, texts, max_length=length, stride=length)}  # fmt: skip
    if run.mode != "baseline":
        stats = routing_statistics(model, tokenizer, texts, max_length=length)
        figures = ("mean_max_weight", "mean_max_weight_multi_source", "mean_entropy", "bands")
        result |= {key: stats[key] for key in figures}
        result["points"] = [{k: v for k, v in point.items() if k != "mean_weights"} for point in stats["points"]]
    log = [json.loads(line) for line in log_path(train_dir).read_text().splitlines()]
    speeds = [line["tokens_per_s"] for line in log if "tokens_per_s" in line]
    result["tokens_per_s"] = sum(speeds) / len(speeds)
    result["val_loss_curve"] = [[line["step"], line["val_loss"]] for line in log if "val_loss" in line]
    return result


def has_work(out: Path) -> bool:
    """Whether any run in study directory `out` has trained (finetune records its settings when training starts)
    or been scored."""
    runs = out / "runs"
    return any((directory / RESULT_NAME).is_file() or run_config_path(directory / "train").is_file()
               for directory in (runs.iterdir() if runs.is_dir() else []))  # fmt: skip


def finished_result(run: Run, out: Path) -> dict | None:
    """The result of a run that finished before, else None."""
    path = run_dir(out, run) / RESULT_NAME
    return json.loads(path.read_text()) if path.is_file() else None


def run_all(runs: list[Run], settings: StudySettings) -> list[dict]:
    """Every run's result, in the order of `runs`: read back if it finished before, else trained (or resumed), up to
    `settings.jobs` at a time in the order of `runs`, and scored when its training ends. When a run fails, or the
    study is interrupted, the runs still training are stopped (each resumes from its latest checkpoint)."""
    results = {run: finished_result(run, settings.out) for run in runs}
    waiting = [run for run in runs if results[run] is None]
    running: dict[Run, subprocess.Popen | None] = {}
    progress = tqdm(total=len(waiting), desc="study runs", unit="run", disable=settings.jobs == 1)
    try:
        while waiting or running:
            while waiting and len(running) < settings.jobs:
                run = waiting.pop(0)
                directory = run_dir(settings.out, run)
                directory.mkdir(parents=True, exist_ok=True)
                index = len(runs) - len(waiting)
                progress.write(f"=== study run {index}/{len(runs)}: {run.name}", file=sys.stderr)
                running[run] = start_training(run, settings, directory)
            ended = [run for run, process in running.items() if process is None or process.poll() is not None]
            if not ended:
                time.sleep(POLL_SECONDS)
            for run in ended:
                directory = run_dir(settings.out, run)
                check_trained(run, running.pop(run), settings, directory)
                results[run] = score(run, settings, directory)
                write_json(directory / RESULT_NAME, results[run])
                figures = {key: results[run][key] for key in ("val_ppl", "tokens_per_s")}
                progress.write(json.dumps({"run": run.name, **figures}), file=sys.stderr)
                progress.update()
    finally:
        progress.close()
        for process in filter(None, running.values()):
            process.terminate()
            process.wait()
    return [results[run] for run in runs]
