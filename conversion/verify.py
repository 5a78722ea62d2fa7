"""Check a conversion: run the source and the converted model on the same probe batch and compare logits."""

import json
from pathlib import Path

import torch

from modeling_delta_qwen3 import AUTO_CLASSES

from .source import resolve_source
from .target_config import delta_architecture

PROBE_SHAPE = (2, 24)


def probe_logits(auto_class, model_dir: Path, input_ids: torch.Tensor, device: str | torch.device,
                 **load_kwargs) -> torch.Tensor:
    """Every float32 logit (all of a head's `*logits` outputs, flattened) of the model in `model_dir`, loaded with
    `auto_class` in its own dtype, for `input_ids`; the model is freed before returning, so two models are never
    held at once."""
    model = auto_class.from_pretrained(model_dir, **load_kwargs).to(device).eval()
    with torch.no_grad():
        output = model(input_ids=input_ids.to(device))
    logits = torch.cat([value.float().flatten().cpu() for key, value in output.items() if key.endswith("logits")])
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
    fixed random probe batch. Both load with the installed classes (no code that either checkpoint ships runs).
    0 (or rounding noise) for gated delta modes; large for AttnRes modes and ungated conversions."""
    src_path, _ = resolve_source(src, revision, token, cache_dir)
    source_config = json.loads((src_path / "config.json").read_text())
    architecture = delta_architecture(source_config)
    auto_class = next(auto for auto, model in AUTO_CLASSES.items() if model.__name__ == architecture)
    input_ids = torch.randint(source_config["vocab_size"], PROBE_SHAPE, generator=torch.Generator().manual_seed(0))
    expected = probe_logits(auto_class, src_path, input_ids, device, trust_remote_code=False)
    converted = probe_logits(auto_class, Path(out), input_ids, device, trust_remote_code=False)
    return (converted - expected).abs().max().item()
