"""What routing adds to a decoding step and to the prompt's forward pass, in milliseconds, at the Qwen3-0.6B shape:
the decoding measurement of `routing_overhead.py` (the two models' forward passes alternating one token at a time,
their common weights shared), with its details printed.

    python -m benchmarks.decode_steps                       # Delta AttnRes and Delta Block
    python -m benchmarks.decode_steps --modes delta --rounds 5
"""

import argparse
from types import SimpleNamespace

import torch

from benchmarks.routing_overhead import (
    DECODE_SHAPES,
    GreedyDecoder,
    _share_base_weights,
    build,
    keep_freed_memory,
    paired_decoding,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="delta,delta_block")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--shape", default="qwen3-0.6b", choices=list(DECODE_SHAPES))
    args = parser.parse_args(argv)
    keep_freed_memory()
    shape = DECODE_SHAPES[args.shape]
    settings = SimpleNamespace(device="cpu", dtype=torch.float32, routing_implementation=None)
    prompt = torch.randint(0, shape["vocab_size"], (1, args.prompt))
    for mode in args.modes.split(","):
        models = {"qwen3": build(shape, None, False, settings), mode: build(shape, mode, False, settings)}
        _share_base_weights(*models.values())
        decoders = {name: GreedyDecoder(model, prompt) for name, model in models.items()}
        result = paired_decoding(decoders, args.new_tokens, args.rounds, "cpu")
        print(
            f"{mode}: prompt +{result['prompt_ms_more']:.1f} ms, step +{result['step_ms_more']:.1f} ms, "
            f"generation ratio {result['ratio']:.3f} (Qwen3 {result['qwen3_seconds']:.2f} s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
