"""A standalone reproduction of the PyTorch bug behind vLLM's miscompilation of `delta_block` on the CPU; it needs
only PyTorch, and exits 1 (printing the largest difference) when the compiled function computes something else than
eager mode. See `test_inductor_mutation_order.py` for what it shows and why it matters here.

    python tests/serving/inductor_mutation_order_repro.py
"""

import sys

import torch

torch.library.define("repro::mm_into", "(Tensor(a!) out, Tensor x, Tensor w) -> ()")


@torch.library.impl("repro::mm_into", "CPU")
def _mm_into(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    torch.mm(x, w, out=out)


@torch.library.register_fake("repro::mm_into")
def _mm_into_fake(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    return None


def layer(h: torch.Tensor, scale: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A residual step as vLLM computes it on the CPU, with per-token scaling on both sides of the product."""
    y = h * scale[:, None]  # [tokens, D] loops: the scale is per token
    v = torch.empty_like(h)
    torch.ops.repro.mm_into(v, y, w)  # as vLLM's CPU linear layers: the product written into a new buffer
    z = h + v  # flat loops; reads h, as y does, which invites fusing the two
    return z, z * scale[:, None]  # [tokens, D] again: z's loops are recomputed to fuse with this


def main() -> int:
    torch.manual_seed(0)
    h, scale, w = torch.randn(16, 64), torch.rand(16), torch.randn(64, 64)
    with torch.no_grad():
        expected = layer(h, scale, w)
        compiled = torch.compile(layer, backend="inductor", fullgraph=True)(h, scale, w)
    difference = max((got - want).abs().max().item() for got, want in zip(compiled, expected, strict=True))
    print(f"torch {torch.__version__}: largest difference between compiled and eager {difference:.3g}")
    return 0 if difference < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
