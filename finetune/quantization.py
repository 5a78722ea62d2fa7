"""Fine-tuning a quantised model (`--quantize 4bit|8bit --lora`, QLoRA): the base loaded by bitsandbytes, frozen,
with LoRA adapters on its projections and the routing parameters training in float32 beside them.

The routing parameters (queries, norm weights, gates) are what conversion leaves to learn, so they train in full,
as PEFT trains any module it is told to save (`modules_to_save`): PEFT keeps a float32 copy of each routing point
that trains and is saved with the adapters, so that the adapters loaded onto the base (quantised or not) give the
trained model; the routing code reads the copy, through PEFT's wrapper. The adapters are the run's output
(`OUT/adapter`): merged into a quantised base they would be rounded to its precision.

A checkpoint holds only the parameters that train: the quantised base is loaded again from `--model` on
`--resume`, and its quantised weights would not load back into a model as tensors.
"""

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from accelerate import Accelerator
from safetensors.torch import load_file
from transformers import PretrainedConfig

from conversion import hub
from delta_qwen3.atomic import staged_directory
from delta_qwen3.checkpoints import loading
from delta_qwen3.errors import CommandError
from modeling_delta_qwen3.modeling_delta_qwen3 import ROUTING_MODULES

from .config import FinetuneConfig
from .model import LORA_TARGETS, MODEL_CLASSES, enable_activation_checkpointing

if TYPE_CHECKING:
    from peft import PeftModel

ADAPTER_NAME = "adapter"
# Compute dtype of the quantised layers, by accelerate's mixed precision.
COMPUTE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def adapter_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / ADAPTER_NAME


def check_no_adapters(config: FinetuneConfig) -> None:
    """Refuse to replace the adapters an earlier run left in --output-dir, unless told to (`--overwrite`) or
    continuing it (`--resume`)."""
    if not (config.resume or config.overwrite) and adapter_dir(config.output_dir).exists():
        raise CommandError(f"--output-dir {config.output_dir} already holds adapters ({adapter_dir(config.output_dir)}); "
                           "pass --overwrite to replace them")  # fmt: skip


def quantization_config(bits: str, mixed_precision: str):
    """bitsandbytes' configuration for `--quantize bits`: QLoRA's 4-bit NormalFloat with nested quantisation of its
    scales, or LLM.int8; products computed in the mixed-precision dtype (float32 without)."""
    try:
        from transformers import BitsAndBytesConfig
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise CommandError(f"--quantize {bits} needs bitsandbytes: pip install bitsandbytes") from None
    compute_dtype = COMPUTE_DTYPES.get(mixed_precision, torch.float32)
    if bits == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute_dtype)  # fmt: skip


def build_quantized_model(
    config: FinetuneConfig, model_config: PretrainedConfig, accelerator: Accelerator
) -> "PeftModel":
    """--model loaded quantised onto this process's device (its other parameters in float32), prepared for training
    as PEFT prepares any quantised model, with LoRA adapters on its projections and its routing points trained in
    float32 copies (`modules_to_save`)."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training  # LoRA runs only (model.py)

    bnb_config = quantization_config(config.quantize, accelerator.mixed_precision)
    with loading(f"--model {config.model} quantised to {config.quantize}"):
        model = MODEL_CLASSES[model_config.model_type].from_pretrained(
            config.model, config=model_config, dtype=torch.float32, quantization_config=bnb_config,
            device_map={"": accelerator.device},
        )  # fmt: skip
    for module in model.modules():
        # bitsandbytes (0.50) repacks a 4-bit layer's weight for its bfloat16 CPU kernel the first time the layer runs
        # in eval mode, and the kernel has no backward: training after a validation would lose the gradients that
        # flow through the base's layers. Trained here, the layers keep their weights as they are.
        if getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if config.gradient_checkpointing:
        enable_activation_checkpointing(model, use_reentrant=False)
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    lora_config = LoraConfig(
        r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
        target_modules=list(LORA_TARGETS), modules_to_save=[name for name in ROUTING_MODULES if name in names] or None,
        task_type="CAUSAL_LM",
    )  # fmt: skip
    return get_peft_model(model, lora_config)


def checkpoint_trainable_parameters_only(accelerator: Accelerator) -> None:
    """Make the checkpoints that `accelerator.save_state` writes hold only the parameters that train, and load them
    back into the model that `--resume` builds anew; a checkpoint that holds other parameters is refused (naming
    some), as one of another model is."""

    def trainable(model: torch.nn.Module) -> set[str]:
        return {name for name, parameter in model.named_parameters() if parameter.requires_grad}

    def keep_trainable(models: list, weights: list, output_dir: str) -> None:
        for model, state in zip(models, weights):
            for name in set(state) - trainable(model):
                del state[name]

    def load_trainable(models: list, input_dir: str) -> None:
        for index, model in enumerate(models):
            path = Path(input_dir) / (f"model_{index}.safetensors" if index else "model.safetensors")
            state = load_file(path)
            expected = trainable(model)
            if set(state) != expected:
                differ = sorted(set(state) ^ expected)
                raise ValueError(f"{path} does not hold the parameters this run trains ({len(differ)} differ, "
                                 f"{', '.join(differ[:3])}, ...)")  # fmt: skip
            model.load_state_dict(state, strict=False)
        models.clear()  # loaded: accelerate's own loading, which expects every tensor of the model, is skipped

    accelerator.register_save_state_pre_hook(keep_trainable)
    accelerator.register_load_state_pre_hook(load_trainable)


def save_adapters(accelerator: Accelerator, model, tokenizer, output_dir: str | Path) -> Path:
    """Save the trained adapters (LoRA and the routing parameters) as PEFT saves them, with the tokenizer, in
    `OUT/adapter`; all processes call this."""
    target = adapter_dir(output_dir)
    if accelerator.is_main_process:
        with staged_directory(target) as staging:
            accelerator.unwrap_model(model).save_pretrained(staging)
            tokenizer.save_pretrained(staging)
    accelerator.wait_for_everyone()
    return target


def push_adapters(folder: Path, repo_id: str) -> str:
    """Publish the adapters' directory to the Hub repository `repo_id` (created if missing); returns the commit URL."""
    return hub.upload_folder(Path(folder), repo_id, commit_message="Upload LoRA adapters trained with finetune")

