"""Routing over depth (SPEC section 2): what a forward pass carries from layer to layer, and the plan it follows.

Sublayer `s` (`2i` = layer i's attention, `2i+1` its MLP) computes `v_s = f_s(h_hat_s)`. The modes differ only in
which sources exist, when they are added, and whether the routed mixture is added to a residual stream or
replaces it. Each mode is one small `DepthState` below:

    delta          h_hat_s = h_s + gamma_s * mix_s([h_0, v_0, ..., v_{s-1}])         h_{s+1} = h_s + v_s
    delta_block    h_hat_s = h_s + gamma_s * mix_s([h_0, Delta_1, ..., Delta_k])     Delta_k = H_k - H_{k-1}
    attnres_full   h_hat_s = mix_s([h_0, v_0, ..., v_{s-1}]);    output = mix_final(all sources)
    attnres_block  h_hat_s = mix_s([B_0, ..., B_{j-1}, P]);     output = mix_final([B_0, ..., B_last])

Sublayer 0 is never routed: its input is `h_0`. Only the delta modes have gates (the configuration refuses them
elsewhere), so every point computes `residual + gamma * mix` with the residual 0 and `gamma` 1 where a mode has
none.

Which implementation computes the routing points' mixtures is `config.routing_implementation`, a name of
`IMPLEMENTATIONS`. Everything a forward pass decides once (implementation, the mode's state, capacity, autograd,
compilation) is in its `RoutingPlan` (`plan_routing`); the points' parameters are resolved once per point into plain
tensors (`routing_points.PointTable`), which is all an implementation sees of them.
"""

import copy
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from .configuration_delta_qwen3 import DeltaQwen3Config
from .routing_buffer import buffer_sources
from .routing_compiled import CompiledSources
from .routing_fla import FlaSources, fla_unavailable
from .routing_fused import FusedSources
from .routing_points import PointTable, ResolvedPoint, RoutingPoint
from .routing_reference import SourceList


class Sources(Protocol):
    """The sources of one forward pass, made by an implementation as `sources(h0, plan, table)` (`h0` is not yet
    appended), and the routing of each point over them."""

    def append(self, x: torch.Tensor) -> None:
        """Adds a source, shaped like `h0`."""

    def route(self, point: ResolvedPoint, residual=None, extra=None) -> tuple[torch.Tensor, torch.Tensor]:
        """`residual + gate * mix` (the residual 0 and the gate 1 when None) over the sources and `extra`, a source
        this point alone reads; and the routing weights `[tokens, n_sources]`."""

    def to(self, *args, **kwargs) -> "Sources":
        """The sources moved like `Tensor.to` (accelerate's device hooks move the depth state between layers)."""

    # Only implementations that route layers recomputed by gradient checkpointing (where `Implementation.not_recomputable` is None):
    def carried(self) -> list[torch.Tensor]:
        """Every tensor held that gradients flow through, in the order `with_carried` takes them back."""

    def with_carried(self, tensors: Iterator[torch.Tensor], table: "PointTable") -> "Sources":
        """A copy holding the next of `tensors` in place of `carried()`, and the points' parameters of `table`."""


@dataclass(frozen=True)
class Implementation:
    """A routing implementation: how it makes a forward pass's `Sources`, why it cannot route hidden states like a
    given tensor (None when it can), and, where it cannot route layers that gradient checkpointing recomputes, why."""

    sources: Callable[..., Sources]
    unavailable: Callable[[torch.Tensor], str | None] = lambda like: None
    not_recomputable: str | None = None


IMPLEMENTATIONS = {
    "reference": Implementation(SourceList),
    "buffer": Implementation(
        buffer_sources,
        not_recomputable="it writes its sources in place, and a layer's recomputation would write them again",
    ),
    "fla": Implementation(FlaSources, unavailable=fla_unavailable),
    "compiled": Implementation(CompiledSources),
    "fused": Implementation(
        FusedSources,
        not_recomputable="it writes its sources in place, and a layer's recomputation would write them again",
    ),
}


def check_routing_implementation(name: str | None) -> None:
    """Raises a `ValueError` naming the choices unless `name` is one of them (or None, the default)."""
    if name is not None and name not in IMPLEMENTATIONS:
        raise ValueError(f"routing_implementation={name!r} is not one of {', '.join(IMPLEMENTATIONS)}")


