"""Check a conversion: run the source and the converted model on the same probe batch and compare logits."""

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from .source import resolve_source

PROBE_SHAPE = (2, 24)


def probe_logits(model_dir: Path, input_ids: torch.Tensor, device: str | torch.device, **load_kwargs) -> torch.Tensor:
    """float32 logits of the model in `model_dir` (loaded in its own dtype) for `input_ids`; the model is freed
    before returning, so two models are never held at once."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, **load_kwargs).to(device).eval()
    with torch.no_grad():
        logits = model(input_ids=input_ids.to(device)).logits.float().cpu()
    del model
    return logits


def verify(
    src: str | Path,
    out: str | Path,
    *,
    device: str | torch.device = "cpu",
    revision: str | None = None,
    token: str | None = None,
    cache_dir: str | Path | None = None,
) -> float:
    """The largest absolute logit difference between the Qwen3 checkpoint `src` and its conversion `out` on a
    fixed random probe batch. The converted model is loaded as a user would, with `trust_remote_code=True`.
    0 (or rounding noise) for gated delta modes; large for AttnRes modes and ungated conversions."""
    src_path, _ = resolve_source(src, revision, token, cache_dir)
    vocab_size = json.loads((src_path / "config.json").read_text())["vocab_size"]
    input_ids = torch.randint(vocab_size, PROBE_SHAPE, generator=torch.Generator().manual_seed(0))
    expected = probe_logits(src_path, input_ids, device)
    converted = probe_logits(Path(out), input_ids, device, trust_remote_code=True)
    return (converted - expected).abs().max().item()
