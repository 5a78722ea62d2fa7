"""Routing over depth (SPEC section 2): the routing point, and what a forward pass carries from layer to layer.

Sublayer `s` (`2i` = layer i's attention, `2i+1` its MLP) computes `v_s = f_s(h_hat_s)`. The modes differ only in
which sources exist, when they are added, and whether the routed mixture is added to a residual stream or
replaces it. Each mode is one small `DepthState` below:

    delta          h_hat_s = h_s + gamma_s * mix_s([h_0, v_0, ..., v_{s-1}])         h_{s+1} = h_s + v_s
    delta_block    h_hat_s = h_s + gamma_s * mix_s([h_0, Delta_1, ..., Delta_k])     Delta_k = H_k - H_{k-1}
    attnres_full   h_hat_s = mix_s([h_0, v_0, ..., v_{s-1}]);    output = mix_final(all sources)
    attnres_block  h_hat_s = mix_s([B_0, ..., B_{j-1}, P]);     output = mix_final([B_0, ..., B_last])

Sublayer 0 is never routed: its input is `h_0`.

Which implementation computes the routing points' mixtures is `config.routing_implementation` (see
`IMPLEMENTATIONS`), decided once per forward pass with everything else that depends on the mode and the situation,
in a `RoutingPlan` (`plan_routing`).
"""

import copy
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from .configuration_delta_qwen3 import ROUTING_IMPLEMENTATIONS, DeltaQwen3Config, check_routing_implementation
from .routing_buffer import SourceBuffer
from .routing_buffer import new_sources as buffer_sources
from .routing_compiled import new_sources as compiled_sources
from .routing_fla import fla_unavailable
from .routing_fla import new_sources as fla_sources
from .routing_reference import SourceList
from .routing_reference import new_sources as reference_sources

# Each implementation's `new_sources(h0, eps, capacity, points)`: the object a forward pass appends its
# sources to and routes its points through (`append(x)`, `route(point, residual, extra)`, `to(...)`).
IMPLEMENTATIONS = {
    "reference": reference_sources,
    "buffer": buffer_sources,
    "fla": fla_sources,
    "compiled": compiled_sources,
}
assert tuple(IMPLEMENTATIONS) == ROUTING_IMPLEMENTATIONS


