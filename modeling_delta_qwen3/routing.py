"""Routing over depth (SPEC section 2): the routing point, and what a forward pass carries from layer to layer.

Sublayer `s` (`2i` = layer i's attention, `2i+1` its MLP) computes `v_s = f_s(h_hat_s)`. The modes differ only in
which sources exist, when they are added, and whether the routed mixture is added to a residual stream or
replaces it. Each mode is one small `DepthState` below:

    delta          h_hat_s = h_s + gamma_s * mix_s([h_0, v_0, ..., v_{s-1}])         h_{s+1} = h_s + v_s
    delta_block    h_hat_s = h_s + gamma_s * mix_s([h_0, Delta_1, ..., Delta_k])     Delta_k = H_k - H_{k-1}
    attnres_full   h_hat_s = mix_s([h_0, v_0, ..., v_{s-1}]);    output = mix_final(all sources)
    attnres_block  h_hat_s = mix_s([B_0, ..., B_{j-1}, P]);     output = mix_final([B_0, ..., B_last])

Sublayer 0 is never routed: its input is `h_0`.
"""

import copy

import torch
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from .configuration_delta_qwen3 import DeltaQwen3Config
from .depth_mix import compute_dtype, depth_mix, fla_depth_mix, inverse_rms, stacked_depth_mix, use_fla


class RoutingPoint(nn.Module):
    """A query `q_p`, an RMSNorm weight `g_p` and, when gated, a scalar gate `gamma_p` (all initialised so that
    routing starts uniform and, gated, switched off)."""

    def __init__(self, hidden_size: int, eps: float, gated: bool):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(hidden_size))
        self.norm = Qwen3RMSNorm(hidden_size, eps=eps)
        self.gate = nn.Parameter(torch.zeros(())) if gated else None


class SourceList:
    """The sources as separate tensors, each with its inverse RMS computed once. Used when autograd records: the
    fused function then saves references to tensors that exist anyway, never a stacked copy."""

    def __init__(self, eps: float, capacity: int):  # `capacity` is for `SourceStack`; a list grows as needed
        self.eps = eps
        self.tensors: list[torch.Tensor] = []
        self.inv_rms: list[torch.Tensor] = []

    def append(self, x: torch.Tensor) -> None:
        self.tensors.append(x)
        self.inv_rms.append(inverse_rms(x, self.eps))

    def route(self, point: RoutingPoint, residual=None, extra=None) -> tuple[torch.Tensor, torch.Tensor]:
        """`residual + gamma * mix` (or `mix` without a residual) over the sources and `extra`, a source that is
        read once; also returns the routing weights."""
        tensors, inv_rms = self.tensors, self.inv_rms
        if extra is not None:
            tensors, inv_rms = [*tensors, extra], [*inv_rms, inverse_rms(extra, self.eps)]
        gate = point.gate if residual is not None else None
        if use_fla(tensors[0]):
            return fla_depth_mix(tensors, point.query, point.norm.weight, self.eps, residual=residual, gate=gate)
        return depth_mix(tensors, inv_rms, point.query, point.norm.weight, residual=residual, gate=gate)

    def to(self, *args, **kwargs) -> "SourceList":
        moved = copy.copy(self)
        moved.tensors = [t.to(*args, **kwargs) for t in self.tensors]
        moved.inv_rms = [t.to(*args, **kwargs) for t in self.inv_rms]
        return moved


