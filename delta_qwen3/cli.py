"""`delta-qwen3`: one entry point; each subcommand lives with the package that implements it."""

import argparse
import importlib
import sys

from .interrupts import run_command

# Modules that define `register(subparsers)`; each sets `func(args) -> int` on its parsers.
SUBCOMMAND_MODULES = ("conversion.cli", "eval.cli", "study.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="delta-qwen3", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; bad input, Ctrl-C and SIGTERM end it with one line on stderr (`run_command`)."""
    args = build_parser().parse_args(argv)
    return run_command(f"delta-qwen3 {args.command}", lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