class RoutingPoint(nn.Module):
    """A query `q_p`, an RMSNorm weight `g_p` and, when gated, a scalar gate `gamma_p` (all initialised so that
    routing starts uniform and, gated, switched off)."""

    def __init__(self, hidden_size: int, eps: float, gated: bool):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(hidden_size))
        self.norm = Qwen3RMSNorm(hidden_size, eps=eps)
        self.gate = nn.Parameter(torch.zeros(())) if gated else None

    def query_and_norm_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`q_p` and `g_p`, read from the modules' parameter registries: `self.query` goes through
        `nn.Module.__getattr__`, slow enough that two or three reads per point count in decoding a token. Falls back
        to attribute access where a wrapper has swapped a parameter for a plain tensor (FSDP1 without
        `use_orig_params`)."""
        query, norm_weight = self._parameters.get("query"), self._modules["norm"]._parameters.get("weight")
        if query is None or norm_weight is None:
            return self.query, self.norm.weight
        return query, norm_weight


def _blocks_formed(config: DeltaQwen3Config) -> int:
    """How many blocks the layers form: fewer than `routing_num_blocks` when `layers_per_block` is rounded up."""
    return -(-config.num_hidden_layers // config.layers_per_block)


class DepthState:
    """What one forward pass carries over depth: the sources routed over (see `IMPLEMENTATIONS`), the
    routing weights so far, and each mode's own tensors.

    Layers receive the state as an argument and hand it back, so nothing crosses depth through module attributes.
    """

    # The tensors of the state's own, besides its sources (`carried`); subclasses add theirs.
    TENSORS: tuple[str, ...] = ("h0",)

    def __init__(self, h0: torch.Tensor, config: DeltaQwen3Config, plan: "RoutingPlan"):
        self.layers_per_block = config.layers_per_block
        new_sources = IMPLEMENTATIONS[plan.implementation]
        self.sources = new_sources(h0, config.rms_norm_eps, self.capacity(config), plan.points)
        self.routing_weights: list[torch.Tensor] = []
        self.h0 = h0
        self.sources.append(h0)

    @staticmethod
    def capacity(config: DeltaQwen3Config) -> int:
        """The most sources this mode holds at once."""
        return 2 * config.num_hidden_layers + 1

    def starts_block(self, layer_idx: int) -> bool:
        return layer_idx > 0 and layer_idx % self.layers_per_block == 0

    def _route(self, point: RoutingPoint, residual=None, extra=None) -> torch.Tensor:
        routed, weights = self.sources.route(point, residual, extra)
        self.routing_weights.append(weights)
        return routed

    def routing_weights_by_token(self) -> tuple[torch.Tensor, ...]:
        """Every point's routing weights so far, shaped `[batch, seq, n_sources]` (they are kept `[tokens,
        n_sources]` and shaped only when asked for: generation never asks)."""
        return tuple(weights.view(*self.h0.shape[:-1], weights.shape[-1]) for weights in self.routing_weights)

    def enter_layer(self, layer_idx: int) -> None:
        """Called before layer `layer_idx` routes its attention input."""

    def routed_input(self, point: RoutingPoint | None) -> torch.Tensor:
        """The input `h_hat_s` of the next sublayer; `point` is None for sublayer 0, which is never routed."""
        raise NotImplementedError

    def layer_hidden_state(self, attn_input: torch.Tensor) -> torch.Tensor:
        """The hidden state of the layer whose routed attention input is `attn_input` (`output_hidden_states`):
        that input itself in the AttnRes modes, which have no residual stream."""
        return attn_input

    def add_output(self, v: torch.Tensor) -> None:
        """Hand back the output `v_s` of the sublayer that just ran."""
        raise NotImplementedError

    def final_hidden(self, final_point: RoutingPoint | None) -> torch.Tensor:
        """The hidden state that goes into the final norm."""
        raise NotImplementedError

    def carried(self) -> list[torch.Tensor]:
        """Every tensor the state holds that gradients flow through, in an order `with_carried` takes them back in."""
        own = (getattr(self, name) for name in self.TENSORS)
        return [*self.sources.carried(), *(tensor for tensor in own if tensor is not None)]

    def with_carried(self, tensors: Iterable[torch.Tensor]) -> "DepthState":
        """A copy of the state holding `tensors` in place of `carried()`: what a layer recomputed by gradient
        checkpointing works on, so that the state it was given stays as it was."""
        tensors = iter(tensors)
        copied = copy.copy(self)
        copied.sources = self.sources.with_carried(tensors)
        for name in self.TENSORS:
            if getattr(self, name) is not None:
                setattr(copied, name, next(tensors))
        copied.routing_weights = list(self.routing_weights)
        if next(tensors, None) is not None:
            raise ValueError("more tensors than the depth state carries")
        return copied

    def to(self, *args, **kwargs) -> "DepthState":
        """A copy with every tensor moved, so that device-placement hooks (accelerate) can move the state."""
        moved = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, (torch.Tensor, SourceBuffer, SourceList)):
                setattr(moved, name, value.to(*args, **kwargs))
        return moved


class _AdditiveState(DepthState):
    """Delta modes: the ordinary residual stream is kept and the routed mixture is added to it."""

    TENSORS = (*DepthState.TENSORS, "hidden")

    def __init__(self, h0, config, plan):
        super().__init__(h0, config, plan)
        self.hidden = h0

    def routed_input(self, point):
        if point is None:
            return self.hidden
        return self._route(point, residual=self.hidden)

    def layer_hidden_state(self, attn_input):
        """The residual stream at the layer boundary, as in Qwen3."""
        return self.hidden

    def final_hidden(self, final_point):
        return self.hidden


class DeltaState(_AdditiveState):
    """`delta`: every sublayer's output is a source, except the last one, which no routing point reads."""

    def __init__(self, h0, config, plan):
        super().__init__(h0, config, plan)
        # Each point reads the outputs of the sublayers before its own: the last sublayer's output, no point.
        self.outputs_to_keep = len(plan.points)

    @staticmethod
    def capacity(config):
        return 2 * config.num_hidden_layers

    def add_output(self, v):
        self.hidden = self.hidden + v
        if self.outputs_to_keep:
            self.sources.append(v)
            self.outputs_to_keep -= 1


class DeltaBlockState(_AdditiveState):
    """`delta_block`: the change of the residual stream over each finished block is a source, visible from the
    next block's first attention sublayer on."""

    TENSORS = (*_AdditiveState.TENSORS, "block_start")

    def __init__(self, h0, config, plan):
        super().__init__(h0, config, plan)
        self.block_start = h0

    @staticmethod
    def capacity(config):
        return _blocks_formed(config)

    def enter_layer(self, layer_idx):
        if self.starts_block(layer_idx):
            self.sources.append(self.hidden - self.block_start)
            self.block_start = self.hidden

    def add_output(self, v):
        self.hidden = self.hidden + v


class AttnResFullState(DepthState):
    """`attnres_full`: no residual stream; each sublayer reads a mixture of the embedding and all earlier outputs."""

    def routed_input(self, point):
        if point is None:
            return self.h0
        return self._route(point)

    def add_output(self, v):
        self.sources.append(v)

    def final_hidden(self, final_point):
        return self._route(final_point)


class AttnResBlockState(DepthState):
    """`attnres_block`: sources are the embedding and finished block sums `B_j`, plus the running partial sum `P`
    of the current block."""

    TENSORS = (*DepthState.TENSORS, "partial")

    def __init__(self, h0, config, plan):
        super().__init__(h0, config, plan)
        self.partial: torch.Tensor | None = None

    @staticmethod
    def capacity(config):
        return 1 + _blocks_formed(config)

    def _close_block(self):
        if self.partial is not None:
            self.sources.append(self.partial)
            self.partial = None

    def enter_layer(self, layer_idx):
        if self.starts_block(layer_idx):
            self._close_block()

    def routed_input(self, point):
        if point is None:
            return self.h0
        return self._route(point, extra=self.partial)

    def add_output(self, v):
        self.partial = v if self.partial is None else self.partial + v

    def final_hidden(self, final_point):
        self._close_block()
        return self._route(final_point)


DEPTH_STATES: dict[str, type[DepthState]] = {
    "delta": DeltaState,
    "delta_block": DeltaBlockState,
    "attnres_full": AttnResFullState,
    "attnres_block": AttnResBlockState,
}


@dataclass(frozen=True)
class RoutingPlan:
    """What one forward pass decides once about its routing: the implementation that routes (a name of
    `IMPLEMENTATIONS`), the mode's depth state, and the routing points in the order they run. A forward pass
    depends on nothing but its arguments: no routing state is kept from one decoding step to the next."""

    implementation: str
    state_class: type[DepthState]
    points: list[RoutingPoint]

    def start(self, h0: torch.Tensor, config: DeltaQwen3Config) -> DepthState:
        """The depth state of a forward pass whose embeddings are `h0`."""
        return self.state_class(h0, config, self)


def resolve_implementation(requested: str | None, h0: torch.Tensor, checkpointing: bool = False) -> str:
    """The implementation that routes hidden states like `h0`, in layers that gradient checkpointing recomputes or
    not: `requested` when it can, else a `ValueError` that says why; by default, under `torch.compile` the compiled
    one, else fla's kernel where it runs, else the buffer, or under gradient checkpointing the compiled one. Checked
    here too: `from_pretrained` sets the field after the configuration's own checks."""
    check_routing_implementation(requested)
    if requested is None:
        if torch.compiler.is_compiling():
            return "compiled"
        if fla_unavailable(h0) is None:
            return "fla"
        return "compiled" if checkpointing else "buffer"
    if requested == "fla" and (reason := fla_unavailable(h0)) is not None:
        raise ValueError(f"routing_implementation='fla' cannot route this forward pass: {reason}")
    if requested == "buffer" and checkpointing:
        raise ValueError(
            "routing_implementation='buffer' cannot route layers that gradient checkpointing recomputes: it writes "
            "its sources in place, and a layer's recomputation would write them again; use 'compiled', the default "
            "under gradient checkpointing"
        )
    return requested


def plan_routing(
    config: DeltaQwen3Config, points: list[RoutingPoint], h0: torch.Tensor, checkpointing: bool
) -> RoutingPlan:
    """The routing plan of a forward pass from `h0` through `points`, in layers that gradient checkpointing
    recomputes or not."""
    implementation = resolve_implementation(config.routing_implementation, h0, checkpointing)
    return RoutingPlan(implementation, DEPTH_STATES[config.routing_mode], points)
