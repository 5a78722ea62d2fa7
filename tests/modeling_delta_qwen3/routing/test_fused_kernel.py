"""The `"fused"` routing implementation's registered operation, `torch.ops.delta_qwen3.route`: PyTorch's own checks of a
custom operation (`torch.library.opcheck`: schema, fake tensors, autograd registration, `torch.compile`), and its
Triton kernels run on the CPU by Triton's interpreter in a fresh interpreter (`tests/modeling_delta_qwen3/routing/
fused_kernel_on_cpu.py`) against the operation's PyTorch code, against the spec's formula, and through the model in
every mode; a copy of the kernels with a deliberate mistake fails the same comparisons. The kernels are also compiled
for NVIDIA GPUs by Triton's own compiler (`tests/modeling_delta_qwen3/routing/kernels_for_gpu.py`): they compile, and their rows fit in
registers. Both with the Triton that PyTorch 2.13's CUDA wheels pin (`.venv-fla`, beside the main environment's
PyTorch) and the newest supported PyTorch's (`.venv-torch-2.15`, with that PyTorch); compiled with the oldest
supported PyTorch's too (`.venv-oldest`), whose Triton's interpreter does not run with NumPy 2. Every other test of the
model runs the operation's PyTorch code (`tests/modeling_delta_qwen3/routing/test_routing_implementations.py` compares it with the
reference in every mode)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.environments import require_environment
from helpers.paths import FLA_PATH, NEWEST_TORCH_PATH, OLDEST_PATH, REPO_ROOT
from helpers.running import isolated_env
from torch._subclasses.fake_tensor import FakeTensorMode

from modeling_delta_qwen3 import routing, routing_op
from modeling_delta_qwen3 import routing_reference

KERNEL_SCRIPT = Path(__file__).with_name("fused_kernel_on_cpu.py")
COMPILE_SCRIPT = Path(__file__).with_name("kernels_for_gpu.py")
# Relative errors (largest absolute difference over the largest absolute expected value). float32: measured up to
# 3e-6. bfloat16: the kernels and the PyTorch code round the same float32 result to bfloat16 apart by at most one
# unit in the last place, 2^-7 of the largest value; gradients of `w` and the gate, kept in float32, to 3e-6.
OP_TOLERANCES = {"float32": 1e-5, "bfloat16": 1e-2}
# The model through the kernels against the "reference" implementation, float32: measured up to 3e-6 in logits and
# routing weights and 3e-5 in gradients (a gate's, whose gradient is a sum of many cancelling terms).
MODEL_TOLERANCES = {"logits": 1e-5, "weights": 1e-5, "gradients": 1e-4}
TRITONS = {"oldest-torch": OLDEST_PATH, "torch-2.13": FLA_PATH, "newest-torch": NEWEST_TORCH_PATH}
INTERPRETED_TRITONS = ("torch-2.13", "newest-torch")
# Bytes of local memory a thread may use: some `ptxas` releases keep a program to fewer registers by spilling a few
# values (up to 16 bytes a thread seen, with the Tritons of PyTorch 2.6 and 2.15); the rows of four grouped points past
# 2048 columns, which do not fit, spill 40 bytes and more.
LOCAL_MEMORY_ALLOWANCE = 16


def sample_inputs(dtype: torch.dtype, own_source: bool, gate: bool, residual: bool) -> tuple:
    generator = torch.Generator().manual_seed(0)
    compute = torch.promote_types(dtype, torch.float32)

    def random(*size, dtype=dtype):
        return torch.randn(*size, generator=generator, dtype=torch.float64).to(dtype).requires_grad_()

    return (random(3, 2, 5, 16), 3, random(2, 5, 16) if own_source else None, random(16, dtype=compute),
            random((), dtype=compute) if gate else None, random(2, 5, 16) if residual else None, 1e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("own_source,gate,residual", [(False, False, False), (True, False, False), (False, True, True)])
def test_operation_passes_opcheck(dtype, own_source, gate, residual):
    torch.library.opcheck(torch.ops.delta_qwen3.route.default, sample_inputs(dtype, own_source, gate, residual))


def grouped_inputs(dtype: torch.dtype, own_source: bool) -> tuple[tuple, tuple]:
    """`route_partial`'s inputs for a group of 3 points over the first 2 of 4 sources, and `route`'s for its second
    point, which reads the other 2 and that point's partial mixture."""
    sources, _, own, w, gate, residual, eps = sample_inputs(dtype, own_source, True, True)
    sources = torch.cat([sources, sources[:1] * 0.5]).detach().requires_grad_()
    w_group = torch.stack([w, w.flip(0), 2 * w]).detach().requires_grad_()
    mix, group_logits = routing_op.route_partial(sources, 2, w_group, eps)
    partial_mix, partial_logits = mix[1].detach().requires_grad_(), group_logits[1].detach().requires_grad_()
    return (sources, 2, w_group, eps), (sources, 4, own, w, gate, residual, eps, 2, partial_mix, partial_logits)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("own_source", [False, True])
