"""Each piece of `routing_math.py` on its own, in float64: the forward pieces against the formula written out in
plain PyTorch, the backward pieces against autograd through that formula. What every fast path composes, checked
before it is composed."""

import math

import pytest
import torch

from modeling_delta_qwen3 import routing_math

pytestmark = pytest.mark.both_ends

EPS = 1e-6
SOURCES, TOKENS, HIDDEN = 5, 7, 16


def random(*shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def plain_inverse_rms(x: torch.Tensor) -> torch.Tensor:
    return 1 / torch.sqrt(x.pow(2).mean(-1) + EPS)


def test_point_query_is_the_query_times_the_norm_weight():
    q, g = random(HIDDEN), random(HIDDEN, seed=1)
    w = routing_math.point_query(q.float(), g.float(), torch.float64)
    assert w.dtype == torch.float64
    torch.testing.assert_close(w, q.float().double() * g.float().double(), atol=0, rtol=0)


def test_inverse_rms_and_logits_are_the_query_against_rms_normalised_sources():
    x, w = random(SOURCES, TOKENS, HIDDEN), random(HIDDEN, seed=1)
    inv_rms = routing_math.inverse_rms(x, x.new_full((), EPS))
    torch.testing.assert_close(inv_rms, plain_inverse_rms(x), atol=1e-14, rtol=0)
    normed = x * plain_inverse_rms(x)[..., None]
    torch.testing.assert_close(routing_math.logits(x, w, inv_rms), normed @ w, atol=1e-13, rtol=0)
    points = random(3, HIDDEN, seed=2)
    against = routing_math.logits_against_points(points, x[0], inv_rms[0])
    torch.testing.assert_close(against, (normed[0] @ points.T).T, atol=1e-13, rtol=0)


def test_one_token_logits_from_padded_norms_are_the_logits():
    x, w = random(1, SOURCES, HIDDEN), random(HIDDEN, seed=1)
    padded = torch.cat([x, x.new_full((1, SOURCES, 1), math.sqrt(HIDDEN * EPS))], -1)
    norms = routing_math.padded_norm(padded, torch.float64)
    got = routing_math.one_token_logits((math.sqrt(HIDDEN) * w)[None, None], x.transpose(1, 2), norms[:, None])
    expected = (x * plain_inverse_rms(x)[..., None]) @ w
    torch.testing.assert_close(got, expected[:, None], atol=1e-13, rtol=0)


@pytest.mark.parametrize("residual", [False, True])
def test_weighted_sums_and_the_gated_residual(residual):
    x, alpha = random(TOKENS, SOURCES, HIDDEN), torch.softmax(random(TOKENS, 1, SOURCES, seed=1), -1)
    base = random(TOKENS, 1, HIDDEN, seed=2) if residual else None
    expected = (alpha.transpose(1, 2) * x).sum(1, keepdim=True) + (base if residual else 0)
    torch.testing.assert_close(routing_math.weighted_sum(x, alpha, base), expected, atol=1e-13, rtol=0)
    listed = routing_math.weighted_sum_of_list(list(x.unbind(1)), alpha[:, 0].T)
    torch.testing.assert_close(listed, expected[:, 0] - (base[:, 0] if residual else 0), atol=1e-13, rtol=0)
    gate = torch.tensor([0.3], dtype=torch.float64)
    gated = routing_math.gated_residual(listed, base[:, 0] if residual else None, gate)
    torch.testing.assert_close(gated, 0.3 * listed + (base[:, 0] if residual else 0), atol=1e-14, rtol=0)


@pytest.mark.parametrize("gated", [False, True])
def test_the_backward_pieces_are_autograd_through_the_formula(gated):
    """`mixture_backward`, `score_gradients`, `inverse_rms_gradient` and `add_inverse_rms_gradient` composed as the
    fast paths compose them give autograd's gradients of the sources, the query and the gate."""
    x, w = random(SOURCES, TOKENS, HIDDEN).requires_grad_(), random(HIDDEN, seed=1).requires_grad_()
    gate = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    grad_out = random(TOKENS, HIDDEN, seed=2)
    inv_rms = plain_inverse_rms(x)
    point_logits = (x * inv_rms[..., None]) @ w
    alpha = torch.softmax(point_logits, 0)
    out = (alpha[..., None] * x).sum(0) * (gate if gated else 1)
    leaves = [x, w, gate] if gated else [x, w]
    expected = torch.autograd.grad(out, leaves, grad_out)

    x, w, inv_rms, point_logits, alpha = x.detach(), w.detach(), inv_rms.detach(), point_logits.detach(), alpha.detach()
    dots = torch.einsum("ntd,td->nt", x, grad_out)
    logit_grads, coefficients, per_token = routing_math.mixture_backward(alpha, dots, gate.detach() if gated else None,
                                                                         sources_dim=0)  # fmt: skip
    score_grads = routing_math.score_gradients(logit_grads, inv_rms)
    grad_x = coefficients[..., None] * grad_out + score_grads[..., None] * w
    # One point reads every source: each source's dL/dr from its own logit.
    inv_rms_grads = torch.stack([routing_math.inverse_rms_gradient(logit_grads[j][None], point_logits[j][None],
                                                                   inv_rms[j]) for j in range(SOURCES)])  # fmt: skip
    for j in range(SOURCES):
        routing_math.add_inverse_rms_gradient(grad_x[j], x[j], inv_rms[j], inv_rms_grads[j])
    got = [grad_x, torch.einsum("nt,ntd->d", score_grads, x)]
    if gated:
        got.append(per_token.sum())
    for name, a, b in zip(("sources", "query", "gate"), got, expected):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12, msg=lambda m, name=name: f"{name}: {m}")


def test_compute_dtype_and_as_dtype():
    assert routing_math.compute_dtype(torch.bfloat16) == torch.float32
    assert routing_math.compute_dtype(torch.float64) == torch.float64
    x = random(3)
    assert routing_math.as_dtype(x, torch.float64) is x
    assert routing_math.as_dtype(x, torch.float32).dtype == torch.float32
