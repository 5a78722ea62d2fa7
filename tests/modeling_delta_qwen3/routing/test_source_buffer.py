"""The buffer implementation, the routing of eager mode, on routing points made of plain tensors: its hand-written
backward against finite differences, the points' parameters stacked up front or not, one-token routing moved
between devices; and, in the model, buffers that reference counting frees."""

import gc
import weakref
from types import SimpleNamespace

import pytest
import torch
from helpers.models import MODES, random_model, token_ids

from modeling_delta_qwen3 import routing_buffer, routing_points
from modeling_delta_qwen3.routing import RoutingPlan
from modeling_delta_qwen3.routing_modes import ROUTING_MODES
from modeling_delta_qwen3.routing_points import PointTable, RoutingPoint, stacked_gates, stacked_queries
from modeling_delta_qwen3.routing_buffer import buffer_sources

pytestmark = pytest.mark.both_ends


def point(query: torch.Tensor, norm_weight: torch.Tensor, gate: torch.Tensor | None = None) -> SimpleNamespace:
    """A routing point over given tensors: a `RoutingPoint` holds parameters, which gradcheck cannot vary."""
    return SimpleNamespace(parameters_now=lambda: (query, norm_weight, gate), gate=gate)


def buffer_over(points: list, like: torch.Tensor, capacity: int, upfront: bool):
    """The buffer's sources for a forward pass through `points` from sources like `like`, in the regime that
    autograd's state and `like`'s shape choose, and the points' table: their parameters stacked up front, or not
    (as when they are sharded)."""
    with pytest.MonkeyPatch.context() as patch:
        if not upfront:
            patch.setattr(routing_points, "stacked_queries", lambda points, like: None)
            patch.setattr(routing_points, "stacked_gates", lambda points, like: None)
        table = PointTable(points, like, stack_gates=True)
    plan = RoutingPlan("buffer", ROUTING_MODES["delta"], points, capacity, eps=1e-6, grad=torch.is_grad_enabled(),
                       compiling=False)
    return buffer_sources(like, plan, table), table


@pytest.mark.parametrize("upfront", [False, True])
@pytest.mark.parametrize("gated", [False, True])
def test_routing_gradients_match_finite_differences(gated, upfront):
    """The hand-written backward of the training regime against numerical gradients, with additive and
    replacement routing, a read-once `own_source` source, and sources computed from earlier routed outputs as in the
    model; with the points' queries and gates stacked up front (scores computed as sources are written; points
    without `own_source` left to their newest source, here two runs of them around a point with `own_source`) and not
    (sharded parameters)."""
    generator = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)

    def routed(x0, x1, x2, residual, own_source, q0, g0, q1, g1, q2, g2, q3, g3, gate):
        points = [point(q0, g0, gate), point(q1, g1, gate), point(q2, g2, gate), point(q3, g3, gate)]
        sources, table = buffer_over(points, x0, capacity=4, upfront=upfront)
        assert isinstance(sources, routing_buffer.TrainingBuffer)
        sources.append(x0)
        sources.append(x1)
        first = sources.route(table.resolve(0), residual=residual)[0]
        second = sources.route(table.resolve(1), own_source=own_source)[0]
        third = sources.route(table.resolve(2), residual=first)[0]
        sources.append(torch.tanh(first) + x2)
        sources.append(second * third)
        return sources.route(table.resolve(3), residual=second)[0]

    inputs = [rand(2, 3, 8) for _ in range(5)] + [rand(8) for _ in range(8)] + [rand(1) if gated else None]
    assert torch.autograd.gradcheck(routed, inputs)


