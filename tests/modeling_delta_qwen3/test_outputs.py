"""What the model returns besides logits: tuples with `return_dict=False`, and hidden states and attentions, which
are Qwen3's for a converted model and the layer boundaries in every mode."""

import pytest
import torch
from helpers.models import MODES, SHAPE, delta_config, random_model, tiny_qwen3_config, token_ids
from transformers import Qwen3ForCausalLM

from modeling_delta_qwen3 import DeltaQwen3ForCausalLM
from modeling_delta_qwen3.routing_modes import GATEABLE_MODES, ROUTING_MODES

pytestmark = pytest.mark.both_ends


def test_return_dict_false_gives_tuple():
    model = random_model("delta")
    ids = token_ids()
    logits = model(ids).logits
    as_tuple = model(ids, return_dict=False, use_cache=False)
    assert torch.equal(as_tuple[0], logits)


@pytest.mark.parametrize("mode", GATEABLE_MODES)
def test_converted_model_hidden_states_and_attentions_are_qwen3s(mode):
    """A gated model with Qwen3's weights and zero-initialised routing returns Qwen3's `num_hidden_layers + 1` hidden
    states (the last after the final norm) and its eager attention weights."""
    torch.manual_seed(0)
    qwen3 = Qwen3ForCausalLM(tiny_qwen3_config(**SHAPE)).eval()
    delta = DeltaQwen3ForCausalLM(delta_config(mode, gated=True)).eval()
    delta.load_state_dict(qwen3.state_dict(), strict=False)
    qwen3.set_attn_implementation("eager")
    delta.set_attn_implementation("eager")
    ids = token_ids()
    expected = qwen3(ids, output_hidden_states=True, output_attentions=True)
    out = delta(ids, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == len(expected.hidden_states) == SHAPE["num_hidden_layers"] + 1
    assert len(out.attentions) == len(expected.attentions) == SHAPE["num_hidden_layers"]
    for got, want in zip([*out.hidden_states, *out.attentions], [*expected.hidden_states, *expected.attentions]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def sublayer_io(model) -> dict[str, list[torch.Tensor]]:
    """Hooks recording, per layer, its attention's routed input (`input_layernorm`'s input), its attention output
    and weights, and its MLP output."""
    records = {"attn_input": [], "attn_output": [], "attn_weights": [], "mlp_output": []}
    for layer in model.model.layers:
        layer.input_layernorm.register_forward_hook(lambda m, args, out: records["attn_input"].append(args[0]))
        layer.self_attn.register_forward_hook(lambda m, args, out: records["attn_output"].append(out[0]))
        layer.self_attn.register_forward_hook(lambda m, args, out: records["attn_weights"].append(out[1]))
        layer.mlp.register_forward_hook(lambda m, args, out: records["mlp_output"].append(out))
    return records


@pytest.mark.parametrize("mode", MODES)
def test_hidden_states_are_the_layer_boundaries(mode):
    """Delta modes: the residual stream entering each layer, `h_0` plus every earlier sublayer's output. AttnRes
    modes: each layer's routed attention input. Then the final norm's output; attention weights under eager."""
    model = random_model(mode, gated=ROUTING_MODES[mode].gateable)
    model.set_attn_implementation("eager")
    records = sublayer_io(model)
    ids = token_ids()
    out = model.model(ids, output_hidden_states=True, output_attentions=True)
    layers = SHAPE["num_hidden_layers"]
    assert len(out.hidden_states) == layers + 1 and len(out.attentions) == layers
    torch.testing.assert_close(out.hidden_states[0], model.model.embed_tokens(ids), atol=0, rtol=0)
    torch.testing.assert_close(out.hidden_states[-1], out.last_hidden_state, atol=0, rtol=0)
    stream = out.hidden_states[0]
    for i in range(layers):
        expected = stream if ROUTING_MODES[mode].residual_stream else records["attn_input"][i]
        torch.testing.assert_close(out.hidden_states[i], expected, atol=1e-5, rtol=0)
        stream = stream + records["attn_output"][i] + records["mlp_output"][i]
        assert out.attentions[i].shape == (2, 4, 11, 11)
        torch.testing.assert_close(out.attentions[i], records["attn_weights"][i], atol=0, rtol=0)
        torch.testing.assert_close(out.attentions[i].sum(-1), torch.ones(2, 4, 11))
    assert not ROUTING_MODES[mode].residual_stream or (out.hidden_states[2] - records["attn_input"][2]).abs().max() > 1e-3
    as_tuple = model(ids, output_hidden_states=True, return_dict=False, use_cache=False)
    assert len(as_tuple[1]) == layers + 1
