"""DeltaQwen3 behaves as Transformers' own models do where Transformers' common tests look: tuples with
`return_dict=False`, attentions under sdpa, the deprecated cache argument, gradient checkpointing through
`GradientCheckpointingLayer`, `torch.export` of decoding, and the task heads Qwen3 has."""

import json
import logging as std_logging
import warnings

import pytest
import torch
from helpers.models import delta_config, random_model, tiny_qwen3_config, token_ids
from helpers.running import last_json_line, run_without_project
from transformers import (
    Qwen3ForCausalLM,
    Qwen3ForSequenceClassification,
    Qwen3ForTokenClassification,
)
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import logging

from conversion import convert, verify
from finetune.model import enable_activation_checkpointing
from modeling_delta_qwen3 import DeltaQwen3Model
from modeling_delta_qwen3.modeling_delta_qwen3 import CACHE_NAME


def _flat(values) -> list[torch.Tensor]:
    """The tensors of a model output's tuple, its caches and nested tuples opened."""
    flat = []
    for value in values:
        if isinstance(value, torch.Tensor):
            flat.append(value)
        elif isinstance(value, (tuple, list)):
            flat += _flat(value)
    return flat


@pytest.mark.parametrize("head", [False, True], ids=["model", "causal-lm"])
def test_return_dict_false_gives_the_outputs_tuple(head):
    torch.manual_seed(0)
    model = random_model("delta_block", gated=True) if head else DeltaQwen3Model(delta_config("delta")).eval()
    ids = token_ids()
    with torch.no_grad():
        as_dict = model(ids, output_hidden_states=True)
        as_tuple = model(ids, output_hidden_states=True, return_dict=False)
        model.config.return_dict = False
        from_config = model(ids, output_hidden_states=True)
    assert type(as_tuple) is tuple and type(from_config) is tuple
    expected = _flat(as_dict.to_tuple())
    for got in (as_tuple, from_config):
        assert len(got) == len(as_dict.to_tuple())
        for a, b in zip(_flat(got), expected, strict=True):
            torch.testing.assert_close(a, b, atol=0, rtol=0)


def _sdpa_warnings(run) -> list[str]:
    """What Transformers logs while `run()` runs, its once-only warnings reset first."""
    std_logging.Logger.warning_once.cache_clear()
    records = []
    handler = std_logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.get_logger("transformers")
    logger.addHandler(handler)
    try:
        run()
    finally:
        logger.removeHandler(handler)
    return [message for message in records if "output_attentions" in message]


def test_output_attentions_under_sdpa_warn_and_give_what_sdpa_gives():
    """As for Qwen3: sdpa computes no attention weights, says so once, and the output has one None per layer (eager
attention's weights: `test_outputs.test_hidden_states_are_the_layer_boundaries`)."""
    config = delta_config("delta_block", gated=True)
    torch.manual_seed(0)
    qwen3 = Qwen3ForCausalLM(config).eval()
    model = random_model("delta_block", gated=True)
    ids = token_ids()
    for m in (qwen3, model):
        m.config._attn_implementation = "sdpa"
    with torch.no_grad():
        qwen3_warnings = _sdpa_warnings(lambda: qwen3(ids, output_attentions=True))
        outputs = []
        warned = _sdpa_warnings(lambda: outputs.append(model(ids, output_attentions=True)))
        plain = model(ids)
    assert warned == qwen3_warnings and warned
    assert outputs[0].attentions == (None,) * config.num_hidden_layers and plain.attentions is None
    torch.testing.assert_close(outputs[0].logits, plain.logits, atol=0, rtol=0)


def _cache_warnings(model, ids) -> tuple[list[type], torch.Tensor]:
    """The warning categories that naming the cache `past_key_values=` raises in a decoding step, and its logits."""
    with torch.no_grad():
        cache = getattr(model(ids[:, :-1], use_cache=True), CACHE_NAME)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            logits = model(ids[:, -1:], past_key_values=cache).logits
    return [w.category for w in caught if "past_key_values" in str(w.message)], logits


def test_past_key_values_argument_warns_as_for_qwen3():
    """Where Transformers has renamed the cache argument to `cache`, the old name still works and warns, as it does
    for Qwen3; where it has not, it is the argument's name and does not warn."""
    ids = token_ids()
    torch.manual_seed(0)
    qwen3_categories, _ = _cache_warnings(Qwen3ForCausalLM(delta_config()).eval(), ids)
    model = random_model("delta_block", gated=True)
    categories, logits = _cache_warnings(model, ids)
    assert categories == qwen3_categories
    assert bool(categories) == (CACHE_NAME == "cache")
    with torch.no_grad():
        cache = getattr(model(ids[:, :-1], use_cache=True), CACHE_NAME)
        torch.testing.assert_close(model(ids[:, -1:], **{CACHE_NAME: cache}).logits, logits, atol=0, rtol=0)


def test_decoder_layers_are_checkpointed_by_transformers():
    """Activation checkpointing checkpoints each decoder layer once per forward pass, through Transformers'
    `GradientCheckpointingLayer`, and the layers then keep only their inputs for backward: checkpointing saves
    memory (the gradients equal the unchecked run's:
    `tests/modeling_delta_qwen3/routing/test_routing_gradients.py::test_gradient_checkpointing_same_loss_and_gradients`)."""
    model = random_model("delta", gated=True).train()
    ids = token_ids(seq=32)
    assert all(isinstance(layer, GradientCheckpointingLayer) for layer in model.model.layers)
    saved_plain = _saved_bytes(model, ids)
    enable_activation_checkpointing(model, use_reentrant=False)
    calls = []
    for layer in model.model.layers:
        checkpoint = layer._gradient_checkpointing_func
        layer._gradient_checkpointing_func = lambda *args, _f=checkpoint, **kwargs: calls.append(1) or _f(*args, **kwargs)
    saved_checkpointed = _saved_bytes(model, ids)
    assert len(calls) == model.config.num_hidden_layers
    assert saved_checkpointed < 0.5 * saved_plain