def test_parameters_are_stacked_up_front_only_from_whole_local_tensors():
    """Up front, the points' `q * g` and gates (each `[1]`) in order, with or without autograd; None for a parameter
    that is offloaded (meta) or partitioned (empty), whose values are known only when its point runs."""
    like = torch.zeros(2, 3, 4)
    q, g, gates = torch.randn(2, 4), torch.randn(2, 4), torch.randn(2, 1)
    points = [point(q[0], g[0], gates[0]), point(q[1], g[1], gates[1])]
    torch.testing.assert_close(stacked_queries(points, like), q * g, atol=0, rtol=0)
    torch.testing.assert_close(stacked_gates(points, like), gates.view(2), atol=0, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(stacked_queries(points, like), q * g, atol=0, rtol=0)
    for odd in (torch.empty(4, device="meta"), torch.empty(0)):
        assert stacked_queries([*points, point(odd, g[0])], like) is None
    assert stacked_queries([point(torch.empty(4, device="meta"), torch.empty(4, device="meta"))], like) is None
    assert stacked_queries([point(torch.empty(0), torch.empty(0))], like) is None
    assert stacked_gates([*points, point(q[0], g[0])], like) is None
    assert stacked_gates([point(q[0], g[0], torch.empty(0)), point(q[1], g[1], torch.empty(0))], like) is None


def test_points_resolve_to_the_same_tensors_stacked_or_not():
    """A point resolves to its `q * g` and gate whether the table stacked them or reads them when it runs (a row of
    the stacked gates, or the `[1]` parameter: the same value either way)."""
    like = torch.zeros(2, 3, 4)
    q, g, gates = torch.randn(2, 4), torch.randn(2, 4), torch.randn(2, 1)
    points = [point(q[0], g[0], gates[0]), point(q[1], g[1], gates[1])]
    stacked, unstacked = buffer_over(points, like, 2, upfront=True)[1], buffer_over(points, like, 2, upfront=False)[1]
    assert stacked.queries is not None and unstacked.queries is None and unstacked.gates is None
    for index in range(2):
        for table in (stacked, unstacked):
            resolved = table.resolve(index)
            assert resolved.index == index
            torch.testing.assert_close(resolved.w, q[index] * g[index], atol=0, rtol=0)
            torch.testing.assert_close(resolved.gate.reshape(1), gates[index], atol=0, rtol=0)


def test_a_routing_point_reads_its_parameters_or_the_tensors_a_wrapper_swapped_in():
    """FSDP1 without `use_orig_params` replaces parameters with plain tensors for the forward pass."""
    routing_point = RoutingPoint(4, 1e-6, gated=True)
    query, norm_weight, gate = routing_point.parameters_now()
    assert query is routing_point.query and norm_weight is routing_point.norm.weight and gate is routing_point.gate
    swapped = torch.randn(4)
    del routing_point.query
    routing_point.query = swapped
    query, norm_weight, gate = routing_point.parameters_now()
    assert query is swapped and norm_weight is routing_point.norm.weight and gate is routing_point.gate


@pytest.mark.parametrize("upfront", [False, True])
def test_one_token_routing_moved_between_points_routes_as_unmoved(upfront):
    """A decoding step whose state a device hook moves between layers (`to`, here a forced copy on the same
    device): the moved buffers stay one padded buffer, so the sources written after the move are routed right. One
    token (`OneTokenBuffer`, gates read as numbers when stacked up front) routes as each of two tokens does
    (`PromptBuffer`), with a gate on the replacement routing too."""
    generator = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    sources = rand(4, 1, 1, 8)
    points = [point(rand(8), rand(8).abs() + 0.5, rand(1)) for _ in range(3)]

    def route(move: bool, batch: int = 1) -> list[torch.Tensor]:
        x = sources.expand(-1, batch, -1, -1)
        with torch.no_grad():
            buffer, table = buffer_over(points, x[0], capacity=4, upfront=upfront)
            expected = routing_buffer.OneTokenBuffer if batch == 1 else routing_buffer.PromptBuffer
            assert isinstance(buffer, expected)
            buffer.append(x[0])
            buffer.append(x[1])
            outs = [buffer.route(table.resolve(0), residual=x[3])[0]]
            if move:
                buffer = buffer.to("cpu", copy=True)
            buffer.append(x[2])
            outs.append(buffer.route(table.resolve(1), residual=x[3])[0])
            outs.append(buffer.route(table.resolve(2), own_source=x[3])[0])
        return outs

    moved, unmoved, two_tokens = route(move=True), route(move=False), route(move=False, batch=2)
    for a, b, c in zip(moved, unmoved, two_tokens):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
        torch.testing.assert_close(c, b.expand_as(c), atol=1e-14, rtol=0)


@pytest.mark.parametrize("mode", MODES)
def test_routing_buffers_are_freed_by_reference_counting(monkeypatch, mode):
    """After a training forward, with or without backward, nothing keeps the sources' buffers (or the autograd
    graph that holds them) alive: no reference cycle, which the garbage collector could not break either."""
    storages = []

    class TrackedStorage(routing_buffer._TrainingStorage):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            storages.append(weakref.ref(self))

    monkeypatch.setattr(routing_buffer, "_TrainingStorage", TrackedStorage)
    model = random_model(mode).train()
    ids = token_ids()
    gc.disable()
    try:
        loss = model(ids, labels=ids).loss
        del loss
        model(ids, labels=ids).loss.backward()
        assert len(storages) == 2 and all(storage() is None for storage in storages)
    finally:
        gc.enable()
