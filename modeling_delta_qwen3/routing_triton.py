"""Triton kernels of `torch.ops.delta_qwen3.route` and its backward pass (`routing_op.py` has the signatures and
the PyTorch code they are tested against).

One program routes one token: it holds the token's row of width D in registers and reads the sources' rows where
they are, one after another (by stride, never stacked or copied), in their own dtype, computing in the dtype of
`w` (float32, or float64 for a float64 model):

- forward: each source's logit `r_j (x_j . w)` and an online softmax over the sources, so the weighted sum needs
  one read of each source; then the gate and residual, and the routing weights from the logits kept in the output.
- backward: one read of the sources for `c = sum_j alpha_j (x_j . G)`, a second for each source's gradient
  `gamma alpha_j G + dL/dl_j (r_j w - (x_j . w) r_j^3 x_j / D)` with `dL/dl_j = gamma alpha_j (x_j . G - c)`; the
  token's part of `dL/dw` and `dL/dgamma` are summed over tokens afterwards.

The number of sources is a run-time argument: one compiled kernel serves every routing point (no recompiling and no
autotuning per number of sources). Launch configuration, fixed: the row padded to a power of two, 4 warps up to
1024 columns and 8 above.
"""

import torch

try:
    import triton
    import triton.language as tl
except ImportError as error:  # routing_op.py then routes with its PyTorch code
    raise ImportError("Triton is not installed") from error


@triton.jit
def _scores(x, query, hidden, eps):
    """A source row's dot product with the query, and its inverse RMS."""
    return tl.sum(x * query), tl.rsqrt(tl.sum(x * x) / hidden + eps)


@triton.jit
def _softmax_step(x, query, hidden, eps, best, total, mix, weight_slot):
    """Adds one source to the online softmax (running maximum, sum and weighted sum); keeps its logit."""
    score, inv_rms = _scores(x, query, hidden, eps)
    logit = score * inv_rms
    tl.store(weight_slot, logit)
    new_best = tl.maximum(best, logit)
    scale = tl.exp(best - new_best)
    p = tl.exp(logit - new_best)
    return new_best, total * scale + p, mix * scale + p * x


