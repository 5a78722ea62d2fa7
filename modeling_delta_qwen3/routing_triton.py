"""Triton kernels of `torch.ops.delta_qwen3.route`, `route_partial` and their backward passes (`routing_op.py` has
the signatures and the PyTorch code they are tested against).

One program routes one token: it holds the token's row of width D in registers and reads the sources' rows where
they are, one after another (by stride, never stacked or copied), in their own dtype, computing in the dtype of
`w` (float32, or float64 for a float64 model):

- forward: each source's logit `r_j (x_j . w)` and an online softmax over the sources, so the weighted sum needs
  one read of each source; then the gate and residual, and the routing weights from the logits kept in the output.
- backward: one read of the sources for `c = sum_j alpha_j (x_j . G)`, a second for each source's gradient
  `gamma alpha_j G + dL/dl_j (r_j w - (x_j . w) r_j^3 x_j / D)` with `dL/dl_j = gamma alpha_j (x_j . G - c)`; the
  token's part of `dL/dw` and `dL/dgamma` are summed over tokens afterwards.
- with a partial mixture (grouped reads): the online softmax starts from it, as a source whose logit is the
  log-sum-exp of its logits; the backward pass adds it to `c` and returns its gradient and its logits'.
- `route_partial`: the same online softmax for each point of a group at once, their queries and mixtures held as
  rows of 2-D blocks `[group, D]`, so each source is read once for the group; its backward pass takes each
  point's log-sum-exp from the logits it kept and writes each source's gradient in one read of the sources.

The number of sources is a run-time argument: one compiled kernel serves every routing point (no recompiling and no
autotuning per number of sources). Launch configuration, fixed: the row padded to a power of two, and warps by
the elements a program holds (a row, or a group's rows): 4 up to 1024, 8 up to 4096 and 16 above, so that no
kernel's rows spill out of registers (`tests/modeling_delta_qwen3/routing/kernels_for_gpu.py` compiles every kernel
for the GPUs, with the Tritons of the oldest and the newest supported PyTorch and of PyTorch 2.13, and counts).
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


@triton.jit
def _log_sum_exp(logits, count):
    """`log sum_j exp(logits[j])` of `count` logits in memory, and their maximum."""
    best = tl.load(logits)
    for j in range(1, count):
        best = tl.maximum(best, tl.load(logits + j))
    total = tl.zeros_like(best)
    for j in range(0, count):
        total += tl.exp(tl.load(logits + j) - best)
    return best + tl.log(total)


@triton.jit(do_not_specialize=["count", "partial_count"])
def _route_forward(
    sources, source_stride, count, own_source, w, gate, residual, partial_mix, partial_logits, partial_count,
    out, weights, hidden, eps,
    HAS_OWN_SOURCE: tl.constexpr, HAS_GATE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_PARTIAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    compute = w.dtype.element_ty
    token = tl.program_id(0).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    mask = columns < hidden
    row = token * hidden + columns
    n = partial_count + count + HAS_OWN_SOURCE
    token_weights = weights + token * n + partial_count  # the sources read; the partial ones before them
    query = tl.load(w + columns, mask=mask, other=0.0)
    if HAS_PARTIAL:  # the partial mixture as a source whose logit is its logits' log-sum-exp
        best = _log_sum_exp(partial_logits + token * partial_count, partial_count).to(compute)
        total = tl.full([], 1.0, compute)
        mix = tl.load(partial_mix + row, mask=mask, other=0.0).to(compute)
    else:
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
    for j in range(0, count + HAS_OWN_SOURCE):
        tl.store(token_weights + j, tl.exp(tl.load(token_weights + j) - best) / total)
    if HAS_PARTIAL:
        for j in range(0, partial_count):
            logit = tl.load(partial_logits + token * partial_count + j)
            tl.store(token_weights - partial_count + j, tl.exp(logit - best) / total)


@triton.jit
def _source_gradient(x, query, grad, gamma, alpha, weighted_dots, hidden, eps):
    """A source row's gradient `gamma alpha G + dL/dl (r w - s r^3 x / D)` and its part of `dL/dw`, `dL/dl r x`."""
    score, inv_rms = _scores(x, query, hidden, eps)
    logit_grad = gamma * alpha * (tl.sum(x * grad) - weighted_dots)
    grad_x = gamma * alpha * grad + (logit_grad * inv_rms) * query
    grad_x -= (logit_grad * score * inv_rms * inv_rms * inv_rms / hidden) * x
    return grad_x, (logit_grad * inv_rms) * x


