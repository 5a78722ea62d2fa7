"""`delta-qwen3 eval`, `delta-qwen3 ppl` and `delta-qwen3 routing`.

lm-eval, Transformers and matplotlib are imported inside the commands: every `delta-qwen3` command builds this
module's parsers, and those imports take seconds.
"""

import argparse
import sys
from pathlib import Path

from delta_qwen3.errors import CommandError
from delta_qwen3.jsonl import json_text

EXPORT_DATA = "export-data"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _batch_size(text: str) -> int | str:
    """A positive number of documents, or lm-eval's `auto` (the largest that fits) or `auto:N` (found again N
    times)."""
    if text.startswith("auto"):
        times = text.removeprefix("auto").removeprefix(":")
        if text != "auto" and not (text.startswith("auto:") and times.isdigit() and int(times) >= 1):
            raise argparse.ArgumentTypeError(f"must be a positive integer, auto or auto:N (N at least 1), got {text}")
        return text
    return _positive_int(text)


def _resolved_device(args: argparse.Namespace) -> str:
    from delta_qwen3.devices import resolve_device

    return resolve_device(args.device)


DTYPES = ("auto", "float32", "bfloat16", "float16")
ROUTING_WINDOW = 1024  # routing's default window; a model with fewer positions is read in windows of its own size
TRUST_HELP = ("run Python code that a checkpoint ships (auto_map in its config.json or tokenizer_config.json), as "
              "Transformers' trust_remote_code=True does; DeltaQwen3 and Qwen3 checkpoints load with the installed "
              "classes without it")  # fmt: skip


def _add_trust_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trust-remote-code", action="store_true", help=TRUST_HELP)


