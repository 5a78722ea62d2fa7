"""Decoding (SPEC section 5): a decoding step gives the full forward pass's last logits and routing weights from the
key-value cache alone; `generate` continues alike with and without the cache, and a left-padded batch as its
rows alone."""

import copy

import pytest
import torch
from helpers.models import MODES, random_model, token_ids
from modeling_delta_qwen3.routing_modes import ROUTING_MODES

pytestmark = pytest.mark.both_ends


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch", [1, 2])
def test_decoding_step_matches_full_forward(mode, batch):
    """A decoding step (one position per sequence: per-point logits, and single-batch products for a single
    sequence) gives the last position's logits and routing weights of a full forward pass."""
    model = random_model(mode, gated=ROUTING_MODES[mode].gateable, scale=1.0).double()
    ids = token_ids(batch=batch, seq=7)
    with torch.no_grad():
        full = model(ids, output_routing_weights=True)
        cache = model(ids[:, :-1], use_cache=True).past_key_values
        step = model(ids[:, -1:], past_key_values=cache, use_cache=True, output_routing_weights=True)
    torch.testing.assert_close(step.logits, full.logits[:, -1:], atol=1e-9, rtol=0)
    assert len(step.routing_weights) == len(full.routing_weights)
    for got, expected in zip(step.routing_weights, full.routing_weights):
        torch.testing.assert_close(got, expected[:, -1:], atol=1e-9, rtol=0)


@pytest.mark.parametrize("mode", MODES)
def test_decoding_steps_depend_on_their_arguments_alone(mode):
    """Each decoding step gives the full forward pass's logits, also from a deep copy of the cache (a prompt's cache
    reused for several continuations); the cache holds the keys and values only: nothing of the routing is kept
    from step to step, so an exported decoding step computes the same."""
    model = random_model(mode, gated=ROUTING_MODES[mode].gateable, scale=1.0).double()
    ids = token_ids(batch=1, seq=9)
    with torch.no_grad():
        cache = model(ids[:, :5], use_cache=True).past_key_values
        attributes = set(vars(cache))
        for position in range(5, 9):
            if position == 7:
                cache = copy.deepcopy(cache)
            expected = model(ids[:, : position + 1]).logits[:, -1:]
            step = model(ids[:, position : position + 1], cache=cache)
            torch.testing.assert_close(step.logits, expected, atol=1e-9, rtol=0)
            assert set(vars(cache)) == attributes


@pytest.mark.parametrize("mode", MODES)
def test_generate_with_and_without_cache(mode):
    model = random_model(mode, gated=ROUTING_MODES[mode].gateable, scale=1.0)
    prompt = token_ids(batch=1, seq=6)
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=2, eos_token_id=None)
    cached = model.generate(prompt, use_cache=True, **kwargs)
    assert cached.shape == (1, 18)
    assert torch.equal(model.generate(prompt, use_cache=False, **kwargs), cached)
    # Logits too, in float64 so that the comparison sees the maths rather than float32 rounding (which the
    # AttnRes modes, having no residual stream, amplify to ~1e-5).
    model.double()
    kwargs.update(output_logits=True, return_dict_in_generate=True)
    with_cache = model.generate(prompt, use_cache=True, **kwargs).logits
    without_cache = model.generate(prompt, use_cache=False, **kwargs).logits
    for a, b in zip(with_cache, without_cache, strict=True):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)
    model.float()
    # The same continuation as a step-by-step argmax over full forward passes.
    sequence = prompt
    for _ in range(12):
        next_token = model(sequence).logits[:, -1].argmax(-1, keepdim=True)
        sequence = torch.cat([sequence, next_token], dim=1)
    assert torch.equal(cached, sequence)


@pytest.mark.parametrize("mode", ["delta_block", "attnres_full"])
def test_left_padded_batch_generates_like_single_rows(mode):
    model = random_model(mode, gated=ROUTING_MODES[mode].gateable, scale=3.0)
    short, long = token_ids(batch=1, seq=4, seed=5)[0], token_ids(batch=1, seq=9, seed=6)[0]
    pad = 2
    batch = torch.full((2, 9), pad)
    batch[0, 5:], batch[1] = short, long
    mask = (torch.arange(9) >= 5).long().unsqueeze(0).repeat(2, 1)
    mask[1] = 1
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=pad, eos_token_id=None)
    batched = model.generate(batch, attention_mask=mask, **kwargs)
    for row, prompt in enumerate([short, long]):
        single = model.generate(prompt[None], attention_mask=torch.ones(1, len(prompt), dtype=torch.long), **kwargs)
        assert torch.equal(batched[row, 9:], single[0, len(prompt) :])