@triton.jit(do_not_specialize=["count", "partial_count"])
def _route_backward(
    grad_out, sources, source_stride, count, own_source, w, gate, weights, partial_mix, partial_count, hidden, eps,
    grad_sources, grad_stride, grad_own_source, grad_w_rows, per_token, grad_partial_mix, grad_partial_logits,
    HAS_OWN_SOURCE: tl.constexpr, HAS_GATE: tl.constexpr, HAS_PARTIAL: tl.constexpr, BLOCK: tl.constexpr,
):
    compute = w.dtype.element_ty
    token = tl.program_id(0).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    mask = columns < hidden
    row = token * hidden + columns
    partial_weights = weights + token * (partial_count + count + HAS_OWN_SOURCE)
    token_weights = partial_weights + partial_count
    query = tl.load(w + columns, mask=mask, other=0.0)
    grad = tl.load(grad_out + row, mask=mask, other=0.0).to(compute)
    gamma = tl.load(gate).to(compute) if HAS_GATE else tl.full([], 1.0, compute)
    weighted_dots = tl.zeros([], compute)  # c = sum_j alpha_j (x_j . G)
    if HAS_PARTIAL:  # the partial mixture, weighted by its sources' weights together
        partial_alpha = tl.zeros([], compute)
        for j in range(0, partial_count):
            partial_alpha += tl.load(partial_weights + j)
        partial_dot = tl.sum(tl.load(partial_mix + row, mask=mask, other=0.0).to(compute) * grad)
        weighted_dots += partial_alpha * partial_dot
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
    if HAS_PARTIAL:  # through the log-sum-exp, each partial logit gets its share of the partial mixture's
        tl.store(grad_partial_mix + row, gamma * partial_alpha * grad, mask=mask)
        scale = gamma * (partial_dot - weighted_dots)
        for j in range(0, partial_count):
            tl.store(grad_partial_logits + token * partial_count + j, tl.load(partial_weights + j) * scale)


@triton.jit
def _group_program(w_group, group, tokens, hidden, GROUP: tl.constexpr, BLOCK: tl.constexpr):
    """A program of grouped reads, for one token and a group's points as rows of 2-D blocks `[GROUP, BLOCK]`: the
    token, its columns and their mask, the points and theirs, the group's queries, and the offsets of the token's
    row of each point in a `[group, tokens, D]` tensor."""
    token = tl.program_id(0).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    points = tl.arange(0, GROUP)
    mask = columns < hidden
    point_mask = points < group
    mask_2d = point_mask[:, None] & mask[None, :]
    queries = tl.load(w_group + points[:, None] * hidden + columns[None, :], mask=mask_2d, other=0.0)
    token_rows = (points[:, None] * tokens + token) * hidden + columns[None, :]
    return token, columns, mask, points, point_mask, mask_2d, queries, token_rows


@triton.jit(do_not_specialize=["count"])
def _route_partial_forward(
    sources, source_stride, count, w_group, group, tokens, mix_out, logits_out, hidden, eps,
    GROUP: tl.constexpr, BLOCK: tl.constexpr,
):
    compute = w_group.dtype.element_ty
    token, columns, mask, points, point_mask, mask_2d, queries, token_rows = _group_program(
        w_group, group, tokens, hidden, GROUP, BLOCK
    )
    point_logits = logits_out + (points * tokens + token) * count  # each point's row of logits for this token
    best = tl.full([GROUP], float("-inf"), compute)
    total = tl.zeros([GROUP], compute)
    mix = tl.zeros([GROUP, BLOCK], compute)
    for j in range(0, count):
        x = tl.load(sources + j * source_stride + token * hidden + columns, mask=mask, other=0.0).to(compute)
        inv_rms = tl.rsqrt(tl.sum(x * x) / hidden + eps)
        logit = tl.sum(queries * x[None, :], axis=1) * inv_rms
        tl.store(point_logits + j, logit, mask=point_mask)
        new_best = tl.maximum(best, logit)
        scale = tl.exp(best - new_best)
        p = tl.exp(logit - new_best)
        best, total = new_best, total * scale + p
        mix = mix * scale[:, None] + p[:, None] * x[None, :]
    tl.store(mix_out + token_rows, mix / total[:, None], mask=mask_2d)


