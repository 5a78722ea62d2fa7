"""Does DeltaQwen3 work on this GPU? A self-check in the spirit of `accelerate test`, one command:

    python -m benchmarks.gpu_check --out DIR               # on one CUDA GPU, in under 12 minutes (`make gpu-check`)
    python -m benchmarks.gpu_check --out DIR --rehearsal   # the same code on the CPU at tiny shapes
    python -m benchmarks.gpu_check --out DIR --sections performance --budget-scale 1.35  # performance alone, 8 min

Six sections, each with its own time budget, pass/fail, figures and tolerances:
  implementations  every routing implementation (reference, buffer, compiled, fused, fla where installed, and fused
                   with its points in groups) against the reference, forward and backward, in every routing mode,
                   in float32 (TF32 off) and bfloat16;
  attention        sdpa (and flash-attention 2 where installed) against eager attention in the model, on a
                   left-padded batch;
  compile          `torch.compile(fullgraph=True)`: a training step's loss and gradients, and generation, against
                   eager;
  performance      at the Qwen3-0.6B shape in bfloat16, as ratios to Qwen3 of the same shape in the same run, the
                   routing implementations buffer and fused side by side: memory and eager training at 4 x 512 and
                   8 x 4096 tokens, the routing operation's bytes/s against the memory bandwidth, kernels and
                   GPU-busy time of a training step, eager decoding, decoding under CUDA graphs and compiled
                   training; each ratio beside its goal (benchmarks/README.md), reported, not failed on;
  learning         a short pre-training of plain Qwen3 and Delta Block on the demo's data: both losses fall;
  serving          where vLLM is installed (here, or in the interpreter of `--vllm-python`): its greedy tokens equal
                   `generate`'s, in vLLM's default (compiled) and eager modes; else skipped, saying why.

A section that fails, raises or runs out of its budget is recorded as such and the others still run. DIR/gpu_check.json
is written before the first section and again after each (to a temporary file, then renamed), so a killed run leaves
what it had; DIR/gpu_check.md holds the table printed at the end, and DIR/gpu_check.log what the sections printed.
Exit status: 0 when no section failed, 1 when one did, 2 for bad options. Nothing is installed.
"""

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.gpu_check.attention import check_attention
from benchmarks.gpu_check.compile import check_compile
from benchmarks.gpu_check.implementations import check_implementations
from benchmarks.gpu_check.learning import check_learning
from benchmarks.gpu_check.performance import check_performance
from benchmarks.gpu_check.profiles import GPU, REHEARSAL, Profile
from benchmarks.gpu_check.report import environment, write_table
from benchmarks.gpu_check.running import Run, run_sections, watchdog
from benchmarks.gpu_check.serving import check_serving

SECTIONS = ("implementations", "attention", "compile", "performance", "learning", "serving")


def section_names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SECTIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown section {', '.join(unknown) or '(none)'}: choose from "
                                         f"{', '.join(SECTIONS)}")
    return names


def positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


class OneLineParser(argparse.ArgumentParser):
    """Bad options end the command with one line naming the problem, and status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m benchmarks.gpu_check", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="where gpu_check.json, .md and .log are written")
    parser.add_argument("--rehearsal", action="store_true", help="the same code on the CPU at tiny shapes")
    parser.add_argument("--sections", type=section_names, default=list(SECTIONS), help="comma-separated, in order")
    parser.add_argument("--budget-scale", type=positive, default=1.0, help="multiply every section's time budget")
    parser.add_argument("--vllm-python", type=Path, help="an interpreter that has vLLM (default: this one, if so)")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, checked against this machine: a GPU unless rehearsing, the files they name."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.rehearsal and not torch.cuda.is_available():
        parser.error("no CUDA GPU is visible to PyTorch here: --rehearsal runs the check on the CPU")
    if args.vllm_python is not None and not args.vllm_python.exists():
        parser.error(f"--vllm-python {args.vllm_python} does not exist")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is not a directory")
    return args


def section_functions(profile: Profile, args: argparse.Namespace) -> dict[str, Callable]:
    functions = {
        "implementations": lambda section: check_implementations(profile, section),
        "attention": lambda section: check_attention(profile, section),
        "compile": lambda section: check_compile(profile, section),
        "performance": lambda section: check_performance(profile, section),
        "learning": lambda section: check_learning(profile, section),
        "serving": lambda section: check_serving(profile, section, args.vllm_python),
    }
    return {name: functions[name] for name in args.sections}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    profile = REHEARSAL if args.rehearsal else GPU
    if profile.threads:
        torch.set_num_threads(profile.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    budgets = {name: seconds * args.budget_scale for name, seconds in profile.budgets.items()}
    run = Run(args.out, {"settings": environment(profile, args.rehearsal) | {"budget_scale": args.budget_scale},
                         "sections": {}})  # fmt: skip
    watchdog(run, sum(budgets[name] for name in args.sections) + 30)  # past every section's budget, and a margin
    with (args.out / "gpu_check.log").open("w") as log:
        run_sections(run, section_functions(profile, args), budgets, log)
    write_table(run)
    return 0 if run.report["passed"] else 1