class SourceStack:
    """The sources copied once each into one `[capacity, tokens, D]` buffer. Used without autograd (inference,
    generation): a routing point is then two matrix products instead of a few operations per source."""

    def __init__(self, eps: float, capacity: int):
        self.eps = eps
        self.capacity = capacity
        self.count = 0
        self.buffer: torch.Tensor | None = None
        self.inv_rms: torch.Tensor | None = None

    def _write(self, slot: int, x: torch.Tensor) -> None:
        if self.buffer is None:
            self.shape, self.dtype = x.shape, x.dtype
            tokens, acc = x.shape[:-1].numel(), compute_dtype(x.dtype)
            self.buffer = x.new_empty(self.capacity, tokens, x.shape[-1], dtype=acc)
            self.inv_rms = x.new_empty(self.capacity, tokens, dtype=acc)
        self.buffer[slot] = x.reshape(-1, x.shape[-1])
        self.inv_rms[slot] = inverse_rms(self.buffer[slot], self.eps).squeeze(-1)

    def append(self, x: torch.Tensor) -> None:
        self._write(self.count, x)
        self.count += 1

    def route(self, point: RoutingPoint, residual=None, extra=None) -> tuple[torch.Tensor, torch.Tensor]:
        count = self.count
        if extra is not None:  # the slot after the last source, overwritten by the next source or extra
            self._write(count, extra)
            count += 1
        gate = point.gate if residual is not None else None
        flat_residual = residual.reshape(-1, residual.shape[-1]) if residual is not None else None
        routed, weights = stacked_depth_mix(
            self.buffer[:count], self.inv_rms[:count], point.query, point.norm.weight, flat_residual, gate
        )
        return routed.view(self.shape).to(self.dtype), weights.reshape(*self.shape[:-1], count)

    def to(self, *args, **kwargs) -> "SourceStack":
        moved = copy.copy(self)
        if self.buffer is not None:
            moved.buffer, moved.inv_rms = self.buffer.to(*args, **kwargs), self.inv_rms.to(*args, **kwargs)
        return moved


class DepthState:
    """What one forward pass carries over depth: the sources routed over (see `SourceList`, `SourceStack`), the
    routing weights so far, and each mode's own tensors.

    Layers receive the state as an argument and hand it back, so nothing crosses depth through module attributes.
    """

    def __init__(self, h0: torch.Tensor, config: DeltaQwen3Config):
        self.layers_per_block = config.layers_per_block
        sources = SourceList if torch.is_grad_enabled() else SourceStack
        self.sources = sources(config.rms_norm_eps, self.capacity(config))
        self.routing_weights: list[torch.Tensor] = []
        self.h0 = h0
        self.sources.append(h0)

    @staticmethod
    def capacity(config: DeltaQwen3Config) -> int:
        """The most sources a routing point of this mode reads."""
        return 2 * config.num_hidden_layers + 1

    def starts_block(self, layer_idx: int) -> bool:
        return layer_idx > 0 and layer_idx % self.layers_per_block == 0

    def _route(self, point: RoutingPoint, residual=None, extra=None) -> torch.Tensor:
        routed, weights = self.sources.route(point, residual, extra)
        self.routing_weights.append(weights)
        return routed

    def enter_layer(self, layer_idx: int) -> None:
        """Called before layer `layer_idx` routes its attention input."""

    def routed_input(self, point: RoutingPoint | None) -> torch.Tensor:
        """The input `h_hat_s` of the next sublayer; `point` is None for sublayer 0, which is never routed."""
        raise NotImplementedError

    def add_output(self, v: torch.Tensor) -> None:
        """Hand back the output `v_s` of the sublayer that just ran."""
        raise NotImplementedError

    def final_hidden(self, final_point: RoutingPoint | None) -> torch.Tensor:
        """The hidden state that goes into the final norm."""
        raise NotImplementedError

    def to(self, *args, **kwargs) -> "DepthState":
        """A copy with every tensor moved, so that device-placement hooks (accelerate) can move the state."""
        moved = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, (torch.Tensor, SourceList, SourceStack)):
                setattr(moved, name, value.to(*args, **kwargs))
        return moved


class _AdditiveState(DepthState):
    """Delta modes: the ordinary residual stream is kept and the routed mixture is added to it."""

    def __init__(self, h0: torch.Tensor, config: DeltaQwen3Config):
        super().__init__(h0, config)
        self.hidden = h0

    def routed_input(self, point):
        if point is None:
            return self.hidden
        return self._route(point, residual=self.hidden)

    def final_hidden(self, final_point):
        return self.hidden


class DeltaState(_AdditiveState):
    """`delta`: every sublayer's output is a source."""

    def add_output(self, v):
        self.hidden = self.hidden + v
        self.sources.append(v)


class DeltaBlockState(_AdditiveState):
    """`delta_block`: the change of the residual stream over each finished block is a source, visible from the
    next block's first attention sublayer on."""

    def __init__(self, h0, config):
        super().__init__(h0, config)
        self.block_start = h0

    @staticmethod
    def capacity(config):
        return -(-config.num_hidden_layers // config.layers_per_block)

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

    def __init__(self, h0, config):
        super().__init__(h0, config)
        self.partial: torch.Tensor | None = None

    @staticmethod
    def capacity(config):
        return 1 + -(-config.num_hidden_layers // config.layers_per_block)

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
