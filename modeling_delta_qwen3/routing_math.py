"""The maths of a routing point (SPEC section 2), as the fast implementations compute it: each formula once, in a
small function whose docstring gives its shapes. `routing_reference.py` writes the same maths out on its own, as
the oracle these are tested against.

For a point with query `q`, norm weight `g` and optional gate `gamma`, over sources `x_1 .. x_n` of width `D`:

    w       = q * g                                          (`point_query`)
    r_j     = 1 / sqrt(mean(x_j^2) + eps)                    (`inverse_rms`)
    l_j     = r_j (x_j . w) = q . RMSNorm_g(x_j)             (`logits`, `logits_against_points`)
    alpha_j = softmax_j(l_j)                                 (`source_softmax`)
    out     = residual + gamma * sum_j alpha_j x_j           (`weighted_sum`, `weighted_sum_of_list`, `gated_residual`)

and for one position, from rows padded with `sqrt(D eps)`, whose norms are `sqrt(D) / r_j`:

    l_j     = sqrt(D) (x_j . w) / |(x_j, sqrt(D eps))|      (`padded_norm`, `one_token_logits`)

and backward, with `G` the gradient of `out` and `d_j = x_j . G`:

    dL/dl_j = gamma alpha_j (d_j - sum_k alpha_k d_k)        (`mixture_backward`)
    dL/ds_j = r_j dL/dl_j  for the scores s_j = x_j . w      (`score_gradients`)
    dL/dr_j = dL/dl_j l_j / r_j,  dr_j/dx_j = -r_j^3 x_j / D (`inverse_rms_gradient`, `add_inverse_rms_gradient`)
"""

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Routing is computed in float32 like `Qwen3RMSNorm`, or in float64 for a float64 model. Decided in Python:
    `torch.promote_types` is a dispatched operation, which a decoding step pays for."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x.to(dtype)`, skipping the call when it would do nothing: routing runs once per sublayer and token in
    generation, where even calls that do nothing add up."""
    return x if x.dtype == dtype else x.to(dtype)


def point_query(query: torch.Tensor, norm_weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`w = q * g` in `dtype`, `[..., D]` for queries and norm weights `[..., D]` (one point, or stacked points):
    `q . RMSNorm_g(x) = r (x . w)`, so a point scores raw sources against `w` and scales by their inverse RMS."""
    return as_dtype(query, dtype) * as_dtype(norm_weight, dtype)


