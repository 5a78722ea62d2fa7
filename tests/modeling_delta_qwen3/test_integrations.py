"""DeltaQwen3 in Transformers: its Auto classes, the text-generation pipeline, attention functions registered with
`AttentionInterface`, and class flags that say what holds (no pipeline-parallel plan)."""

import pytest
import torch
from helpers.models import SHAPE, delta_config, random_model, token_ids
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, pipeline

from modeling_delta_qwen3 import DeltaQwen3Config, DeltaQwen3ForCausalLM, DeltaQwen3Model

pytestmark = pytest.mark.both_ends


def test_auto_classes_are_registered():
    config = delta_config("delta")
    assert isinstance(AutoConfig.for_model("delta_qwen3", num_hidden_layers=2, routing_num_blocks=2), DeltaQwen3Config)
    assert isinstance(AutoModel.from_config(config), DeltaQwen3Model)
    assert isinstance(AutoModelForCausalLM.from_config(config), DeltaQwen3ForCausalLM)


def test_text_generation_pipeline(tokenizer):
    model = random_model("delta_block", gated=True, scale=1.0)
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    prompt = "The for statement"
    text = generator(prompt, max_new_tokens=6, do_sample=False, return_full_text=False)[0]["generated_text"]
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    expected = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=2)
    assert expected.shape[1] == ids.shape[1] + 6 and text
    assert text == tokenizer.decode(expected[0, ids.shape[1] :], skip_special_tokens=True)


def test_class_flags_say_what_holds():
    """No pipeline-parallel plan (layers hand on the depth state, not hidden states), and an attention function
    registered with Transformers' `AttentionInterface` is what the layers call."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    assert DeltaQwen3ForCausalLM._pp_plan is None and DeltaQwen3Config.base_model_pp_plan is None
    assert not DeltaQwen3ForCausalLM(delta_config("delta")).supports_pp_plan
    calls = []

    def counting_attention(*args, **kwargs):
        calls.append(1)
        return sdpa_attention_forward(*args, **kwargs)

    AttentionInterface.register("counting_sdpa", counting_attention)
    model = random_model("delta_block")
    ids = token_ids()
    model.set_attn_implementation("sdpa")
    expected = model(ids).logits
    model.set_attn_implementation("counting_sdpa")
    torch.testing.assert_close(model(ids).logits, expected, atol=0, rtol=0)
    assert len(calls) == SHAPE["num_hidden_layers"]
