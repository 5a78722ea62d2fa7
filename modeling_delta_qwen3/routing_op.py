"""A routing point as one registered operation, `torch.ops.delta_qwen3.route`, with its backward pass
`torch.ops.delta_qwen3.route_backward`: eager mode, `torch.compile` and CUDA graphs each see one operation per point.

    route(sources, count, own_source, w, gate, residual, eps, start=0, partial_mix=None, partial_logits=None)
        -> (out, weights)

reads sources `start` to `count` of `sources` `[>= count, *tokens, D]` (a buffer read in place, by stride) and
`own_source`, a source that this point alone reads, and computes (`routing_math.py` has the formulas)

    out     = residual + gate * sum_j alpha_j x_j,     alpha_j = softmax_j( r_j (x_j . w) )

with the residual 0 and the gate 1 when None, in the compute dtype of `w`, returned in the sources' dtype, and the
routing weights `[*tokens, n]` in the compute dtype. Its gradient for `sources` is zero outside the slots read.

Grouped reads (training): the points of a group (`routing_fused.py`) first read the sources that exist when the group
starts all at once,

    route_partial(sources, count, w_group, eps) -> (mix, logits)

the mixture of the first `count` sources `mix [G, *tokens, D]` for each of the group's G points, and their logits
`[G, *tokens, count]`, in the compute dtype; then each point calls `route` with its row of both (`partial_mix`,
`partial_logits`) and reads only the sources from `start` (= that `count`) on. The partial mixture counts as one
source whose logit is the log-sum-exp of its logits, so the softmax merges it with the others exactly; the routing
weights `route` returns are over all the point's sources, the partial ones first.

On CUDA, when Triton is installed, the operations are the kernels of `routing_triton.py`; everywhere else, the
PyTorch code below, which is also what the kernels are tested against besides the reference. A kernel that fails to
compile or launch on a GPU (one it was never compiled for, say) is not fatal: that GPU routes with the PyTorch code
for the rest of the process, after one warning (`_on_cuda`).
"""

import warnings

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


def has_kernels() -> bool:
    """Whether the operations have Triton kernels for CUDA (Triton is installed)."""
    return routing_triton is not None


