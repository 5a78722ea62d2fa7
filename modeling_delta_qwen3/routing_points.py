"""Routing points: the parameters of each (`RoutingPoint`), and those of all the points of one forward pass resolved
into plain tensors, once per point (`PointTable`, `ResolvedPoint`), which is all an implementation sees of them."""

import torch
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from .routing_math import compute_dtype, point_query
from .routing_modes import DepthData
from .routing_sources import ResolvedPoint


def gate_in_format(gate: torch.Tensor) -> torch.Tensor:
    """A routing gate shaped as the checkpoint format has it, `[1]`, read from a checkpoint of the format's first
    version too, which held it 0-d."""
    return gate.reshape(1) if gate.dim() == 0 else gate


class RoutingPoint(nn.Module):
    """A query `q_p`, an RMSNorm weight `g_p` and, when gated, a gate `gamma_p` shaped `[1]` (all initialised so that
    routing starts uniform and, gated, switched off)."""

    def __init__(self, hidden_size: int, eps: float, gated: bool):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(hidden_size))
        self.norm = Qwen3RMSNorm(hidden_size, eps=eps)
        self.gate = nn.Parameter(torch.zeros(1)) if gated else None

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # `load_state_dict` of a checkpoint with 0-d gates (`from_pretrained` reshapes them with the model's weight
        # conversion, which this hook never sees).
        if (gate := state_dict.get(prefix + "gate")) is not None:
            state_dict[prefix + "gate"] = gate_in_format(gate)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def parameters_now(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """`q_p`, `g_p` and `gamma_p` (None without a gate), read from the modules' parameter registries:
        `self.query` goes through `nn.Module.__getattr__`, slow enough that a few reads per point count in decoding
        a token. Falls back to attribute access where a wrapper has swapped a parameter for a plain tensor (FSDP1
        without `use_orig_params`)."""
        query, norm_weight = self._parameters.get("query"), self._modules["norm"]._parameters.get("weight")
        if query is None or norm_weight is None:
            return self.query, self.norm.weight, self.gate
        return query, norm_weight, self._parameters.get("gate")


class _Stack(torch.autograd.Function):
    """`torch.stack` whose backward pass is one `unbind`, where PyTorch's own selects each row: one dispatched
    operation per routing point fewer in every training step, for each stacked parameter."""

    @staticmethod
    def forward(ctx, *tensors):
        return torch.stack(tensors)

    @staticmethod
    def backward(ctx, grad):
        return grad.unbind(0)


def _stacked_on(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor | None:
    """`torch.stack(tensors)` when they are ordinary tensors on `device`, else None (sharded, offloaded, on other
    devices or of different sizes). Checked once on the result rather than per tensor: decoding a token pays for
    every check."""
    try:
        stacked = _Stack.apply(*tensors)
    except RuntimeError:  # on different devices, or of different sizes
        return None
    return stacked if type(stacked) is torch.Tensor and stacked.device == device else None


def stacked_queries(points: list[RoutingPoint], like: torch.Tensor) -> torch.Tensor | None:
    """`w_p = q_p * g_p` of every point in order, `[points, D]` in the compute dtype of hidden states like `like`;
    None when the points' parameters are not whole ordinary tensors on `like`'s device (sharded by FSDP or
    DeepSpeed, offloaded, on another device): their values are then known only when each point runs."""
    queries, norm_weights, _ = zip(*(point.parameters_now() for point in points))
    queries, norm_weights = _stacked_on(queries, like.device), _stacked_on(norm_weights, like.device)
    if queries is None or norm_weights is None or not queries.shape[1:] == norm_weights.shape[1:] == like.shape[-1:]:
        return None
    return point_query(queries, norm_weights, compute_dtype(like.dtype))


def stacked_gates(points: list[RoutingPoint], like: torch.Tensor) -> torch.Tensor | None:
    """`gamma_p` of every point in order, `[points]`; None when a point has no gate, or when the gates are not whole
    ordinary `[1]` tensors on `like`'s device (see `stacked_queries`)."""
    gates = [point.parameters_now()[2] for point in points]
    if any(gate is None for gate in gates):
        return None
    gates = _stacked_on(gates, like.device)
    return gates.view(len(points)) if gates is not None and gates.shape == (len(points), 1) else None


class PointTable(DepthData):
    """The routing points' parameters for one forward pass, in the order the points run, resolved once per point
    (`resolve`): stacked up front (`queries` `[points, D]`, and `gates` `[points]` for an implementation that reads
    them all at once, `stack_gates`) when they are whole ordinary tensors on the hidden states' device, else read
    from its module when a point runs (sharded, offloaded: only then do their values exist; a gate is a `[1]`
    parameter, which a point can take as it is). Implementations that score sources against every later point when
    the sources are written read `queries`; None when not stacked."""

    DERIVED = ("_query_rows", "_gate_rows")

    def __init__(self, points: list[RoutingPoint], like: torch.Tensor, stack_gates: bool):
        self.points, self.dtype = points, compute_dtype(like.dtype)
        self.gated = any(point.gate is not None for point in points)
        self.queries = stacked_queries(points, like)
        self.gates = stacked_gates(points, like) if stack_gates else None
        self.derive()

    def derive(self) -> None:
        # Rows made once: indexing costs a dispatched operation per point.
        self._query_rows = None if self.queries is None else self.queries.unbind(0)
        self._gate_rows = None if self.gates is None else self.gates.unbind(0)

    def resolve(self, index: int) -> ResolvedPoint:
        """The point that runs `index`-th, as plain tensors."""
        w = None if self._query_rows is None else self._query_rows[index]
        gate = None if self._gate_rows is None else self._gate_rows[index]
        if w is None or (gate is None and self.gated):
            query, norm_weight, own_gate = self.points[index].parameters_now()
            w = point_query(query, norm_weight, self.dtype) if w is None else w
            gate = own_gate if gate is None else gate
        return ResolvedPoint(index, w, gate)

