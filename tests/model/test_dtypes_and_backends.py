"""The model under Transformers' attention backends (sdpa and eager agree) and in bfloat16 (forward, backward and a
decoding step, to bfloat16's precision)."""

import pytest
import torch
from helpers.models import MODES, random_model, token_ids
from modeling_delta_qwen3.routing_modes import ROUTING_MODES

pytestmark = pytest.mark.both_ends


@pytest.mark.parametrize("mode", MODES)
def test_sdpa_and_eager_agree(mode):
    """Masks and positions reach both attention backends alike. Their float32 rounding differs by ~1e-6, which
    replacement routing (AttnRes) amplifies through depth to ~1e-5 at these logits (magnitude ~3); a mask or a
    position handled differently would differ by orders of magnitude more. (In float64 the eager backend turns the
    left-padded sequence into NaN.)"""
    model = random_model(mode, gated=ROUTING_MODES[mode].gateable)
    ids = token_ids()
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding in the second row
    model.set_attn_implementation("eager")
    eager = model(ids, attention_mask=mask).logits
    model.set_attn_implementation("sdpa")
    sdpa = model(ids, attention_mask=mask).logits
    real = mask.bool()  # padded positions attend to nothing; each backend fills them differently
    torch.testing.assert_close(sdpa[real], eager[real], atol=2e-5, rtol=0)


@pytest.mark.parametrize("mode", MODES)
def test_bfloat16_forward_and_backward(mode):
    model = random_model(mode, gated=ROUTING_MODES[mode].gateable).train()
    ids = token_ids()
    reference = model(ids).logits
    model = model.to(torch.bfloat16)
    out = model(ids, labels=ids, output_routing_weights=True)
    out.loss.backward()
    assert out.logits.dtype == torch.bfloat16
    assert (out.logits.float() - reference).abs().max() < 0.1 * reference.abs().max()
    route_grads = [p.grad for n, p in model.named_parameters() if "_route." in n]
    assert all(g is not None and g.dtype == torch.bfloat16 and torch.isfinite(g).all() for g in route_grads)
    assert any(g.abs().sum() > 0 for g in route_grads)


@pytest.mark.parametrize("mode", MODES)
def test_bfloat16_decoding_step(mode):
    """A bfloat16 decoding step (routing in float32 on bfloat16 sources) gives the full forward pass's last logits,
    to bfloat16's precision."""
    model = random_model(mode, gated=ROUTING_MODES[mode].gateable).to(torch.bfloat16)
    ids = token_ids(batch=1, seq=7)
    with torch.no_grad():
        full = model(ids).logits[:, -1:]
        cache = model(ids[:, :-1], use_cache=True).past_key_values
        step = model(ids[:, -1:], past_key_values=cache, use_cache=True).logits
    assert step.dtype == torch.bfloat16
    assert (step.float() - full.float()).abs().max() < 0.05 * full.float().abs().max()
