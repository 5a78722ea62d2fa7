"""A routing point as one registered operation, `torch.ops.delta_qwen3.route`, with its backward pass
`torch.ops.delta_qwen3.route_backward`: eager mode, `torch.compile` and CUDA graphs each see one operation per point.

    route(sources, count, own_source, w, gate, residual, eps) -> (out, weights)

reads the first `count` sources of `sources` `[>= count, *tokens, D]` (a buffer read in place, by stride) and
`own_source`, a source that this point alone reads, and computes (`routing_math.py` has the formulas)

    out     = residual + gate * sum_j alpha_j x_j,     alpha_j = softmax_j( r_j (x_j . w) )

with the residual 0 and the gate 1 when None, in the compute dtype of `w`, returned in the sources' dtype, and the
routing weights `[*tokens, n]` in the compute dtype. Gradients flow to `sources` when `count` is all of them.

On CUDA, when Triton is installed, both operations are the kernels of `routing_triton.py`; everywhere else, the
PyTorch code below, which is also what the kernels are tested against besides the reference.
"""

import torch

from .routing_math import (
    add_inverse_rms_gradient,
    as_dtype,
    inverse_rms,
    logits,
    mixture_backward,
    source_softmax,
    score_gradients,
)

try:
    from . import routing_triton
except ImportError:  # Triton is not installed
    routing_triton = None


def _read(sources: torch.Tensor, count: int, own_source: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """The sources a point reads, `[n, *tokens, D]` in `dtype`."""
    x = as_dtype(sources[:count], dtype)
    return x if own_source is None else torch.cat([x, as_dtype(own_source, dtype)[None]])


def _scores(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse RMS `r_j` and logits `r_j (x_j . w)` of sources `x` `[n, *tokens, D]`, both `[n, *tokens]`."""
    inv_rms = inverse_rms(x, x.new_full((), eps))
    return inv_rms, logits(x, w, inv_rms)


def _route(
    sources: torch.Tensor,
    count: int,
    own_source: torch.Tensor | None,
    w: torch.Tensor,
    gate: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    x = _read(sources, count, own_source, w.dtype)
    alpha = source_softmax(_scores(x, w, eps)[1], sources_dim=0)
    out = torch.einsum("n...,n...d->...d", alpha, x)
    if gate is not None:
        out = out * as_dtype(gate, w.dtype).reshape(())
    if residual is not None:
        out = out + residual
    return as_dtype(out, sources.dtype), alpha.movedim(0, -1).contiguous()


def _route_backward(
    grad_out: torch.Tensor,
    sources: torch.Tensor,
    count: int,
    own_source: torch.Tensor | None,
    w: torch.Tensor,
    gate: torch.Tensor | None,
    weights: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of the sources read (`[count, *tokens, D]`), of `own_source` (empty without it), of `w` and of the
    gate (empty without it), from the gradient of `out` and the routing weights the forward pass returned."""
    x = _read(sources, count, own_source, w.dtype)
    grad = as_dtype(grad_out, w.dtype)
    inv_rms, point_logits = _scores(x, w, eps)
    alpha = weights.movedim(-1, 0)
    dots = torch.einsum("n...d,...d->n...", x, grad)
    gate_value = None if gate is None else as_dtype(gate, w.dtype).reshape(())
    logit_grads, coefficients, per_token = mixture_backward(alpha, dots, gate_value, sources_dim=0)
    score_grads = score_gradients(logit_grads, inv_rms)
    grad_x = torch.addcmul(score_grads[..., None] * w, coefficients[..., None], grad)
    # dL/dr_j = dL/dl_j * l_j / r_j
    add_inverse_rms_gradient(grad_x, x, inv_rms, logit_grads * point_logits / inv_rms)
    grad_w = torch.einsum("n...,n...d->d", score_grads, x)
    grad_gate = w.new_empty(0) if gate is None else per_token.sum().reshape(gate.shape).to(gate.dtype)
    grad_sources = grad_x[:count].to(sources.dtype)
    # A copy: the outputs of an operation may not alias each other.
    grad_own_source = w.new_empty(0) if own_source is None else grad_x[count].to(own_source.dtype, copy=True)
    return grad_sources, grad_own_source, grad_w, grad_gate


def _route_fake(sources, count, own_source, w, gate, residual, eps):
    n = count + (own_source is not None)
    return sources.new_empty(sources.shape[1:]), w.new_empty(*sources.shape[1:-1], n)


def _route_backward_fake(grad_out, sources, count, own_source, w, gate, weights, eps):
    grad_own_source = w.new_empty(0) if own_source is None else torch.empty_like(own_source)
    grad_gate = w.new_empty(0) if gate is None else torch.empty_like(gate)
    return sources.new_empty(count, *sources.shape[1:]), grad_own_source, torch.empty_like(w), grad_gate


def _setup_context(ctx, inputs, output):
    sources, count, own_source, w, gate, residual, eps = inputs
    ctx.set_materialize_grads(False)  # the routing weights never have a gradient: no zeros made for them
    ctx.save_for_backward(sources, own_source, w, gate, output[1])
    ctx.count, ctx.eps, ctx.has_residual = count, eps, residual is not None


def _backward(ctx, grad_out, _grad_weights):
    if grad_out is None:  # the routed output did not reach the loss
        return (None,) * 7
    sources, own_source, w, gate, weights = ctx.saved_tensors
    if ctx.count != sources.shape[0]:
        raise RuntimeError("delta_qwen3::route differentiates its sources only when it reads all of them")
    grad_sources, grad_own_source, grad_w, grad_gate = route_backward(
        grad_out, sources, ctx.count, own_source, w, gate, weights, ctx.eps
    )
    return (
        grad_sources,
        None,
        None if own_source is None else grad_own_source,
        grad_w,
        None if gate is None else grad_gate,
        grad_out if ctx.has_residual else None,
        None,
    )


def _register() -> None:
    route_op = torch.library.custom_op("delta_qwen3::route", _route, mutates_args=())
    backward_op = torch.library.custom_op("delta_qwen3::route_backward", _route_backward, mutates_args=())
    route_op.register_fake(_route_fake)
    backward_op.register_fake(_route_backward_fake)
    route_op.register_autograd(_backward, setup_context=_setup_context)
    if routing_triton is not None:
        route_op.register_kernel("cuda")(routing_triton.route)
        backward_op.register_kernel("cuda")(routing_triton.route_backward)


# Registered once per process: a checkpoint's remote code is another copy of this module, which finds the
# operations already there.
if not hasattr(torch.ops.delta_qwen3, "route"):
    _register()
route = torch.ops.delta_qwen3.route.default
route_backward = torch.ops.delta_qwen3.route_backward.default


class RouteFunction(torch.autograd.Function):
    """`route` differentiated by the same autograd formula (`_setup_context`, `_backward`) without the wrapper that
    PyTorch puts around a custom operation's formula, which dispatches six more operations (`detach`, `select`) per
    call: for eager training, where each dispatched operation costs a GPU step time. `route` itself stays
    differentiable for every other caller (`torch.compile`, `torch.library.opcheck`)."""

    @staticmethod
    def forward(ctx, sources, count, own_source, w, gate, residual, eps):
        inputs = (sources, count, own_source, w, gate, residual, eps)
        output = route(*inputs)
        _setup_context(ctx, inputs, output)
        ctx.mark_non_differentiable(output[1])
        return output

    @staticmethod
    def backward(ctx, grad_out, grad_weights):
        return _backward(ctx, grad_out, grad_weights)
