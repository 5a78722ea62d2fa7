"""`make demo` / `python -m demo`: the whole DeltaQwen3 journey on an embedded default, on CPU in minutes.

    python -m demo                                        # pre-train a small Qwen3 on Python's docs, then the rest
    python -m demo --base Qwen/Qwen3-0.6B --data HuggingFaceFW/fineweb-edu --steps 2000 --device cuda
"""

import argparse
import sys
from pathlib import Path

from delta_qwen3.devices import resolve_device
from delta_qwen3.interrupts import run_command

from .journey import DemoSettings, run_journey


def parse_settings(argv: list[str] | None = None) -> DemoSettings:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", help="Qwen3 checkpoint, Hub id or directory (default: pre-train a small one)")
    parser.add_argument("--data", help="fine-tuning data: Hub dataset id or local file (default: Python's docs)")
    parser.add_argument("--steps", type=int, default=150, help="fine-tuning steps for each model")
    parser.add_argument("--pretrain-steps", type=int, default=400, help="pre-training steps of the embedded base")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per training block")
    parser.add_argument("--num-blocks", type=int, help="Delta Block blocks (default: 2 for the embedded base, else 4)")
    parser.add_argument("--out", type=Path, default=Path("demo-output"), help="where everything is written")
    args = parser.parse_args(argv)
    return DemoSettings(
        out=args.out,
        base=args.base,
        data=args.data,
        steps=args.steps,
        pretrain_steps=args.pretrain_steps,
        device=resolve_device(args.device),  # checked before the first step, which pre-trains or converts
        seq_len=args.seq_len,
        num_blocks=args.num_blocks or (4 if args.base else 2),
    )


def main(argv: list[str] | None = None) -> int:
    def journey() -> None:
        run_journey(parse_settings(argv))

    return run_command("demo", journey)


if __name__ == "__main__":
    sys.exit(main())
