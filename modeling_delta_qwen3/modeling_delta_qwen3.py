"""DeltaQwen3: Qwen3 with Delta Attention Residuals (arXiv 2605.18855).

Qwen3's attention, MLP, norms and rotary embedding are used unchanged; each decoder layer only asks the depth state
(`routing_modes.py`) for its sublayers' inputs and hands their outputs back. With zero queries, unit norm weights and
zero gates a gated delta model computes exactly what the Qwen3 model with the same weights computes.
"""

import inspect
from dataclasses import dataclass, fields, replace
from typing import NamedTuple

import torch
from torch import nn
from transformers import AutoModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.core_model_loading import ConversionOps, WeightConverter
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_layers import (
    GenericForQuestionAnswering,
    GenericForSequenceClassification,
    GenericForTokenClassification,
    GradientCheckpointingLayer,
)
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3Attention,
    Qwen3MLP,
    Qwen3PreTrainedModel,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
)
from transformers.utils import logging
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import can_return_tuple

from .configuration_delta_qwen3 import DeltaQwen3Config

# Loading remote code from a local directory, older Transformers (5.5 among them) copy only the files that this
# file imports itself: so it imports every module of the package, including those only the routing uses.
# (`from .module import name`: the form they recognise.)
from .routing_buffer import buffer_sources  # noqa: F401
from .routing_compiled import CompiledSources  # noqa: F401
from .routing_fla import FlaSources  # noqa: F401
from .routing_fused import FusedSources  # noqa: F401
from .routing_math import compute_dtype  # noqa: F401
from .routing_op import route  # noqa: F401
try:  # the routing operation's kernels, where Triton is installed
    from .routing_triton import route_backward  # noqa: F401
except ImportError:
    pass
from .routing_points import RoutingPoint
from .routing_reference import ReferenceSources  # noqa: F401
from .routing_modes import ROUTING_MODES, DepthState
from .routing_sources import Implementation  # noqa: F401
from .routing import check_routing_implementation, plan_routing

# Transformers 5.24 renamed the cache argument and output field `past_key_values` to `cache`. This file is shipped
# with checkpoints and runs inside whichever Transformers a user has, so it speaks the installed version's name.
CACHE_NAME = "cache" if "cache" in inspect.signature(Qwen3Attention.forward).parameters else "past_key_values"

logger = logging.get_logger(__name__)


def cache_argument_renamed(forward):
    """Where the cache argument is `cache`, `past_key_values=` still works and warns, as it does for Qwen3 (and from
    the same version on it will be refused)."""
    if CACHE_NAME == "cache":
        return deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")(forward)
    return forward


@dataclass
class DeltaQwen3ModelOutput(BaseModelOutputWithPast):
    """
    routing_weights (`tuple(torch.FloatTensor)`, *optional*, returned when `output_routing_weights=True`):
        One tensor `[batch, seq, n_sources]` per routing point, in the order they run (the final point last).
    """

    routing_weights: tuple[torch.Tensor, ...] | None = None


@dataclass
class DeltaQwen3CausalLMOutput(CausalLMOutputWithPast):
    """
    routing_weights (`tuple(torch.FloatTensor)`, *optional*, returned when `output_routing_weights=True`):
        One tensor `[batch, seq, n_sources]` per routing point, in the order they run (the final point last).
    """

    routing_weights: tuple[torch.Tensor, ...] | None = None


assert CACHE_NAME in {f.name for f in fields(BaseModelOutputWithPast)}


class _GateInFormat(ConversionOps):
    """`from_pretrained`'s weight conversion of the routing gates to the checkpoint format's `[1]`, so that
    checkpoints of the format's first version, whose gates are 0-d, load. Its own reverse: saving writes `[1]`."""

    def convert(self, input_dict, source_patterns, target_patterns, **kwargs):
        pieces = next(iter(input_dict.values()))
        # Transformers reads a 0-d gate as the one element along the parameter's first dimension, which a process
        # that shards the parameter (FSDP) may not hold: it then receives no piece, and holds an empty shard.
        if not pieces:
            gate = kwargs["model"].get_parameter(kwargs["full_layer_name"])
            return {target_patterns[0]: torch.empty(0, dtype=gate.dtype)}
        return {target_patterns[0]: torch.cat([piece.reshape(-1) for piece in pieces])}

    @property
    def reverse_op(self) -> ConversionOps:
        return self


