"""The model to train: a DeltaQwen3 or Qwen3 checkpoint, or a new model from a preset; then what trains in it:
everything, only the routing parameters (`--freeze-base`), or LoRA adapters plus routing (`--lora`).

The configuration is built and checked first (`build_model_config`), so that a wrong mode or sequence length is
reported before any weights are read.

PEFT is imported by LoRA runs only: importing it imports bitsandbytes where that is installed, whose CPU backend
(0.50, on a CPU with AVX512-BF16) fetches a kernel from the Hub as it is imported, a download (and code) that a run
without LoRA has not asked for.
"""

import hashlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import PretrainedConfig, PreTrainedModel, Qwen3Config, Qwen3ForCausalLM

from conversion.target_config import default_num_blocks
from delta_qwen3.checkpoints import check_model_source, check_vocabulary, load_model_config, loading, local_directory
from delta_qwen3.checkpoints import read_config_fields
from delta_qwen3.checkpoints import load_tokenizer as load_checked_tokenizer
from delta_qwen3.errors import CommandError
from delta_qwen3.model_shapes import check_buildable, check_model_fields
from modeling_delta_qwen3 import DeltaQwen3Config, DeltaQwen3ForCausalLM

from .config import FinetuneConfig
from .presets import preset_fields

if TYPE_CHECKING:
    from peft import PeftModel

ROUTING_MARK = "_route."  # in every routing parameter's name: attn_route, mlp_route, final_route
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
VOCAB_MULTIPLE = 64  # a new model's vocabulary is the tokenizer's, rounded up for efficient matrix shapes
MODEL_CLASSES = {"delta_qwen3": DeltaQwen3ForCausalLM, "qwen3": Qwen3ForCausalLM}
# Not what is trained: the Transformers release that built the configuration, and where it was read from (the
# options naming the source are compared on --resume on their own).
UNRECORDED_CONFIG_KEYS = ("transformers_version", "_name_or_path")


def is_routing_parameter(name: str) -> bool:
    return ROUTING_MARK in name


def mode_of(model_config: PretrainedConfig) -> str:
    """`baseline` for a Qwen3 configuration, else its routing mode."""
    return getattr(model_config, "routing_mode", "baseline")


def load_tokenizer(config: FinetuneConfig):
    """`--tokenizer`, by default `--model`'s own. A model's configuration is loaded and checked first: its tokenizer
    may load even when the model cannot, or fail with text about tokenizer files when the directory is no
    checkpoint. Code the tokenizer ships runs only with `--trust-remote-code`; a broken tokenizer file is named."""
    if config.tokenizer:
        option, source = "--tokenizer", config.tokenizer
        local_directory(source, option)
    else:
        option, source = "--model", config.model
        _checkpoint_config(config)
    return load_checked_tokenizer(source, option, config.trust_remote_code)


def build_model_config(config: FinetuneConfig, tokenizer) -> PretrainedConfig:
    """The configuration of the model to train, checked against the options and the tokenizer."""
    if config.from_scratch:
        model_config = _new_config(config, tokenizer)
    else:
        model_config = _checkpoint_config(config)
        subject = f"--tokenizer {config.tokenizer}" if config.tokenizer else f"the tokenizer of --model {config.model}"
        check_vocabulary(tokenizer, model_config.vocab_size, subject, f"--model {config.model}")
    check_buildable(MODEL_CLASSES[model_config.model_type], model_config, _config_subject(config))
    if config.seq_len > model_config.max_position_embeddings:
        raise CommandError(
            f"--seq-len {config.seq_len} is beyond the model's max_position_embeddings "
            f"({model_config.max_position_embeddings})"
        )
    if config.freeze_base and mode_of(model_config) == "baseline":
        raise CommandError("--freeze-base trains only routing parameters, and a baseline Qwen3 model has none")
    return model_config


def _config_subject(config: FinetuneConfig) -> str:
    """Where the configuration of the model to train comes from, as its messages name it."""
    if not config.from_scratch:
        return f"--model {config.model} (its config.json)"
    return f"--model-config {config.model_config}" if config.model_config else f"--preset {config.preset}"


def _checkpoint_config(config: FinetuneConfig) -> PretrainedConfig:
    """The configuration of --model, which must be a DeltaQwen3 or Qwen3 checkpoint: its `config.json` is read as
    data first, so that the model always loads with the installed classes, never with code a checkpoint ships."""
    check_model_source(config.model, "--model")
    model_type = read_config_fields(config.model, "--model").get("model_type")
    if model_type not in MODEL_CLASSES:
        raise CommandError(f"--model {config.model} is a {model_type!r} model; expected a DeltaQwen3 or Qwen3 "
                           "checkpoint")  # fmt: skip
    model_config = load_model_config(config.model, "--model")
    mode = mode_of(model_config)
    if config.mode is not None and config.mode != mode:
        hint = (
            f"convert a Qwen3 checkpoint with `delta-qwen3 convert SRC OUT --mode {config.mode}`"
            if config.mode != "baseline"
            else "fine-tune the original Qwen3 checkpoint for the baseline"
        )
        raise CommandError(f"--mode {config.mode} does not match --model {config.model}, whose mode is {mode}; {hint}")
    return model_config


