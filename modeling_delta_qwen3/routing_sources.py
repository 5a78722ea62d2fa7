"""What every routing implementation shares, and nothing of any one of them: the sources of a forward pass as an
implementation makes them (`Sources`), the routing point as it sees it (`ResolvedPoint`), what the registry knows of
it (`Implementation`), and sources kept as a list, for the implementations that call one function per point
(`SourceList`). Implementations import this module and `routing_math`, never each other or the reference.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

import torch

from .routing_modes import DepthData

if TYPE_CHECKING:
    from .routing_points import PointTable, RoutingPoint


class ResolvedPoint(NamedTuple):
    """A routing point as implementations see it: its place in the order the points run, `w = q * g` `[D]` in the
    compute dtype, and its gate (None without one)."""

    index: int
    w: torch.Tensor
    gate: torch.Tensor | None


def buffer_slots(buffer: torch.Tensor, untracked: bool = True) -> tuple[torch.Tensor, ...]:
    """Each slot of `buffer` along its first dimension, for the buffer implementations to write sources into, made
    once per forward pass (indexing a tensor costs a dispatched operation each time, as much as the arithmetic in
    generation); through an alias that autograd does not track (`.data`) when `untracked`, so that writing a slot
    does not count as modifying what earlier points saved of the buffer."""
    return (buffer.data if untracked else buffer).unbind(0)


class SourcesPlan(Protocol):
    """What an implementation reads of a forward pass's plan (`routing.RoutingPlan`): the routing points in the order
    they run, the most sources held at once, RMSNorm's eps, whether autograd records the pass and whether
    `torch.compile` traces it."""

    points: "list[RoutingPoint]"
    capacity: int
    eps: float
    grad: bool
    compiling: bool


class Sources(Protocol):
    """The sources of one forward pass, made by an implementation as `sources(h0, plan, table)` (`h0` is not yet
    appended), and the routing of each point over them: a `routing_modes.DepthData`, which the depth state moves,
    carries and copies with the rest of it."""

    def append(self, x: torch.Tensor) -> None:
        """Adds a source, shaped like `h0`."""

    def route(
        self, point: ResolvedPoint, residual: torch.Tensor | None = None, own_source: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`residual + gate * mix` (the residual 0 and the gate 1 when None) over the sources and `own_source`, a source
        this point alone reads; and the routing weights `[tokens, n_sources]`."""


@dataclass(frozen=True)
class Implementation:
    """A routing implementation: how it makes a forward pass's `Sources`, why it cannot route hidden states like a
    given tensor (None when it can), where it cannot route layers that gradient checkpointing recomputes, why, and
    whether it reads the points' gates stacked (`PointTable.gates`) rather than each point its own."""

    sources: Callable[[torch.Tensor, SourcesPlan, "PointTable"], Sources]
    unavailable: Callable[[torch.Tensor], str | None] = lambda like: None
    not_recomputable: str | None = None
    stacked_gates: bool = False


class SourceList(DepthData):
    """The sources of one forward pass as a list of tensors, for the implementations that keep them apart; each
    subclass routes a point over them (`route`)."""

    def __init__(self, h0: torch.Tensor, plan, table):
        self.eps = plan.eps
        self.tensors: list[torch.Tensor] = []

    def append(self, x: torch.Tensor) -> None:
        self.tensors.append(x)