def gate_conversions(config: DeltaQwen3Config) -> list[WeightConverter]:
    """The weight conversions that loading a model of this configuration adds to those registered for its model type:
    the gates' (`_GateInFormat`) where the model has gates, none where it has none. Transformers looks conversions up
    by model type or class name only, never by configuration, and its common tests count a conversion whose patterns
    match no weight of the saved model as wrongly written; so the gates' conversion is added per model
    (`DeltaQwen3PreTrainedModel._load_pretrained_model`), not registered for the model type."""
    if not config.routing_gate:
        return []
    return [WeightConverter(source_patterns="_route.gate", target_patterns="_route.gate", operations=[_GateInFormat()])]


# The modules that hold the routing parameters (queries, norm weights, gates): kept in float32 in a model loaded or
# built in bfloat16 or float16 (`DeltaQwen3PreTrainedModel._keep_in_fp32_modules_strict`).
ROUTING_MODULES = ("attn_route", "mlp_route", "final_route")


def _routing_point(hidden_size: int, eps: float, gated: bool) -> RoutingPoint:
    """A routing point, in float32 where the model is built in half precision (`from_config(config, dtype=...)`,
    and `from_pretrained`, which builds the model before loading it)."""
    point = RoutingPoint(hidden_size, eps, gated)
    return point.float() if torch.get_default_dtype() in (torch.float16, torch.bfloat16) else point


class DecoderLayerOutput(NamedTuple):
    """The depth state to hand to the next layer, and the two sublayer outputs this layer added to it. The outputs
    are returned as tensors so that wrappers which hook a layer's outputs (FSDP re-gathers a layer's parameters for
    backward when gradients reach them) see this layer's work; the state itself is opaque to them. Also the layer's
    hidden state (`DepthState.layer_hidden_state`) and its attention weights (None unless the attention backend
    returns them, as eager attention does)."""

    state: DepthState
    attn_output: torch.Tensor
    mlp_output: torch.Tensor
    hidden_state: torch.Tensor
    attn_weights: torch.Tensor | None