def _new_config(config: FinetuneConfig, tokenizer) -> PretrainedConfig:
    if config.preset is not None:
        fields = preset_fields(config.preset)
    else:
        try:
            fields = json.loads(Path(config.model_config).read_text())
        except (OSError, ValueError) as error:
            raise CommandError(f"--model-config {config.model_config}: {error}") from error
        if not isinstance(fields, dict):
            raise CommandError(f"--model-config {config.model_config} holds a JSON {type(fields).__name__}, not an "
                               "object of configuration fields")  # fmt: skip
    check_model_fields(fields, _config_subject(config))
    vocab_size = -(-len(tokenizer) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    fields = {"vocab_size": vocab_size, **fields}
    # A vocabulary size that is not a number is left for the configuration to refuse, naming the field.
    if isinstance(fields["vocab_size"], int) and fields["vocab_size"] < len(tokenizer):
        raise CommandError(f"vocab_size {fields['vocab_size']} is smaller than the tokenizer's {len(tokenizer)} tokens")
    special = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    num_blocks = default_num_blocks(fields) if config.num_blocks is None else config.num_blocks
    routing = dict(routing_mode=config.mode, routing_gate=config.gate, routing_num_blocks=num_blocks)
    try:
        if config.mode == "baseline":
            return Qwen3Config(**{**fields, **special})
        return DeltaQwen3Config(**{**fields, **special, **routing})
    except (TypeError, ValueError, StrictDataclassError) as error:
        raise CommandError(f"{_config_subject(config)}: invalid model configuration: {' '.join(str(error).split())}") \
            from error


def recorded_model_config(model_config: PretrainedConfig) -> dict:
    """The values of `model_config` that differ from its class's defaults, as JSON: what a run records, so that a
    resumed run finds an edited --model-config file, or another checkpoint at the --model path, whatever the path."""
    fields = {key: value for key, value in model_config.to_diff_dict().items() if key not in UNRECORDED_CONFIG_KEYS}
    return json.loads(json.dumps(fields))


def tokenizer_content(tokenizer) -> str:
    """A hash of what makes `tokenizer` tokenise as it does (its rules and vocabulary, and its special tokens): what
    a run records, so that a resumed run finds another tokenizer at the --tokenizer path, whatever the path."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    rules = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    special = json.dumps(tokenizer.special_tokens_map, sort_keys=True)
    return "blake2b " + hashlib.blake2b(f"{rules}\0{special}".encode(), digest_size=8).hexdigest()


def enable_activation_checkpointing(model: PreTrainedModel, **checkpoint_kwargs) -> None:
    """Checkpoint every decoder layer, under the method's name in the installed Transformers: 5.25 renamed
    `gradient_checkpointing_enable` to `activation_checkpointing_enable`, and the old name warns."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpoint_kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs)


def build_model(config: FinetuneConfig, model_config: PretrainedConfig) -> PreTrainedModel:
    """The model with the parameters to train marked `requires_grad`; weights in float32, the optimiser's
    precision (mixed precision only changes the compute dtype)."""
    model_class = MODEL_CLASSES[model_config.model_type]
    if config.from_scratch:
        model = model_class(model_config)
        if config.released_routing:
            draw_released_queries(model)
    else:
        with loading(f"--model {config.model}"):
            model = model_class.from_pretrained(config.model, config=model_config, dtype=torch.float32)
    if config.gradient_checkpointing:
        enable_activation_checkpointing(model, use_reentrant=False)
    if config.freeze_base:
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(is_routing_parameter(name))
    if config.lora:
        model = add_lora(model, config.lora_rank, config.lora_alpha, config.lora_dropout)
    return model


RELEASED_QUERY_STD = 0.02  # the paper's released code draws its routing queries from N(0, 0.02)


def draw_released_queries(model: PreTrainedModel) -> None:
    """Every routing query drawn from N(0, 0.02) as the paper's released code does, in place of the zeros that make
    routing start uniform (`--routing-init released`): from the generator the model was initialised from."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if is_routing_parameter(name) and name.endswith(".query"):
                parameter.normal_(0.0, RELEASED_QUERY_STD)


def add_lora(model: PreTrainedModel, rank: int, alpha: float, dropout: float) -> "PeftModel":
    """Wrap `model` with LoRA adapters on the base's linear layers; routing parameters train in full.

    The routing parameters are made trainable in place, so that a checkpoint and the merged model hold them under
    their ordinary names. (`--quantize` trains them through PEFT's `modules_to_save` instead, whose wrapper hands the
    routing code its trained copy, so that its saved adapters hold them: `quantization.py`.)
    """
    from peft import LoraConfig, get_peft_model  # here: see the module's docstring

    lora_config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(LORA_TARGETS), task_type="CAUSAL_LM"
    )
    peft_model = get_peft_model(model, lora_config)
    for name, parameter in peft_model.named_parameters():
        if is_routing_parameter(name):
            parameter.requires_grad_(True)
    return peft_model


def merge_lora(model: "PreTrainedModel | PeftModel") -> PreTrainedModel:
    """The ordinary model: LoRA updates folded into the base weights (in place), or `model` itself without LoRA."""
    peft = sys.modules.get("peft")  # None: no LoRA in this process (the module's docstring)
    return model.merge_and_unload() if peft is not None and isinstance(model, peft.PeftModel) else model
