"""`delta-qwen3 study`: the paper's comparison (routing modes x depths x seeds, x block counts for the block modes)
from scratch, resumable, with one results JSON, a table and pictures."""

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path

from delta_qwen3.atomic import write_json
from delta_qwen3.devices import resolve_device
from delta_qwen3.errors import CommandError
from delta_qwen3.output_paths import check_not_an_input, output_lock, reporting_write_failure
from delta_qwen3.texts import documents_content, read_texts
from finetune.config import (
    DATA_CONTENT,
    INVOCATION_OPTIONS,
    MODES,
    RESOLVED_SETTINGS,
    TOKENIZER_CONTENT,
    FinetuneConfig,
    check_seed,
    parse_args,
    resume_changes,
)
from finetune.model import load_tokenizer, tokenizer_content
from finetune.presets import PRESETS
from modeling_delta_qwen3.routing_modes import BLOCK_MODES

from .grid import expand_grid
from .report import (
    PICTURE_NAMES,
    early_loss,
    format_band_table,
    format_seed_table,
    format_table,
    paired_comparisons,
    summarise,
    write_pictures,
)
from .runs import StudySettings, finished_result, has_work, run_all

RESULTS_NAME = "results.json"
STUDY_NAME = "study.json"  # the settings its runs are trained and scored with (`study_record`)
# Options each run sets itself; the shared finetune options after `--` must not.
PER_RUN_OPTIONS = ("--from-scratch", "--mode", "--model-config", "--preset", "--seed", "--output-dir", "--num-blocks",
                   "--resume", "--overwrite", "--model")  # fmt: skip


def register(subparsers) -> None:
    study = subparsers.add_parser(
        "study",
        help="the paper's comparison: modes x depths x seeds from scratch, resumable, one results table",
        usage="delta-qwen3 study --out DIR [options] -- FINETUNE_OPTIONS",
        description="Pre-train one model per routing mode, depth, block count (block modes) and seed through "
        "`finetune` (FINETUNE_OPTIONS after `--` are shared by every run: --data, --tokenizer, --seq-len, "
        "--max-steps, ...), then score each on the held-out documents (validation perplexity, routing sharpness). "
        "Runs already finished are read back; a killed run resumes from its checkpoint: run the same command again.",
    )
    study.add_argument("--out", type=Path, required=True, help="study directory (one subdirectory per run)")
    study.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    study.add_argument("--depths", nargs="+", type=int, default=[4, 8, 16], help="numbers of layers")
    study.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    study.add_argument("--num-blocks", nargs="+", type=int, default=[4], help="block counts of the block modes")
    study.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                       help="model shape; each run replaces its number of layers")  # fmt: skip
    study.add_argument("--launcher", default=shlex.quote(sys.executable),
                       help='how finetune is started, e.g. "accelerate launch --num_processes 2" (default: this Python)')  # fmt: skip
    study.add_argument("--validation-data", default=None,
                       help="documents to score (default: each run's held-out documents, the same for every run)")  # fmt: skip
    study.add_argument("--device", default="cpu", help="torch device for scoring")
    study.add_argument("--jobs", type=int, default=1,
                       help="runs trained side by side, each its own finetune process (on one GPU or the CPU cores; "
                            "each run's output then goes to runs/NAME/finetune.log)")  # fmt: skip
    study.add_argument("--report-only", action="store_true",
                       help="train nothing: write the results of the runs that have finished (say which have not)")  # fmt: skip
    study.add_argument("finetune_args", nargs=argparse.REMAINDER, help="options for every finetune run, after --")
    study.set_defaults(func=run_study)


def _shared_finetune_args(args: argparse.Namespace) -> tuple[list[str], FinetuneConfig]:
    """The options after `--`, and what finetune's own parser makes of them (with placeholders for what each run
    sets)."""
    shared = args.finetune_args[1:] if args.finetune_args[:1] == ["--"] else args.finetune_args
    own = [option for option in shared if option.split("=")[0] in PER_RUN_OPTIONS]
    if own:
        raise CommandError(f"{', '.join(own)}: set by the study for each run; leave it out of the finetune options")
    if any(depth < 1 for depth in args.depths):
        raise CommandError(f"--depths must be at least 1, got {args.depths}")
    if args.jobs < 1:
        raise CommandError(f"--jobs must be at least 1, got {args.jobs}")
    if len(set(args.seeds)) != len(args.seeds) or len(args.seeds) < 1:
        raise CommandError(f"--seeds must be distinct, got {args.seeds}")
    for seed in args.seeds:
        check_seed(seed, "--seeds")
    if any(blocks < 1 for blocks in args.num_blocks):
        raise CommandError(f"--num-blocks must be at least 1, got {args.num_blocks}")
    args.device = resolve_device(args.device)  # used only to score each run, after its training: checked now
    for layers in args.depths:
        for blocks in args.num_blocks if set(args.modes) & set(BLOCK_MODES) else []:
            if not 1 <= blocks <= layers:
                raise CommandError(f"--num-blocks {blocks} must be between 1 and the depth, here {layers}")
    # Parsed as each mode's runs will parse them, so that an option a mode does not take (--gate, --routing-init) is
    # refused now, not when its first run starts.
    configs = [parse_args([*shared, "--from-scratch", "--preset", args.preset, "--mode", mode,
                           "--output-dir", str(args.out)]) for mode in args.modes]  # fmt: skip
    return shared, configs[0]