class DeltaQwen3DecoderLayer(GradientCheckpointingLayer):
    """A Qwen3 decoder layer whose attention and MLP sublayers read routed inputs from the depth state.

    Layer 0's attention is the model's first sublayer and has no routing point (`attn_route` is None).

    Under gradient checkpointing the whole layer, routing included, is recomputed in backward, so it must not change
    the state it is given: the model then passes the state's tensors (`DepthState.carried`) positionally after it,
    and the layer works on a copy made of them and returns its own copy's tensors after its output. Positional
    tensors are also what reentrant checkpointing carries gradients through.
    """

    def __init__(self, config: DeltaQwen3Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.attention_type = config.layer_types[layer_idx]
        self.self_attn = Qwen3Attention(config=config, layer_idx=layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        gated = config.routing_gate
        self.attn_route = _routing_point(config.hidden_size, config.rms_norm_eps, gated) if layer_idx > 0 else None
        self.mlp_route = _routing_point(config.hidden_size, config.rms_norm_eps, gated)

    @property
    def checkpointing(self) -> bool:
        """Whether this call will be recomputed in backward (`GradientCheckpointingLayer`'s own condition)."""
        return self.gradient_checkpointing and self.training and torch.is_grad_enabled()

    def forward(
        self,
        state: DepthState,
        *carried: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> DecoderLayerOutput | tuple:
        if carried:
            state = state.with_carried(carried)
        if self.checkpointing:
            cache = None  # recomputing attention in backward would write the cache a second time
        state.enter_layer(self.layer_idx)
        attn_input = state.routed_input(self.attn_route)
        hidden_state = state.layer_hidden_state(attn_input)
        attn_output, attn_weights = self.self_attn(
            self.input_layernorm(attn_input), position_embeddings, attention_mask, **{CACHE_NAME: cache}, **kwargs
        )
        state.add_output(attn_output)
        mlp_output = self.mlp(self.post_attention_layernorm(state.routed_input(self.mlp_route)))
        state.add_output(mlp_output)
        output = DecoderLayerOutput(state, attn_output, mlp_output, hidden_state, attn_weights)
        return (*output, *state.carried()) if carried else output


class DeltaQwen3PreTrainedModel(Qwen3PreTrainedModel):
    config_class = DeltaQwen3Config
    config: DeltaQwen3Config
    _no_split_modules = ["DeltaQwen3DecoderLayer"]
    # Loaded in bfloat16 or float16, the routing parameters stay in float32 (as Transformers keeps other small
    # parameters that must not lose precision): they are what fine-tuning a converted checkpoint learns, and
    # bfloat16 storage would round away the small updates that move a norm weight near 1 or a gate. The routing
    # computes in float32 whatever they are stored in. `model.to(dtype)` casts them as it casts every parameter.
    _keep_in_fp32_modules_strict = list(ROUTING_MODULES)
    # Hidden states and attention weights are collected by `DeltaQwen3Model.forward` itself: a decoder layer takes
    # and returns the depth state, not the hidden states that Transformers' output hooks expect.
    _can_record_outputs = {}

    @staticmethod
    def _load_pretrained_model(model, state_dict, checkpoint_files, load_config, *args, **kwargs):
        """Transformers' loading of weights (`from_pretrained`, and adapters), with the model's `gate_conversions`
        after the conversions Transformers found for it."""
        weight_mapping = [*(load_config.weight_mapping or []), *gate_conversions(model.config)]
        load_config = replace(load_config, weight_mapping=weight_mapping)
        return Qwen3PreTrainedModel._load_pretrained_model(
            model, state_dict, checkpoint_files, load_config, *args, **kwargs
        )

    def set_routing_implementation(self, routing_implementation: str | None) -> None:
        """Route with `routing_implementation` (see `DeltaQwen3Config`; None: the default for the situation)."""
        check_routing_implementation(routing_implementation)
        self.config.routing_implementation = routing_implementation

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, RoutingPoint):
            init.zeros_(module.query)
            init.ones_(module.norm.weight)
            if module.gate is not None:
                init.zeros_(module.gate)


def _check_no_missing_layers(layers: nn.ModuleList) -> None:
    """Refuse decoder layers replaced by placeholders (`nn.Identity`), as pipeline parallelism (vLLM's among others)
    replaces the layers of other stages: each layer routes over the outputs of all earlier sublayers, but only the
    hidden state is handed from stage to stage, so a later stage would compute without its sources."""
    if any(isinstance(layer, nn.Identity) for layer in layers):
        raise ValueError(
            "DeltaQwen3 cannot be split into pipeline stages: some decoder layers are placeholders, and each layer "
            "routes over the outputs of all earlier sublayers, which do not cross stages"
        )


def inductor_orders_out_variant_writes_right() -> bool:
    """Whether this PyTorch's Inductor orders the kernels that read an out-variant op's output after the op: from
    2.14 on (pytorch/pytorch#185509, fixed by #185873; `tests/serving/test_inductor_mutation_order.py` checks both
    sides)."""
    return torch.torch_version.TorchVersion(torch.__version__) >= (2, 14)


def _check_vllm_compilation(config: DeltaQwen3Config) -> None:
    """Refuse to be built for vLLM's compiled mode on the CPU in `delta_block` mode under PyTorch before 2.14, where
    it computes wrong tokens without an error: Inductor moves kernels that read a linear layer's output before
    vLLM's CPU matrix product (which writes into a new buffer) has written it, and `delta_block`'s residual stream
    feeding per-token routing is the pattern that triggers it (docs/SERVING.md). vLLM's eager mode computes the
    right tokens. Models are built by vLLM only with its own attention, which is how this check knows vLLM is
    building it."""
    mode = ROUTING_MODES[config.routing_mode]
    if config._attn_implementation != "vllm" or not mode.miscompiled_on_cpu_before_torch_2_14:
        return
    if inductor_orders_out_variant_writes_right():
        return
    try:  # in a try block, so that Transformers does not require vLLM to load this file as remote code
        from vllm.config import CompilationMode, get_current_vllm_config_or_none
    except ImportError:
        return
    vllm_config = get_current_vllm_config_or_none()
    if vllm_config is None:
        return
    compilation = vllm_config.compilation_config
    if (
        vllm_config.device_config.device_type == "cpu"
        and compilation.mode != CompilationMode.NONE
        and compilation.backend == "inductor"
    ):
        raise ValueError(
            f"DeltaQwen3 in routing_mode='delta_block' cannot be served by vLLM's compiled mode on the CPU with "
            f"PyTorch {torch.__version__}: its Inductor miscompiles it there (wrong tokens, no error; fixed in "
            "PyTorch 2.14); serve it with --enforce-eager (LLM(..., enforce_eager=True))"
        )


class DeltaQwen3Model(DeltaQwen3PreTrainedModel):
    """The DeltaQwen3 decoder: embeddings, routed decoder layers, (for AttnRes modes) a final routing point, norm."""

    def __init__(self, config: DeltaQwen3Config):
        _check_vllm_compilation(config)
        check_routing_implementation(config.routing_implementation)
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(
            [DeltaQwen3DecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        self.final_route = (
            _routing_point(config.hidden_size, config.rms_norm_eps, gated=False)
            if ROUTING_MODES[config.routing_mode].final_point
            else None
        )
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def _causal_masks(self, inputs_embeds, attention_mask, cache, position_ids) -> dict:
        if isinstance(attention_mask, dict):  # already prepared, e.g. by `generate`
            return attention_mask
        mask_kwargs = {
            "config": self.config,
            "inputs_embeds": inputs_embeds,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            CACHE_NAME: cache,
        }
        masks = {"full_attention": create_causal_mask(**mask_kwargs)}
        if "sliding_attention" in self.config.layer_types:
            masks["sliding_attention"] = create_sliding_window_causal_mask(**mask_kwargs)
        return masks

    @cache_argument_renamed
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_routing_weights: bool = False,
        cache: Cache | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        **kwargs,
    ) -> DeltaQwen3ModelOutput:
        r"""
        output_routing_weights (`bool`, *optional*, defaults to `False`):
            Return the routing weights of every routing point (SPEC section 5).
        output_hidden_states (`bool`, *optional*):
            Return `num_hidden_layers + 1` hidden states, as Qwen3 does: each layer's hidden state (in the delta
            modes the residual stream entering the layer, in the AttnRes modes, which have no residual stream, the
            layer's routed attention input; the embeddings for layer 0), then the final norm's output.
        output_attentions (`bool`, *optional*):
            Return each layer's attention weights, as the attention backend gives them: only eager attention
            computes them (the others warn and give None, as for Qwen3).
        """
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if output_attentions is None:
            output_attentions = self.config.output_attentions
        if output_attentions:
            kwargs["output_attentions"] = True  # the attention backends that cannot return them warn
        cache = cache if cache is not None else past_key_values
        layers = self.layers[: self.config.num_hidden_layers]
        _check_no_missing_layers(layers)
        checkpointing = any(layer.checkpointing for layer in layers)
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if checkpointing and use_cache:
            logger.warning_once("`use_cache=True` is incompatible with gradient checkpointing. Setting `use_cache=False`.")
            use_cache = False
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if position_ids is None:
            past_seen_tokens = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen_tokens
            position_ids = position_ids.unsqueeze(0)

        masks = self._causal_masks(inputs_embeds, attention_mask, cache, position_ids)
        position_embeddings = self.rotary_emb(inputs_embeds, position_ids)
        points = [point for layer in layers for point in (layer.attn_route, layer.mlp_route) if point is not None]
        points += [self.final_route] if self.final_route is not None else []
        plan = plan_routing(self.config, points, inputs_embeds, checkpointing)
        state = plan.start(inputs_embeds, self.config)
        all_hidden_states, all_attentions = [], []
        for layer in layers:
            carried = state.carried() if layer.checkpointing else ()
            result = layer(
                state,
                *carried,
                position_embeddings=position_embeddings,
                attention_mask=masks[layer.attention_type],
                cache=cache,
                position_ids=position_ids,
                **kwargs,
            )
            # A checkpointed layer returns its output's fields followed by its state's tensors; never slice the
            # output itself, which PyTorch 2.6's Dynamo fails on.
            layer_output = DecoderLayerOutput(*result[: len(DecoderLayerOutput._fields)]) if carried else result
            state = layer_output.state
            if carried:
                state = state.with_carried(result[len(DecoderLayerOutput._fields) :])
            all_hidden_states.append(layer_output.hidden_state)
            all_attentions.append(layer_output.attn_weights)
        hidden_states = self.norm(state.final_hidden())
        return DeltaQwen3ModelOutput(
            last_hidden_state=hidden_states,
            routing_weights=state.routing_weights_by_token() if output_routing_weights else None,
            hidden_states=(*all_hidden_states, hidden_states) if output_hidden_states else None,
            attentions=tuple(all_attentions) if output_attentions else None,
            **{CACHE_NAME: cache if use_cache else None},
        )


class DeltaQwen3ForCausalLM(DeltaQwen3PreTrainedModel, GenerationMixin):
    """DeltaQwen3 with a language-modelling head; a drop-in replacement for `Qwen3ForCausalLM`.

    ```python
    >>> from transformers import AutoModelForCausalLM, AutoTokenizer
    >>> model = AutoModelForCausalLM.from_pretrained("path/or/repo", trust_remote_code=True)
    >>> tokenizer = AutoTokenizer.from_pretrained("path/or/repo", trust_remote_code=True)
    >>> out = model.generate(**tokenizer("Depth routing", return_tensors="pt"), max_new_tokens=20)
    >>> weights = model(**tokenizer("Depth routing", return_tensors="pt"), output_routing_weights=True).routing_weights
    ```

    The tokenizer is the source's own, but `AutoTokenizer` reads `config.json` before `tokenizer_config.json`, and
    its `auto_map` names this model's code: without `trust_remote_code` it asks on the terminal whether to run that
    code. `trust_remote_code=False` loads the same tokenizer without running any.
    """

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}

    def __init__(self, config: DeltaQwen3Config):
        super().__init__(config)
        self.model = DeltaQwen3Model(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    @cache_argument_renamed
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        output_routing_weights: bool = False,
        cache: Cache | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        **kwargs,
    ) -> DeltaQwen3CausalLMOutput | tuple:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            Labels for the language-modelling loss, as in `Qwen3ForCausalLM`.
        output_routing_weights (`bool`, *optional*, defaults to `False`):
            Return the routing weights of every routing point (SPEC section 5).
        """
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache if cache is not None else past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_routing_weights=output_routing_weights,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            return_dict=True,  # whatever `config.return_dict` says: this head reads the fields, then decides
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, keep, :])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return DeltaQwen3CausalLMOutput(
            loss=loss,
            logits=logits,
            routing_weights=outputs.routing_weights,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            **{CACHE_NAME: getattr(outputs, CACHE_NAME)},
        )


class _TaskHead:
    """Transformers' generic task heads build their decoder with `AutoModel.from_config`, whose registry does not
    know a configuration loaded as remote code: the pair is registered first, as `AutoModel` itself does for remote
    code, keyed by the configuration's own class (loaded as remote code, it may be another class object than this
    file's import), so that another version of this file loaded beside this one keeps its own."""

    def __init__(self, config: DeltaQwen3Config):
        AutoModel.register(type(config), DeltaQwen3Model, exist_ok=True)
        super().__init__(config)


class DeltaQwen3ForSequenceClassification(_TaskHead, GenericForSequenceClassification, DeltaQwen3PreTrainedModel):
    pass


class DeltaQwen3ForTokenClassification(_TaskHead, GenericForTokenClassification, DeltaQwen3PreTrainedModel):
    pass


class DeltaQwen3ForQuestionAnswering(_TaskHead, GenericForQuestionAnswering, DeltaQwen3PreTrainedModel):
    pass


__all__ = [
    "DeltaQwen3ForCausalLM",
    "DeltaQwen3ForQuestionAnswering",
    "DeltaQwen3ForSequenceClassification",
    "DeltaQwen3ForTokenClassification",
    "DeltaQwen3Model",
    "DeltaQwen3PreTrainedModel",
]
