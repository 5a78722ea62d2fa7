"""flash-linear-attention's `fused_attnres` Triton kernels, run on CPU tensors by Triton's interpreter, measured
against fla's own PyTorch reference (`naive_attnres`), against SPEC section 2's formula in float64, and through the
model (`routing_implementation="fla"` against `"reference"`). `tests/modeling_delta_qwen3/routing/test_fla_dispatch.py` runs this script
in a fresh interpreter, with `.venv-fla` (fla-core and Triton, pinned in the Makefile) on PYTHONPATH, and asserts
what it prints as one JSON line: relative errors (largest absolute difference over the largest absolute expected
value).

Three things keep the kernels from running without a GPU, and are worked around here, in this process only; the
shipped model still refuses `"fla"` on the CPU, and that refusal is lifted here too:
- `fused_attnres_fwd` raises unless its first source says `is_cuda`, though it reads only the source's shape, dtype
  and device (the kernel reads the sources through the pointer table it is given besides);
- fla's autotuner would time every candidate configuration on a GPU: each kernel keeps one configuration, chosen
  so that a routing point's sources take several tiles, the last one partly masked;
- the interpreter runs a kernel's `for i in range(...)` over Python ints, where the compiler gives Triton scalars,
  and the kernels' `(i * BL).to(tl.int64)` needs the latter: the interpreter's rewriting of the kernels' source is
  told to turn such a loop variable into a Triton scalar at the top of the loop's body.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported

import ast  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import torch  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

import fla.ops.attnres.fused as fla_fused  # noqa: E402
from fla.ops.attnres import fused_attnres, naive_attnres  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for the tests' `helpers` package

# Each kernel's one configuration: four sources per tile (routing points here read up to ten).
TILE = {"BL": 4}
SOURCES_SEEN: list[int] = []  # the number of sources of every forward call of the kernel since it was cleared


class _ClaimsCuda:
    """A tensor's stand-in that says it is on CUDA and answers everything else as the tensor."""

    is_cuda = True

    def __init__(self, tensor: torch.Tensor):
        self._tensor = tensor

    def __getattr__(self, name):
        return getattr(self._tensor, name)


def _without_cuda_check(forward):
    def fused_attnres_fwd(*args, residuals, **kwargs):
        SOURCES_SEEN.append(len(residuals))
        return forward(*args, residuals=[_ClaimsCuda(residuals[0]), *residuals[1:]], **kwargs)

    return fused_attnres_fwd


class _LoopVariablesAsScalars(interpreter.ASTTransformer):
    """Adds `i = interpreter_semantic.to_tensor(i, False)` at the top of every `for i in range(...)` body (the
    `tl.static_range` loops keep their ints: they index the tuple of source pointers)."""

    def visit_For(self, node):
        self.generic_visit(node)
        iterates_range = isinstance(node.iter, ast.Call) and getattr(node.iter.func, "id", None) == "range"
        if iterates_range and isinstance(node.target, ast.Name):
            name = node.target.id
            to_tensor = ast.Attribute(ast.Name("interpreter_semantic", ast.Load()), "to_tensor", ast.Load())
            value = ast.Call(to_tensor, [ast.Name(name, ast.Load()), ast.Constant(False)], [])
            node.body.insert(0, ast.Assign([ast.Name(name, ast.Store())], value))
        return node


def run_kernels_on_cpu() -> None:
    fla_fused.fused_attnres_fwd = _without_cuda_check(fla_fused.fused_attnres_fwd)
    for kernel in (fla_fused.attnres_fwd_kernel, fla_fused.attnres_bwd_kernel_dv, fla_fused.attnres_bwd_kernel_dqdw):
        kernel.configs = [next(c for c in kernel.configs if TILE.items() <= c.kwargs.items() or "BL" not in c.kwargs)]
    interpreter.FunctionRewriter.ast_transformer = _LoopVariablesAsScalars()


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.double() - expected.double()).abs().max() / expected.double().abs().max()).item()


def spec_formula(query, sources, norm_weight, eps):
    """SPEC section 2's mix_p and weights, as `tests/helpers/spec_reference.py` writes them, with weights `[n, ...]`."""
    from helpers.spec_reference import mix

    point = SimpleNamespace(query=query, norm=SimpleNamespace(weight=norm_weight))
    log = []
    return mix(point, sources, eps, log), log[0].movedim(-1, 0)


