"""Quantised inference through remote code: a DeltaQwen3 checkpoint loaded with bitsandbytes' 8-bit and 4-bit
quantisation and torchao's int8 weight-only quantisation, in a process that has Transformers and the quantisation
libraries but not this project, runs in every mode, keeps its routing parameters unquantised in float32, and
computes what the float32 model with the weights the quantisation stores computes, within the tolerances below
(docs/compatibility.md, "Supported versions"). A freshly converted checkpoint, quantised, computes exactly what its
quantised Qwen3 source computes. On the CPU, bitsandbytes runs its CPU backend."""

import json

import bitsandbytes  # noqa: F401  (test dependencies, setup.cfg's `quantization` extra: missing, these tests fail)
import pytest
import torch
import torchao  # noqa: F401
from helpers.models import MODES, save_random_delta, save_tiny_qwen3
from helpers.running import last_json_line, run_without_project

from conversion import convert
from modeling_delta_qwen3.routing_modes import ROUTING_MODES

pytestmark = [pytest.mark.both_ends, pytest.mark.slow]

METHODS = ("bitsandbytes-8bit", "bitsandbytes-4bit", "torchao-int8")
# The largest |logit difference| from the float32 model with the weights the quantisation stores, as a fraction of
# its largest |logit|: for the modes with a residual stream, and for the AttnRes modes, which amplify any rounding
# through depth. bitsandbytes' 8-bit product quantises the activations too, and its 4-bit CPU kernel does not
# compute in float32; torchao's weight-only product does. Measured at all three ends of `make test` (PyTorch 2.6
# with Transformers 5.5, 2.13 and 2.15 with 5.25; bitsandbytes 0.50, torchao 0.16 and 0.18): at most 0.032 and
# 0.141 (8-bit), 0.023 and 0.056 (4-bit), 1.3e-6 and 5.0e-6 (torchao).
TOLERANCES = {
    "bitsandbytes-8bit": (0.06, 0.25),
    "bitsandbytes-4bit": (0.04, 0.1),
    "torchao-int8": (1e-4, 1e-4),
}

PROMPT = [[5, 17, 99, 230, 41, 8]]
NEW_TOKENS = 8

# Each checkpoint quantised by each method, through remote code: a projection's weight class, the dtypes of the
# routing parameters, the logits of a batch, `generate`'s greedy tokens (KV cache) and those of greedy decoding
# without the cache; and the same of the float32 model loaded from the checkpoint with each quantised projection's
# weight replaced by its dequantised values. `CHECKPOINTS`, `METHODS`, `PROMPT` and `NEW_TOKENS` are set above it.
QUANTISE_AND_REPORT = """
import json, torch
import bitsandbytes as bnb
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, TorchAoConfig
from torchao.quantization import Int8WeightOnlyConfig

CONFIGS = {
    "bitsandbytes-8bit": lambda: BitsAndBytesConfig(load_in_8bit=True),
    "bitsandbytes-4bit": lambda: BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                    bnb_4bit_compute_dtype=torch.float32),
    "torchao-int8": lambda: TorchAoConfig(Int8WeightOnlyConfig()),
}
ids = torch.randint(3, 512, (2, 12), generator=torch.Generator().manual_seed(1))


def dequantized(weight):
    if isinstance(weight, bnb.nn.Params4bit):
        return bnb.functional.dequantize_4bit(weight.data, weight.quant_state).float()
    if isinstance(weight, bnb.nn.Int8Params):  # rows of int8 values and each row's absolute maximum
        return weight.data.float() * weight.SCB.float().unsqueeze(1) / 127
    return weight.dequantize().float()


def outputs(model):
    with torch.no_grad():
        logits = model(ids).logits
        tokens = model.generate(PROMPT, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=2,
                                eos_token_id=None)
        uncached = PROMPT
        for _ in range(NEW_TOKENS):
            step = model(uncached, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            uncached = torch.cat([uncached, step], dim=1)
    return {"logits": logits.float().tolist(), "tokens": tokens.tolist(), "uncached_tokens": uncached.tolist()}


report = {}
for name, path in CHECKPOINTS.items():
    for method in METHODS:
        model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True, dtype=torch.float32,
                                                     quantization_config=CONFIGS[method]()).eval()
        twin = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True, dtype=torch.float32).eval()
        quantised = dict(model.named_modules())
        replaced = []
        for module_name, module in twin.named_modules():
            weight = getattr(quantised[module_name], "weight", None)
            if isinstance(module, torch.nn.Linear) and type(weight) is not torch.nn.Parameter:
                module.weight.data = dequantized(weight)
                replaced.append(module_name)
        report[f"{name} {method}"] = {
            "module": type(model).__module__,
            "weight_class": type(model.get_submodule(replaced[0]).weight).__name__,
            "projections": len(replaced),
            "routing_dtypes": sorted({str(p.dtype) for n, p in model.named_parameters() if "_route." in n}),
            "quantised": outputs(model),
            "float32": outputs(twin),
        }
print(json.dumps(report))
"""


