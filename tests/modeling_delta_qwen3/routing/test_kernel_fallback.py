"""A GPU whose first launch of a routing kernel fails (Triton cannot compile for its architecture, too few registers,
a launch error) routes with the operation's PyTorch code from then on, after one warning naming the GPU, its compute
capability and the Triton version: never a crash, never a different result.

No GPU here: the operations' CUDA implementations, as registered, are made the CPU's for the test, and the Triton
kernels they call are replaced by ones that fail as Triton does."""

import types

import pytest
import torch
from helpers.models import random_model, token_ids
from helpers.routing_runs import assert_all_close, run
from torch._library.custom_ops import OPDEFS

from modeling_delta_qwen3 import routing_fused, routing_op

pytestmark = pytest.mark.both_ends

OPERATIONS = ("route", "route_backward", "route_partial", "route_partial_backward")
GPU = "Imaginary GPU (compute capability 12.1)"


class FailingKernels:
    """Stands in for `routing_triton`: every kernel raises on its launch, as Triton does for an architecture its
    compiler does not know; records the launches tried."""

    triton = types.SimpleNamespace(__version__="9.9.9")

    def __init__(self):
        self.launches: list[str] = []

    def __getattr__(self, name):
        def launch(*args):
            self.launches.append(name)
            raise RuntimeError("PTX .version 9.0 does not support .target sm_121\n(the rest of ptxas' log)")

        return launch


@pytest.fixture
def cuda_implementations_on_cpu(monkeypatch):
    """The operations' registered CUDA implementations run for CPU tensors, calling `FailingKernels`."""
    kernels = FailingKernels()
    monkeypatch.setattr(routing_op, "routing_triton", kernels)
    monkeypatch.setattr(routing_op, "_gpu_description", lambda device: GPU)
    monkeypatch.setattr(routing_op, "_FAILED_DEVICES", set())
    opdefs = [OPDEFS[f"delta_qwen3::{name}"] for name in OPERATIONS]
    for opdef in opdefs:
        opdef.register_kernel("cpu")(opdef._backend_fns["cuda"])
    yield kernels
    for opdef in opdefs:
        opdef.register_kernel("cpu")(opdef._init_fn)


def test_failing_kernels_fall_back_to_the_pytorch_code_with_one_warning(cuda_implementations_on_cpu, monkeypatch):
    """Training through every operation (points alone and in groups) computes what the PyTorch code computes; the
    first failure warns once, and no kernel is tried again on that GPU."""
    model = random_model("delta", gated=True).train().double()
    model.set_routing_implementation("fused")
    monkeypatch.setattr(routing_fused, "GROUP_OPERATIONS_BYTES", -(2**62))  # grouped reads at this small shape
    with pytest.warns(RuntimeWarning) as warned:
        got = run(model, token_ids())
    assert len(warned) == 1, [str(w.message) for w in warned]
    message = str(warned[0].message)
    for part in (GPU, "Triton 9.9.9", "'route_partial'", "sm_121", "PyTorch code"):
        assert part in message, message
    assert "rest of ptxas" not in message  # one line
    assert cuda_implementations_on_cpu.launches == ["route_partial"]  # the first operation a training pass runs
    for opdef in (OPDEFS[f"delta_qwen3::{name}"] for name in OPERATIONS):
        opdef.register_kernel("cpu")(opdef._init_fn)
    assert_all_close(got, run(model, token_ids()), 0)


def test_running_out_of_memory_is_not_a_kernel_failure(cuda_implementations_on_cpu, monkeypatch):
    def out_of_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(cuda_implementations_on_cpu, "route", out_of_memory, raising=False)
    sources = torch.randn(3, 4, 8)
    with pytest.raises(torch.OutOfMemoryError):
        routing_op.route(sources, 3, None, torch.randn(8), None, None, 1e-6)
    assert not routing_op._FAILED_DEVICES
