"""The routing point's mixture as one autograd function, so that routing costs almost no memory.

For a routing point with query `q`, norm weight `g` and optional gate `gamma`, over sources `x_1 .. x_n`:

    alpha_j = softmax_j( q . RMSNorm_g(x_j) ) = softmax_j( r_j * (x_j . w) ),   w = q * g,  r_j = 1 / RMS(x_j)
    out     = residual + gamma * sum_j alpha_j x_j          (additive routing)
    out     = sum_j alpha_j x_j                             (replacement routing: no residual, no gate)

`r_j` is computed once per source by the caller and shared by every routing point that reads it. Plain autograd
would save a stacked, normalised copy of all sources at every routing point (memory quadratic in depth); this
function saves only references to the sources, which the forward pass keeps alive anyway, and per-token tensors
of size `n`. The backward pass is derived by hand and checked against autograd in the tests.
"""

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Routing is computed in float32 like `Qwen3RMSNorm`, or in float64 for a float64 model."""
    return torch.promote_types(dtype, torch.float32)


def inverse_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """`1 / sqrt(mean(x^2) + eps)` over the last dimension, shape `[..., 1]`."""
    return torch.rsqrt(x.to(compute_dtype(x.dtype)).pow(2).mean(-1, keepdim=True) + eps)


def _dot_last(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.einsum("...d,...d->...", x, y)


class _DepthMix(torch.autograd.Function):
    @staticmethod
    def forward(ctx, residual, gate, query, norm_weight, num_sources, *sources_and_inv_rms):
        sources = sources_and_inv_rms[:num_sources]
        inv_rms = torch.cat(sources_and_inv_rms[num_sources:], dim=-1)
        acc = inv_rms.dtype
        w = query.to(acc) * norm_weight.to(acc)
        scores = torch.stack([x.to(acc) @ w for x in sources], dim=-1)
        alpha = torch.softmax(scores * inv_rms, dim=-1)
        mix = _weighted_sum(alpha, sources)
        if residual is None:
            out = mix.to(sources[0].dtype)
        else:
            scaled = mix if gate is None else mix * gate.to(acc)
            out = (residual.to(acc) + scaled).to(residual.dtype)
        ctx.num_sources = num_sources
        ctx.has_residual = residual is not None
        ctx.save_for_backward(gate, query, norm_weight, alpha, scores, inv_rms, *sources)
        ctx.mark_non_differentiable(alpha)
        return out, alpha

    @staticmethod
    def backward(ctx, grad_out, _grad_alpha):
        gate, query, norm_weight, alpha, scores, inv_rms, *sources = ctx.saved_tensors
        acc = inv_rms.dtype
        grad_out_f = grad_out.to(acc)
        grad_mix = grad_out_f if gate is None else grad_out_f * gate.to(acc)

        grad_gate = None
        if gate is not None and ctx.needs_input_grad[1]:
            grad_gate = _dot_last(grad_out_f, _weighted_sum(alpha, sources)).sum().to(gate.dtype).reshape(gate.shape)

        grad_alpha = torch.stack([_dot_last(x.to(acc), grad_mix) for x in sources], dim=-1)
        grad_logits = alpha * (grad_alpha - (alpha * grad_alpha).sum(-1, keepdim=True))
        grad_scores = grad_logits * inv_rms
        grad_inv_rms = grad_logits * scores

        w = query.to(acc) * norm_weight.to(acc)
        grad_w = torch.zeros_like(w)
        grad_sources = []
        for j, x in enumerate(sources):
            a_j, s_j = alpha[..., j : j + 1], grad_scores[..., j : j + 1]
            grad_sources.append((grad_mix * a_j + s_j * w).to(x.dtype))
            grad_w += s_j.flatten() @ x.to(acc).flatten(0, -2)
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


def _weighted_sum(alpha: torch.Tensor, sources: list[torch.Tensor]) -> torch.Tensor:
    """`sum_j alpha_j x_j` in alpha's precision, accumulated in place rather than over a stacked copy."""
    mix = sources[0].to(alpha.dtype) * alpha[..., :1]
    for j, x in enumerate(sources[1:], start=1):
        mix.addcmul_(x, alpha[..., j : j + 1])
    return mix


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