def _blocks_formed(config: DeltaQwen3Config) -> int:
    """How many blocks the layers form: fewer than `routing_num_blocks` when `layers_per_block` is rounded up."""
    return -(-config.num_hidden_layers // config.layers_per_block)


class DepthState:
    """What one forward pass carries over depth: the points' parameters (`PointTable`), the sources routed over
    (made by the plan's implementation), the routing weights so far, and each mode's own tensors.

    Layers receive the state as an argument and hand it back, so nothing crosses depth through module attributes.
    """

    # The tensors of the state's own, besides its table's and its sources' (`carried`); subclasses add theirs.
    TENSORS: tuple[str, ...] = ("h0",)

    def __init__(self, h0: torch.Tensor, config: DeltaQwen3Config, plan: "RoutingPlan"):
        self.layers_per_block = config.layers_per_block
        self.table = PointTable(plan.points, h0)
        self.sources = IMPLEMENTATIONS[plan.implementation].sources(h0, plan, self.table)
        self.routing_weights: list[torch.Tensor] = []
        self.h0 = h0
        self.sources.append(h0)

    @staticmethod
    def capacity(config: DeltaQwen3Config) -> int:
        """The most sources this mode holds at once."""
        return 2 * config.num_hidden_layers + 1

    def starts_block(self, layer_idx: int) -> bool:
        return layer_idx > 0 and layer_idx % self.layers_per_block == 0

    def _route(self, residual=None, extra=None) -> torch.Tensor:
        """Routes the next point: the points run in the plan's order, one routing weight tensor each."""
        point = self.table.resolve(len(self.routing_weights))
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
        """The input `h_hat_s` of the next sublayer, whose routing point is `point`: None for sublayer 0, which is
        never routed. The points run in the plan's order, so the state knows which one runs next."""
        raise NotImplementedError

    def layer_hidden_state(self, attn_input: torch.Tensor) -> torch.Tensor:
        """The hidden state of the layer whose routed attention input is `attn_input` (`output_hidden_states`):
        that input itself in the AttnRes modes, which have no residual stream."""
        return attn_input

    def add_output(self, v: torch.Tensor) -> None:
        """Hand back the output `v_s` of the sublayer that just ran."""
        raise NotImplementedError

    def final_hidden(self) -> torch.Tensor:
        """The hidden state that goes into the final norm (through the final point in the AttnRes modes)."""
        raise NotImplementedError

    def carried(self) -> list[torch.Tensor]:
        """Every tensor the state holds that gradients flow through, in an order `with_carried` takes them back in."""
        own = (getattr(self, name) for name in self.TENSORS)
        return [*self.table.carried(), *self.sources.carried(), *(tensor for tensor in own if tensor is not None)]

    def with_carried(self, tensors: Iterable[torch.Tensor]) -> "DepthState":
        """A copy of the state holding `tensors` in place of `carried()`: what a layer recomputed by gradient
        checkpointing works on, so that the state it was given stays as it was."""
        tensors = iter(tensors)
        copied = copy.copy(self)
        copied.table = self.table.with_carried(tensors)
        copied.sources = self.sources.with_carried(tensors, copied.table)
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
        moved.table, moved.sources = self.table.to(*args, **kwargs), self.sources.to(*args, **kwargs)
        for name in self.TENSORS:
            if getattr(self, name) is not None:
                setattr(moved, name, getattr(self, name).to(*args, **kwargs))
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
        return self._route(residual=self.hidden)

    def layer_hidden_state(self, attn_input):
        """The residual stream at the layer boundary, as in Qwen3."""
        return self.hidden

    def final_hidden(self):
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
        return self._route()

    def add_output(self, v):
        self.sources.append(v)

    def final_hidden(self):
        return self._route()


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
        return self._route(extra=self.partial)

    def add_output(self, v):
        self.partial = v if self.partial is None else self.partial + v

    def final_hidden(self):
        self._close_block()
        return self._route()


DEPTH_STATES: dict[str, type[DepthState]] = {
    "delta": DeltaState,
    "delta_block": DeltaBlockState,
    "attnres_full": AttnResFullState,
    "attnres_block": AttnResBlockState,
}


@dataclass(frozen=True)
class RoutingPlan:
    """What one forward pass decides once about its routing: the implementation that routes (a name of
    `IMPLEMENTATIONS`), the mode's depth state, the routing points in the order they run, the most sources held at
    once, RMSNorm's eps, and whether autograd records the pass and `torch.compile` traces it. A forward pass
    depends on nothing but its arguments: no routing state is kept from one decoding step to the next."""

    implementation: str
    state_class: type[DepthState]
    points: list[RoutingPoint]
    capacity: int
    eps: float
    grad: bool
    compiling: bool

    def start(self, h0: torch.Tensor, config: DeltaQwen3Config) -> DepthState:
        """The depth state of a forward pass whose embeddings are `h0`."""
        return self.state_class(h0, config, self)


def resolve_implementation(requested: str | None, h0: torch.Tensor, checkpointing: bool = False) -> str:
    """The implementation that routes hidden states like `h0`, in layers that gradient checkpointing recomputes or
    not: `requested` when it can, else a `ValueError` that says why; by default the buffer, or the compiled one under
    `torch.compile` and gradient checkpointing. fla's kernel only when asked for: on a GPU it measured slower than the
    buffer and autotunes for every new number of sources. Checked here too: `from_pretrained` sets the field after
    the model's own check."""
    check_routing_implementation(requested)
    if requested is None:
        return "compiled" if torch.compiler.is_compiling() or checkpointing else "buffer"
    implementation = IMPLEMENTATIONS[requested]
    if (reason := implementation.unavailable(h0)) is not None:
        raise ValueError(f"routing_implementation={requested!r} cannot route this forward pass: {reason}")
    if checkpointing and implementation.not_recomputable is not None:
        raise ValueError(
            f"routing_implementation={requested!r} cannot route layers that gradient checkpointing recomputes: "
            f"{implementation.not_recomputable}; use 'compiled', the default under gradient checkpointing"
        )
    return requested


def plan_routing(
    config: DeltaQwen3Config, points: list[RoutingPoint], h0: torch.Tensor, checkpointing: bool
) -> RoutingPlan:
    """The routing plan of a forward pass from `h0` through `points`, in layers that gradient checkpointing
    recomputes or not."""
    implementation = resolve_implementation(config.routing_implementation, h0, checkpointing)
    state_class = DEPTH_STATES[config.routing_mode]
    return RoutingPlan(
        implementation,
        state_class,
        points,
        capacity=state_class.capacity(config),
        eps=config.rms_norm_eps,
        grad=torch.is_grad_enabled(),
        compiling=torch.compiler.is_compiling(),
    )
