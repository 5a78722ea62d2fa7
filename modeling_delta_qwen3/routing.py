"""Routing over depth (SPEC section 2): which implementation computes the routing points' mixtures, and the plan
each forward pass follows.

`config.routing_implementation` names an entry of `IMPLEMENTATIONS`, as `attn_implementation` names an attention
backend. Everything a forward pass decides once (implementation, the mode, the points, capacity, autograd,
compilation) is in its `RoutingPlan` (`plan_routing`), which starts the mode's depth state (`routing_modes.py`) with
the points' parameters resolved into plain tensors (`routing_points.PointTable`) and the implementation's sources
(`routing_sources.Sources`): all an implementation sees.
"""

from dataclasses import dataclass

import torch

from .configuration_delta_qwen3 import DeltaQwen3Config
from .routing_buffer import buffer_sources
from .routing_compiled import CompiledSources
from .routing_fla import FlaSources, fla_unavailable
from .routing_fused import FusedSources, routes_with_kernels
from .routing_modes import ROUTING_MODES, DepthState, RoutingMode
from .routing_points import PointTable, RoutingPoint
from .routing_reference import ReferenceSources
from .routing_sources import Implementation

# Written in place, so not in layers that gradient checkpointing recomputes.
_WRITES_IN_PLACE = "it writes its sources in place, and a layer's recomputation would write them again"

IMPLEMENTATIONS = {
    "reference": Implementation(ReferenceSources),
    "buffer": Implementation(buffer_sources, not_recomputable=_WRITES_IN_PLACE, stacked_gates=True),
    "fla": Implementation(FlaSources, unavailable=fla_unavailable),
    "compiled": Implementation(CompiledSources),
    "fused": Implementation(FusedSources, not_recomputable=_WRITES_IN_PLACE),
}


def check_routing_implementation(name: str | None) -> None:
    """Raises a `ValueError` naming the choices unless `name` is one of them (or None, the default)."""
    if name is not None and name not in IMPLEMENTATIONS:
        raise ValueError(f"routing_implementation={name!r} is not one of {', '.join(IMPLEMENTATIONS)}")


@dataclass(frozen=True)
class RoutingPlan:
    """What one forward pass decides once about its routing: the implementation that routes (a name of
    `IMPLEMENTATIONS`), the routing mode, the routing points in the order they run, the most sources held at once,
    RMSNorm's eps, and whether autograd records the pass and `torch.compile` traces it (what implementations read:
    `routing_sources.SourcesPlan`). A forward pass depends on nothing but its arguments: no routing state is kept
    from one decoding step to the next."""

    implementation: str
    mode: RoutingMode
    points: list[RoutingPoint]
    capacity: int
    eps: float
    grad: bool
    compiling: bool

    def start(self, h0: torch.Tensor, config: DeltaQwen3Config) -> DepthState:
        """The depth state of a forward pass whose embeddings are `h0`."""
        implementation = IMPLEMENTATIONS[self.implementation]
        table = PointTable(self.points, h0, stack_gates=implementation.stacked_gates)
        sources = implementation.sources(h0, self, table)
        return self.mode.state(h0, config, len(self.points), table, sources)


def resolve_implementation(requested: str | None, h0: torch.Tensor, checkpointing: bool = False) -> str:
    """The implementation that routes hidden states like `h0`, in layers that gradient checkpointing recomputes or
    not: `requested` when it can, else a `ValueError` that says why. By default: the compiled one in layers that
    gradient checkpointing recomputes (the others write their sources in place); the fused operation where it runs
    Triton kernels (an NVIDIA GPU with Triton: one kernel per point, eager or compiled); elsewhere the buffer, or
    the compiled one under `torch.compile`. fla's kernel only when asked for: it autotunes for every new number of
    sources, and trained slower than the buffer on a GPU (benchmarks/README.md, "On an H200"). Checked here too:
    `from_pretrained` sets the field after the model's own check."""
    check_routing_implementation(requested)
    if requested is None:
        if checkpointing:
            return "compiled"
        if routes_with_kernels(h0):
            return "fused"
        return "compiled" if torch.compiler.is_compiling() else "buffer"
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
    mode = ROUTING_MODES[config.routing_mode]
    return RoutingPlan(
        implementation,
        mode,
        points,
        capacity=mode.state.capacity(config),
        eps=config.rms_norm_eps,
        grad=torch.is_grad_enabled(),
        compiling=torch.compiler.is_compiling(),
    )
