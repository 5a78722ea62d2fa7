"""A saved DeltaQwen3 directory is self-contained: it loads with `trust_remote_code=True` in a process that has
Transformers but not this project (SPEC section 4)."""

import json
from pathlib import Path

import pytest
import torch
import transformers
from helpers.models import gate_shapes, save_random_delta, write_scalar_gates
from helpers.paths import MODEL_CODE_FILES
from helpers.running import last_json_line, run_without_project
from packaging.version import Version

from modeling_delta_qwen3.configuration_delta_qwen3 import AUTO_MAP
from modeling_delta_qwen3.routing_modes import ROUTING_MODES

pytestmark = pytest.mark.both_ends

PROMPT = [[5, 17, 99, 230, 41, 8]]

LOAD_AND_REPORT = """
import json, sys, torch, transformers
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
path = sys.argv[1] if len(sys.argv) > 1 else "{path}"
config = AutoConfig.from_pretrained(path, trust_remote_code=True)
base = AutoModel.from_pretrained(path, trust_remote_code=True)
model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
ids = torch.tensor({prompt})
with torch.no_grad():
    out = model(ids, output_routing_weights=True)
tokens = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=2, eos_token_id=None)
{extra}
print(json.dumps({{
    "config_class": type(config).__name__, "base_class": type(base).__name__, "class": type(model).__name__,
    "module": type(model).__module__, "mode": config.routing_mode,
    "transformers": transformers.__version__, "logits": out.logits.tolist(), "n_points": len(out.routing_weights), "tokens": tokens.tolist(),
}}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(ROUTING_MODES))
def test_loads_with_trust_remote_code_without_the_project(tmp_path, mode):
    model = save_random_delta(tmp_path / "model", mode)
    files = sorted(p.name for p in (tmp_path / "model").iterdir())
    assert files == sorted(["config.json", "generation_config.json", "model.safetensors", *MODEL_CODE_FILES])
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["auto_map"] == AUTO_MAP and config["model_type"] == "delta_qwen3"

    code = LOAD_AND_REPORT.format(path=tmp_path / "model", prompt=PROMPT, extra="")
    report = last_json_line(run_without_project(code, cwd=tmp_path).stdout)
    assert report["config_class"] == "DeltaQwen3Config"
    assert report["base_class"] == "DeltaQwen3Model"
    assert report["class"] == "DeltaQwen3ForCausalLM"
    assert report["module"].startswith("transformers_modules.")
    assert report["mode"] == mode
    assert report["transformers"] == transformers.__version__
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        out = model(ids, output_routing_weights=True)
    torch.testing.assert_close(torch.tensor(report["logits"]), out.logits, atol=1e-5, rtol=0)
    assert report["n_points"] == len(out.routing_weights)
    expected = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=2, eos_token_id=None)
    assert report["tokens"] == expected.tolist()


@pytest.mark.slow
def test_resaving_a_remote_code_model_keeps_it_loadable(tmp_path):
    """Fine-tuning loads through remote code and saves again: the second save must still be self-contained."""
    model = save_random_delta(tmp_path / "first", "delta_block")
    resave = f'model.save_pretrained("{tmp_path / "second"}")'
    run_without_project(LOAD_AND_REPORT.format(path=tmp_path / "first", prompt=PROMPT, extra=resave), cwd=tmp_path)
    config = json.loads((tmp_path / "second" / "config.json").read_text())
    assert set(config["auto_map"]) == set(AUTO_MAP)
    code = LOAD_AND_REPORT.format(path=tmp_path / "second", prompt=PROMPT, extra="")
    report = last_json_line(run_without_project(code, cwd=tmp_path).stdout)
    with torch.no_grad():
        expected = model(torch.tensor(PROMPT)).logits
    torch.testing.assert_close(torch.tensor(report["logits"]), expected, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_checkpoint_with_0d_gates_loads_through_remote_code_and_is_saved_with_1_element_gates(tmp_path):
    """A checkpoint of the format's first version (SPEC section 4: its gates 0-d) computes what the model that wrote
    it computes, loaded through its remote code alone; saved again, its gates are `[1]`."""
    model = save_random_delta(tmp_path / "first", "delta_block")
    write_scalar_gates(tmp_path / "first")
    assert gate_shapes(tmp_path / "first") == {()}
    resave = f'model.save_pretrained("{tmp_path / "second"}")'
    code = LOAD_AND_REPORT.format(path=tmp_path / "first", prompt=PROMPT, extra=resave)
    report = last_json_line(run_without_project(code, cwd=tmp_path).stdout)
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        torch.testing.assert_close(torch.tensor(report["logits"]), model(ids).logits, atol=1e-5, rtol=0)
    assert report["tokens"] == model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=2,
                                              eos_token_id=None).tolist()
    assert gate_shapes(tmp_path / "second") == {(1,)}


# From 5.25 on, `from_pretrained` swaps layers for the `kernels` package's by default (`use_kernels`); Transformers
# requires that package then, and says so itself when it is missing.
KERNELS_BY_DEFAULT = Version(transformers.__version__).release >= (5, 25)

LOAD_WITH_KERNEL_OPTIONS = """
import json, sys, torch, traceback
if {without_kernels}:
    sys.modules["kernels"] = None  # as if the package were not installed: importing it fails, and find_spec is None
