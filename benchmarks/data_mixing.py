"""Does the training pipeline learn as well as a plain loop of the same budget? Pre-trains one model three ways on
real text and scores each on the pipeline's held-out documents:

- `pipeline`: `finetune --from-scratch` as it is (packed blocks mixed by the block shuffle buffer);
- `packing_order`: the same with `--block-shuffle-buffer 1`, so a batch holds consecutive blocks of few documents;
- `plain_loop`: random windows of the training documents' token stream, AdamW and the same schedule, written out
  here without any of the project's training code.

    python benchmarks/data_mixing.py --data DOCS.jsonl --tokenizer TOKENIZER_DIR [--steps 300] [--output FILE]
"""

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import Qwen3ForCausalLM

import finetune
from delta_qwen3.atomic import write_json
from delta_qwen3.texts import token_stream
from finetune.config import parse_args
from finetune.data import build_training_data
from finetune.evaluation import loss_and_perplexity, validation_nll
from finetune.model import build_model_config, load_tokenizer
from finetune.outputs import log_path


def plain_loop(config, tokenizer, data) -> float:
    """Validation loss after `config.max_steps` steps of `config.batch_size` random windows of the training
    documents, AdamW (the paper's betas and decay) with linear warm-up and cosine to `config.min_lr_ratio`."""
    stream = token_stream(tokenizer, data.training_texts(0))
    torch.manual_seed(config.seed)
    model = Qwen3ForCausalLM(build_model_config(config, tokenizer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.1)
    generator = torch.Generator().manual_seed(config.seed + 1)
    steps, warmup, floor = config.max_steps, config.warmup_steps, config.min_lr_ratio
    for step in range(steps):
        progress = max(0.0, (step - warmup) / max(1, steps - warmup))
        cosine = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        for group in optimizer.param_groups:
            group["lr"] = config.lr * ((step + 1) / warmup if step < warmup else cosine)
        starts = torch.randint(0, len(stream) - config.seq_len, (config.batch_size,), generator=generator).tolist()
        batch = torch.stack([stream[start : start + config.seq_len] for start in starts])
        logits = model(input_ids=batch).logits
        F.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    return loss_and_perplexity(validation_nll(model, data.validation, config.batch_size, 0, 1, "cpu"))["val_loss"]


def pipeline_loss(argv: list[str]) -> float:
    """Train with `finetune` in this process; the validation loss of its last step."""
    if finetune.main(argv) != 0:
        raise SystemExit("finetune failed (its error is above)")
    config = parse_args(argv)
    lines = [json.loads(line) for line in log_path(config.output_dir).read_text().splitlines()]
    return [line["val_loss"] for line in lines if "val_loss" in line][-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--val-blocks", type=int, default=256)
    parser.add_argument("--output", type=Path, default=None, help="results JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        shared = ["--from-scratch", "--preset", args.preset, "--mode", "baseline", "--tokenizer", args.tokenizer,
                  "--data", args.data, "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size),
                  "--max-steps", str(args.steps), "--warmup-steps", str(max(1, args.steps // 10)), "--lr",
                  str(args.lr), "--val-blocks", str(args.val_blocks), "--eval-every", str(args.steps),
                  "--save-every", "0", "--log-every", str(max(1, args.steps // 10))]  # fmt: skip
        losses = {
            "pipeline": pipeline_loss([*shared, "--output-dir", f"{work}/pipeline"]),
            "packing_order": pipeline_loss([*shared, "--output-dir", f"{work}/packed", "--block-shuffle-buffer", "1"]),
        }
        config = parse_args([*shared, "--output-dir", f"{work}/plain"])
        tokenizer = load_tokenizer(config)
        losses["plain_loop"] = plain_loop(config, tokenizer, build_training_data(config, tokenizer, world_size=1))
    results = {name: {"val_loss": loss, "val_ppl": math.exp(loss)} for name, loss in losses.items()}
    for name, values in results.items():
        print(f"{name:14s} validation loss {values['val_loss']:.4f}  perplexity {values['val_ppl']:.2f}")
    if args.output is not None:
        write_json(args.output, {"settings": vars(args) | {"output": str(args.output)}, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