def test_grouped_reads_pass_opcheck(dtype, own_source):
    """The operations, and their backward passes called as operations (whose outputs' strides `torch.compile`
    checks against the fake ones)."""
    partial_inputs, route_inputs = grouped_inputs(dtype, own_source)
    torch.library.opcheck(torch.ops.delta_qwen3.route_partial.default, partial_inputs)
    torch.library.opcheck(torch.ops.delta_qwen3.route.default, route_inputs)
    sources, count, w_group, eps = partial_inputs
    with torch.no_grad():
        mix, group_logits = routing_op.route_partial(*partial_inputs)
        out, weights = routing_op.route(*route_inputs)
    _, _, own, w, gate, _, _, start, partial_mix, _ = route_inputs
    backward_inputs = (torch.ones_like(out), sources, 4, own, w, gate, weights, eps, start, partial_mix)
    partial_backward_inputs = (torch.ones_like(mix), torch.ones_like(group_logits), sources, count, w_group, mix,
                               group_logits, eps)  # fmt: skip
    for op, inputs in ((routing_op.route_backward, backward_inputs),
                       (routing_op.route_partial_backward, partial_backward_inputs)):  # fmt: skip
        # Not differentiable themselves: called with tensors that need no gradient.
        inputs = tuple(x.detach() if isinstance(x, torch.Tensor) else x for x in inputs)
        torch.library.opcheck(op, inputs)


def test_grouped_reads_are_the_formula_over_all_the_sources_forward_and_backward():
    """A point that merges its group's partial mixture with the sources read after it computes what it would over
    all of them (float64, through autograd, the formula written out by `routing_reference.route`)."""
    partial_inputs, route_inputs = grouped_inputs(torch.float64, own_source=True)
    sources, _, w_group, eps = partial_inputs
    _, count, own, w, gate, residual, _, start, _, _ = route_inputs
    w = w_group[1]  # the point's query is its row of the group's
    mix, group_logits = routing_op.route_partial(sources, start, w_group, eps)
    out, weights = routing_op.route(sources, count, own, w, gate, residual, eps, start, mix[1], group_logits[1])
    expected_out, expected_weights = routing_reference.route(sources, count, own, w, gate, residual, eps)
    torch.testing.assert_close(out, expected_out, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(weights, expected_weights, atol=1e-12, rtol=1e-12)
    grad_out = torch.randn_like(out)
    leaves = [sources, own, w_group, gate, residual]
    got = torch.autograd.grad(out, leaves, grad_out)
    expected = torch.autograd.grad(expected_out, leaves, grad_out)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_operation_reads_a_prefix_of_a_buffer_in_place_without_autograd():
    """A decoding step reads the first `count` slots of a buffer larger than that: the slots after them do not
    count."""
    sources, _, own_source, w, gate, residual, eps = sample_inputs(torch.float32, True, True, True)
    with torch.no_grad():
        buffer = torch.cat([sources, torch.full_like(sources[:2], 1e3)])
        got = routing_op.route(buffer, 3, own_source, w, gate, residual, eps)
        expected = routing_op.route(sources, 3, own_source, w, gate, residual, eps)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def run_with_triton(script: Path, *args: str, triton: str = "torch-2.13", interpret: bool = True):
    """What `script` prints last, as JSON, run with the environment `TRITONS[triton]` (by Triton's interpreter when
    `interpret`)."""
    path = TRITONS[triton]
    require_environment(path)
    env = isolated_env() | {"PYTHONPATH": f"{path}{os.pathsep}{REPO_ROOT}"}
    env |= {"TRITON_INTERPRET": "1"} if interpret else {}
    completed = subprocess.run([sys.executable, str(script), *args], cwd=REPO_ROOT, env=env,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-5000:]
    # Triton 3.9 warns where a kernel leaves fused multiply-adds to its default, which 3.10 changes; ours ask for them.
    assert "TRITON_DEFAULT_FP_FUSION" not in completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])


def run_kernel_script(*args: str, triton: str = "torch-2.13") -> dict:
    return run_with_triton(KERNEL_SCRIPT, *args, triton=triton)


def op_failures(report: dict) -> list[str]:
    return [f"{dtype} {name}: {error:.2e}" for dtype, errors in report["op"].items()
            for name, error in errors.items() if not error < OP_TOLERANCES[dtype]]


@pytest.mark.slow
@pytest.mark.parametrize("triton", INTERPRETED_TRITONS)
def test_the_kernels_compute_the_operation_forward_and_backward_alone_and_through_the_model(triton):
    report = run_kernel_script(triton=triton)
    assert set(report["op"]) == {"float32", "bfloat16"}
    assert not op_failures(report)
    assert len(report["model"]) == 12  # each variant with points alone and in groups
    for variant, errors in report["model"].items():
        assert all(errors[name] < tolerance for name, tolerance in MODEL_TOLERANCES.items()), (variant, errors)