def inverse_rms(x: torch.Tensor, eps: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`r = 1 / sqrt(mean(x^2) + eps)` over the last dimension of `x` (in the compute dtype), shape `x.shape[:-1]`;
    `eps` is a 0-dim tensor of `x`'s dtype. Taken from the Euclidean norm: one pass over `x` without a temporary of
    its size, and fewer dispatched operations than `x.pow(2).mean(-1)`, which for one token cost more than the
    arithmetic."""
    norm = torch.linalg.vector_norm(x, dim=-1)
    return torch.rsqrt(torch.addcmul(eps, norm, norm, value=1 / x.shape[-1]), out=out)


def logits(x: torch.Tensor, w: torch.Tensor, inv_rms: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """One point's logits `l_j = r_j (x_j . w)` for sources `x` `[n, tokens, D]` (or one source `[tokens, D]`),
    `w` `[D]` and inverse RMS `[n, tokens]` (`[tokens]`): shape `[n, tokens]` (`[tokens]`)."""
    return torch.mul(x @ w, inv_rms, out=out)


def logits_against_points(
    w: torch.Tensor, x: torch.Tensor, inv_rms: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """One source's logits `l_p = r (x . w_p)` against several points, for `w` `[points, D]`, the source `x`
    `[tokens, D]` and its inverse RMS `[tokens]`: shape `[points, tokens]`, one matrix product."""
    return torch.mm(w, x.T, out=out).mul_(inv_rms)


def padded_norm(padded_row: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """The norm `|(x, sqrt(D eps))| = sqrt(|x|^2 + D eps) = sqrt(D) / r` of a source's row padded with
    `sqrt(D eps)` (and zeros), in `dtype`: one operation where the inverse RMS takes three."""
    return torch.linalg.vector_norm(padded_row, dim=-1, dtype=dtype, out=out)


def one_token_logits(scaled_w: torch.Tensor, x_transposed: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    """One position's logits `l_j = sqrt(D) (x_j . w) / |(x_j, sqrt(D eps))| = r_j (x_j . w)`, `[1, 1, n]`, for
    `scaled_w` `sqrt(D) w` `[1, 1, D]`, its sources transposed `[1, D, n]` and their padded rows' norms
    (`padded_norm`) `[1, 1, n]`: a product and a division, where at one token each dispatched operation costs more
    than its arithmetic."""
    return torch.bmm(scaled_w, x_transposed).div_(norms)


def source_softmax(logits: torch.Tensor, sources_dim: int) -> torch.Tensor:
    """`alpha_j = softmax_j(l_j)` over the sources' dimension of `logits`, any layout."""
    return torch.softmax(logits, dim=sources_dim)


def weighted_sum(x_by_token: torch.Tensor, weights: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """`residual + sum_j weights[:, :, j] * x_by_token[:, j]` for sources `[tokens, n, D]`, weights `[tokens, 1, n]`
    (`gamma alpha_j` with a gate) and a residual `[tokens, 1, D]` or None: one batched product per token, shaped
    like the residual."""
    if x_by_token.shape[1] == 1:  # a batched product with a single term takes a slow path on CPU
        return x_by_token * weights if residual is None else torch.addcmul(residual, x_by_token, weights)
    if residual is None:
        return torch.bmm(weights, x_by_token)
    return torch.baddbmm(residual, weights, x_by_token)


def weighted_sum_of_list(sources: list[torch.Tensor], alpha: torch.Tensor) -> torch.Tensor:
    """`sum_j alpha_j x_j` for sources kept apart, each `[..., D]`, and weights `alpha` `[n, ...]`: for an
    implementation that never stacks its sources."""
    mix = alpha[0].unsqueeze(-1) * sources[0]
    for weight, source in zip(alpha[1:], sources[1:]):
        mix = mix + weight.unsqueeze(-1) * source
    return mix


def gated_residual(mix: torch.Tensor, residual: torch.Tensor | None, gate: torch.Tensor | None) -> torch.Tensor:
    """`residual + gamma * mix`, the residual 0 and `gamma` 1 when None: for an implementation whose kernel returns
    the mixture alone. Shapes broadcast; `gate` is 0-dim or `[1]`."""
    if gate is not None:
        mix = gate.to(mix.dtype) * mix
    return mix if residual is None else residual + mix


def mixture_backward(alpha: torch.Tensor, dots: torch.Tensor, gate: torch.Tensor | None, sources_dim: int):
    """With `dots` `d_j = x_j . G`, the dot products of a point's sources with its output gradient, and `alpha` its
    routing weights (same layout, sources along `sources_dim`): its logits' gradients `dL/dl_j = gamma alpha_j (d_j
    - sum_k alpha_k d_k)`, its coefficients `gamma alpha_j`, and per token `sum_j alpha_j d_j`, whose sum is its
    gate's gradient. `gate`, if any, broadcasts against `alpha`."""
    weighted_dots = alpha * dots
    per_token = weighted_dots.sum(sources_dim, keepdim=True)
    logit_grads = torch.addcmul(weighted_dots, alpha, per_token, value=-1)
    if gate is None:
        return logit_grads, alpha, per_token
    return logit_grads.mul_(gate), alpha * gate, per_token


def score_gradients(logit_grads: torch.Tensor, inv_rms: torch.Tensor) -> torch.Tensor:
    """`dL/ds_j = r_j dL/dl_j`, the gradients of the raw scores `s_j = x_j . w`; shapes broadcast."""
    return logit_grads * inv_rms


def inverse_rms_gradient(logit_grads: torch.Tensor, logits: torch.Tensor, inv_rms: torch.Tensor) -> torch.Tensor:
    """`dL/dr = sum_p dL/dl_p l_p / r` for one source read by several points: `logit_grads` and `logits` `[points,
    tokens]`, `inv_rms` `[tokens]`; shape `[tokens]`."""
    return (logit_grads * logits).sum(0).div_(inv_rms)


def add_inverse_rms_gradient(grad: torch.Tensor, x: torch.Tensor, inv_rms: torch.Tensor, inv_rms_grad: torch.Tensor):
    """Adds to a source's gradient `grad` `[tokens, D]` the part that flows through its `r = 1 / RMS(x)`: `dL/dr *
    dr/dx` with `dr/dx = -r^3 x / D`, for `x` `[tokens, D]` and `inv_rms`, `inv_rms_grad` `[tokens]`. In place."""
    return grad.addcmul_(x, (inv_rms_grad * inv_rms.pow(3) / -x.shape[-1]).unsqueeze(-1))
