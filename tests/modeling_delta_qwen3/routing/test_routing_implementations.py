"""Every routing implementation against `routing_reference.route`, SPEC section 2's mix_p in plain PyTorch,
in every mode: logits, routing weights, loss and every parameter's gradient, in float64 (to 1e-12, where only
summation order differs) and float32 (to 1e-5; to 5e-5 in `attnres_full`, whose replacement routing over up to
eleven sources without a residual stream amplifies float32 rounding: 3.5e-5 at most in its embedding's gradient,
while in float64 it agrees to 1e-12 like every mode)."""

import contextlib

import pytest
import torch
from helpers.models import VARIANTS, random_model, token_ids
from helpers.routing_runs import assert_all_close, run
from helpers.spec_reference import mix as spec_mix

from modeling_delta_qwen3 import (
    DeltaQwen3ForCausalLM,
    routing,
    routing_fused,
    routing_op,
    routing_points,
    routing_reference,
)
from modeling_delta_qwen3 import modeling_delta_qwen3 as modeling

pytestmark = pytest.mark.both_ends

TOLERANCES = {torch.float64: 1e-12, torch.float32: 1e-5}


def tolerance(mode: str, dtype: torch.dtype) -> float:
    return 5e-5 if (mode, dtype) == ("attnres_full", torch.float32) else TOLERANCES[dtype]


def use_reference(model) -> None:
    model.set_routing_implementation("reference")


# A routing point computed by one call of the fast path's signature (`routing_op.route`): the reference, and the
# registered operation (here its PyTorch code; its Triton kernels in `test_fused_kernel.py`).
ROUTE_FUNCTIONS = {"reference": routing_reference.route, "operation": routing_op.route}


