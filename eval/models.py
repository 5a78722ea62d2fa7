"""Loading a causal language model and its tokenizer: the one way every evaluation command loads a model (lm-eval
receives the loaded model), so that a missing path, a broken checkpoint or tokenizer, code the checkpoint ships, or
a window beyond the model's positions is reported alike everywhere, before any work.

DeltaQwen3 and Qwen3 checkpoints load with the installed classes; a checkpoint's own Python code runs only with
`trust_remote_code` (the commands' `--trust-remote-code`), as in Transformers and lm-eval
(`delta_qwen3.checkpoints.remote_code_allowed`)."""

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

import modeling_delta_qwen3  # noqa: F401  (registers DeltaQwen3 with the Auto classes: loaded without remote code)
from delta_qwen3.checkpoints import (
    check_model_source,
    check_vocabulary,
    load_model_config,
    load_tokenizer,
    loading,
    read_config_fields,
    remote_code_allowed,
)
from delta_qwen3.errors import CommandError
from delta_qwen3.model_shapes import check_model_shape

MODEL_OPTION = "MODEL"  # how the commands' usage names a model argument
MIN_WINDOW = 2  # one token to predict and one to predict it from
DEFAULT_WINDOW = 2048  # perplexity's longest default window (`eval.perplexity.perplexity`)


def require_distinct(models: list[str]) -> None:
    """Results are keyed by model name: at least one model, each named once."""
    if not models:
        raise CommandError("no models given")
    repeated = sorted({model for model in models if models.count(model) > 1})
    if repeated:
        raise CommandError(f"model given more than once: {', '.join(repeated)}")


def check_models(models: list[str], trust_remote_code: bool = False) -> None:
    """Each model named once, and each one loadable: a checkpoint (`check_model_source`) whose configuration and
    tokenizer load without code it ships unless `trust_remote_code`, and whose tokenizer fits its embedding; all
    told before the first model runs."""
    require_distinct(models)
    for model in models:
        check_model_source(model, MODEL_OPTION)
    for model in models:
        config = load_config(model, trust_remote_code)
        tokenizer = load_tokenizer(model, MODEL_OPTION, trust_remote_code)
        check_vocabulary(tokenizer, config.vocab_size, f"the tokenizer of {MODEL_OPTION} {model}", f"model {model}")


def load_config(name: str, trust_remote_code: bool = False) -> PretrainedConfig:
    """The configuration of a model (Hub id or directory), read without its weights; a Qwen3 or DeltaQwen3 one
    that cannot make a working model is refused (`check_model_shape`)."""
    config = load_model_config(name, MODEL_OPTION, trust_remote_code, subject=f"model {name!r}")
    check_model_shape(config, f"{MODEL_OPTION} {name} (its config.json)")
    return config


def check_window(max_length: int | None, name: str, trust_remote_code: bool = False) -> None:
    """Refuse a `--max-length` that predicts nothing, or that is beyond the positions of model `name`: its
    outputs there are numbers without meaning. None (the command's default) fits every model."""
    if max_length is None:
        return
    if max_length < MIN_WINDOW:
        raise CommandError(f"--max-length {max_length} is too short: a window needs at least {MIN_WINDOW} tokens")
    positions = load_config(name, trust_remote_code).max_position_embeddings
    if max_length > positions:
        raise CommandError(f"--max-length {max_length} is beyond the max_position_embeddings ({positions}) of {name}")


def check_routed(name: str, trust_remote_code: bool = False) -> None:
    """Refuse, before any model runs, a model without routing weights (not DeltaQwen3)."""
    config = load_config(name, trust_remote_code)
    if getattr(config, "routing_mode", None) is None:
        raise CommandError(f"MODEL {name} is a {config.model_type!r} model, not DeltaQwen3: it has no routing weights")


def check_stride(stride: int | None, max_length: int | None, name: str, trust_remote_code: bool = False) -> None:
    """Refuse a `--stride` longer than the window (`--max-length`, or its default: the model's positions up to
    2048): the tokens between two windows would be scored by neither."""
    if stride is None:
        return
    window = max_length or min(load_config(name, trust_remote_code).max_position_embeddings, DEFAULT_WINDOW)
    if stride > window:
        option = f"--max-length {max_length}" if max_length else f"the default window of {name}, {window} tokens"
        raise CommandError(f"--stride {stride} is longer than the window ({option}): the tokens between two windows "
                           "would be scored by neither; give a --stride of at most the window")  # fmt: skip


def load_causal_lm(
    name: str, *, device: str = "cpu", dtype: str = "auto", trust_remote_code: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A model (Hub id or directory) in evaluation mode on `device`, and its tokenizer; code the checkpoint ships
    runs only with `trust_remote_code` (see the module's docstring)."""
    config = load_config(name, trust_remote_code)  # first: a foreign or broken configuration is the plainest reason
    trust = remote_code_allowed(read_config_fields(name, MODEL_OPTION), name, MODEL_OPTION, trust_remote_code)
    tokenizer = load_tokenizer(name, MODEL_OPTION, trust_remote_code)
    check_vocabulary(tokenizer, config.vocab_size, f"the tokenizer of {MODEL_OPTION} {name}", f"model {name}")
    with loading(f"model {name!r}"):
        model = AutoModelForCausalLM.from_pretrained(
            name, config=config, trust_remote_code=trust, dtype=dtype if dtype == "auto" else getattr(torch, dtype)
        )
    return model.to(device).eval(), tokenizer