def quantise_and_report(cwd, checkpoints: dict, methods=METHODS) -> dict:
    """Run `QUANTISE_AND_REPORT` over `checkpoints` (name: directory) in a process without this project."""
    paths = {name: str(path) for name, path in checkpoints.items()}
    header = (f"import torch\nCHECKPOINTS = {paths!r}\nMETHODS = {list(methods)!r}\n"
              f"PROMPT = torch.tensor({PROMPT!r})\nNEW_TOKENS = {NEW_TOKENS}\n")  # fmt: skip
    return last_json_line(run_without_project(header + QUANTISE_AND_REPORT, cwd=cwd, timeout=900).stdout)


def relative_error(quantised, reference) -> float:
    """The largest |logit difference| as a fraction of the reference's largest |logit|."""
    quantised, reference = torch.tensor(quantised), torch.tensor(reference)
    return ((quantised - reference).abs().max() / reference.abs().max()).item()


def test_quantised_models_compute_the_float32_model_of_their_stored_weights(tmp_path):
    """Every mode (gated where it can be), each method: quantised projections, routing parameters float32 and left
    alone, logits within the method's tolerance of the float32 model with the dequantised weights, and `generate`'s
    tokens those of greedy decoding without the cache; torchao's, whose product is float32's, also the float32
    model's tokens."""
    checkpoints = {mode: tmp_path / mode for mode in MODES}
    for mode, path in checkpoints.items():
        save_random_delta(path, mode)
    report = quantise_and_report(tmp_path, checkpoints)
    errors = {}
    for mode in MODES:
        for method in METHODS:
            result = report[f"{mode} {method}"]
            assert result["module"].startswith("transformers_modules.")
            assert result["weight_class"] != "Parameter"
            assert result["projections"] == 4 * 7  # every projection of the 4 layers; the output layer is kept
            assert result["routing_dtypes"] == ["torch.float32"]
            quantised, float32 = result["quantised"], result["float32"]
            errors[f"{mode} {method}"] = relative_error(quantised["logits"], float32["logits"])
            assert quantised["tokens"] == quantised["uncached_tokens"], (mode, method)
            if method == "torchao-int8":
                assert quantised["tokens"] == float32["tokens"], mode
    print(json.dumps({name: f"{error:.2e}" for name, error in errors.items()}))
    for mode in MODES:
        for method in METHODS:
            tolerance = TOLERANCES[method][0 if ROUTING_MODES[mode].residual_stream else 1]
            assert errors[f"{mode} {method}"] < tolerance, (mode, method, errors[f"{mode} {method}"])


def test_a_converted_checkpoint_quantised_computes_what_its_quantised_qwen3_source_computes(tmp_path, tokenizer):
    """Conversion is exact in the gated delta modes, and quantisation does not change that: each method quantises
    the same projections alike, and the routing adds exactly nothing (its gates are 0), so the logits and tokens
    of the converted model equal its Qwen3 source's, quantised the same way."""
    source = save_tiny_qwen3(tmp_path / "qwen3", tokenizer)
    checkpoints = {"qwen3": source}
    for mode in ("delta", "delta_block"):
        checkpoints[mode] = convert(source, tmp_path / mode, mode=mode)
    report = quantise_and_report(tmp_path, checkpoints)
    for method in METHODS:
        expected = report[f"qwen3 {method}"]["quantised"]
        for mode in ("delta", "delta_block"):
            assert report[f"{mode} {method}"]["quantised"] == expected, (mode, method)