def point_inputs(own_source: bool, gate: bool, residual: bool) -> tuple:
    """`route`'s inputs in float64: a buffer of 5 slots of which the first 4 are read, `[2, 3, 8]` tokens each."""
    generator = torch.Generator().manual_seed(0)

    def random(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_()

    return (random(5, 2, 3, 8), 4, random(2, 3, 8) if own_source else None, random(8),
            torch.tensor([0.7], dtype=torch.float64, requires_grad=True) if gate else None,
            random(2, 3, 8) if residual else None, 1e-6)  # fmt: skip


@pytest.mark.parametrize("name", ROUTE_FUNCTIONS)
@pytest.mark.parametrize("own_source,gate,residual", [(False, False, False), (True, False, False), (False, True, True),
                                                      (True, True, False)])  # fmt: skip
def test_a_routing_point_is_the_spec_formula(name, own_source, gate, residual):
    """SPEC section 2's mix_p written loop by loop, with the gate and residual around it: the routed output, and
    the routing weights `[*tokens, n]` over the slots read and then the point's own source."""
    inputs = point_inputs(own_source, gate, residual)
    sources, count, own, w, gate_value, residual_value, eps = inputs
    point = torch.nn.Module()
    point.query, point.norm = w.detach(), torch.nn.Module()
    point.norm.weight = torch.ones(8, dtype=torch.float64)
    read = [*sources[:count].detach().unbind(0), *([own.detach()] if own_source else [])]
    log = []
    expected = spec_mix(point, read, eps, log)
    if gate:
        expected = 0.7 * expected
    if residual:
        expected = residual_value.detach() + expected
    with torch.no_grad():
        routed, weights = ROUTE_FUNCTIONS[name](*inputs)
    torch.testing.assert_close(routed, expected, atol=1e-14, rtol=0)
    torch.testing.assert_close(weights, log[0].reshape(2, 3, len(read)), atol=1e-14, rtol=0)


@pytest.mark.parametrize("name", [name for name in ROUTE_FUNCTIONS if name != "reference"])
@pytest.mark.parametrize("own_source,gate,residual", [(False, False, False), (True, True, True)])
def test_a_routing_point_has_the_reference_gradients(name, own_source, gate, residual):
    """Every input's gradient against autograd through the reference, the unread slot's zero."""
    inputs = point_inputs(own_source, gate, residual)
    leaves = [x for x in inputs if isinstance(x, torch.Tensor)]
    grad_out = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    expected = torch.autograd.grad(routing_reference.route(*inputs)[0], leaves, grad_out)
    got = torch.autograd.grad(ROUTE_FUNCTIONS[name](*inputs)[0], leaves, grad_out)
    assert not got[0][4].any()
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("mode,gated", VARIANTS)
def test_implementations_match_reference_forward_and_backward(monkeypatch, mode, gated, dtype):
    """Every implementation that runs here (the buffer is the default), with and without autograd, and with the
    points' parameters stacked up front or not (sharded, offloaded: each point then reads its own when it runs)."""
    model = random_model(mode, gated).train().to(dtype)
    ids = token_ids()
    assert model.config.routing_implementation is None
    results = {"default": run(model, ids)}
    for name in runnable_here():
        model.set_routing_implementation(name)
        results[name] = run(model, ids)
        results[f"{name} without autograd"] = run(model, ids, grad=False)
        with monkeypatch.context() as patch:
            patch.setattr(routing_points, "stacked_queries", lambda points, like: None)
            patch.setattr(routing_points, "stacked_gates", lambda points, like: None)
            results[f"{name}, parameters not stacked"] = run(model, ids)
    # `fused` reads the sources once per group of points only for batches far longer than these: here always.
    model.set_routing_implementation("fused")
    with monkeypatch.context() as patch:
        patch.setattr(routing_fused, "GROUP_OPERATIONS_BYTES", -(2**62))  # whatever the number of sources
        groups = []
        start_group = routing_fused.FusedSources._start_group
        patch.setattr(routing_fused.FusedSources, "_start_group", lambda self, first: groups.append(first) or
                      start_group(self, first))  # fmt: skip
        results["fused, grouped reads"] = run(model, ids)
        assert len(groups) >= 2, groups  # groups of points read the sources together

        groups.clear()
        patch.setattr(routing_points, "stacked_queries", lambda points, like: None)
        results["fused, grouping forced, parameters not stacked"] = run(model, ids)
        assert not groups  # a group would need its later points' queries before they run (sharded, offloaded)
    use_reference(model)
    expected = run(model, ids)
    assert any(name.endswith("_route.query") for name in expected)
    assert {"buffer", "compiled"} <= results.keys()
    for name, got in results.items():
        want = {k: v for k, v in expected.items() if k in got}
        assert len(want) == len(expected) or name.endswith("without autograd"), name
        assert_all_close(got, want, tolerance(mode, dtype))


@pytest.mark.parametrize("mode,gated", VARIANTS)
def test_fused_routing_moved_between_layers_trains_as_unmoved(monkeypatch, mode, gated):
    """The fused operation's depth state moved before every layer, as accelerate's device hooks move it (here a
    forced copy on the same device), in groups of points: the buffer, the prefixes gradients flow through, the
    sources appended since a group started and the group's partial mixtures move with it, and training computes
    what it does unmoved."""
    model = random_model(mode, gated).train().double()
    model.set_routing_implementation("fused")
    monkeypatch.setattr(routing_fused, "GROUP_OPERATIONS_BYTES", -(2**62))
    unmoved = run(model, token_ids())

    def move(module, args, kwargs):
        return (args[0].to("cpu", copy=True), *args[1:]), kwargs

    for layer in model.model.layers:
        layer.register_forward_pre_hook(move, with_kwargs=True)
    assert_all_close(run(model, token_ids()), unmoved, 1e-12)


def runnable_here() -> list[str]:
    """Every implementation but the reference that can route on this machine's CPU."""
    return [name for name, implementation in routing.IMPLEMENTATIONS.items()
            if name != "reference" and implementation.unavailable(torch.zeros(1)) is None]


@pytest.mark.parametrize("mode,gated", VARIANTS)
@pytest.mark.parametrize("batch", [1, 2], ids=["one-sequence", "batched"])
def test_decoding_steps_match_reference(monkeypatch, mode, gated, batch):
    """A decoding step of every implementation that runs here (the buffer's: one sequence's single-batch products
    and padded norms, or several sequences' logits per point) against the reference's step, in float64."""
    model = random_model(mode, gated, scale=1.0).double()
    ids = token_ids(batch=batch, seq=7)

    def steps(implementation: str | None) -> list[torch.Tensor]:
        model.set_routing_implementation(implementation)
        with torch.no_grad():
            cache = model(ids[:, :-2], use_cache=True).past_key_values
            return [model(ids[:, i : i + 1], past_key_values=cache).logits for i in (5, 6)]

    expected = steps("reference")
    for implementation in [None, *runnable_here()]:
        for got, want in zip(steps(implementation), expected, strict=True):
            torch.testing.assert_close(got, want, atol=1e-12, rtol=0, msg=lambda m: f"{implementation}: {m}")


def test_implementation_is_chosen_by_name_in_from_pretrained_and_not_saved(tmp_path):
    model = random_model("delta_block", gated=True)
    model.set_routing_implementation("reference")
    model.save_pretrained(tmp_path)
    assert "routing_implementation" not in (tmp_path / "config.json").read_text()
    loaded = DeltaQwen3ForCausalLM.from_pretrained(tmp_path, routing_implementation="compiled")
    assert loaded.config.routing_implementation == "compiled"
    assert DeltaQwen3ForCausalLM.from_pretrained(tmp_path).config.routing_implementation is None
    chosen = []
    for implementation in ["reference", *runnable_here()]:
        loaded.set_routing_implementation(implementation)
        with patch_plan(chosen):
            loaded(token_ids())
    assert chosen == ["reference", *runnable_here()]
    with pytest.raises(ValueError, match="routing_implementation='fast' is not one of reference, buffer, fla, compiled"):
        loaded.set_routing_implementation("fast")
    with pytest.raises(ValueError, match="routing_implementation='fast' is not one of"):
        DeltaQwen3ForCausalLM.from_pretrained(tmp_path, routing_implementation="fast")


@contextlib.contextmanager
def patch_plan(chosen: list):
    """Records the implementation of every forward pass's routing plan."""
    plan_routing = routing.plan_routing

    def recording(*args):
        plan = plan_routing(*args)
        chosen.append(plan.implementation)
        return plan

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(modeling, "plan_routing", recording)
        yield
