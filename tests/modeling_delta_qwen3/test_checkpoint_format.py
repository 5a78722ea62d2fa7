"""The routing gates in the checkpoint format (SPEC section 4): one-element vectors `[1]`, and checkpoints of the
format's first version, whose gates are 0-d, load (`from_pretrained`, `load_state_dict`, under PEFT), compute what
the model that wrote them computes, and are saved with `[1]` gates."""

import pytest
import torch
from helpers.models import gate_shapes, random_model, token_ids, with_scalar_gates, write_scalar_gates
from peft import LoraConfig, PeftModel, get_peft_model

from modeling_delta_qwen3 import DeltaQwen3ForCausalLM

pytestmark = pytest.mark.both_ends


@pytest.fixture
def model_and_0d_gate_checkpoint(tmp_path):
    """A gated model with random routing (its gates non-zero, so that they change the logits), and its checkpoint
    rewritten with 0-d gates."""
    model = random_model("delta_block", gated=True)
    model.save_pretrained(tmp_path / "model")
    assert gate_shapes(tmp_path / "model") == {(1,)}
    write_scalar_gates(tmp_path / "model")
    assert gate_shapes(tmp_path / "model") == {()}
    return model, tmp_path / "model"


def test_from_pretrained_loads_0d_gates_and_saves_1_element_gates(tmp_path, model_and_0d_gate_checkpoint):
    model, path = model_and_0d_gate_checkpoint
    loaded = DeltaQwen3ForCausalLM.from_pretrained(path).eval()
    ids = token_ids()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=1e-5, rtol=0)
    loaded.save_pretrained(tmp_path / "resaved")
    assert gate_shapes(tmp_path / "resaved") == {(1,)}


def test_load_state_dict_takes_0d_gates():
    model = random_model("delta", gated=True)
    fresh = DeltaQwen3ForCausalLM(model.config).eval()
    fresh.load_state_dict(with_scalar_gates(model.state_dict()))
    assert {p.shape for name, p in fresh.named_parameters() if name.endswith("_route.gate")} == {(1,)}
    ids = token_ids()
    with torch.no_grad():
        torch.testing.assert_close(fresh(ids).logits, model(ids).logits, atol=1e-5, rtol=0)


def test_peft_adapters_on_a_0d_gate_checkpoint(tmp_path, model_and_0d_gate_checkpoint):
    """LoRA on the base loaded from the checkpoint: its adapter, saved and loaded again onto that base, computes
    the same logits, and the merged model saves `[1]` gates."""
    _, path = model_and_0d_gate_checkpoint
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    adapted = get_peft_model(DeltaQwen3ForCausalLM.from_pretrained(path), config).eval()
    with torch.no_grad():  # trained adapters: LoRA's B starts at zero
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(0))
    adapted.save_pretrained(tmp_path / "adapter")
    reloaded = PeftModel.from_pretrained(DeltaQwen3ForCausalLM.from_pretrained(path), tmp_path / "adapter").eval()
    ids = token_ids()
    with torch.no_grad():
        expected = adapted(ids).logits
        torch.testing.assert_close(reloaded(ids).logits, expected, atol=1e-5, rtol=0)
    merged = reloaded.merge_and_unload()
    merged.save_pretrained(tmp_path / "merged")
    assert gate_shapes(tmp_path / "merged") == {(1,)}
    with torch.no_grad():
        reloaded_merged = DeltaQwen3ForCausalLM.from_pretrained(tmp_path / "merged").eval()
        torch.testing.assert_close(reloaded_merged(ids).logits, expected, atol=1e-5, rtol=0)
