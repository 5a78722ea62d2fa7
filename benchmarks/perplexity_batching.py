"""How much running the windows in batches speeds up `delta-qwen3 ppl`: a `mini`-shaped DeltaQwen3 (8 layers, width
128, random weights, windows of its 1,024 positions every 512 tokens) with a 4,096-token BPE tokenizer, scoring the
first 0.5 MB of Python's documentation at each batch size. The batch sizes take turns within each round and are
compared within it, so that other load on the machine falls on all of them alike; every batch size must give the
first one's totals to float rounding.

    python benchmarks/perplexity_batching.py [--batch-sizes 1,4,16] [--rounds 3] [--output FILE]
"""

import argparse
import time

import torch

from delta_qwen3.atomic import write_json
from delta_qwen3.corpus import python_docs_texts, train_bpe_tokenizer
from delta_qwen3.texts import token_stream
from eval.perplexity import negative_log_likelihood
from finetune.presets import preset_fields
from modeling_delta_qwen3 import DeltaQwen3Config, DeltaQwen3ForCausalLM

TEXT_CHARACTERS = 500_000
VOCAB_SIZE = 4096


def build_model(vocab_size: int) -> DeltaQwen3ForCausalLM:
    """The `mini` shape in the default routing mode (Delta Block), with random weights drawn from a fixed seed."""
    torch.manual_seed(0)
    return DeltaQwen3ForCausalLM(DeltaQwen3Config(vocab_size=vocab_size, **preset_fields("mini"))).eval()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="1,4,16", help="comma-separated; the first is the reference")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    batch_sizes = [int(size) for size in args.batch_sizes.split(",")]

    texts = python_docs_texts()
    tokenizer = train_bpe_tokenizer(texts, VOCAB_SIZE)
    ids = token_stream(tokenizer, ["\n\n".join(texts)[:TEXT_CHARACTERS]])
    model = build_model(len(tokenizer))
    max_length = model.config.max_position_embeddings
    seconds: dict[int, list[float]] = {size: [] for size in batch_sizes}
    totals: dict[int, tuple[float, int]] = {}
    for _ in range(args.rounds):
        for size in batch_sizes:
            start = time.perf_counter()
            totals[size] = negative_log_likelihood(model, ids, max_length, max_length // 2, size)
            seconds[size].append(time.perf_counter() - start)
    reference = totals[batch_sizes[0]]
    for size, (total, count) in totals.items():
        assert count == reference[1] and abs(total - reference[0]) <= 1e-5 * abs(reference[0]), (size, total)

    # Each round's own ratios: load that comes and goes between rounds moves the times far more than batching.
    speedups = {size: [one / many for one, many in zip(seconds[batch_sizes[0]], times, strict=True)]
                for size, times in seconds.items()}  # fmt: skip
    for size, ratios in speedups.items():
        print(f"batch size {size:3d}: {', '.join(f'{ratio:.2f}' for ratio in ratios)} x the speed of batch size "
              f"{batch_sizes[0]} in the same round ({', '.join(f'{t:.1f}' for t in seconds[size])} s)")
    if args.output:
        write_json(args.output, {"tokens": len(ids), "window": max_length, "stride": max_length // 2,
                                 "speedup_per_round": speedups, "seconds": seconds})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