def study_record(args: argparse.Namespace, config: FinetuneConfig) -> dict:
    """What makes the runs in --out the work they are, besides each one's mode, depth, block count and seed: the
    finetune options as finetune reads them (so that neither their order nor their spelling counts), what the data
    and the tokenizer hold (as finetune records them), the preset, and the documents scored."""
    per_run = {name.removeprefix("--").replace("-", "_") for name in PER_RUN_OPTIONS} | INVOCATION_OPTIONS
    options = {name: value for name, value in config.to_dict().items() if name not in per_run}
    return {**options, DATA_CONTENT: documents_content(config.data),
            TOKENIZER_CONTENT: tokenizer_content(load_tokenizer(config)), "preset": args.preset,
            "validation_data": args.validation_data}  # fmt: skip


def check_same_study(out: Path, record: dict) -> None:
    """Refuse settings other than those the runs already in `out` were trained and scored with: their results
    would be reported as this study's. Without runs (nothing was trained yet), the settings may change."""
    path = out / STUDY_NAME
    if not has_work(out):
        return
    if not path.is_file():
        print(f"{path} is missing (the study started with an earlier release): the settings of its runs cannot be "
              "checked", file=sys.stderr)  # fmt: skip
        return
    saved = json.loads(path.read_text())
    if TOKENIZER_CONTENT not in saved:
        print(f"{path} does not record {RESOLVED_SETTINGS[TOKENIZER_CONTENT]} (the study started with an earlier "
              "release): it cannot be checked", file=sys.stderr)  # fmt: skip
        saved[TOKENIZER_CONTENT] = record[TOKENIZER_CONTENT]
    changes = sorted(sum(resume_changes(saved, record), []))  # each one counts here
    if changes:
        raise CommandError(
            f"--out {out} holds runs trained and scored with other settings: {'; '.join(changes)} (run the study "
            "with the settings it started with, or give another --out)"
        )


def check_inputs_untouched(args: argparse.Namespace, config: FinetuneConfig) -> None:
    """Refuse a study directory whose outputs (the runs, the records, the results and pictures) would overwrite, or
    be written into, what the study reads: the data, the tokenizer, the documents scored."""
    written = [args.out / "runs", args.out / STUDY_NAME, args.out / RESULTS_NAME,
               *(args.out / name for name in PICTURE_NAMES)]  # fmt: skip
    inputs = [("--data", config.data), ("--tokenizer", config.tokenizer), ("--validation-data", args.validation_data)]
    check_not_an_input("--out", args.out, written, inputs)


def run_study(args: argparse.Namespace) -> int:
    shared, config = _shared_finetune_args(args)
    check_inputs_untouched(args, config)
    with output_lock("--out", args.out, inside=True):  # one study at a time in --out
        return _run_study(args, shared, config)


def launcher_command(text: str) -> list[str]:
    """--launcher as a command line whose program can start: checked before the first run trains, so that a typo
    is not found only when the first finetune process should start (or taken for a failure to write --out)."""
    try:
        command = shlex.split(text)
    except ValueError as error:
        raise CommandError(f"--launcher {text!r} is not a command line: {error}") from None
    if not command:
        raise CommandError(f"--launcher is empty; give the command that starts Python, e.g. "
                           f"{shlex.quote(sys.executable)}")  # fmt: skip
    if shutil.which(command[0]) is None:
        raise CommandError(f"--launcher {text}: {command[0]} is not a program that can be started (not on PATH, or "
                           "not an executable file)")  # fmt: skip
    return command


def _run_study(args: argparse.Namespace, shared: list[str], config: FinetuneConfig) -> int:
    record = study_record(args, config)
    check_same_study(args.out, record)
    launcher = launcher_command(args.launcher)
    if args.validation_data is not None and not args.report_only:  # scored only after each run: read it now
        read_texts(args.validation_data, option="--validation-data")
    settings = StudySettings(args.out, launcher, args.preset, shared, args.validation_data, config.seq_len,
                             args.device, args.jobs)  # fmt: skip
    runs = expand_grid(args.modes, args.depths, args.seeds, args.num_blocks)
    if args.report_only:
        found = {run.name: finished_result(run, args.out) for run in runs}
        results = [result for result in found.values() if result is not None]
        missing = [name for name, result in found.items() if result is None]
        if not results:
            raise CommandError(f"--out {args.out} has no finished run of this study yet")
        if missing:
            print(f"not finished yet, left out: {', '.join(missing)}", file=sys.stderr)
    else:
        with reporting_write_failure("--out", args.out, "the runs finished so far are kept; run the study again "
                                     "to continue"):  # fmt: skip
            write_json(args.out / STUDY_NAME, record)
            results = run_all(runs, settings)
    summary, paired = summarise(results), paired_comparisons(results)
    print(format_table(summary, paired))
    early_step = early_loss(results[0]["val_loss_curve"])[0]
    print(f"validation perplexity per seed (validation loss at step {early_step}: the early plateau)")
    print(format_seed_table(results))
    print(format_band_table(summary))
    with reporting_write_failure("--out", args.out):
        write_json(args.out / RESULTS_NAME, {"finetune_options": shared, "preset": args.preset, "groups": summary,
                                             "paired": paired, "runs": results})  # fmt: skip
        for path in write_pictures(summary, paired, results, args.out):
            print(f"wrote {path}", file=sys.stderr)
    return 0
