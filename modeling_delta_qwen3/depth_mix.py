"""The routing point's mixture as one autograd function, so that routing costs almost no memory.

For a routing point with query `q`, norm weight `g` and optional gate `gamma`, over sources `x_1 .. x_n`:

    alpha_j = softmax_j( q . RMSNorm_g(x_j) ) = softmax_j( r_j * (x_j . w) ),   w = q * g,  r_j = 1 / RMS(x_j)
    out     = residual + gamma * sum_j alpha_j x_j          (additive routing)
    out     = sum_j alpha_j x_j                             (replacement routing: no residual, no gate)

Three implementations of these two lines, all checked against the spec's float64 reference in the tests:

- `depth_mix`, the default while autograd records: one autograd function. `r_j` is computed once per source by
  the caller and shared by every routing point that reads it. Plain autograd would save a stacked, normalised copy
  of all sources at every routing point (memory quadratic in depth); this function saves only references to the
  sources, which the forward pass keeps alive anyway, and per-token tensors of size `n`. Its backward pass is
  derived by hand.
- `stacked_depth_mix`, without autograd (inference, generation): sources stacked once in one buffer, so that a
  routing point is a few batched products whatever the number of sources.
- `fla_depth_mix`, on CUDA when flash-linear-attention is installed: its fused `fused_attnres` kernels.
"""

import torch

try:  # flash-linear-attention's fused CUDA kernels for the mixture, forward and backward: `pip install delta-qwen3[fla]`
    from fla.ops.attnres import fused_attnres
except ImportError:
    fused_attnres = None


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Routing is computed in float32 like `Qwen3RMSNorm`, or in float64 for a float64 model."""
    return torch.promote_types(dtype, torch.float32)


def inverse_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """`1 / sqrt(mean(x^2) + eps)` over the last dimension, shape `[..., 1]`."""
    return torch.rsqrt(x.to(compute_dtype(x.dtype)).pow(2).mean(-1, keepdim=True) + eps)


def _dot_last(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Dot products over the last dimension, `[..., D] x [..., D] -> [...]`, as one batched matrix product."""
    return (x.unsqueeze(-2) @ y.unsqueeze(-1)).flatten(-3)


class _DepthMix(torch.autograd.Function):
    # Every pass over a `[batch, seq, D]` tensor costs as much as the routing's arithmetic, so each step below is
    # arranged to read each source as few times as possible: forward twice (scores, mixture), backward three times.

    @staticmethod
    def forward(ctx, residual, gate, query, norm_weight, num_sources, *sources_and_inv_rms):
        sources = sources_and_inv_rms[:num_sources]
        inv_rms = torch.cat(sources_and_inv_rms[num_sources:], dim=-1)
        acc = inv_rms.dtype
        w = query.to(acc) * norm_weight.to(acc)
        scores = torch.stack([x.to(acc) @ w for x in sources], dim=-1)
        alpha = torch.softmax(scores * inv_rms, dim=-1)
        # With a residual: residual + sum_j (gamma alpha_j) x_j, accumulated straight onto the residual.
        weights = alpha if gate is None or residual is None else alpha * gate.to(acc)
        if residual is None:
            out = sources[0].to(acc) * weights[..., :1]
        else:
            out = torch.addcmul(residual.to(acc), sources[0], weights[..., :1])
        for j in range(1, num_sources):
            out.addcmul_(sources[j], weights[..., j : j + 1])
        ctx.num_sources = num_sources
        ctx.has_residual = residual is not None
        ctx.save_for_backward(gate, query, norm_weight, alpha, scores, inv_rms, *sources)
        ctx.mark_non_differentiable(alpha)
        return out.to((residual if residual is not None else sources[0]).dtype), alpha

    @staticmethod
    def backward(ctx, grad_out, _grad_alpha):
        gate, query, norm_weight, alpha, scores, inv_rms, *sources = ctx.saved_tensors
        acc = inv_rms.dtype
        weights = alpha if gate is None or not ctx.has_residual else alpha * gate.to(acc)
        grad_out_f = grad_out.to(acc)
        # x_j . dL/d(out): the gradient of alpha_j up to the gate, and of the gate up to alpha_j.
        dots = torch.stack([_dot_last(x.to(acc), grad_out_f) for x in sources], dim=-1)
        grad_gate = None
        if gate is not None and ctx.needs_input_grad[1]:
            grad_gate = (alpha * dots).sum().to(gate.dtype).reshape(gate.shape)
        grad_alpha = dots if weights is alpha else dots * gate.to(acc)
        grad_logits = alpha * (grad_alpha - (alpha * grad_alpha).sum(-1, keepdim=True))
        grad_scores = grad_logits * inv_rms
        grad_inv_rms = grad_logits * scores

        w = query.to(acc) * norm_weight.to(acc)
        grad_w = torch.zeros_like(w)
        grad_sources = []
        for j, x in enumerate(sources):
            s_j = grad_scores[..., j : j + 1]
            grad_sources.append(torch.addcmul(s_j * w, grad_out_f, weights[..., j : j + 1]).to(x.dtype))
            grad_w.addmv_(x.to(acc).flatten(0, -2).T, s_j.flatten())
        grad_residual = grad_out if ctx.has_residual else None
        return (
            grad_residual,
            grad_gate,
            (grad_w * norm_weight.to(acc)).to(query.dtype),
            (grad_w * query.to(acc)).to(norm_weight.dtype),
            None,
            *grad_sources,
            *grad_inv_rms.split(1, dim=-1),
        )


