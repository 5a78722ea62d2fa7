"""The model, routed by its default implementation (`buffer`), against SPEC section 2 written out loop by loop
(`helpers/spec_reference.py`), in every mode, gated and not, with and without autograd; and the routing weights each
point returns: one per source it reads, summing to one. The other implementations are compared with the reference
implementation in `test_routing_implementations.py`."""

import pytest
import torch
from helpers.models import MODES, VARIANTS, delta_config, random_model, token_ids
from helpers.spec_reference import reference_forward

from modeling_delta_qwen3 import DeltaQwen3ForCausalLM
from modeling_delta_qwen3.routing_buffer import TrainingBuffer

pytestmark = pytest.mark.both_ends


@pytest.mark.parametrize("mode,gated", VARIANTS)
@pytest.mark.parametrize("num_blocks", [2, 3])
@pytest.mark.parametrize("grad", [True, False], ids=["autograd", "inference"])
def test_matches_spec_reference(mode, gated, num_blocks, grad):
    """Both of the buffer's regimes here: with autograd (its hand-written backward) and without."""
    model = random_model(mode, gated)
    model.config.routing_num_blocks = num_blocks
    ids = token_ids()
    expected_logits, expected_weights = reference_forward(model, ids)
    with torch.set_grad_enabled(grad):
        out = model.double()(ids, output_routing_weights=True)
    torch.testing.assert_close(out.logits, expected_logits, atol=1e-5, rtol=0)
    assert len(out.routing_weights) == len(expected_weights)
    for got, expected in zip(out.routing_weights, expected_weights):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # In float32 the model differs from the float64 reference by rounding alone.
    with torch.set_grad_enabled(grad):
        logits32 = model.float()(ids).logits
    torch.testing.assert_close(logits32.double(), expected_logits, atol=1e-4, rtol=0)


def test_reference_is_sensitive_to_routing():
    """The reference would catch a model that ignored its routing parameters."""
    model = random_model("delta")
    ids = token_ids()
    before, _ = reference_forward(model, ids)
    with torch.no_grad():
        model.model.layers[3].mlp_route.query.mul_(-1)
    after, _ = reference_forward(model, ids)
    assert (before - after).abs().max() > 1e-3


@pytest.mark.parametrize("mode", MODES)
def test_routing_weight_shapes(monkeypatch, mode):
    kept = []  # per source appended, the buffer's capacity

    def append(self, x, append=TrainingBuffer.append):
        kept.append(self.storage.capacity)
        append(self, x)

    monkeypatch.setattr(TrainingBuffer, "append", append)
    config = delta_config(mode)  # 5 layers, 2 blocks of 3 layers
    out = DeltaQwen3ForCausalLM(config)(token_ids(batch=2, seq=7), output_routing_weights=True)
    counts = [w.shape[-1] for w in out.routing_weights]
    # Only sources that some point reads are kept (in delta mode, not the last sublayer's output), in a buffer
    # of just their number.
    assert kept == [max(counts)] * max(counts)
    expected = {
        "delta": list(range(2, 11)),
        "delta_block": [1] * 5 + [2] * 4,
        "attnres_full": list(range(2, 12)),
        "attnres_block": [2] * 5 + [2] + [3] * 3 + [3],
    }[mode]
    assert counts == expected
    for weights in out.routing_weights:
        assert weights.shape[:2] == (2, 7)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 7))
