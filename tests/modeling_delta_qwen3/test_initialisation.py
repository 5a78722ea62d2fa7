"""A DeltaQwen3 model is Qwen3's parameters plus zero-initialised routing points (SPEC section 3): gated, it
computes what Qwen3 computes until the gates open; ungated, it adds the uniform mean of the sources."""

import pytest
import torch
from helpers.models import MODES, SHAPE, delta_config, tiny_qwen3_config, token_ids
from helpers.spec_reference import randomize_routing
from transformers import Qwen3ForCausalLM

from modeling_delta_qwen3 import DeltaQwen3ForCausalLM
from modeling_delta_qwen3.routing_modes import GATEABLE_MODES, ROUTING_MODES

pytestmark = pytest.mark.both_ends


@pytest.mark.parametrize("mode", MODES)
def test_parameter_names_shapes_and_init(mode):
    gated = ROUTING_MODES[mode].gateable
    config = delta_config(mode, gated)
    model = DeltaQwen3ForCausalLM(config)
    routing = {name: p for name, p in model.state_dict().items() if "_route." in name}
    expected = set()
    for i in range(config.num_hidden_layers):
        for kind in (["attn", "mlp"] if i >= 1 else ["mlp"]):
            expected |= {f"model.layers.{i}.{kind}_route.query", f"model.layers.{i}.{kind}_route.norm.weight"}
            if gated:
                expected.add(f"model.layers.{i}.{kind}_route.gate")
    if ROUTING_MODES[mode].final_point:
        expected |= {"model.final_route.query", "model.final_route.norm.weight"}
    assert set(routing) == expected
    for name, value in routing.items():
        shape, fill = {"query": ((64,), 0.0), "weight": ((64,), 1.0), "gate": ((1,), 0.0)}[name.rsplit(".", 1)[1]]
        assert value.shape == shape
        assert torch.equal(value, torch.full(shape, fill))
    qwen3_names = set(Qwen3ForCausalLM(tiny_qwen3_config(**SHAPE)).state_dict())
    assert set(model.state_dict()) - expected == qwen3_names


@pytest.mark.parametrize("mode", GATEABLE_MODES)
@pytest.mark.parametrize("tied", [False, True])
def test_gated_zero_init_reproduces_qwen3(mode, tied):
    torch.manual_seed(0)
    qwen3 = Qwen3ForCausalLM(tiny_qwen3_config(**SHAPE, tie_word_embeddings=tied)).eval()
    delta = DeltaQwen3ForCausalLM(delta_config(mode, gated=True, tie_word_embeddings=tied)).eval()
    missing, unexpected = delta.load_state_dict(qwen3.state_dict(), strict=False)
    assert not unexpected and all("_route." in name for name in missing)
    ids = token_ids()
    expected = qwen3(ids).logits
    torch.testing.assert_close(delta(ids).logits, expected, atol=1e-5, rtol=0)
    # Once the gates open, routing changes the function.
    randomize_routing(delta)
    assert (delta(ids).logits - expected).abs().max() > 1e-2


def test_ungated_zero_init_adds_the_mean_of_the_sources():
    """Ungated, zero queries add the uniform mean of the sources. In `delta` mode that mean is `h_s / n`, which
    the pre-norm cancels (up to its eps); in `delta_block` it is not proportional to `h_s`, so the function moves."""
    torch.manual_seed(0)
    qwen3 = Qwen3ForCausalLM(tiny_qwen3_config(**SHAPE)).eval()
    ids = token_ids()
    expected = qwen3(ids).logits
    differences = {}
    for mode in GATEABLE_MODES:
        ungated = DeltaQwen3ForCausalLM(delta_config(mode, gated=False)).eval()
        ungated.load_state_dict(qwen3.state_dict(), strict=False)
        differences[mode] = (ungated(ids).logits - expected).abs().max().item()
    assert differences["delta"] < 1e-4
    assert differences["delta_block"] > 1e-2