def stacked_depth_mix(
    stack: torch.Tensor,
    inv_rms: torch.Tensor,
    query: torch.Tensor,
    norm_weight: torch.Tensor,
    residual: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same routing without autograd, over sources stacked as `[n, tokens, D]` in the compute dtype, with
    inverse RMS `[n, tokens]` (views into buffers that hold each source once): two matrix products, however many
    sources there are. Returns the routed tensor `[tokens, D]` and the routing weights `[tokens, n]`."""
    n, tokens, hidden = stack.shape
    acc = stack.dtype
    w = query.to(acc) * norm_weight.to(acc)
    scores = (stack.reshape(n * tokens, hidden) @ w).view(n, tokens)
    alpha = torch.softmax((scores * inv_rms).T, dim=-1)
    mix = torch.bmm(alpha.unsqueeze(1), stack.transpose(0, 1)).squeeze(1)
    if residual is None:
        return mix, alpha
    if gate is not None:
        mix = mix * gate.to(acc)
    return (residual.to(acc) + mix).to(residual.dtype), alpha


def depth_mix(
    sources: list[torch.Tensor],
    inv_rms: list[torch.Tensor],
    query: torch.Tensor,
    norm_weight: torch.Tensor,
    residual: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Route over `sources`; returns the routed tensor and the routing weights `[..., n_sources]`."""
    return _DepthMix.apply(residual, gate, query, norm_weight, len(sources), *sources, *inv_rms)


def use_fla(x: torch.Tensor) -> bool:
    """Whether routing over sources like `x` goes through flash-linear-attention's kernel: on CUDA, when installed."""
    return fused_attnres is not None and x.is_cuda


def fla_depth_mix(
    sources: list[torch.Tensor],
    query: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`depth_mix` through `fla.ops.attnres.fused_attnres`, which computes exactly `mix` (RMS-normalised sources
    scored against the query, softmax over sources, weighted sum) in fused kernels; the residual and gate are
    applied around it."""
    mix, weights = fused_attnres(query, sources, norm_weight, rms_eps=eps, return_weights=True)
    weights = weights.movedim(0, -1)
    if residual is None:
        return mix, weights
    return residual + (mix if gate is None else gate.to(mix.dtype) * mix), weights
