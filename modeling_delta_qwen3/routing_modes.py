"""The routing modes (SPEC section 2), each declared once: what it declares (`RoutingMode`), and the depth state
its forward pass carries from layer to layer (`DepthState` and one subclass per mode). Everything that depends on
the mode reads `ROUTING_MODES`; no other code compares mode names.

Sublayer `s` (`2i` = layer i's attention, `2i+1` its MLP) computes `v_s = f_s(h_hat_s)`. The modes differ only in
which sources exist, when they are added, and whether the routed mixture is added to a residual stream or
replaces it:

    delta          h_hat_s = h_s + gamma_s * mix_s([h_0, v_0, ..., v_{s-1}])         h_{s+1} = h_s + v_s
    delta_block    h_hat_s = h_s + gamma_s * mix_s([h_0, Delta_1, ..., Delta_k])     Delta_k = H_k - H_{k-1}
    attnres_full   h_hat_s = mix_s([h_0, v_0, ..., v_{s-1}]);    output = mix_final(all sources)
    attnres_block  h_hat_s = mix_s([B_0, ..., B_{j-1}, P]);     output = mix_final([B_0, ..., B_last])

Sublayer 0 is never routed: its input is `h_0`. Only the modes with a residual stream have gates, so every point
computes `residual + gamma * mix` with the residual 0 and `gamma` 1 where a mode has none.

Adding a mode: its `DepthState` subclass and its `RoutingMode` entry here, and its spec in SPEC section 2; the
configuration, conversion, model card, tests and benchmarks take it from `ROUTING_MODES` (docs/DESIGN.md).

The depth state is data (`DepthData`): the state, its points' parameters and its implementation's sources are
objects of attributes whose tensors one generic walk moves (`to`, which accelerate's device hooks call), lists
(`carried`) and replaces (`with_carried`, what gradient checkpointing recomputes a layer from).
"""

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

# The configuration imports this module, which therefore imports no other file of the package (remote code copies
# a file's imports with it): `PointTable`, `RoutingPoint` (routing_points.py) and `Sources` (routing_sources.py) are
# named in annotations only.


class DepthData:
    """An object of the depth state: the state itself (`DepthState`), its points' parameters (`PointTable`) and its
    sources as each implementation keeps them. Its data are its attributes, walked through (with the lists and
    tuples and other `DepthData` they hold) by the three things done to a state, which every class therefore gets
    from here and none writes for itself:

    - `to`: a copy with every tensor moved like `Tensor.to` (accelerate's device hooks move the state between layers
      on different devices);
    - `carried`: every tensor, in the order of the walk (gradient checkpointing passes them to a layer positionally);
    - `with_carried`: a copy holding other tensors in their places (the state a recomputed layer works on).

    The convention, the one there is: the caller keeps what these return and no longer uses the object it called.
    Attributes named in `DERIVED` (views of the data and caches over them) are not walked: `derive` remakes them in a
    copy. A class whose objects autograd's saved contexts hold and read after a move (`IN_PLACE`: the buffer's
    storage, whose counts earlier points' backward passes read) is updated in place instead of copied; such an
    object is never in a layer that gradient checkpointing recomputes. Anything else an attribute holds (numbers,
    modules, shapes) is kept as it is."""

    DERIVED: tuple[str, ...] = ()
    IN_PLACE = False

    def derive(self) -> None:
        """Remake the attributes in `DERIVED` from the data."""

    def to(self, *args, **kwargs):
        return map_tensors(self, lambda tensor: tensor.to(*args, **kwargs), copy_unchanged=False)

    def carried(self) -> list[torch.Tensor]:
        return tensors_in(self)

    def with_carried(self, tensors: Iterable[torch.Tensor]):
        tensors = iter(tensors)
        copied = map_tensors(self, lambda _: next(tensors), copy_unchanged=True)
        if next(tensors, None) is not None:
            raise ValueError("more tensors than the depth state carries")
        return copied


def _parts(value) -> dict | list | tuple | None:
    """What the walk goes through in `value`: a `DepthData`'s attributes but those in `DERIVED` (by name), a list's
    or tuple's items; None for anything else."""
    if isinstance(value, DepthData):
        return {name: part for name, part in vars(value).items() if name not in value.DERIVED}
    return value if type(value) in (list, tuple) else None


def tensors_in(value) -> list[torch.Tensor]:
    """Every tensor in `value`, in the order of the walk."""
    if isinstance(value, torch.Tensor):
        return [value]
    parts = _parts(value)
    return [] if parts is None else [t for part in (parts.values() if isinstance(parts, dict) else parts)
                                     for t in tensors_in(part)]  # fmt: skip


def map_tensors(value, function: Callable[[torch.Tensor], torch.Tensor], copy_unchanged: bool):
    """`value` with every tensor in it replaced by `function(tensor)`, in the order of the walk: its lists, tuples
    and `DepthData` copied (or updated in place: see `DepthData`), but where `function` changed none of their tensors
    and not `copy_unchanged`, themselves (a state moved where it already is stays the same state)."""
    if isinstance(value, torch.Tensor):
        return function(value)
    parts = _parts(value)
    if parts is None:
        return value
    if isinstance(parts, dict):
        mapped = {name: map_tensors(part, function, copy_unchanged) for name, part in parts.items()}
        if not copy_unchanged and all(mapped[name] is part for name, part in parts.items()):
            return value
        copied = value if value.IN_PLACE else copy.copy(value)
        copied.__dict__.update(mapped)
        copied.derive()
        return copied
    mapped = [map_tensors(part, function, copy_unchanged) for part in parts]
    if not copy_unchanged and all(new is old for new, old in zip(mapped, parts)):
        return value
    return type(value)(mapped)


