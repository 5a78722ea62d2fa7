"""DeltaQwen3 configuration: a Qwen3 configuration plus the depth-routing fields."""

from huggingface_hub.dataclasses import strict
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

from .routing_modes import GATEABLE_MODES, ROUTING_MODES

# Written into every saved config.json so that every Auto class resolves to the code saved next to it, whichever
# class the model was saved from.
AUTO_MAP = {
    "AutoConfig": "configuration_delta_qwen3.DeltaQwen3Config",
    "AutoModel": "modeling_delta_qwen3.DeltaQwen3Model",
    "AutoModelForCausalLM": "modeling_delta_qwen3.DeltaQwen3ForCausalLM",
    "AutoModelForSequenceClassification": "modeling_delta_qwen3.DeltaQwen3ForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_delta_qwen3.DeltaQwen3ForTokenClassification",
    "AutoModelForQuestionAnswering": "modeling_delta_qwen3.DeltaQwen3ForQuestionAnswering",
}


@strict
class DeltaQwen3Config(Qwen3Config):
    r"""
    Configuration of a Qwen3 model with Delta Attention Residuals (arXiv 2605.18855).

    All [`Qwen3Config`] fields keep their meaning. Added fields:

    Args:
        routing_mode (`str`, *optional*, defaults to `"delta_block"`):
            `"delta"` routes over every earlier sublayer's output, `"delta_block"` over block deltas; both add
            the routed mixture to the ordinary residual stream. `"attnres_full"` and `"attnres_block"` are the
            Attention Residuals baselines, which replace the residual stream with the mixture.
        routing_num_blocks (`int`, *optional*, defaults to 4):
            Number of blocks for the block modes, between 1 and `num_hidden_layers`.
        routing_gate (`bool`, *optional*, defaults to `False`):
            Give each routing point a scalar gate, initialised to zero, so that a converted checkpoint computes
            exactly what its Qwen3 source did. Delta modes only.
        routing_implementation (`str`, *optional*):
            What computes the routing, like `attn_implementation` for attention (settable in `from_pretrained`,
            or on a model with `set_routing_implementation`; never saved): `"fused"` (each routing point one
            registered operation, Triton kernels on an NVIDIA GPU), `"buffer"` (sources in one buffer, backward
            written by hand), `"compiled"` (traceable by `torch.compile(fullgraph=True)`), `"fla"`
            (flash-linear-attention's fused kernel, CUDA), `"reference"` (SPEC section 2 in plain PyTorch). By
            default (None) the one for the situation: `"compiled"` in layers that gradient checkpointing
            recomputes; else `"fused"` on an NVIDIA GPU with Triton; else `"compiled"` under `torch.compile` and
            `"buffer"` eagerly (SPEC section 3).

    ```python
    >>> from modeling_delta_qwen3 import DeltaQwen3Config, DeltaQwen3ForCausalLM
    >>> config = DeltaQwen3Config(num_hidden_layers=8, routing_mode="delta_block", routing_num_blocks=4)
    >>> model = DeltaQwen3ForCausalLM(config)
    ```
    """

    model_type = "delta_qwen3"
    # Qwen3's pipeline plan hands hidden states from layer to layer; DeltaQwen3's layers hand on the depth state.
    base_model_pp_plan = None

    routing_mode: str = "delta_block"
    routing_num_blocks: int = 4
    routing_gate: bool = False
    routing_implementation: str | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.routing_mode not in ROUTING_MODES:
            raise ValueError(f"routing_mode={self.routing_mode!r} is not one of {', '.join(ROUTING_MODES)}")
        if not 1 <= self.routing_num_blocks <= self.num_hidden_layers:
            raise ValueError(
                f"routing_num_blocks={self.routing_num_blocks} is out of range: it must be between 1 and "
                f"num_hidden_layers={self.num_hidden_layers}"
            )
        if self.routing_gate and self.routing_mode not in GATEABLE_MODES:
            raise ValueError(
                f"routing_gate=True is only allowed with the delta modes ({', '.join(GATEABLE_MODES)}), "
                f"not with routing_mode={self.routing_mode!r}"
            )
        if getattr(self, "auto_map", None) is None:
            self.auto_map = dict(AUTO_MAP)

    def to_dict(self) -> dict:
        """The saved fields: not `routing_implementation`, a choice of the run rather than of the checkpoint."""
        fields = super().to_dict()
        fields.pop("routing_implementation", None)
        return fields

    @property
    def layers_per_block(self) -> int:
        """`ceil(num_hidden_layers / routing_num_blocks)`: layers in each block of the block modes."""
        return -(-self.num_hidden_layers // self.routing_num_blocks)


__all__ = ["DeltaQwen3Config"]
