"""The PyTorch bug behind vLLM's miscompilation of `delta_block` on the CPU, reproduced without vLLM or this model.

vLLM's CPU linear layers write their product into a new buffer through a custom op that mutates its first argument
(`_C.onednn_mm(out, x, ...)`). When Inductor's C++ backend fuses a flat pointwise kernel that reads such a buffer
with a `[tokens, D]` one, it recomputes the flat kernel's loops (`SchedulerNode.recompute_size_and_body`), and in
PyTorch 2.13 the recomputed reads name the buffer itself rather than the op's mutation of it: the kernel loses its
dependency on the op, and a later fusion can move it before the op, so it reads memory not yet written. A DeltaQwen3
model in `delta_block` mode has exactly this shape: the residual stream (flat) feeds each routing point's input
(`[tokens, D]`, its routing weights are per token), so DeltaQwen3 refuses vLLM's compiled mode on the CPU in that
mode (docs/SERVING.md). When this test starts passing, PyTorch is fixed: lift that refusal
(`_check_vllm_compilation` in `modeling_delta_qwen3.py`).
"""

import pytest
import torch

torch.library.define("delta_qwen3_tests::mm_into", "(Tensor(a!) out, Tensor x, Tensor w) -> ()")


@torch.library.impl("delta_qwen3_tests::mm_into", "CPU")
def _mm_into(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    torch.mm(x, w, out=out)


@torch.library.register_fake("delta_qwen3_tests::mm_into")
def _mm_into_fake(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    return None


def layer(h: torch.Tensor, scale: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A residual step as vLLM computes it on the CPU, with per-token scaling on both sides of the product."""
    y = h * scale[:, None]  # [tokens, D] loops: the scale is per token
    v = torch.empty_like(h)
    torch.ops.delta_qwen3_tests.mm_into(v, y, w)
    z = h + v  # flat loops; reads h, as y does, which invites fusing the two
    return z, z * scale[:, None]  # [tokens, D] again: z's loops are recomputed to fuse with this


@pytest.mark.xfail(
    strict=True,
    reason="PyTorch 2.13's Inductor moves a kernel before the out-variant op whose output it reads (module docstring)",
)
def test_inductor_reads_an_out_variant_ops_output_after_the_op_writes_it():
    torch.manual_seed(0)
    h, scale, w = torch.randn(16, 64), torch.rand(16), torch.randn(64, 64)
    torch._dynamo.reset()
    with torch.no_grad():
        expected = layer(h, scale, w)
        compiled = torch.compile(layer, backend="inductor", fullgraph=True)(h, scale, w)
    for got, want in zip(compiled, expected, strict=True):
        torch.testing.assert_close(got, want)
