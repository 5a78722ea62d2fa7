"""The model under Transformers' attention backends (sdpa and eager agree) and in bfloat16 (forward, backward and a
decoding step, to bfloat16's precision), with its routing parameters kept in float32 when loaded in half precision."""

import pytest
import torch
from helpers.models import MODES, random_model, token_ids

from modeling_delta_qwen3 import DeltaQwen3ForCausalLM
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


HALF_PRECISION = [torch.bfloat16, torch.float16]


def dtypes_by_kind(model) -> dict[str, set[torch.dtype]]:
    """The dtypes of the routing parameters and of all the others."""
    kinds: dict[str, set[torch.dtype]] = {"routing": set(), "other": set()}
    for name, parameter in model.named_parameters():
        kinds["routing" if "_route." in name else "other"].add(parameter.dtype)
    return kinds


@pytest.mark.parametrize("dtype", HALF_PRECISION)
def test_routing_parameters_stay_float32_in_a_half_precision_model(tmp_path, dtype):
    """Loaded (`from_pretrained(..., dtype=...)`) or built (`from_config`) in bfloat16 or float16, the model keeps
    its routing queries, norm weights and gates in float32, as Transformers keeps the modules a model names in
    `_keep_in_fp32_modules_strict`; everything else is in the dtype asked for."""
    random_model("delta_block", gated=True).save_pretrained(tmp_path)
    loaded = DeltaQwen3ForCausalLM.from_pretrained(tmp_path, dtype=dtype)
    built = DeltaQwen3ForCausalLM._from_config(loaded.config, dtype=dtype)
    for model in (loaded, built):
        assert dtypes_by_kind(model) == {"routing": {torch.float32}, "other": {dtype}}


@pytest.mark.parametrize("mode", MODES)
def test_bfloat16_model_with_float32_routing_forward_backward_and_decoding(tmp_path, mode):
    """Loaded in bfloat16 (routing parameters in float32, hidden states in bfloat16), every mode computes the
    float32 logits to bfloat16's precision, its routing gradients are float32, and a decoding step gives the full
    forward pass's last logits. Replacement routing (AttnRes) amplifies rounding through depth: bfloat16 moves these
    random models' largest logit by up to about a quarter of its size there (0.69 of 2.87 for `attnres_full`; loaded
    in bfloat16, the rotary frequencies stay float32, which `.to(torch.bfloat16)` rounds, and the errors land
    differently), by under a tenth with a residual stream."""
    reference_model = random_model(mode, gated=ROUTING_MODES[mode].gateable)
    reference_model.save_pretrained(tmp_path)
    ids = token_ids()
    with torch.no_grad():
        reference = reference_model(ids).logits
    model = DeltaQwen3ForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).train()
    out = model(ids, labels=ids)
    out.loss.backward()
    assert out.logits.dtype == torch.bfloat16
    tolerance = 0.1 if ROUTING_MODES[mode].residual_stream else 0.35
    assert (out.logits.float() - reference).abs().max() < tolerance * reference.abs().max()
    route_grads = [p.grad for n, p in model.named_parameters() if "_route." in n]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in route_grads)
    model.eval()
    prompt = ids[:1, :7]
    with torch.no_grad():
        full = model(prompt).logits[:, -1:]
        cache = model(prompt[:, :-1], use_cache=True).past_key_values
        step = model(prompt[:, -1:], past_key_values=cache, use_cache=True).logits
    assert (step.float() - full.float()).abs().max() < 0.05 * full.float().abs().max()


def routing_after_adamw_steps(model, ids: torch.Tensor, steps: int = 3) -> dict[str, torch.Tensor]:
    """The routing norm weights and gates after `steps` AdamW steps of pure fine-tuning (no float32 master copy:
    parameters are updated in their own dtype), at a learning rate of 5e-4 without decay."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.0)
    for _ in range(steps):
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return {n: p.detach().float().clone() for n, p in model.named_parameters() if n.endswith(("norm.weight", "gate"))
            and "_route." in n}  # fmt: skip


def moved(after: dict[str, torch.Tensor], before: dict[str, torch.Tensor]) -> set[str]:
    return {name for name, value in after.items() if not torch.equal(value, before[name].float())}


def test_pure_bfloat16_fine_tuning_moves_routing_norms_and_gates(tmp_path):
    """What fine-tuning a converted checkpoint learns first is in the routing: norm weights near 1 and gates. An
    AdamW step of 5e-4 moves a value near 1 by less than half of bfloat16's spacing there (2**-8 below 1, 2**-7
    above), so stored in bfloat16 they would never move; loaded in bfloat16, the model keeps them in float32 and
    the same ones move as in float32 training (every gate, and the norm weights of the points with more than one
    source: with one source the routing weight is 1 whatever the norm)."""
    source = random_model("delta_block", gated=True)
    with torch.no_grad():  # a trained state: gates switched on, norm weights at their initial 1
        for name, parameter in source.named_parameters():
            if name.endswith("_route.gate"):
                parameter.fill_(0.5)
            elif "_route.norm" in name:
                parameter.fill_(1.0)
    source.save_pretrained(tmp_path)
    start, ids = dict(source.named_parameters()), token_ids()

    in_float32 = moved(routing_after_adamw_steps(DeltaQwen3ForCausalLM.from_pretrained(tmp_path).train(), ids), start)
    assert any(name.endswith("gate") for name in in_float32) and any("norm" in name for name in in_float32)
    loaded = DeltaQwen3ForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).train()
    assert moved(routing_after_adamw_steps(loaded, ids), start) == in_float32

    # The same steps with the routing stored in bfloat16, as `model.to(torch.bfloat16)` casts it: nothing moves.
    cast = DeltaQwen3ForCausalLM.from_pretrained(tmp_path).to(torch.bfloat16).train()
    assert dtypes_by_kind(cast)["routing"] == {torch.bfloat16}
    assert moved(routing_after_adamw_steps(cast, ids), start) == set()