@triton.jit(do_not_specialize=["count"])
def _route_partial_backward(
    grad_mix, grad_logits, sources, source_stride, count, w_group, group, tokens, mix, group_logits, hidden, eps,
    grad_sources, grad_stride, grad_w_rows,
    GROUP: tl.constexpr, BLOCK: tl.constexpr,
):
    compute = w_group.dtype.element_ty
    token, columns, mask, points, point_mask, mask_2d, queries, token_rows = _group_program(
        w_group, group, tokens, hidden, GROUP, BLOCK
    )
    grads = tl.load(grad_mix + token_rows, mask=mask_2d, other=0.0)
    mix_dots = tl.sum(tl.load(mix + token_rows, mask=mask_2d, other=0.0) * grads, axis=1)
    point_offsets = (points * tokens + token) * count
    # Each point's log-sum-exp over the sources, from the logits the forward pass kept.
    best = tl.full([GROUP], float("-inf"), compute)
    for j in range(0, count):
        best = tl.maximum(best, tl.load(group_logits + point_offsets + j, mask=point_mask, other=0.0))
    total = tl.zeros([GROUP], compute)
    for j in range(0, count):
        total += tl.exp(tl.load(group_logits + point_offsets + j, mask=point_mask, other=0.0) - best)
    log_total = best + tl.log(total)
    grad_w = tl.zeros([GROUP, BLOCK], compute)
    for j in range(0, count):
        x = tl.load(sources + j * source_stride + token * hidden + columns, mask=mask, other=0.0).to(compute)
        inv_rms = tl.rsqrt(tl.sum(x * x) / hidden + eps)
        logit = tl.load(group_logits + point_offsets + j, mask=point_mask, other=0.0)
        beta = tl.where(point_mask, tl.exp(logit - log_total), 0.0)
        dots = tl.sum(grads * x[None, :], axis=1)
        logit_grad = tl.load(grad_logits + point_offsets + j, mask=point_mask, other=0.0) + beta * (dots - mix_dots)
        score_grad = logit_grad * inv_rms  # dL/ds for s = x . w
        grad_x = tl.sum(beta[:, None] * grads + score_grad[:, None] * queries, axis=0)
        # through r: dL/dr = sum_p dL/dl_p l_p / r, and dr/dx = -r^3 x / D
        grad_x -= (tl.sum(logit_grad * logit) * inv_rms * inv_rms / hidden) * x
        grad_w += score_grad[:, None] * x[None, :]
        tl.store(grad_sources + j * grad_stride + token * hidden + columns,
                 grad_x.to(grad_sources.dtype.element_ty), mask=mask)
    tl.store(grad_w_rows + token_rows, grad_w, mask=mask_2d)


def _launch(hidden: int, group: int | None = None) -> dict:
    """The row padded to a power of two (and the group's rows, for grouped reads), and warps by how many elements a
    program holds, so that each thread holds as many whether the program holds one row or a group's. Fused
    multiply-adds asked for by name: the kernels are tested with them, and Triton's default for them changes."""
    shape = dict(BLOCK=triton.next_power_of_2(hidden))
    if group is not None:
        shape["GROUP"] = triton.next_power_of_2(group)
    held = shape["BLOCK"] * shape.get("GROUP", 1)
    return dict(shape, num_warps=4 if held <= 1024 else 8 if held <= 4096 else 16, enable_fp_fusion=True)


def _rows(x: torch.Tensor | None) -> torch.Tensor | None:
    return None if x is None else x.contiguous()


