"""Loading a causal language model and its tokenizer: the one way every evaluation command loads a model (lm-eval
receives the loaded model), so that a missing path, a broken checkpoint or a window beyond the model's positions is
reported alike everywhere, before any work."""

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedModel
from transformers import PreTrainedTokenizerBase

from delta_qwen3.checkpoints import check_model_source, loading
from delta_qwen3.errors import CommandError

MODEL_OPTION = "MODEL"  # how the commands' usage names a model argument
MIN_WINDOW = 2  # one token to predict and one to predict it from


def require_distinct(models: list[str]) -> None:
    """Results are keyed by model name: at least one model, each named once."""
    if not models:
        raise CommandError("no models given")
    repeated = sorted({model for model in models if models.count(model) > 1})
    if repeated:
        raise CommandError(f"model given more than once: {', '.join(repeated)}")


def check_models(models: list[str]) -> None:
    """Each model named once, and each one that is local a loadable checkpoint: all told before the first runs."""
    require_distinct(models)
    for model in models:
        check_model_source(model, MODEL_OPTION)


def load_config(name: str) -> PretrainedConfig:
    """The configuration of a model (Hub id or directory), read without its weights."""
    check_model_source(name, MODEL_OPTION)
    with loading(f"model {name!r}"):
        return AutoConfig.from_pretrained(name, trust_remote_code=True)


def check_window(max_length: int | None, name: str) -> None:
    """Refuse a `--max-length` that predicts nothing, or that is beyond the positions of model `name`: its
    outputs there are numbers without meaning. None (the command's default) fits every model."""
    if max_length is None:
        return
    if max_length < MIN_WINDOW:
        raise CommandError(f"--max-length {max_length} is too short: a window needs at least {MIN_WINDOW} tokens")
    positions = load_config(name).max_position_embeddings
    if max_length > positions:
        raise CommandError(f"--max-length {max_length} is beyond the max_position_embeddings ({positions}) of {name}")


def load_causal_lm(
    name: str, *, device: str = "cpu", dtype: str = "auto"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A model (Hub id or directory, `trust_remote_code` on) in evaluation mode on `device`, and its tokenizer."""
    config = load_config(name)  # first: a foreign or broken configuration is the plainest reason a model won't load
    with loading(f"model {name!r}"):
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=True)
        model = AutoModelForCausalLM.from_pretrained(
            name, config=config, trust_remote_code=True, dtype=dtype if dtype == "auto" else getattr(torch, dtype)
        )
    return model.to(device).eval(), tokenizer
