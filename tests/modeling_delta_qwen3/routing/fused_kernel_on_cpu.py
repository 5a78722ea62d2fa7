"""The Triton kernels of `torch.ops.delta_qwen3.route` (`modeling_delta_qwen3/routing_triton.py`), run on CPU tensors
by Triton's interpreter: against the operation's PyTorch code and against SPEC section 2's formula written out
(`routing_reference.route`, through autograd), forward and backward, alone and through the model in every mode.
`tests/modeling_delta_qwen3/routing/test_fused_kernel.py` runs this script in a fresh interpreter with `.venv-fla` (which holds Triton)
on PYTHONPATH and asserts what it prints as one JSON line: relative errors (largest absolute difference over the
largest absolute expected value), per comparison and dtype.

Through the model in float32 only: in bfloat16 two implementations round differently at every layer, and their
logits part by more than a kernel's mistake would move them. `--broken route` swaps in a copy of the kernels with
deliberate mistakes in those every point calls (the forward pass's weighted sum and the backward pass's output
gradient scaled by 1.01), `--broken partial` in those of grouped reads only (the partial mixtures, and a source's
gradient through its RMS), which the comparisons must catch.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import types  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for the tests' `helpers` package

from helpers.models import VARIANTS, random_model, token_ids  # noqa: E402

from modeling_delta_qwen3 import routing_fused, routing_op, routing_triton  # noqa: E402
from modeling_delta_qwen3.routing_fused import GROUP_OPERATIONS_BYTES  # noqa: E402
from modeling_delta_qwen3 import routing_reference  # noqa: E402

EPS = 1e-6
MISTAKES = {  # in the kernels every point calls, and in those of grouped reads only
    "route": [
        ("mix * scale + p * x", "mix * scale + 1.01 * p * x"),
        ("grad = tl.load(grad_out + row, mask=mask, other=0.0).to(compute)",
         "grad = tl.load(grad_out + row, mask=mask, other=0.0).to(compute) * 1.01"),
    ],
    "partial": [
        ("mix / total[:, None]", "1.01 * mix / total[:, None]"),
        ("grad_x -= (tl.sum(logit_grad * logit)", "grad_x -= 1.01 * (tl.sum(logit_grad * logit)"),
    ],
}


def broken_kernels(where: str) -> types.ModuleType:
    """`routing_triton` compiled from its source with the mistakes `MISTAKES[where]` made."""
    source = Path(routing_triton.__file__).read_text()
    for right, wrong in MISTAKES[where]:
        assert right in source, right
        source = source.replace(right, wrong)
    # Triton reads a kernel's source from the file its code names.
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as file:
        file.write(source)
    module = types.ModuleType("broken_routing_triton")
    module.__file__ = file.name
    exec(compile(source, file.name, "exec"), module.__dict__)
    return module


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.double() - expected.double()).abs().max() / expected.double().abs().max().clamp_min(1e-30)).item()


def op_case(kernels, dtype, count: int, own_source: bool, gate: bool, residual: bool, shape=(3, 5), hidden=48) -> dict:
    """One call of the kernels against the operation's PyTorch code and against the formula through autograd:
    the routed output, the routing weights, and every input's gradient. The sources are the first `count` slots of
    a larger buffer, read in place; 48 columns leave part of the padded row masked."""
    generator = torch.Generator().manual_seed(count * 8 + own_source * 4 + gate * 2 + residual)
    compute = torch.promote_types(dtype, torch.float32)

    def random(*size, dtype=dtype):
        return torch.randn(*size, generator=generator, dtype=torch.float64).to(dtype)

    buffer = random(count + 2, *shape, hidden)
    inputs = {
        "sources": buffer[:count].clone(), "own_source": random(*shape, hidden) if own_source else None,
        "w": random(hidden, dtype=compute), "gate": torch.tensor(0.7, dtype=compute) if gate else None,
        "residual": random(*shape, hidden) if residual else None,
    }
    grad_out = random(*shape, hidden)
    out, weights = kernels.route(buffer, count, inputs["own_source"], inputs["w"], inputs["gate"], inputs["residual"], EPS)
    grads = kernels.route_backward(grad_out, buffer[:count], count, inputs["own_source"], inputs["w"], inputs["gate"],
                                   weights, EPS)
    torch_out, torch_weights = routing_op._route(buffer, count, *(inputs[k] for k in ("own_source", "w", "gate", "residual")), EPS)
    torch_grads = routing_op._route_backward(grad_out, buffer[:count], count, inputs["own_source"], inputs["w"],
                                             inputs["gate"], torch_weights, EPS)
    names = [name for name in ("sources", "own_source", "w", "gate") if inputs[name] is not None]
    kernel_grads = dict(zip(("sources", "own_source", "w", "gate"), grads))
    leaves = {name: inputs[name].clone().requires_grad_() for name in names}
    if residual:
        leaves["residual"] = inputs["residual"].clone().requires_grad_()
    full = {**inputs, **leaves}
    formula_out, formula_weights = routing_reference.route(full["sources"], count, full["own_source"], full["w"],
                                                           full["gate"], full["residual"], EPS)  # fmt: skip
    formula_grads = dict(zip(leaves, torch.autograd.grad(formula_out, list(leaves.values()), grad_out)))
    errors = {
        "out_vs_torch": relative_error(out, torch_out),
        "out_vs_formula": relative_error(out, formula_out),
        "weights_vs_formula": relative_error(weights, formula_weights),
    }
    for name in names:
        if name == "w" and count + own_source == 1:
            continue  # one source: its weight is 1 whatever w, and w's gradient is zero
        errors[f"grad_{name}_vs_formula"] = relative_error(kernel_grads[name], formula_grads[name])
        errors[f"grad_{name}_vs_torch"] = relative_error(kernel_grads[name], dict(zip(
            ("sources", "own_source", "w", "gate"), torch_grads))[name])
    return errors


def grouped_case(kernels, dtype, start: int, count: int, own_source: bool, gate: bool, shape=(3, 5), hidden=48) -> dict:
    """A point of a group of 3 (the second) through the kernels: `route_partial` over the first `start` sources of a
    buffer, then `route` over the sources from `start` to `count` and that point's partial mixture; forward and
    backward against the operations' PyTorch code and against the formula over all the sources."""
    generator = torch.Generator().manual_seed(100 + start * 16 + count * 4 + own_source * 2 + gate)
    compute = torch.promote_types(dtype, torch.float32)

    def random(*size, dtype=dtype):
        return torch.randn(*size, generator=generator, dtype=torch.float64).to(dtype)

    buffer = random(count + 2, *shape, hidden)
    own = random(*shape, hidden) if own_source else None
    w_group, gate_value = random(3, hidden, dtype=compute), torch.tensor(0.7, dtype=compute) if gate else None
    residual, grad_out, point = random(*shape, hidden), random(*shape, hidden), 1
    errors, results = {}, {}
    for name, ops in (("kernels", kernels), ("torch", routing_op)):
        partial = getattr(ops, "_route_partial" if ops is routing_op else "route_partial")
        forward = getattr(ops, "_route" if ops is routing_op else "route")
        backward = getattr(ops, "_route_backward" if ops is routing_op else "route_backward")
        partial_backward = getattr(ops, "_route_partial_backward" if ops is routing_op else "route_partial_backward")
        mix, group_logits = partial(buffer, start, w_group, EPS)
        out, weights = forward(buffer, count, own, w_group[point], gate_value, residual, EPS, start, mix[point],
                               group_logits[point])
        grads = backward(grad_out, buffer[:count], count, own, w_group[point], gate_value, weights, EPS, start,
                         mix[point])
        grad_mix, grad_logits = torch.zeros_like(mix), torch.zeros_like(group_logits)
        grad_mix[point], grad_logits[point] = grads[4], grads[5]
        grad_pre, grad_w_group = partial_backward(grad_mix, grad_logits, buffer[:start], start, w_group, mix,
                                                  group_logits, EPS)
        results[name] = {
            "out": out, "weights": weights,
            "grad_sources": torch.cat([grad_pre, grads[0]]), "grad_w": grad_w_group[point] + grads[2],
            "grad_w_other_points": grad_w_group[[0, 2]],
            **({"grad_own_source": grads[1]} if own_source else {}), **({"grad_gate": grads[3]} if gate else {}),
        }
    sources = buffer[:count].clone().requires_grad_()
    leaves = {"sources": sources, "w": w_group[point].clone().requires_grad_()}
    if own_source:
        leaves["own_source"] = own.clone().requires_grad_()
    if gate:
        leaves["gate"] = gate_value.clone().requires_grad_()
    formula_out, formula_weights = routing_reference.route(sources, count, leaves.get("own_source"), leaves["w"],
                                                           leaves.get("gate"), residual, EPS)  # fmt: skip
    formula_grads = torch.autograd.grad(formula_out, list(leaves.values()), grad_out)
    formula = dict(zip([f"grad_{k}" for k in leaves], formula_grads))
    formula |= {"out": formula_out, "weights": formula_weights, "grad_w_other_points": torch.zeros(2, hidden)}
    for name, got in results["kernels"].items():
        if name == "grad_w" and count + own_source == 1:
            continue  # one source: its weight is 1 whatever w, and w's gradient is zero
        errors[f"grouped_{name}_vs_torch"] = relative_error(got, results["torch"][name])
        if name != "grad_w_other_points":
            errors[f"grouped_{name}_vs_formula"] = relative_error(got, formula[name])
    return errors