def _sources(sources: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """The sources read, each a contiguous block of rows (a buffer's slots are), at any stride between them."""
    read = sources[start:count]
    return read if read.shape[0] == 0 or read[0].is_contiguous() else read.contiguous()


def route(sources, count, own_source, w, gate, residual, eps, start=0, partial_mix=None, partial_logits=None):
    """`routing_op.route` in one kernel launch."""
    read, own_source, residual = _sources(sources, start, count), _rows(own_source), _rows(residual)
    partial_mix, partial_logits = _rows(partial_mix), _rows(partial_logits)
    tokens_shape, hidden = sources.shape[1:-1], sources.shape[-1]
    partial_count = 0 if partial_logits is None else partial_logits.shape[-1]
    n = partial_count + count - start + (own_source is not None)
    out = sources.new_empty(sources.shape[1:])
    weights = w.new_empty(*tokens_shape, n)
    _route_forward[(tokens_shape.numel(),)](
        read, read.stride(0), count - start, own_source, w, gate, residual, partial_mix, partial_logits,
        partial_count, out, weights, hidden, eps,
        HAS_OWN_SOURCE=own_source is not None, HAS_GATE=gate is not None, HAS_RESIDUAL=residual is not None,
        HAS_PARTIAL=partial_mix is not None, **_launch(hidden),
    )
    return out, weights


def route_backward(grad_out, sources, count, own_source, w, gate, weights, eps, start=0, partial_mix=None):
    """`routing_op.route_backward` in one kernel launch and the sums over tokens of `dL/dw` and `dL/dgamma`."""
    read, own_source, grad_out = _sources(sources, start, count), _rows(own_source), grad_out.contiguous()
    partial_mix = _rows(partial_mix)
    hidden = sources.shape[-1]
    tokens = sources.shape[1:-1].numel()
    partial_count = 0 if partial_mix is None else weights.shape[-1] - (count - start) - (own_source is not None)
    grad_sources = sources.new_empty(count - start, *sources.shape[1:])
    grad_own_source = w.new_empty(0) if own_source is None else torch.empty_like(own_source)
    grad_w_rows = w.new_empty(tokens, hidden)
    per_token = w.new_empty(tokens)
    grad_partial_mix = w.new_empty(0) if partial_mix is None else torch.empty_like(partial_mix)
    grad_partial_logits = w.new_empty(0) if partial_mix is None else weights.new_empty(*weights.shape[:-1],
                                                                                        partial_count)  # fmt: skip
    _route_backward[(tokens,)](
        grad_out, read, read.stride(0), count - start, own_source, w, gate, weights.contiguous(), partial_mix,
        partial_count, hidden, eps, grad_sources, grad_sources.stride(0), grad_own_source, grad_w_rows, per_token,
        grad_partial_mix, grad_partial_logits,
        HAS_OWN_SOURCE=own_source is not None, HAS_GATE=gate is not None, HAS_PARTIAL=partial_mix is not None,
        **_launch(hidden),
    )
    grad_w = grad_w_rows.sum(0)
    grad_gate = w.new_empty(0) if gate is None else per_token.sum().reshape(gate.shape).to(gate.dtype)
    return grad_sources, grad_own_source, grad_w, grad_gate, grad_partial_mix, grad_partial_logits


def route_partial(sources, count, w_group, eps):
    """`routing_op.route_partial` in one kernel launch."""
    read = _sources(sources, 0, count)
    tokens_shape, hidden, group = sources.shape[1:-1], sources.shape[-1], w_group.shape[0]
    mix = w_group.new_empty(group, *sources.shape[1:])
    group_logits = w_group.new_empty(group, *tokens_shape, count)
    _route_partial_forward[(tokens_shape.numel(),)](
        read, read.stride(0), count, w_group.contiguous(), group, tokens_shape.numel(), mix, group_logits, hidden,
        eps, **_launch(hidden, group),
    )
    return mix, group_logits


def route_partial_backward(grad_mix, grad_logits, sources, count, w_group, mix, group_logits, eps):
    """`routing_op.route_partial_backward` in one kernel launch and the sum over tokens of `dL/dw_group`."""
    read = _sources(sources, 0, count)
    hidden, group, tokens = sources.shape[-1], w_group.shape[0], sources.shape[1:-1].numel()
    grad_sources = sources.new_empty(count, *sources.shape[1:])
    grad_w_rows = w_group.new_empty(group, tokens, hidden)
    _route_partial_backward[(tokens,)](
        grad_mix.contiguous(), grad_logits.contiguous(), read, read.stride(0), count, w_group.contiguous(), group,
        tokens, mix.contiguous(), group_logits.contiguous(), hidden, eps, grad_sources, grad_sources.stride(0),
        grad_w_rows, **_launch(hidden, group),
    )
    return grad_sources, grad_w_rows.sum(1)
