"""The Triton kernels of `torch.ops.delta_qwen3.route` (`modeling_delta_qwen3/routing_triton.py`) compiled for NVIDIA
GPUs without one: Triton's own compiler and the `ptxas` that its wheel ships turn each kernel into machine code for a
GPU architecture in the dtypes it runs, as a first launch on that GPU would (Triton's own `ptxas` command, options
and all), and `ptxas -v` reports the registers each thread uses and the bytes it spills to local memory. What
Triton's interpreter (`fused_kernel_on_cpu.py`) cannot see: that a kernel compiles at all, and that its rows fit in
registers at every hidden size of the Qwen3 family.

Each kernel is compiled from a launch of the wrappers in `routing_triton.py` on CPU tensors (the kernels swapped for
recorders), so the arguments, the launch configuration and Triton's specialisation of them are those of a real
launch. Run in a fresh interpreter with an environment holding Triton on PYTHONPATH by
`tests/routing/test_fused_kernel.py`; prints one JSON line: a record per compiled kernel. Triton's binder and
argument packing are private and may move between releases: they are what a launch calls, which is the point.

`--group-size G` compiles grouped reads in groups of G rather than `routing_fused.group_size`'s, to show that the
register figures can fail: four points past 2048 columns spill, which is why groups are halved there.
"""

import argparse
import contextlib
import io
import json
import re
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

from modeling_delta_qwen3 import routing_fused, routing_triton

ARCHITECTURES = {"sm_75": 75, "sm_80": 80, "sm_90": 90}  # T4; A100; H100 and H200
# The dtypes of the hidden states each runs: the T4 has no bfloat16, and runs models in float16.
DTYPES = {"sm_75": (torch.float16, torch.float32), "sm_80": (torch.bfloat16, torch.float32),
          "sm_90": (torch.bfloat16, torch.float32)}  # fmt: skip
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


def ptxas_report(log: str) -> dict:
    """What `ptxas -v` said of the kernel when Triton assembled it: registers per thread, bytes spilled."""
    used = int(re.search(r"Used (\d+) registers", log).group(1))
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return dict(registers=used, spill_stores=int(spills.group(1)), spill_loads=int(spills.group(2)))


def compile_launch(name: str, args: tuple, kwargs: dict, arch: str) -> dict:
    """Compiles one recorded launch for `arch` as `JITFunction.run` would on that GPU."""
    kernel = _KERNELS[name]
    backend = make_backend(GPUTarget("cuda", ARCHITECTURES[arch], 32))
    kwargs = dict(kwargs, debug=False)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound_args, specialization, options)
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # where Triton prints ptxas's report (`dump_ptxas_log` below)
        triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=backend.target, options=options.__dict__)
    flags = sorted(key for key, value in kwargs.items() if key.startswith("HAS_") and value)
    shape = {key: kwargs[key] for key in ("BLOCK", "GROUP") if key in kwargs}
    return dict(kernel=name, arch=arch, flags=flags, num_warps=options.num_warps, **shape,
                **ptxas_report(log.getvalue()))  # fmt: skip


_KERNELS = {name: getattr(routing_triton, name) for name in KERNELS}


def compile_all(hidden_sizes: list[int], architectures: list[str], group_size: int | None) -> list[dict]:
    """A record per kernel launch, architecture, dtype and hidden size; in groups of `group_size` points, or of
    `routing_fused.group_size`'s."""
    records = []
    for hidden in hidden_sizes:
        group = group_size or routing_fused.group_size(hidden)
        for arch in architectures:
            for dtype in DTYPES[arch]:
                for name, launch_args, kwargs in launches(hidden, dtype, group):
                    record = compile_launch(name, launch_args, kwargs, arch)
                    records.append(dict(hidden=hidden, dtype=str(dtype).removeprefix("torch."), **record))
                    print(json.dumps(records[-1]), file=sys.stderr)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--hidden-sizes", type=int, nargs="+", default=list(HIDDEN_SIZES))
    parser.add_argument("--architectures", nargs="+", default=list(ARCHITECTURES))
    args = parser.parse_args()
    # Triton prints the report of its own `ptxas` command on each kernel, compiled anew (in a cache of its own).
    triton.knobs.nvidia.dump_ptxas_log = True
    triton.knobs.compilation.always_compile = True
    with tempfile.TemporaryDirectory() as cache:
        triton.knobs.cache.dir = cache
        records = compile_all(args.hidden_sizes, args.architectures, args.group_size)
    print(json.dumps(records))


if __name__ == "__main__":
    main()