@triton.jit(do_not_specialize=["count"])
def _route_forward(
    sources, source_stride, count, own_source, w, gate, residual, out, weights, hidden, eps,
    HAS_OWN_SOURCE: tl.constexpr, HAS_GATE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    compute = w.dtype.element_ty
    token = tl.program_id(0).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    mask = columns < hidden
    row = token * hidden + columns
    n = count + HAS_OWN_SOURCE
    token_weights = weights + token * n
    query = tl.load(w + columns, mask=mask, other=0.0)
    best = tl.full([], float("-inf"), compute)
    total = tl.zeros([], compute)
    mix = tl.zeros([BLOCK], compute)
    for j in range(0, count):
        x = tl.load(sources + j * source_stride + row, mask=mask, other=0.0).to(compute)
        best, total, mix = _softmax_step(x, query, hidden, eps, best, total, mix, token_weights + j)
    if HAS_OWN_SOURCE:
        x = tl.load(own_source + row, mask=mask, other=0.0).to(compute)
        best, total, mix = _softmax_step(x, query, hidden, eps, best, total, mix, token_weights + count)
    mix = mix / total
    if HAS_GATE:
        mix = mix * tl.load(gate).to(compute)
    if HAS_RESIDUAL:
        mix += tl.load(residual + row, mask=mask, other=0.0).to(compute)
    tl.store(out + row, mix.to(out.dtype.element_ty), mask=mask)
    for j in range(0, n):
        tl.store(token_weights + j, tl.exp(tl.load(token_weights + j) - best) / total)


@triton.jit
def _source_gradient(x, query, grad, gamma, alpha, weighted_dots, hidden, eps):
    """A source row's gradient `gamma alpha G + dL/dl (r w - s r^3 x / D)` and its part of `dL/dw`, `dL/dl r x`."""
    score, inv_rms = _scores(x, query, hidden, eps)
    logit_grad = gamma * alpha * (tl.sum(x * grad) - weighted_dots)
    grad_x = gamma * alpha * grad + (logit_grad * inv_rms) * query
    grad_x -= (logit_grad * score * inv_rms * inv_rms * inv_rms / hidden) * x
    return grad_x, (logit_grad * inv_rms) * x


@triton.jit(do_not_specialize=["count"])
def _route_backward(
    grad_out, sources, source_stride, count, own_source, w, gate, weights, hidden, eps,
    grad_sources, grad_stride, grad_own_source, grad_w_rows, per_token,
    HAS_OWN_SOURCE: tl.constexpr, HAS_GATE: tl.constexpr, BLOCK: tl.constexpr,
):
    compute = w.dtype.element_ty
    token = tl.program_id(0).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    mask = columns < hidden
    row = token * hidden + columns
    token_weights = weights + token * (count + HAS_OWN_SOURCE)
    query = tl.load(w + columns, mask=mask, other=0.0)
    grad = tl.load(grad_out + row, mask=mask, other=0.0).to(compute)
    gamma = tl.load(gate).to(compute) if HAS_GATE else tl.full([], 1.0, compute)
    weighted_dots = tl.zeros([], compute)  # c = sum_j alpha_j (x_j . G)
    for j in range(0, count):
        x = tl.load(sources + j * source_stride + row, mask=mask, other=0.0).to(compute)
        weighted_dots += tl.load(token_weights + j) * tl.sum(x * grad)
    if HAS_OWN_SOURCE:
        x = tl.load(own_source + row, mask=mask, other=0.0).to(compute)
        weighted_dots += tl.load(token_weights + count) * tl.sum(x * grad)
    grad_w = tl.zeros([BLOCK], compute)
    for j in range(0, count):
        x = tl.load(sources + j * source_stride + row, mask=mask, other=0.0).to(compute)
        alpha = tl.load(token_weights + j)
        grad_x, grad_w_part = _source_gradient(x, query, grad, gamma, alpha, weighted_dots, hidden, eps)
        grad_w += grad_w_part
        tl.store(grad_sources + j * grad_stride + row, grad_x.to(grad_sources.dtype.element_ty), mask=mask)
    if HAS_OWN_SOURCE:
        x = tl.load(own_source + row, mask=mask, other=0.0).to(compute)
        alpha = tl.load(token_weights + count)
        grad_x, grad_w_part = _source_gradient(x, query, grad, gamma, alpha, weighted_dots, hidden, eps)
        grad_w += grad_w_part
        tl.store(grad_own_source + row, grad_x.to(grad_own_source.dtype.element_ty), mask=mask)
    tl.store(grad_w_rows + row, grad_w, mask=mask)
    tl.store(per_token + token, weighted_dots)


def _launch(hidden: int) -> dict:
    block = triton.next_power_of_2(hidden)
    return dict(BLOCK=block, num_warps=4 if block <= 1024 else 8)


def _rows(x: torch.Tensor | None) -> torch.Tensor | None:
    return None if x is None else x.contiguous()


def _sources(sources: torch.Tensor, count: int) -> torch.Tensor:
    """The sources read, each a contiguous block of rows (a buffer's slots are), at any stride between them."""
    read = sources[:count]
    return read if read[0].is_contiguous() else read.contiguous()


def route(sources, count, own_source, w, gate, residual, eps):
    """`routing_op.route` in one kernel launch."""
    read, own_source, residual = _sources(sources, count), _rows(own_source), _rows(residual)
    tokens_shape, hidden = sources.shape[1:-1], sources.shape[-1]
    tokens, n = tokens_shape.numel(), count + (own_source is not None)
    out = sources.new_empty(sources.shape[1:])
    weights = w.new_empty(*tokens_shape, n)
    _route_forward[(tokens,)](
        read, read.stride(0), count, own_source, w, gate, residual, out, weights, hidden, eps,
        HAS_OWN_SOURCE=own_source is not None, HAS_GATE=gate is not None, HAS_RESIDUAL=residual is not None,
        **_launch(hidden),
    )
    return out, weights


def route_backward(grad_out, sources, count, own_source, w, gate, weights, eps):
    """`routing_op.route_backward` in one kernel launch and the sums over tokens of `dL/dw` and `dL/dgamma`."""
    read, own_source, grad_out = _sources(sources, count), _rows(own_source), grad_out.contiguous()
    hidden = sources.shape[-1]
    tokens = sources.shape[1:-1].numel()
    grad_sources = sources.new_empty(count, *sources.shape[1:])
    grad_own_source = w.new_empty(0) if own_source is None else torch.empty_like(own_source)
    grad_w_rows = w.new_empty(tokens, hidden)
    per_token = w.new_empty(tokens)
    _route_backward[(tokens,)](
        grad_out, read, read.stride(0), count, own_source, w, gate, weights.contiguous(), hidden, eps,
        grad_sources, grad_sources.stride(0), grad_own_source, grad_w_rows, per_token,
        HAS_OWN_SOURCE=own_source is not None, HAS_GATE=gate is not None, **_launch(hidden),
    )
    grad_w = grad_w_rows.sum(0)
    grad_gate = w.new_empty(0) if gate is None else per_token.sum().reshape(gate.shape).to(gate.dtype)
    return grad_sources, grad_own_source, grad_w, grad_gate
