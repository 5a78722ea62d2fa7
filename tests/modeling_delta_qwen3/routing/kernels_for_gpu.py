"""The Triton kernels of `torch.ops.delta_qwen3.route` (`modeling_delta_qwen3/routing_triton.py`) compiled for NVIDIA
GPUs without one: each kernel's first launch on a GPU of each architecture, in the dtypes it runs there, compiled by
Triton as on that GPU (its `warmup`: the same binding, specialisation, compiler and `ptxas` command, without running
the kernel; Triton's driver is answered by a stand-in for a GPU of that architecture), and the machine code's resource
usage read by the `cuobjdump` that Triton's wheel ships: registers per thread and bytes of local memory, where
spilled registers go. What Triton's interpreter (`fused_kernel_on_cpu.py`) cannot see: that a kernel compiles at
all, and that its rows fit in registers at every hidden size of the Qwen3 family.

Each kernel is compiled from a launch of the wrappers in `routing_triton.py` on CPU tensors (the kernels swapped for
recorders), so the arguments and the launch configuration are those of a real launch. Run in a fresh interpreter
with an environment holding Triton on PYTHONPATH by `tests/modeling_delta_qwen3/routing/test_fused_kernel.py`; prints one JSON line: a
record per compiled kernel.

An architecture that the Triton's `ptxas` does not know (Blackwell's for the Triton of PyTorch 2.6) gets one record
naming it, `unsupported` with the compiler's message: on such a GPU the kernels fail at their first launch, and the
operation routes with its PyTorch code (`routing_op._on_cuda`).

`--group-size G` compiles grouped reads in groups of G rather than `routing_fused.group_size`'s, to show that the
register figures can fail: four points past 2048 columns spill, which is why groups are halved there.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

from modeling_delta_qwen3 import routing_fused, routing_triton

# T4; A100; L4 and RTX 40xx; H100 and H200; B200; RTX 50xx.
ARCHITECTURES = {"sm_75": 75, "sm_80": 80, "sm_89": 89, "sm_90": 90, "sm_100": 100, "sm_120": 120}
# The dtypes of the hidden states each runs: the T4 has no bfloat16, and runs models in float16.
DTYPES = {arch: (torch.float16 if arch == "sm_75" else torch.bfloat16, torch.float32) for arch in ARCHITECTURES}
HIDDEN_SIZES = (1024, 2048, 2560, 4096, 5120)  # Qwen3 0.6B, 1.7B, 4B, 8B, 14B and 32B
TOKENS = 16
KERNELS = ("_route_forward", "_route_backward", "_route_partial_forward", "_route_partial_backward")


class _Recorder:
    """Stands in for a kernel: records the arguments of each launch instead of running it."""

    def __init__(self, name: str, launches: list):
        self.name, self.launches = name, launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.name, args, kwargs))


def launches(hidden: int, dtype: torch.dtype, group: int) -> list[tuple[str, tuple, dict]]:
    """The kernel launches of a grouped point and its group's partial read, forward and backward, with every
    optional input given (own source, gate, residual, partial mixture), and of a plain point with none."""
    recorded = []
    for name in KERNELS:
        setattr(routing_triton, name, _Recorder(name, recorded))
    count, start = 6, 4
    sources = torch.randn(count, TOKENS, hidden, dtype=dtype)
    w, w_group = torch.randn(hidden), torch.randn(group, hidden)
    own, residual = torch.randn(TOKENS, hidden, dtype=dtype), torch.randn(TOKENS, hidden, dtype=dtype)
    gate = torch.ones(1)
    mix, logits = torch.randn(TOKENS, hidden), torch.randn(TOKENS, start)
    routing_triton.route_partial(sources, start, w_group, 1e-6)
    routing_triton.route_partial_backward(torch.randn(group, TOKENS, hidden), torch.randn(group, TOKENS, start),
                                          sources, start, w_group, torch.randn(group, TOKENS, hidden),
                                          torch.randn(group, TOKENS, start), 1e-6)  # fmt: skip
    routing_triton.route(sources, count, own, w, gate, residual, 1e-6, start, mix, logits)
    weights = torch.rand(TOKENS, count + 1)  # the partial sources, those read after them, the own source
    routing_triton.route_backward(torch.randn(TOKENS, hidden, dtype=dtype), sources, count, own, w, gate, weights,
                                  1e-6, start, mix)  # fmt: skip
    routing_triton.route(sources, count, None, w, None, None, 1e-6)
    routing_triton.route_backward(torch.randn(TOKENS, hidden, dtype=dtype), sources, count, None, w, None,
                                  torch.rand(TOKENS, count), 1e-6)  # fmt: skip
    return recorded


class _StandInDriver:
    """What a launch asks Triton's active driver, answered for a GPU of compute capability `capability` that is not
    here. Its device number is the capability, so that each architecture has its own cache of compiled kernels."""

    def __init__(self, capability: int):
        self.capability = capability

    def get_current_device(self) -> int:
        return self.capability

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", self.capability, 32)


CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def resource_usage(cubin: bytes) -> dict:
    """What the machine code says a thread of the kernel uses: registers, and bytes of local memory (its stack
    frame, where spilled registers go, and any other)."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory, "kernel.cubin")
        path.write_bytes(cubin)
        report = subprocess.run([str(CUOBJDUMP), "--dump-resource-usage", str(path)], capture_output=True, text=True,
                                check=True).stdout  # fmt: skip
    usage = {key: int(value) for key, value in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", report)}
    return dict(registers=usage["REG"], stack=usage["STACK"], local=usage["LOCAL"])


def compile_launch(name: str, args: tuple, kwargs: dict, arch: str) -> dict:
    """Compiles one recorded launch as its first launch on a GPU of `arch`, the active driver's, would (`warmup`: the
    same binding, specialisation and compiler, without running it)."""
    compiled = _KERNELS[name].warmup(*args, grid=(1,), **kwargs)
    flags = sorted(key for key, value in kwargs.items() if key.startswith("HAS_") and value)
    shape = {key: kwargs[key] for key in ("BLOCK", "GROUP") if key in kwargs}
    return dict(kernel=name, arch=arch, flags=flags, num_warps=kwargs["num_warps"], **shape,
                **resource_usage(compiled.asm["cubin"]))  # fmt: skip


_KERNELS = {name: getattr(routing_triton, name) for name in KERNELS}


def unknown_architecture(error: Exception, arch: str) -> str | None:
    """The line of `ptxas`' message saying that it does not know `arch`, if that is why a compilation failed."""
    return next((line.strip() for line in str(error).splitlines() if f"'{arch}" in line and "not defined" in line), None)


def compile_architecture(arch: str, hidden_sizes: list[int], group_size: int | None) -> list[dict]:
    """A record per kernel launch, dtype and hidden size on a GPU of `arch`; in groups of `group_size` points, or of
    `routing_fused.group_size`'s. One record, `unsupported`, if the compiler does not know the architecture."""
    driver.set_active(_StandInDriver(ARCHITECTURES[arch]))  # left so: this machine has no driver to go back to
    records = []
    for hidden in hidden_sizes:
        group = group_size or routing_fused.group_size(hidden)
        for dtype in DTYPES[arch]:
            for name, launch_args, kwargs in launches(hidden, dtype, group):
                try:
                    record = compile_launch(name, launch_args, kwargs, arch)
                except Exception as error:  # Triton's compile errors have no common type across releases
                    if not records and (message := unknown_architecture(error, arch)):
                        return [dict(arch=arch, unsupported=message)]
                    raise
                records.append(dict(hidden=hidden, dtype=str(dtype).removeprefix("torch."), **record))
                print(json.dumps(records[-1]), file=sys.stderr)
    return records


def compile_all(hidden_sizes: list[int], architectures: list[str], group_size: int | None) -> list[dict]:
    """`compile_architecture`'s records for each of `architectures`."""
    return [record for arch in architectures for record in compile_architecture(arch, hidden_sizes, group_size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--hidden-sizes", type=int, nargs="+", default=list(HIDDEN_SIZES))
    parser.add_argument("--architectures", nargs="+", default=list(ARCHITECTURES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRITON_CACHE_DIR"] = cache  # compiled anew, and nothing left behind
        print(json.dumps(compile_all(args.hidden_sizes, args.architectures, args.group_size)))


if __name__ == "__main__":
    main()
