"""Routing gives the same loss and gradients however the backward pass is arranged: with checkpointed layers, with
each point's backward left to its newest source or taken by the point itself, and with accelerate's device hooks
moving the depth state between layers."""

import pytest
import torch
from accelerate.hooks import AlignDevicesHook, add_hook_to_module
from helpers.models import MODES, VARIANTS, random_model, token_ids

from finetune.model import enable_activation_checkpointing
from modeling_delta_qwen3 import routing_points
from modeling_delta_qwen3.routing_modes import ROUTING_MODES

pytestmark = pytest.mark.both_ends


def _loss_and_grads(model, ids):
    model.zero_grad()
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mode,gated", VARIANTS)
@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_same_loss_and_gradients(mode, gated, reentrant):
    """Checkpointed layers route with the compiled implementation by default (see `resolve_implementation`): the
    same one computes the unchecked run."""
    model = random_model(mode, gated).train()
    ids = token_ids()
    model.set_routing_implementation("compiled")
    loss, grads = _loss_and_grads(model, ids)
    model.set_routing_implementation(None)
    enable_activation_checkpointing(model, use_reentrant=reentrant)
    assert model.model.layers[0].gradient_checkpointing
    loss_ckpt, grads_ckpt = _loss_and_grads(model, ids)
    torch.testing.assert_close(loss_ckpt, loss, atol=1e-6, rtol=0)
    assert grads.keys() == grads_ckpt.keys() and any("_route." in n for n in grads)
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("mode,gated", VARIANTS)
def test_backward_passes_left_to_the_sources_agree_with_each_points_own(monkeypatch, mode, gated):
    """With the points' parameters known up front, points leave their backward pass to their newest source (see
    `_deferred_point_backward`); with them unknown (sharded, offloaded), each point takes its own. Both give the
    same gradients, in float64."""
    model = random_model(mode, gated).train().double()
    ids = token_ids()
    loss, grads = _loss_and_grads(model, ids)
    monkeypatch.setattr(routing_points, "stacked_queries", lambda points, like: None)
    monkeypatch.setattr(routing_points, "stacked_gates", lambda points, like: None)
    own_loss, own_grads = _loss_and_grads(model, ids)
    torch.testing.assert_close(own_loss, loss, atol=1e-12, rtol=0)
    assert grads.keys() == own_grads.keys() and any(name.endswith("_route.gate") for name in grads) == gated
    for name in grads:
        torch.testing.assert_close(own_grads[name], grads[name], atol=1e-12, rtol=1e-10, msg=name)


@pytest.mark.parametrize("mode", MODES)
def test_accelerate_device_hooks_keep_loss_and_gradients(mode):
    """Dispatch with a `device_map` hooks every decoder layer to move its inputs, the depth state among them, to the
    layer's device; the moved state must keep routing over the same sources and give the same gradients."""
    model = random_model(mode, gated=ROUTING_MODES[mode].gateable).train()
    ids = token_ids()
    loss, grads = _loss_and_grads(model, ids)
    for layer in model.model.layers:
        add_hook_to_module(layer, AlignDevicesHook(execution_device="cpu", io_same_device=True))
    hooked_loss, hooked_grads = _loss_and_grads(model, ids)
    torch.testing.assert_close(hooked_loss, loss, atol=0, rtol=0)
    assert hooked_grads.keys() == grads.keys()
    for name in grads:
        torch.testing.assert_close(hooked_grads[name], grads[name], atol=0, rtol=0, msg=name)


def _moving_every_tensor(layer, args, kwargs):
    """A device hook that moves as far as the CPU can: every tensor of the depth state copied (`Tensor.to`'s
    `copy=True`), as a move to another GPU copies them."""
    state, *rest = args
    before = state.carried()
    moved = state.to("cpu", copy=True)
    assert all(new is not old for new, old in zip(moved.carried(), before, strict=True))
    return (moved, *rest), kwargs


@pytest.mark.parametrize("implementation", ["buffer", "fused", "compiled", "reference"])
@pytest.mark.parametrize("mode", MODES)
def test_a_state_moved_between_layers_keeps_loss_and_gradients(mode, implementation):
    """Every tensor of the depth state copied before every layer, as a move between devices copies them (the
    buffer's storage in place, which its earlier points' backward passes hold): the same loss and gradients, in
    float64."""
    model = random_model(mode, gated=ROUTING_MODES[mode].gateable).train().double()
    model.set_routing_implementation(implementation)
    ids = token_ids()
    loss, grads = _loss_and_grads(model, ids)
    for layer in model.model.layers:
        layer.register_forward_pre_hook(_moving_every_tensor, with_kwargs=True)
    moved_loss, moved_grads = _loss_and_grads(model, ids)
    torch.testing.assert_close(moved_loss, loss, atol=1e-12, rtol=0)
    assert moved_grads.keys() == grads.keys()
    for name in grads:
        torch.testing.assert_close(moved_grads[name], grads[name], atol=1e-12, rtol=1e-10, msg=name)