def op_errors(kernels) -> dict:
    """The worst of each comparison over source counts, and with or without a source of the point's own, gate and residual."""
    report = {}
    for dtype in (torch.float32, torch.bfloat16):
        worst: dict[str, float] = {}
        for count in (1, 2, 5, 11):
            for own_source, gate, residual in ((False, False, False), (True, False, False), (False, True, True),
                                          (True, True, True)):
                for name, error in op_case(kernels, dtype, count, own_source, gate, residual).items():
                    worst[name] = max(worst.get(name, 0.0), error)
        for start, count in ((1, 1), (2, 5), (5, 6), (9, 11)):
            for own_source, gate in ((False, False), (True, True)):
                for name, error in grouped_case(kernels, dtype, start, count, own_source, gate).items():
                    worst[name] = max(worst.get(name, 0.0), error)
        report[str(dtype).removeprefix("torch.")] = worst
    return report


def model_errors(mode: str, gated: bool) -> dict:
    """The model routed by `"fused"` (the kernels, registered as the operations' CPU code in this process) against
    `"reference"`: logits, routing weights, and every parameter's gradient."""
    model = random_model(mode, gated).train()
    ids = token_ids()

    def run(implementation: str) -> dict[str, torch.Tensor]:
        model.zero_grad()
        model.set_routing_implementation(implementation)
        out = model(ids, labels=ids, output_routing_weights=True)
        out.loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        return {"logits": out.logits.detach(), "weights": torch.cat([w.flatten() for w in out.routing_weights]),
                **grads}

    got, expected = run("fused"), run("reference")
    assert got.keys() == expected.keys()
    grads = [name for name in expected if name not in ("logits", "weights")]
    return {
        "logits": relative_error(got["logits"], expected["logits"]),
        "weights": relative_error(got["weights"], expected["weights"]),
        "gradients": max(relative_error(got[name], expected[name]) for name in grads),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broken", choices=list(MISTAKES), help="run a copy of the kernels with these mistakes")
    broken = parser.parse_args().broken
    kernels = broken_kernels(broken) if broken else routing_triton
    for name in ("route", "route_backward", "route_partial", "route_partial_backward"):
        torch.library.register_kernel(f"delta_qwen3::{name}", "cpu", getattr(kernels, name))
    report = {"op": op_errors(kernels), "model": {}}
    if kernels is routing_triton:
        for mode, gated in VARIANTS:
            report["model"][f"{mode}{'+gate' if gated else ''}"] = model_errors(mode, gated)
            # Groups of points reading the sources together, which the model's batches here are too short for.
            routing_fused.GROUP_OPERATIONS_BYTES = -(2**62)
            report["model"][f"{mode}{'+gate' if gated else ''} grouped"] = model_errors(mode, gated)
            routing_fused.GROUP_OPERATIONS_BYTES = GROUP_OPERATIONS_BYTES
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