from transformers import AutoModelForCausalLM
report = {{}}
for name, option in {{"default": {{}}, "off": {{"use_kernels": False}}, "on": {{"use_kernels": True}}}}.items():
    try:
        model = AutoModelForCausalLM.from_pretrained("{path}", trust_remote_code=True, **option).eval()
    except Exception as error:
        raised_in = traceback.extract_tb(error.__traceback__)[-1].filename
        report[name] = {{"error": f"{{type(error).__name__}}: {{error}}", "raised_in": raised_in}}
        continue
    with torch.no_grad():
        logits = model(torch.tensor({prompt})).logits
    report[name] = {{"use_kernels": model.use_kernels, "logits": logits.tolist()}}
print(json.dumps(report))
"""


@pytest.mark.slow
def test_loads_with_kernels_on_and_off(tmp_path):
    """`use_kernels` on and off (the CPU has no kernel for any of the model's layers, so the logits are the same):
    the option is taken as Transformers takes it for its own models."""
    model = save_random_delta(tmp_path / "model", "delta_block")
    code = LOAD_WITH_KERNEL_OPTIONS.format(without_kernels=False, path=tmp_path / "model", prompt=PROMPT)
    report = last_json_line(run_without_project(code, cwd=tmp_path).stdout)
    with torch.no_grad():
        expected = model(torch.tensor(PROMPT)).logits
    for name, use_kernels in {"default": KERNELS_BY_DEFAULT, "off": False, "on": True}.items():
        assert report[name]["use_kernels"] is use_kernels, name
        torch.testing.assert_close(torch.tensor(report[name]["logits"]), expected, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_without_the_kernels_package_the_error_is_transformers_own(tmp_path):
    save_random_delta(tmp_path / "model", "delta")
    code = LOAD_WITH_KERNEL_OPTIONS.format(without_kernels=True, path=tmp_path / "model", prompt=PROMPT)
    report = last_json_line(run_without_project(code, cwd=tmp_path).stdout)
    assert "logits" in report["off"]
    refused = ["on", "default"] if KERNELS_BY_DEFAULT else ["on"]
    for name in refused:
        assert "transformers" in Path(report[name]["raised_in"]).parts, report[name]  # not the model's code
        assert report[name]["error"].startswith("ValueError: ") and "kernels" in report[name]["error"], report[name]
    assert ("logits" in report["default"]) is not KERNELS_BY_DEFAULT


def test_project_is_really_blocked_in_the_isolated_process(tmp_path):
    with pytest.raises(AssertionError, match="must not import"):
        run_without_project("import modeling_delta_qwen3", cwd=tmp_path)
