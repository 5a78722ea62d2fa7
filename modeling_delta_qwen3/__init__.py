"""DeltaQwen3: Qwen3 with Delta Attention Residuals. Importing this package registers the Auto classes."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_delta_qwen3 import DeltaQwen3Config
from .modeling_delta_qwen3 import DeltaQwen3ForCausalLM, DeltaQwen3Model, DeltaQwen3PreTrainedModel

AutoConfig.register(DeltaQwen3Config.model_type, DeltaQwen3Config, exist_ok=True)
AutoModel.register(DeltaQwen3Config, DeltaQwen3Model, exist_ok=True)
AutoModelForCausalLM.register(DeltaQwen3Config, DeltaQwen3ForCausalLM, exist_ok=True)

# `save_pretrained` then writes the Python files next to the weights, loadable with `trust_remote_code=True`.
DeltaQwen3Config.register_for_auto_class("AutoConfig")
DeltaQwen3Model.register_for_auto_class("AutoModel")
DeltaQwen3ForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = ["DeltaQwen3Config", "DeltaQwen3ForCausalLM", "DeltaQwen3Model", "DeltaQwen3PreTrainedModel"]
