"""The PyTorch bug behind vLLM's miscompilation of `delta_block` on the CPU, reproduced without vLLM or this model
(`inductor_mutation_order_repro.py`).

vLLM's CPU linear layers write their product into a new buffer through a custom op that mutates its first argument
(`_C.onednn_mm(out, x, ...)`). When Inductor's C++ backend fuses a flat pointwise kernel that reads such a buffer
with a `[tokens, D]` one, it recomputes the flat kernel's loops (`SchedulerNode.recompute_size_and_body`), and
before PyTorch 2.14 the recomputed reads name the buffer itself rather than the op's mutation of it: the kernel
loses its dependency on the op, and a later fusion can move it before the op, so it reads memory not yet written
(pytorch/pytorch#185509, fixed in 2.14 by #185873). A DeltaQwen3 model in `delta_block` mode has exactly this
shape: the residual stream (flat) feeds each routing point's input (`[tokens, D]`, its routing weights are per
token), so under PyTorch before 2.14 DeltaQwen3 refuses vLLM's compiled mode on the CPU in that mode
(`_check_vllm_compilation` in `modeling_delta_qwen3.py`, docs/SERVING.md). This test pins down that the refusal's
version test matches PyTorch's behaviour: `make test` runs it under PyTorch 2.13 (the bug) and 2.15 (fixed).

The reproduction runs in a fresh interpreter, as in a vLLM worker: after some of this suite's tests, Inductor in
the same process happened to fuse otherwise and compute it right.
"""

import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from helpers.running import isolated_env

from modeling_delta_qwen3.configuration_delta_qwen3 import DeltaQwen3Config
from modeling_delta_qwen3.modeling_delta_qwen3 import _check_vllm_compilation, inductor_orders_out_variant_writes_right

pytestmark = pytest.mark.newest_end

REPRO = Path(__file__).with_name("inductor_mutation_order_repro.py")


def test_inductor_miscompiles_the_reproduction_exactly_where_the_model_refuses_vllms_compiled_mode():
    completed = subprocess.run([sys.executable, str(REPRO)], env=isolated_env(), capture_output=True, text=True,
                               timeout=300)
    assert "largest difference between compiled and eager" in completed.stdout, completed.stderr[-3000:]
    fixed = inductor_orders_out_variant_writes_right()
    assert completed.returncode == (0 if fixed else 1), (
        f"{completed.stdout.strip()}: the model takes torch {torch.__version__} to be "
        f"{'fixed' if fixed else 'affected'} (inductor_orders_out_variant_writes_right)"
    )


def test_the_model_refuses_vllms_compiled_mode_on_the_cpu_only_under_an_affected_pytorch(monkeypatch):
    """vLLM's CPU build pins PyTorch 2.13 (`tests/serving/test_vllm.py` sees the refusal there); vLLM's
    configuration, as a compiled CPU engine being built would hold it, stands in for vLLM under the PyTorch that
    runs this test."""
    vllm_config = types.SimpleNamespace(
        device_config=types.SimpleNamespace(device_type="cpu"),
        compilation_config=types.SimpleNamespace(mode="VLLM_COMPILE", backend="inductor"),
    )
    config_module = types.ModuleType("vllm.config")
    config_module.CompilationMode = types.SimpleNamespace(NONE="NONE")
    config_module.get_current_vllm_config_or_none = lambda: vllm_config
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.config", config_module)
    config = DeltaQwen3Config(num_hidden_layers=2, routing_num_blocks=2, routing_mode="delta_block")
    config._attn_implementation = "vllm"
    if inductor_orders_out_variant_writes_right():
        _check_vllm_compilation(config)
    else:
        with pytest.raises(ValueError, match=r"with PyTorch 2\.1[0-3].*--enforce-eager"):
            _check_vllm_compilation(config)
    vllm_config.device_config.device_type = "cuda"
    _check_vllm_compilation(config)
