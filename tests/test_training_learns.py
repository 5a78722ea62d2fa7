"""The training pipeline learns as well as a plain loop of the same budget on real text: the same model, steps,
tokens per step and learning-rate schedule, the plain loop drawing random windows from the training documents'
token stream, both scored on the pipeline's held-out documents."""

import math

import pytest
import torch
import torch.nn.functional as F
from finetune_fixtures import log_lines, write_corpus
from transformers import Qwen3ForCausalLM

import finetune
from delta_qwen3.texts import token_stream
from finetune.config import parse_args
from finetune.data import build_training_data
from finetune.evaluation import loss_and_perplexity, validation_nll
from finetune.model import build_model_config

STEPS, BATCH, SEQ_LEN, LR, WARMUP = 120, 8, 64, 3e-3, 10


def plain_loop(config, tokenizer, data) -> float:
    """Random windows of the training documents, AdamW with warm-up and cosine to 0.1, written out here."""
    stream = token_stream(tokenizer, data.training_texts(0))
    torch.manual_seed(config.seed)
    model = Qwen3ForCausalLM(build_model_config(config, tokenizer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    generator = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        progress = max(0.0, (step - WARMUP) / (STEPS - WARMUP))
        scale = (step + 1) / WARMUP if step < WARMUP else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
        for group in optimizer.param_groups:
            group["lr"] = LR * scale
        starts = torch.randint(0, len(stream) - SEQ_LEN, (BATCH,), generator=generator)
        batch = torch.stack([stream[start : start + SEQ_LEN] for start in starts.tolist()])
        logits = model(input_ids=batch).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    return loss_and_perplexity(validation_nll(model, data.validation, BATCH, 0, 1, "cpu"))["val_loss"]


@pytest.mark.slow
def test_the_pipeline_learns_as_well_as_a_plain_loop_of_the_same_budget(tmp_path, tokenizer):
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    corpus = write_corpus(tmp_path / "python_docs.jsonl")
    argv = ["--from-scratch", "--preset", "tiny", "--mode", "baseline", "--tokenizer", str(tmp_path / "tokenizer"),
            "--data", str(corpus), "--output-dir", str(tmp_path / "run"), "--seq-len", str(SEQ_LEN),
            "--batch-size", str(BATCH), "--max-steps", str(STEPS), "--warmup-steps", str(WARMUP), "--lr", str(LR),
            "--val-blocks", "64", "--eval-every", str(STEPS), "--save-every", "0", "--log-every", "20"]  # fmt: skip
    assert finetune.main(argv) == 0
    pipeline = [line["val_loss"] for line in log_lines(tmp_path / "run") if "val_loss" in line][-1]
    config = parse_args(argv)
    plain = plain_loop(config, tokenizer, build_training_data(config, tokenizer, world_size=1))
    assert pipeline < plain + 0.05, (pipeline, plain)
