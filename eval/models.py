"""Loading a causal language model and its tokenizer for perplexity and routing analysis."""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from delta_qwen3.errors import CommandError


def require_distinct(models: list[str]) -> None:
    """Results are keyed by model name: at least one model, each named once."""
    if not models:
        raise CommandError("no models given")
    repeated = sorted({model for model in models if models.count(model) > 1})
    if repeated:
        raise CommandError(f"model given more than once: {', '.join(repeated)}")


def load_causal_lm(
    name: str, *, device: str = "cpu", dtype: str = "auto"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A model (Hub id or directory, `trust_remote_code` on) in evaluation mode on `device`, and its tokenizer."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=True)
        model = AutoModelForCausalLM.from_pretrained(
            name, trust_remote_code=True, dtype=dtype if dtype == "auto" else getattr(torch, dtype)
        )
    except Exception as error:  # transformers raises OSError, ValueError, KeyError... for unusable checkpoints
        raise CommandError(f"could not load model {name!r}: {type(error).__name__}: {error}") from error
    return model.to(device).eval(), tokenizer