def mix_and_gradients(function, inputs: list[torch.Tensor], output_grad: torch.Tensor, dtype, eps=1e-6) -> list:
    """The mixture, weights and the gradients of query, norm weight and sources for `output_grad`."""
    leaves = [x.detach().to(dtype).requires_grad_() for x in inputs]
    query, norm_weight, *sources = leaves
    mix, weights = function(query, sources, norm_weight, eps)
    grads = torch.autograd.grad(mix, leaves, output_grad.to(dtype))
    return [mix.detach(), weights.detach(), *grads]


def kernel_errors(n_sources: int, hidden: int = 48) -> dict:
    """The kernel and fla's reference against the float64 formula, and the kernel against fla's reference, in
    float32; the largest relative error over mixture, weights and every gradient. A hidden size that is not a
    power of two exercises the kernels' masks along it."""
    generator = torch.Generator().manual_seed(n_sources)
    sources = [torch.randn(2, 7, hidden, generator=generator) * (1 + j) for j in range(n_sources)]
    query, norm_weight = torch.randn(hidden, generator=generator), 1 + 0.3 * torch.randn(hidden, generator=generator)
    output_grad = torch.randn(2, 7, hidden, generator=generator)
    inputs = [query, norm_weight, *sources]

    def fla_call(function):
        return lambda q, s, w, eps: function(q, s, w, rms_eps=eps, return_weights=True)

    exact = mix_and_gradients(spec_formula, inputs, output_grad, torch.float64)
    kernel = mix_and_gradients(fla_call(fused_attnres), inputs, output_grad, torch.float32)
    naive = mix_and_gradients(fla_call(naive_attnres), inputs, output_grad, torch.float32)
    names = ["mix", "weights", "query_grad", "norm_weight_grad"] + [f"source_{j}_grad" for j in range(n_sources)]

    def worst(got, expected) -> dict:
        errors = {name: relative_error(a, b) for name, a, b in zip(names, got, expected, strict=True)}
        return {"forward": max(errors["mix"], errors["weights"]), "backward": max(errors[n] for n in names[2:])}

    return {"kernel_vs_naive": worst(kernel, naive), "kernel_vs_float64": worst(kernel, exact),
            "naive_vs_float64": worst(naive, exact)}  # fmt: skip


def model_errors(mode: str) -> dict:
    """The model in float32 with `routing_implementation="fla"` against `"reference"`: the largest absolute
    difference of logits and of routing weights, and of the routing parameters' gradients relative to the largest
    of them (taken jointly: a gate's gradient, of order 1e-4, differs between any two implementations by float32
    rounding alone by 1e-5 of itself). Three layers and one short sequence: the interpreter's time grows with the
    routing points and the tokens."""
    from helpers.models import delta_config, token_ids
    from helpers.spec_reference import randomize_routing

    from modeling_delta_qwen3 import DeltaQwen3ForCausalLM, routing

    # The model refuses fla on the CPU; this process runs it there.
    routing.IMPLEMENTATIONS["fla"] = dataclasses.replace(routing.IMPLEMENTATIONS["fla"], unavailable=lambda like: None)
    torch.manual_seed(0)
    model = DeltaQwen3ForCausalLM(delta_config(mode, mode.startswith("delta"), num_hidden_layers=3)).train()
    randomize_routing(model)
    ids = token_ids(batch=1, seq=6)
    results = {}
    for implementation in ("fla", "reference"):
        model.set_routing_implementation(implementation)
        model.zero_grad()
        SOURCES_SEEN.clear()
        out = model(ids, labels=ids, output_routing_weights=True)
        if implementation == "fla":
            kernel_calls = list(SOURCES_SEEN)
        out.loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if "_route." in name}
        results[implementation] = (out.logits.detach(), [w.detach() for w in out.routing_weights], grads)
    (logits, weights, grads), (ref_logits, ref_weights, ref_grads) = results["fla"], results["reference"]
    return {
        "logits_max_abs": (logits - ref_logits).abs().max().item(),
        "weights_max_abs": max((a - b).abs().max().item() for a, b in zip(weights, ref_weights, strict=True)),
        "routing_grad_relative": relative_error(torch.cat([grads[n].flatten() for n in ref_grads]),
                                                torch.cat([g.flatten() for g in ref_grads.values()])),
        "routing_parameters": len(ref_grads),
        "routing_points": len(ref_weights),
        "kernel_calls": len(kernel_calls),
        "most_sources": max(kernel_calls),
    }


def main() -> int:
    run_kernels_on_cpu()
    torch.manual_seed(0)
    # Eleven sources: three tiles, the last one partly masked, and a table of sixteen source pointers.
    report = {"kernel": kernel_errors(11)}
    report["model"] = {mode: model_errors(mode) for mode in ("delta", "delta_block", "attnres_full", "attnres_block")}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