def _blocks_formed(config) -> int:
    """How many blocks the layers form: fewer than `routing_num_blocks` when `layers_per_block` is rounded up."""
    return -(-config.num_hidden_layers // config.layers_per_block)


class DepthState(DepthData):
    """What one forward pass carries over depth: the points' parameters (`PointTable`), the sources routed over
    (made by the plan's implementation), the routing weights so far, and each mode's own tensors.

    Layers receive the state as an argument and hand it back, so nothing crosses depth through module attributes.
    """

    def __init__(self, h0: torch.Tensor, config, point_count: int, table: "PointTable", sources: "Sources"):
        """`point_count`: how many routing points the forward pass runs; `table`: their parameters; `sources`: made
        by the plan's implementation, empty."""
        self.layers_per_block = config.layers_per_block
        self.table, self.sources = table, sources
        self.routing_weights: list[torch.Tensor] = []
        self.h0 = h0
        self.sources.append(h0)

    @staticmethod
    def capacity(config) -> int:
        """The most sources this mode holds at once."""
        return 2 * config.num_hidden_layers + 1

    def starts_block(self, layer_idx: int) -> bool:
        return layer_idx > 0 and layer_idx % self.layers_per_block == 0

    def _route(self, residual=None, own_source=None) -> torch.Tensor:
        """Routes the next point: the points run in the plan's order, one routing weight tensor each."""
        point = self.table.resolve(len(self.routing_weights))
        routed, weights = self.sources.route(point, residual, own_source)
        self.routing_weights.append(weights)
        return routed

    def routing_weights_by_token(self) -> tuple[torch.Tensor, ...]:
        """Every point's routing weights so far, shaped `[batch, seq, n_sources]` (they are kept `[tokens,
        n_sources]` and shaped only when asked for: generation never asks)."""
        return tuple(weights.view(*self.h0.shape[:-1], weights.shape[-1]) for weights in self.routing_weights)

    def enter_layer(self, layer_idx: int) -> None:
        """Called before layer `layer_idx` routes its attention input."""

    def routed_input(self, point: "RoutingPoint | None") -> torch.Tensor:
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

class _AdditiveState(DepthState):
    """Delta modes: the ordinary residual stream is kept and the routed mixture is added to it."""

    def __init__(self, h0, config, point_count, table, sources):
        super().__init__(h0, config, point_count, table, sources)
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

    def __init__(self, h0, config, point_count, table, sources):
        super().__init__(h0, config, point_count, table, sources)
        # Each point reads the outputs of the sublayers before its own: the last sublayer's output, no point.
        self.outputs_to_keep = point_count

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

    def __init__(self, h0, config, point_count, table, sources):
        super().__init__(h0, config, point_count, table, sources)
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

    def __init__(self, h0, config, point_count, table, sources):
        super().__init__(h0, config, point_count, table, sources)
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
        return self._route(own_source=self.partial)

    def add_output(self, v):
        self.partial = v if self.partial is None else self.partial + v

    def final_hidden(self):
        self._close_block()
        return self._route()


@dataclass(frozen=True)
class RoutingMode:
    """What a routing mode declares: its name in the paper; its depth state; whether the routed mixture is added to
    a residual stream (else it replaces it); whether its sources are blocks of layers (`routing_num_blocks`);
    whether its points may be gated (`routing_gate`: only with a residual stream); whether a final routing point
    mixes the sources into the last hidden state; and whether Inductor on the CPU before PyTorch 2.14 computes it
    wrong, which vLLM's compiled mode meets (docs/SERVING.md)."""

    name: str
    title: str  # the paper's name
    state: type[DepthState]
    residual_stream: bool
    blocks: bool
    final_point: bool
    miscompiled_on_cpu_before_torch_2_14: bool = False

    @property
    def gateable(self) -> bool:
        return self.residual_stream


ROUTING_MODES: dict[str, RoutingMode] = {
    mode.name: mode
    for mode in (
        RoutingMode("delta", "Delta AttnRes", DeltaState, residual_stream=True, blocks=False, final_point=False),
        RoutingMode("delta_block", "Delta Block", DeltaBlockState, residual_stream=True, blocks=True, final_point=False,
                    miscompiled_on_cpu_before_torch_2_14=True),
        RoutingMode("attnres_full", "Full AttnRes", AttnResFullState, residual_stream=False, blocks=False,
                    final_point=True),
        RoutingMode("attnres_block", "Block AttnRes", AttnResBlockState, residual_stream=False, blocks=True,
                    final_point=True),
    )
}
GATEABLE_MODES = tuple(name for name, mode in ROUTING_MODES.items() if mode.gateable)
BLOCK_MODES = tuple(name for name, mode in ROUTING_MODES.items() if mode.blocks)
