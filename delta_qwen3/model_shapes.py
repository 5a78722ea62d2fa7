"""A model configuration checked before any work: one from which no working Qwen3 or DeltaQwen3 model can be built
(a size that is not a positive whole number, attention heads that key-value heads do not divide, a norm epsilon
that is not a positive number) is refused in one line naming where it came from, rather than failing inside
PyTorch when the model is built, or at its first forward pass."""

import math

import torch

from .errors import CommandError

QWEN3_FAMILY = ("qwen3", "delta_qwen3")
# Sizes that must be positive whole numbers; `head_dim` too where it is set (None: hidden_size / heads).
SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "max_position_embeddings")  # fmt: skip


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check(fields: dict, subject: str) -> None:
    """The checks of `check_model_fields` over `fields`, those present (None where unset)."""
    sizes = [name for name in SIZE_FIELDS if name in fields]
    sizes += ["head_dim"] if fields.get("head_dim") is not None else []  # None: hidden_size / num_attention_heads
    for name in sizes:
        if not _positive_int(fields[name]):
            raise CommandError(f"{subject}: {name} must be a positive whole number, got {fields[name]!r}")
    heads, groups = fields.get("num_attention_heads"), fields.get("num_key_value_heads")
    if heads is not None and groups is not None and heads % groups:
        raise CommandError(f"{subject}: num_attention_heads ({heads}) must be a multiple of num_key_value_heads "
                           f"({groups}): each key-value head serves a whole group of attention heads")  # fmt: skip
    hidden = fields.get("hidden_size")
    if fields.get("head_dim") is None and "head_dim" in fields and hidden is not None and heads is not None \
            and hidden % heads:
        raise CommandError(f"{subject}: hidden_size ({hidden}) must be a multiple of num_attention_heads ({heads}) "
                           "when head_dim is not set")  # fmt: skip
    if "rms_norm_eps" in fields:
        eps = fields["rms_norm_eps"]
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not math.isfinite(eps) or eps <= 0:
            raise CommandError(f"{subject}: rms_norm_eps must be a positive number, got {eps!r}")


def check_model_fields(fields: dict, subject: str) -> None:
    """Refuse configuration fields (a `config.json`, a `--model-config` file, read as data) of a Qwen3-family model
    that cannot make a working model, before a configuration class sees them (see the module's docstring); fields
    that are absent take their class's defaults. `subject` names where they came from."""
    if fields.get("model_type", QWEN3_FAMILY[0]) in QWEN3_FAMILY:
        _check(fields, subject)


def check_model_shape(config, subject: str) -> None:
    """`check_model_fields` for a configuration object: every field, set or defaulted; configurations of other
    models are left to their own classes."""
    if getattr(config, "model_type", None) in QWEN3_FAMILY:
        _check({name: getattr(config, name, None) for name in [*SIZE_FIELDS, "head_dim", "rms_norm_eps"]}, subject)


def check_buildable(model_class, config, subject: str) -> None:
    """`check_model_shape`, then build the model on the meta device (no memory, no values): any other reason the
    class cannot build it is one line naming `subject`."""
    check_model_shape(config, subject)
    try:
        with torch.device("meta"):
            model_class(config)
    except Exception as error:  # the class and PyTorch raise many types for a configuration they cannot build
        reason = " ".join(str(error).split())
        raise CommandError(f"{subject} cannot build a model: {type(error).__name__}: {reason}") from None
