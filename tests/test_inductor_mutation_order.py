"""The PyTorch bug behind vLLM's miscompilation of `delta_block` on the CPU, reproduced without vLLM or this model
(`inductor_mutation_order_repro.py`).

vLLM's CPU linear layers write their product into a new buffer through a custom op that mutates its first argument
(`_C.onednn_mm(out, x, ...)`). When Inductor's C++ backend fuses a flat pointwise kernel that reads such a buffer
with a `[tokens, D]` one, it recomputes the flat kernel's loops (`SchedulerNode.recompute_size_and_body`), and in
PyTorch 2.13 the recomputed reads name the buffer itself rather than the op's mutation of it: the kernel loses its
dependency on the op, and a later fusion can move it before the op, so it reads memory not yet written. A DeltaQwen3
model in `delta_block` mode has exactly this shape: the residual stream (flat) feeds each routing point's input
(`[tokens, D]`, its routing weights are per token), so DeltaQwen3 refuses vLLM's compiled mode on the CPU in that
mode (docs/SERVING.md). When this test fails, PyTorch is fixed: lift that refusal
(`_check_vllm_compilation` in `modeling_delta_qwen3.py`).

The reproduction runs in a fresh interpreter, as in a vLLM worker: after some of this suite's tests, Inductor in
the same process happened to fuse otherwise and compute it right.
"""

import subprocess
import sys
from pathlib import Path

from conftest import isolated_env

REPRO = Path(__file__).with_name("inductor_mutation_order_repro.py")


def test_inductor_still_reads_an_out_variant_ops_output_before_the_op_writes_it():
    completed = subprocess.run([sys.executable, str(REPRO)], env=isolated_env(), capture_output=True, text=True,
                               timeout=300)
    assert "largest difference between compiled and eager" in completed.stdout, completed.stderr[-3000:]
    assert completed.returncode == 1, (
        f"{completed.stdout.strip()}: this PyTorch compiles the reproduction right, so lift the refusal of vLLM's "
        "compiled mode in delta_block mode on the CPU (module docstring)"
    )
