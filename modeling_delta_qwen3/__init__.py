"""DeltaQwen3: Qwen3 with Delta Attention Residuals. Importing this package registers the Auto classes."""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from . import modeling_delta_qwen3
from .configuration_delta_qwen3 import DeltaQwen3Config
from .modeling_delta_qwen3 import (
    DeltaQwen3ForCausalLM,
    DeltaQwen3ForQuestionAnswering,
    DeltaQwen3ForSequenceClassification,
    DeltaQwen3ForTokenClassification,
    DeltaQwen3Model,
    DeltaQwen3PreTrainedModel,
)

AUTO_CLASSES = {
    AutoModel: DeltaQwen3Model,
    AutoModelForCausalLM: DeltaQwen3ForCausalLM,
    AutoModelForSequenceClassification: DeltaQwen3ForSequenceClassification,
    AutoModelForTokenClassification: DeltaQwen3ForTokenClassification,
    AutoModelForQuestionAnswering: DeltaQwen3ForQuestionAnswering,
}

AutoConfig.register(DeltaQwen3Config.model_type, DeltaQwen3Config, exist_ok=True)
# `save_pretrained` then writes the Python files next to the weights, loadable with `trust_remote_code=True`.
DeltaQwen3Config.register_for_auto_class("AutoConfig")
for auto_class, model_class in AUTO_CLASSES.items():
    auto_class.register(DeltaQwen3Config, model_class, exist_ok=True)
    model_class.register_for_auto_class(auto_class.__name__)

__all__ = ["AUTO_CLASSES", "DeltaQwen3Config", *modeling_delta_qwen3.__all__]
