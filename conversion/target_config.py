"""The DeltaQwen3 configuration of a converted checkpoint: the source's Qwen3 fields plus the routing fields."""

import torch
from huggingface_hub.errors import StrictDataclassError

from delta_qwen3.errors import CommandError
from delta_qwen3.model_shapes import check_model_fields, check_model_shape
from modeling_delta_qwen3 import DeltaQwen3Config
from modeling_delta_qwen3.routing_modes import GATEABLE_MODES

# Keys of a Qwen3 config.json that describe the file rather than the model; the target writes its own.
_FILE_KEYS = ("model_type", "architectures", "auto_map", "transformers_version", "torch_dtype", "dtype")
OUTPUT_DTYPES = ("float32", "float16", "bfloat16")
# The DeltaQwen3 class of each Qwen3 class a checkpoint may be saved from: a converted checkpoint keeps its head.
# Not Qwen3ForQuestionAnswering, which keeps its decoder under `transformer.` (the prefix of older models) where
# DeltaQwen3ForQuestionAnswering, like every other Qwen3 class, has `model.`.
DELTA_ARCHITECTURES = {
    "Qwen3ForCausalLM": "DeltaQwen3ForCausalLM",
    "Qwen3ForSequenceClassification": "DeltaQwen3ForSequenceClassification",
    "Qwen3ForTokenClassification": "DeltaQwen3ForTokenClassification",
}


def output_dtype(dtype: str | torch.dtype | None, source_dtype: str) -> torch.dtype:
    """The dtype the converted weights are written in: `dtype` if given, else the source's."""
    name = str(dtype).removeprefix("torch.") if dtype is not None else source_dtype
    if name not in OUTPUT_DTYPES:
        raise CommandError(f"dtype {name!r} is not one of {', '.join(OUTPUT_DTYPES)}")
    return getattr(torch, name)


def default_num_blocks(config_fields: dict) -> int:
    """The block count when none is given for a model of `config_fields`: SPEC's default (4), or one block per
    layer in a model with fewer layers, so that a shallow model converts, or trains from scratch, with default
    options (in every mode: the config checks the count even where it is unused). A layer count that is not a
    number is left for the config to refuse, naming the field."""
    layers = config_fields.get("num_hidden_layers", DeltaQwen3Config.num_hidden_layers)
    if not isinstance(layers, int):
        return DeltaQwen3Config.routing_num_blocks
    return min(DeltaQwen3Config.routing_num_blocks, layers)


def delta_architecture(qwen3_config: dict) -> str:
    """The DeltaQwen3 class for a Qwen3 `config.json`'s `architectures` (a causal LM when it names none)."""
    architectures = qwen3_config.get("architectures") or ["Qwen3ForCausalLM"]
    if not isinstance(architectures, list):
        raise CommandError(f"cannot convert architectures {architectures!r}: config.json must name them in a list")
    if len(architectures) != 1 or architectures[0] not in DELTA_ARCHITECTURES:
        raise CommandError(
            f"cannot convert architectures {architectures}: a Qwen3 checkpoint of one of "
            f"{', '.join(DELTA_ARCHITECTURES)} is needed"
        )
    return DELTA_ARCHITECTURES[architectures[0]]


def delta_config(qwen3_config: dict, mode: str, num_blocks: int | None, gate: bool | None,
                 dtype: torch.dtype) -> DeltaQwen3Config:
    """The DeltaQwen3 config for a Qwen3 `config.json`. `num_blocks=None` takes `default_num_blocks`. `gate=None`
    gates the delta modes (so the conversion is exact) and leaves the AttnRes modes ungated (they have no gate).
    Invalid routing settings, such as a block count out of range for the model's depth, are refused with the
    config's own message."""
    gate = mode in GATEABLE_MODES if gate is None else gate
    if num_blocks is None:
        num_blocks = default_num_blocks(qwen3_config)
    fields = {key: value for key, value in qwen3_config.items() if key not in _FILE_KEYS}
    check_model_fields(fields, "cannot convert to DeltaQwen3: the source's config.json")
    try:
        config = DeltaQwen3Config(**fields, routing_mode=mode, routing_num_blocks=num_blocks, routing_gate=gate)
    except (ValueError, TypeError, StrictDataclassError) as error:
        raise CommandError(f"cannot convert to DeltaQwen3: {' '.join(str(error).split())}")  # one line
    check_model_shape(config, "cannot convert to DeltaQwen3: the source's config.json")
    config.architectures = [delta_architecture(qwen3_config)]
    config.dtype = dtype
    return config


def is_function_preserving(config: DeltaQwen3Config) -> bool:
    """Whether a freshly converted checkpoint computes exactly what its source did (SPEC section 2.5)."""
    return config.routing_mode in GATEABLE_MODES and config.routing_gate


def cast_caveat(source_dtype: str, dtype: str | torch.dtype) -> str:
    """What "computes exactly what the source computes" leaves out when the weights were cast: the function is
    the source's, its arithmetic is not, so the outputs differ by the cast's rounding. Empty without a cast."""
    dtype = str(dtype).removeprefix("torch.")
    if dtype == source_dtype:
        return ""
    return (f" at the source's precision ({source_dtype}); its weights were cast to {dtype}, so its outputs differ "
            f"from the source's by that rounding")