@pytest.mark.slow
def test_a_broken_kernel_fails_the_comparisons():
    failures = op_failures(run_kernel_script("--broken", "route"))
    for comparison in ("out_vs_torch", "out_vs_formula", "grad_sources_vs_formula", "grad_w_vs_formula"):
        assert f"float32 {comparison}" in " ".join(failures), failures


@pytest.mark.slow
def test_a_broken_kernel_of_grouped_reads_fails_their_comparisons_alone():
    failures = " ".join(op_failures(run_kernel_script("--broken", "partial")))
    for comparison in ("grouped_out_vs_torch", "grouped_out_vs_formula", "grouped_grad_sources_vs_formula"):
        assert f"float32 {comparison}" in failures, failures
    assert "float32 out_vs_torch" not in failures and "float32 grad_sources_vs_torch" not in failures


def spilling(records: list[dict]) -> list[str]:
    return [f"{r['kernel']} {r['arch']} {r['dtype']} hidden {r['hidden']}: {r['stack'] + r['local']} bytes"
            for r in records if r["stack"] + r["local"] > LOCAL_MEMORY_ALLOWANCE]


# The architectures each Triton compiles for: the Triton of PyTorch 2.6 (CUDA 12.4's `ptxas`) knows no Blackwell GPU.
# Its LLVM aborts the process on sm_120 rather than raise, so it is not asked: PyTorch 2.6 itself has no build for
# those GPUs, so no user meets that pair.
ARCHITECTURES = ("sm_75", "sm_80", "sm_89", "sm_90", "sm_100", "sm_120")
COMPILED = {"oldest-torch": ARCHITECTURES[:4], "torch-2.13": ARCHITECTURES, "newest-torch": ARCHITECTURES}
UNKNOWN = {"oldest-torch": ("sm_100",), "torch-2.13": (), "newest-torch": ()}


@pytest.mark.slow
@pytest.mark.parametrize("triton", TRITONS)
def test_the_kernels_compile_for_the_gpus_and_their_rows_stay_in_registers(triton):
    """Each kernel, with its launch configuration, for the T4 (float16, float32) and the later GPUs (bfloat16,
    float32) at every hidden size of the Qwen3 family: compiled as a first launch on those GPUs would, no row
    spilled to local memory. An architecture the Triton does not know is reported as such (its first launch there
    raises, and the operation falls back to its PyTorch code: `test_kernel_fallback.py`)."""
    architectures = COMPILED[triton] + UNKNOWN[triton]
    records = run_with_triton(COMPILE_SCRIPT, "--architectures", *architectures, triton=triton, interpret=False)
    compiled = [r for r in records if "unsupported" not in r]
    assert sorted(r["arch"] for r in records if "unsupported" in r) == sorted(UNKNOWN[triton])
    assert {r["arch"] for r in compiled} == set(COMPILED[triton])
    assert len(compiled) == 5 * 2 * 6 * len(COMPILED[triton])  # hidden sizes, dtypes, launches, architectures
    assert {r["kernel"] for r in compiled} == {"_route_forward", "_route_backward", "_route_partial_forward",
                                               "_route_partial_backward"}  # fmt: skip
    assert all(0 < r["registers"] <= 255 for r in compiled)
    assert not spilling(compiled)


@pytest.mark.slow
@pytest.mark.parametrize("triton", TRITONS)
def test_groups_of_four_points_past_2048_columns_would_spill(triton):
    """Why `routing_fused.group_size` halves the groups past 2048 columns; and that the count above can fail."""
    records = run_with_triton(COMPILE_SCRIPT, "--group-size", "4", "--hidden-sizes", "4096", "--architectures",
                              "sm_90", triton=triton, interpret=False)  # fmt: skip
    assert any("_route_partial_backward sm_90 bfloat16" in line for line in spilling(records)), records


def test_the_fused_operation_routes_by_default_where_it_runs_triton_kernels(monkeypatch):
    """On an NVIDIA GPU with Triton installed (hidden states on CUDA made by fake tensors, which need no GPU): the
    fused operation, eager or compiled, except in layers that gradient checkpointing recomputes; without Triton, or
    on the CPU, the defaults stay."""
    with FakeTensorMode():
        on_gpu = torch.empty(2, 3, 8, device="cuda")
    monkeypatch.setattr(routing_op, "routing_triton", object())  # as if Triton were installed
    assert routing.resolve_implementation(None, on_gpu) == "fused"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert routing.resolve_implementation(None, on_gpu) == "fused"
    assert routing.resolve_implementation(None, on_gpu, checkpointing=True) == "compiled"
    assert routing.resolve_implementation(None, torch.zeros(1)) == "compiled"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    assert routing.resolve_implementation(None, torch.zeros(1)) == "buffer"
    assert routing.resolve_implementation("buffer", on_gpu) == "buffer"
    monkeypatch.setattr(routing_op, "routing_triton", None)
    assert routing.resolve_implementation(None, on_gpu) == "buffer"