def _saved_bytes(model, ids) -> int:
    """The bytes autograd saves for backward outside checkpointed regions, in one training forward pass."""
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(ids, labels=ids).loss.backward()
    return total


def test_buffer_routing_refuses_checkpointed_layers():
    model = random_model("delta").train()
    enable_activation_checkpointing(model)
    model.set_routing_implementation("buffer")
    with pytest.raises(ValueError, match="routing_implementation='buffer' cannot route layers that gradient "
                                         "checkpointing recomputes.*use 'compiled'"):
        model(token_ids())
    model.set_routing_implementation("compiled")
    model(token_ids()).logits.sum().backward()


@pytest.mark.slow
def test_exported_decoding_gives_generates_tokens():
    """`torch.export` through Transformers' ExecuTorch recipe (static cache, one token a step): greedy tokens from the
    exported program equal `generate`'s."""
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    model = random_model("delta_block", gated=True, scale=1.0)
    model.generation_config.cache_implementation = "static"
    prompt = token_ids(batch=1, seq=6)
    expected = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=2, eos_token_id=None)
    exportable = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=16)
    step = exportable.export(input_ids=prompt[:, :1], cache_position=torch.tensor([0])).module()
    tokens = prompt[0].tolist()
    for position in range(expected.shape[1] - 1):
        logits = step(input_ids=torch.tensor([[tokens[position]]]), cache_position=torch.tensor([position]))
        if position >= prompt.shape[1] - 1:
            tokens.append(int(logits[0, -1].argmax()))
    assert tokens == expected[0].tolist()


HEADS_AGAINST_QWEN3 = """
import json, sys, torch
from transformers import AutoConfig, AutoModel, AutoModelForQuestionAnswering, \\
    AutoModelForSequenceClassification, AutoModelForTokenClassification
source, converted = sys.argv[1:3] if len(sys.argv) > 2 else ("{source}", "{converted}")
ids = torch.randint(3, 512, (2, 9), generator=torch.Generator().manual_seed(0))
report = {{}}
for auto, head in [(AutoModelForSequenceClassification, "score"), (AutoModelForTokenClassification, "score"),
                   (AutoModelForQuestionAnswering, "qa_outputs")]:
    qwen3 = auto.from_config(AutoConfig.from_pretrained(source, num_labels=3, pad_token_id=2)).eval()
    # The source's decoder, under whatever prefix Qwen3's head keeps it (`transformer.` for question answering)
    qwen3.base_model.load_state_dict(AutoModel.from_pretrained(source).state_dict())
    delta = auto.from_pretrained(converted, num_labels=3, pad_token_id=2, trust_remote_code=True).eval()
    getattr(delta, head).load_state_dict(getattr(qwen3, head).state_dict())  # the new head, the same in both
    with torch.no_grad():
        got, want = delta(ids), qwen3(ids)
    keys = [k for k in want.keys() if k.endswith("logits")]
    report[auto.__name__] = {{
        "class": type(delta).__name__, "module": type(delta).__module__,
        "max_difference": max((got[k] - want[k]).abs().max().item() for k in keys),
        "scale": max(want[k].abs().max().item() for k in keys),
    }}
print(json.dumps(report))
"""


@pytest.mark.slow
def test_converted_checkpoint_serves_qwen3s_task_heads(tmp_path, qwen3_checkpoint):
    """A converted checkpoint loads through the Auto classes of Qwen3's other heads (sequence and token
    classification, question answering) with `trust_remote_code=True`, without this project, and with the same new
    head computes what Qwen3's head model computes from the source."""
    converted = convert(qwen3_checkpoint, tmp_path / "converted", mode="delta_block", num_blocks=2)
    code = HEADS_AGAINST_QWEN3.format(source=qwen3_checkpoint, converted=converted)
    report = last_json_line(run_without_project(code, cwd=tmp_path).stdout)
    assert [r["class"] for r in report.values()] == [
        "DeltaQwen3ForSequenceClassification", "DeltaQwen3ForTokenClassification", "DeltaQwen3ForQuestionAnswering"
    ]
    for result in report.values():
        assert result["module"].startswith("transformers_modules.")
        assert result["scale"] > 1e-3 and result["max_difference"] < 1e-5


@pytest.mark.parametrize("head", [Qwen3ForSequenceClassification, Qwen3ForTokenClassification])
def test_converting_a_head_checkpoint_keeps_its_head(tmp_path, head):
    """A fine-tuned Qwen3 classifier converts into the DeltaQwen3 model with the same head, which computes what the
    source computes (`verify` loads both with the head's Auto class)."""
    torch.manual_seed(0)
    head(tiny_qwen3_config(num_labels=3)).save_pretrained(tmp_path / "source")
    out = convert(tmp_path / "source", tmp_path / "converted", mode="delta_block", num_blocks=2)
    config = json.loads((out / "config.json").read_text())
    delta_class = head.__name__.replace("Qwen3", "DeltaQwen3")
    assert config["architectures"] == [delta_class] and len(config["id2label"]) == 3
    card = (out / "README.md").read_text()
    assert f"model = {head.__name__.replace('Qwen3For', 'AutoModelFor')}.from_pretrained(" in card
    assert "generate" not in card and "vllm serve" not in card
    assert verify(tmp_path / "source", out) < 1e-5