def _add_text_source_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="Hub dataset id, or a local file or directory of them: a .txt file is one document, "
                        "a .jsonl / .json file one document per line, a .parquet file one per row")
    parser.add_argument("--text-field", default="text", help="field holding the text (JSON lines, parquet, Hub; default: text)")
    parser.add_argument("--split", default="validation", help="Hub dataset split (default: validation)")
    parser.add_argument("--config", default=None, help="Hub dataset configuration, e.g. wikitext-2-raw-v1")
    parser.add_argument("--limit", type=_positive_int, default=None, help="use at most this many documents")
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--dtype", default="auto", choices=DTYPES, help="weights dtype (default: the checkpoint's)")
    _add_trust_argument(parser)


def register(subparsers) -> None:
    """Add the `eval`, `ppl` and `routing` subcommands."""
    evaluate = subparsers.add_parser(
        "eval",
        help="the paper's eight zero-shot benchmarks through lm-eval, side by side",
        usage="delta-qwen3 eval MODEL [MODEL ...] [options]\n       delta-qwen3 eval export-data DIR [--tasks T]",
        description="Run the paper's zero-shot benchmarks (HellaSwag, ARC-Easy, ARC-Challenge, PIQA, WinoGrande, "
        "BoolQ, MMLU, LAMBADA) through lm-eval for each MODEL (Hub id or directory), write a results JSON and "
        "print a table. `export-data DIR` instead downloads the benchmarks' documents from the Hub into DIR, "
        "one JSON-lines file per task, for --data-dir on machines without Hub access.",
    )
    evaluate.add_argument("models", nargs="+", metavar="MODEL", help="Hub ids or checkpoint directories")
    evaluate.add_argument("--tasks", default="paper", help="'paper' (all eight) or comma-separated task names")
    evaluate.add_argument("--data-dir", type=Path, default=None, help="read <task>.jsonl files here, not the Hub")
    evaluate.add_argument("--limit", type=_positive_int, default=None, help="documents per task (for quick runs)")
    evaluate.add_argument("--batch-size", type=_batch_size, default=8, help="lm-eval batch size or 'auto'")
    evaluate.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    evaluate.add_argument("--dtype", default="auto", choices=DTYPES, help="weights dtype (default: the checkpoint's)")
    evaluate.add_argument("--output", type=Path, default=Path("eval_results.json"), help="results JSON")
    _add_trust_argument(evaluate)
    evaluate.set_defaults(func=run_eval)

    ppl = subparsers.add_parser(
        "ppl",
        help="validation perplexity with strided windows",
        description="Perplexity of MODEL on --data: token-weighted negative log-likelihood over strided windows.",
    )
    ppl.add_argument("model", metavar="MODEL")
    _add_text_source_arguments(ppl)
    ppl.add_argument("--max-length", type=_positive_int, default=None, help="window length (default: context, <=2048)")
    ppl.add_argument("--stride", type=_positive_int, default=None, help="window step (default: half a window)")
    ppl.add_argument(
        "--batch-size", type=_positive_int, default=None,
        help="windows per forward pass, the same result to float rounding; memory grows with it (default: 4 on a "
        "CPU, 16 on an accelerator, fewer where their logits would pass 2^28 values: one at a time for Qwen3's "
        "151,936-token vocabulary in windows of 2,048)",
    )
    ppl.add_argument("--output", type=Path, default=None, help="also write the result as JSON here")
    ppl.set_defaults(func=run_ppl)

    routing = subparsers.add_parser(
        "routing",
        help="routing sharpness per routing point: JSON and pictures",
        description="Per routing point, the mean largest routing weight and the mean entropy over the tokens of "
        "--data, for each MODEL; writes routing.json, routing_heatmap.png and routing_max_weight.png into --out.",
    )
    routing.add_argument("models", nargs="+", metavar="MODEL")
    _add_text_source_arguments(routing)
    routing.add_argument(
        "--max-length", type=_positive_int, default=None,
        help=f"tokens per forward pass (default: {ROUTING_WINDOW}, or the model's positions if fewer)",
    )
    routing.add_argument("--out", type=Path, required=True, help="output directory")
    routing.add_argument("--overwrite", action="store_true", help="replace the report of an earlier run in --out")
    routing.set_defaults(func=run_routing)


def run_eval(args: argparse.Namespace) -> int:
    from delta_qwen3.atomic import write_json
    from delta_qwen3.output_paths import check_not_an_input, check_output_file, output_lock, reporting_write_failure
    from .benchmarks import resolve_benchmarks
    from .local_data import export_data
    from .runner import format_table, run_benchmarks

    if args.models[0] == EXPORT_DATA:
        if len(args.models) != 2:
            raise CommandError(f"usage: delta-qwen3 eval {EXPORT_DATA} DIR [--tasks T]")
        benchmarks = resolve_benchmarks(args.tasks)
        with (output_lock("DIR", args.models[1], inside=True),
              reporting_write_failure("DIR", args.models[1], "the files of the tasks before it are kept")):
            counts = export_data(Path(args.models[1]), benchmarks)
        print(json_text({"data_dir": args.models[1], "documents": counts}))
        return 0
    device = _resolved_device(args)
    check_output_file(args.output, "--output")
    check_not_an_input("--output", args.output, [args.output],
                       [*(("MODEL", model) for model in args.models), ("--data-dir", args.data_dir)])  # fmt: skip
    with output_lock("--output", args.output):
        results = run_benchmarks(
            args.models,
            tasks=args.tasks,
            data_dir=args.data_dir,
            limit=args.limit,
            batch_size=args.batch_size,
            device=device,
            dtype=args.dtype,
            trust_remote_code=args.trust_remote_code,
        )
        print(format_table(results))
        with reporting_write_failure("--output", args.output):
            write_json(args.output, results)
    print(f"results written to {args.output}", file=sys.stderr)
    return 0


def run_ppl(args: argparse.Namespace) -> int:
    from contextlib import nullcontext

    from delta_qwen3.atomic import write_json
    from delta_qwen3.output_paths import check_not_an_input, check_output_file, output_lock, reporting_write_failure
    from .models import check_models, check_stride, check_window, load_causal_lm
    from .perplexity import perplexity
    from delta_qwen3.texts import read_texts

    device = _resolved_device(args)
    if args.output is not None:
        check_output_file(args.output, "--output")
        check_not_an_input("--output", args.output, [args.output], [("MODEL", args.model), ("--data", args.data)])
    with output_lock("--output", args.output) if args.output is not None else nullcontext():
        check_models([args.model], args.trust_remote_code)
        check_window(args.max_length, args.model, args.trust_remote_code)
        check_stride(args.stride, args.max_length, args.model, args.trust_remote_code)
        texts = read_texts(args.data, text_field=args.text_field, split=args.split, config=args.config,
                           limit=args.limit)  # fmt: skip
        model, tokenizer = load_causal_lm(args.model, device=device, dtype=args.dtype,
                                          trust_remote_code=args.trust_remote_code)  # fmt: skip
        try:
            value = perplexity(model, tokenizer, texts, max_length=args.max_length, stride=args.stride,
                               batch_size=args.batch_size)  # fmt: skip
        except ValueError as error:
            raise CommandError(str(error)) from None
        result = {"model": args.model, "data": args.data, "documents": len(texts), "perplexity": value}
        print(json_text(result))
        if args.output is not None:
            with reporting_write_failure("--output", args.output):
                write_json(args.output, result)
    return 0


def run_routing(args: argparse.Namespace) -> int:
    from delta_qwen3.output_paths import check_not_an_input, check_output_dir, output_lock, reporting_write_failure
    from .models import check_models, check_routed, check_window, load_causal_lm
    from .routing import routing_statistics
    from .routing_plots import REPORT_FILES, sharpness_label, write_routing_report
    from delta_qwen3.texts import read_texts

    device = _resolved_device(args)
    check_output_dir(args.out, "--out", overwrite=args.overwrite, files=REPORT_FILES)
    check_not_an_input("--out", args.out, [args.out / name for name in REPORT_FILES],
                       [*(("MODEL", model) for model in args.models), ("--data", args.data)])  # fmt: skip
    with output_lock("--out", args.out, inside=True):
        check_output_dir(args.out, "--out", overwrite=args.overwrite, files=REPORT_FILES)  # again: now it is ours
        check_models(args.models, args.trust_remote_code)
        for name in args.models:
            check_window(args.max_length, name, args.trust_remote_code)
            check_routed(name, args.trust_remote_code)
        texts = read_texts(args.data, text_field=args.text_field, split=args.split, config=args.config,
                           limit=args.limit)  # fmt: skip
        runs = {}
        for name in args.models:
            model, tokenizer = load_causal_lm(name, device=device, dtype=args.dtype,
                                              trust_remote_code=args.trust_remote_code)  # fmt: skip
            runs[name] = routing_statistics(model, tokenizer, texts, max_length=args.max_length or ROUTING_WINDOW)
            del model  # before the next model loads
            print(f"{name}: {sharpness_label(runs[name])}, mean entropy {runs[name]['mean_entropy']:.4f} nats",
                  file=sys.stderr)
        print(json_text({name: stats["mean_max_weight"] for name, stats in runs.items()}))
        with reporting_write_failure("--out", args.out):
            write_routing_report(runs, args.out, data=args.data, documents=len(texts))
    return 0