def _read(
    sources: torch.Tensor, start: int, count: int, own_source: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """The sources a point reads, `[n, *tokens, D]` in `dtype`."""
    x = as_dtype(sources[start:count], dtype)
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
    start: int = 0,
    partial_mix: torch.Tensor | None = None,
    partial_logits: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    x = _read(sources, start, count, own_source, w.dtype)
    point_logits = _scores(x, w, eps)[1]
    if partial_mix is not None:  # the partial mixture: one more source, whose logit is its logits' log-sum-exp
        x = torch.cat([partial_mix[None], x])
        point_logits = torch.cat([torch.logsumexp(partial_logits, -1)[None], point_logits])
    alpha = source_softmax(point_logits, sources_dim=0)
    out = torch.einsum("n...,n...d->...d", alpha, x)
    if gate is not None:
        out = out * as_dtype(gate, w.dtype).reshape(())
    if residual is not None:
        out = out + residual
    weights = alpha.movedim(0, -1)
    if partial_mix is not None:  # the partial mixture's weight spread over its sources
        all_logits = torch.logsumexp(point_logits, 0)
        weights = torch.cat([torch.exp(partial_logits - all_logits[..., None]), weights[..., 1:]], -1)
    return as_dtype(out, sources.dtype), weights.contiguous()


def _route_backward(
    grad_out: torch.Tensor,
    sources: torch.Tensor,
    count: int,
    own_source: torch.Tensor | None,
    w: torch.Tensor,
    gate: torch.Tensor | None,
    weights: torch.Tensor,
    eps: float,
    start: int = 0,
    partial_mix: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of the sources read (`[count - start, *tokens, D]`), of `own_source` (empty without it), of `w`,
    of the gate (empty without it), and of the partial mixture and its logits (empty without them), from the
    gradient of `out` and the routing weights the forward pass returned."""
    x = _read(sources, start, count, own_source, w.dtype)
    grad = as_dtype(grad_out, w.dtype)
    inv_rms, point_logits = _scores(x, w, eps)
    alpha = weights.movedim(-1, 0)
    gate_value = None if gate is None else as_dtype(gate, w.dtype).reshape(())
    partial_count = alpha.shape[0] - x.shape[0]
    if partial_count:  # the partial mixture as one source, weighted by its sources' weights together
        alpha = torch.cat([alpha[:partial_count].sum(0, keepdim=True), alpha[partial_count:]])
        x_read = torch.cat([partial_mix[None], x])
    else:
        x_read = x
    dots = torch.einsum("n...d,...d->n...", x_read, grad)
    logit_grads, coefficients, per_token = mixture_backward(alpha, dots, gate_value, sources_dim=0)
    read_logit_grads, read_coefficients = logit_grads, coefficients
    if partial_count:
        read_logit_grads, read_coefficients = logit_grads[1:], coefficients[1:]
    score_grads = score_gradients(read_logit_grads, inv_rms)
    grad_x = torch.addcmul(score_grads[..., None] * w, read_coefficients[..., None], grad)
    # dL/dr_j = dL/dl_j * l_j / r_j
    add_inverse_rms_gradient(grad_x, x, inv_rms, read_logit_grads * point_logits / inv_rms)
    grad_w = torch.einsum("n...,n...d->d", score_grads, x)
    grad_gate = w.new_empty(0) if gate is None else per_token.sum().reshape(gate.shape).to(gate.dtype)
    read = count - start
    grad_sources = grad_x[:read].to(sources.dtype)
    # A copy: the outputs of an operation may not alias each other.
    grad_own_source = w.new_empty(0) if own_source is None else grad_x[read].to(own_source.dtype, copy=True)
    if not partial_count:
        return grad_sources, grad_own_source, grad_w, grad_gate, w.new_empty(0), w.new_empty(0)
    # Through the log-sum-exp, each partial logit's gradient is its share of the partial mixture's logit's.
    grad_partial_mix = coefficients[0, ..., None] * grad
    partial_scale = (dots[0] - per_token[0]) if gate_value is None else (dots[0] - per_token[0]) * gate_value
    grad_partial_logits = (weights[..., :partial_count] * partial_scale[..., None]).contiguous()
    return grad_sources, grad_own_source, grad_w, grad_gate, grad_partial_mix, grad_partial_logits


def _route_partial(
    sources: torch.Tensor, count: int, w_group: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each point of a group (queries `w_group` `[G, D]`), the mixture of the first `count` sources `[G,
    *tokens, D]` and their logits `[G, *tokens, count]`, in the compute dtype."""
    x = as_dtype(sources[:count], w_group.dtype)
    inv_rms = inverse_rms(x, x.new_full((), eps))
    group_logits = torch.einsum("n...d,gd->g...n", x, w_group) * inv_rms.movedim(0, -1)
    beta = source_softmax(group_logits, sources_dim=-1)
    return torch.einsum("g...n,n...d->g...d", beta, x).contiguous(), group_logits.contiguous()


def _route_partial_backward(
    grad_mix: torch.Tensor,
    grad_logits: torch.Tensor,
    sources: torch.Tensor,
    count: int,
    w_group: torch.Tensor,
    mix: torch.Tensor,
    group_logits: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of the first `count` sources and of `w_group` from those of the partial mixtures and logits."""
    x = as_dtype(sources[:count], w_group.dtype)
    inv_rms = inverse_rms(x, x.new_full((), eps))
    beta = source_softmax(group_logits, sources_dim=-1)
    dots = torch.einsum("n...d,g...d->g...n", x, grad_mix)
    mix_dots = (mix * grad_mix).sum(-1, keepdim=True)
    # dL/dl_j: directly, and through the mixture's softmax: beta_j (x_j . dL/dmix - mix . dL/dmix)
    logit_grads = torch.addcmul(grad_logits, beta, dots - mix_dots)
    score_grads = score_gradients(logit_grads, inv_rms.movedim(0, -1))
    grad_x = torch.einsum("g...n,g...d->n...d", beta, grad_mix) + torch.einsum("g...n,gd->n...d", score_grads, w_group)
    inv_rms_grad = (logit_grads * group_logits).sum(0).movedim(-1, 0) / inv_rms  # sum_p dL/dl_pj l_pj / r_j
    add_inverse_rms_gradient(grad_x, x, inv_rms, inv_rms_grad)
    grad_w = torch.einsum("g...n,n...d->gd", score_grads, x)
    return grad_x.to(sources.dtype).contiguous(), grad_w


def _route_fake(sources, count, own_source, w, gate, residual, eps, start=0, partial_mix=None, partial_logits=None):
    n = count - start + (own_source is not None) + (0 if partial_logits is None else partial_logits.shape[-1])
    return sources.new_empty(sources.shape[1:]), w.new_empty(*sources.shape[1:-1], n)


def _route_backward_fake(grad_out, sources, count, own_source, w, gate, weights, eps, start=0, partial_mix=None):
    grad_own_source = w.new_empty(0) if own_source is None else torch.empty_like(own_source)
    grad_gate = w.new_empty(0) if gate is None else torch.empty_like(gate)
    if partial_mix is None:
        grad_partial_mix = grad_partial_logits = w.new_empty(0)
    else:
        grad_partial_mix = torch.empty_like(partial_mix)
        grad_partial_logits = weights.new_empty(*weights.shape[:-1], weights.shape[-1] - (count - start)
                                                - (own_source is not None))  # fmt: skip
    grad_sources = sources.new_empty(count - start, *sources.shape[1:])
    return grad_sources, grad_own_source, torch.empty_like(w), grad_gate, grad_partial_mix, grad_partial_logits


def _route_partial_fake(sources, count, w_group, eps):
    group = w_group.shape[0]
    return w_group.new_empty(group, *sources.shape[1:]), w_group.new_empty(group, *sources.shape[1:-1], count)


def _route_partial_backward_fake(grad_mix, grad_logits, sources, count, w_group, mix, group_logits, eps):
    return sources.new_empty(count, *sources.shape[1:]), torch.empty_like(w_group)


def _setup_context(ctx, inputs, output):
    sources, count, own_source, w, gate, residual, eps, start, partial_mix, _ = inputs[:10]
    ctx.set_materialize_grads(False)  # the routing weights never have a gradient: no zeros made for them
    ctx.save_for_backward(sources, own_source, w, gate, output[1], partial_mix)
    ctx.count, ctx.eps, ctx.start, ctx.has_residual = count, eps, start, residual is not None


def _gradients(ctx, grad_out) -> tuple:
    """The gradients of the sources read (`[count - start, ...]`), then of `route`'s arguments after `count`."""
    sources, own_source, w, gate, weights, partial_mix = ctx.saved_tensors
    grad_sources, grad_own_source, grad_w, grad_gate, grad_partial_mix, grad_partial_logits = route_backward(
        grad_out, sources, ctx.count, own_source, w, gate, weights, ctx.eps, ctx.start, partial_mix
    )
    partial = partial_mix is not None
    return (
        grad_sources,
        None if own_source is None else grad_own_source,
        grad_w,
        None if gate is None else grad_gate,
        grad_out if ctx.has_residual else None,
        None,  # eps
        None,  # start
        grad_partial_mix if partial else None,
        grad_partial_logits if partial else None,
    )


def _padded(grad: torch.Tensor, start: int, sources: torch.Tensor) -> torch.Tensor:
    """The gradient `grad` of sources `[start, start + len(grad))` as one of all of `sources`: zero for the others,
    which were not read (the model's calls differentiate only what they read: `RouteFunction`, `PartialFunction`)."""
    after = sources.shape[0] - start - grad.shape[0]
    if not start and not after:
        return grad
    return torch.cat([grad.new_zeros(start, *grad.shape[1:]), grad, grad.new_zeros(after, *grad.shape[1:])])


def _backward(ctx, grad_out, _grad_weights):
    if grad_out is None:  # the routed output did not reach the loss
        return (None,) * 10
    grad_sources, *others = _gradients(ctx, grad_out)
    return _padded(grad_sources, ctx.start, ctx.saved_tensors[0]), None, *others


def _setup_partial_context(ctx, inputs, output):
    sources, count, w_group, eps = inputs
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(sources, w_group, *output)
    ctx.count, ctx.eps = count, eps


def _partial_backward(ctx, grad_mix, grad_logits):
    sources, w_group, mix, group_logits = ctx.saved_tensors
    grad_mix = torch.zeros_like(mix) if grad_mix is None else grad_mix
    grad_logits = torch.zeros_like(group_logits) if grad_logits is None else grad_logits
    grad_sources, grad_w_group = route_partial_backward(
        grad_mix, grad_logits, sources, ctx.count, w_group, mix, group_logits, ctx.eps
    )
    return _padded(grad_sources, 0, sources), None, grad_w_group, None


# The GPUs where a kernel failed: every operation routes there with its PyTorch code from then on.
_FAILED_DEVICES: set[torch.device] = set()


def _gpu_description(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else "no message"


def _on_cuda(name: str, pytorch_code):
    """The CUDA implementation of operation `name`: its Triton kernel, or `pytorch_code` where Triton is not installed
    or on a GPU where a kernel failed to compile or launch. The kernels are compiled and checked for the GPUs
    `tests/modeling_delta_qwen3/routing/kernels_for_gpu.py` names; on any other, Triton may refuse them (an
    architecture its compiler does not know, too few registers or too little shared memory), and a failure there must
    cost speed, not the user's run. The kernel's outputs are fresh tensors, so nothing it may have written before
    failing is read. Running out of GPU memory is not a kernel's failure and is raised as it is."""

    def run(*args):
        device = args[0].device
        if routing_triton is None or device in _FAILED_DEVICES:
            return pytorch_code(*args)
        try:
            return getattr(routing_triton, name)(*args)
        except torch.OutOfMemoryError:
            raise
        except Exception as error:  # compile and launch errors have no common type across Triton releases
            _FAILED_DEVICES.add(device)
            warnings.warn(
                f"DeltaQwen3's routing kernel {name!r} failed on {_gpu_description(device)} with Triton "
                f"{routing_triton.triton.__version__} ({type(error).__name__}: {_first_line(error)}); this GPU "
                "routes with the PyTorch code for the rest of the process: slower, same results",
                RuntimeWarning,
                stacklevel=2,
            )
            return pytorch_code(*args)

    return run


def _register() -> None:
    operations = {
        "route": (_route, _route_fake, _backward, _setup_context),
        "route_backward": (_route_backward, _route_backward_fake, None, None),
        "route_partial": (_route_partial, _route_partial_fake, _partial_backward, _setup_partial_context),
        "route_partial_backward": (_route_partial_backward, _route_partial_backward_fake, None, None),
    }
    for name, (function, fake, backward, setup_context) in operations.items():
        op = torch.library.custom_op(f"delta_qwen3::{name}", function, mutates_args=())
        op.register_fake(fake)
        if backward is not None:
            op.register_autograd(backward, setup_context=setup_context)
        op.register_kernel("cuda")(_on_cuda(name, function))


# Registered once per process: a checkpoint's remote code is another copy of this module, which finds the
# operations already there.
if not hasattr(torch.ops.delta_qwen3, "route_partial"):
    _register()
route = torch.ops.delta_qwen3.route.default
route_backward = torch.ops.delta_qwen3.route_backward.default
route_partial = torch.ops.delta_qwen3.route_partial.default
route_partial_backward = torch.ops.delta_qwen3.route_partial_backward.default


class RouteFunction(torch.autograd.Function):
    """`route` differentiated by the same formula (`_gradients`) without the wrapper that PyTorch puts around a
    custom operation's formula, which dispatches six more operations (`detach`, `select`) per call: for eager
    training, where each dispatched operation costs a GPU step time. `route` itself stays differentiable for every
    other caller (`torch.compile`, `torch.library.opcheck`).

    A point of a group (`start` > 0) gives the sources from `start` to `count` again after `route`'s arguments, one
    tensor each (`read`): the operation reads them in the buffer, and their gradients go to them directly, so the
    buffer needs none. Otherwise `sources` is the prefix of the buffer that it reads, and has the gradient."""

    @staticmethod
    def forward(ctx, sources, count, own_source, w, gate, residual, eps, start, partial_mix, partial_logits, *read):
        inputs = (sources, count, own_source, w, gate, residual, eps, start, partial_mix, partial_logits)
        output = route(*inputs)
        _setup_context(ctx, inputs, output)
        ctx.mark_non_differentiable(output[1])
        return output

    @staticmethod
    def backward(ctx, grad_out, _grad_weights):
        if grad_out is None:
            return (None,) * (10 + ctx.count - ctx.start)
        grad_sources, *others = _gradients(ctx, grad_out)
        if not ctx.start:
            return grad_sources, None, *others
        return None, None, *others, *grad_sources.unbind(0)


class PartialFunction(torch.autograd.Function):
    """`route_partial` for a group of points with its outputs one tensor per point, so that each point's gradient
    comes alone rather than padded with zeros to the whole group's; differentiated by `_partial_backward`."""

    @staticmethod
    def forward(ctx, sources, count, w_group, eps):
        mix, group_logits = route_partial(sources, count, w_group, eps)
        _setup_partial_context(ctx, (sources, count, w_group, eps), (mix, group_logits))
        return (*mix.unbind(0), *group_logits.unbind(0))

    @staticmethod
    def backward(ctx, *grads):
        group = len(grads) // 2
        if all(grad is None for grad in grads):
            return None, None, None, None
        _, _, mix, group_logits = ctx.saved_tensors
        grad_mix = torch.stack([torch.zeros_like(m) if g is None else g for g, m in zip(grads[:group], mix)])
        grad_logits = torch.stack(
            [torch.zeros_like(m) if g is None else g for g, m in zip(grads[group:], group_logits)]
        )
        return _partial_backward(ctx, grad_mix, grad_logits)
