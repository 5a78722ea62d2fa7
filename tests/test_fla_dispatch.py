"""The glue to flash-linear-attention's fused kernel. Its Triton kernels need CUDA, so here the kernel is replaced,
at the call, by an implementation of its documented contract (`fused_attnres(query, residuals, rms_weight,
rms_eps=..., return_weights=True)` -> mixture in the sources' dtype and weights `[n_sources, ...]`; the signature and
arithmetic of fla-core 0.6.0's `fused_attnres` and of its PyTorch reference `naive_attnres`: RMSNorm, scores and
softmax in float32), and the model must still compute the spec's function, forward and backward."""

import pytest
import torch
from spec_reference import reference_forward
from test_modeling import VARIANTS, random_model, token_ids

from modeling_delta_qwen3 import routing, routing_fla


def contract_fused_attnres(query, residuals, rms_weight, rms_eps=1e-6, return_weights=False):
    """The kernel's contract; computed in float32 or, for these float64 tests, float64."""
    acc = torch.promote_types(residuals[0].dtype, torch.float32)
    stacked = torch.stack([r.to(acc) for r in residuals])
    keys = stacked * torch.rsqrt(stacked.pow(2).mean(-1, keepdim=True) + rms_eps) * rms_weight.to(acc)
    weights = (keys @ query.to(acc)).softmax(dim=0)
    mix = (weights.unsqueeze(-1) * stacked).sum(0).to(residuals[0].dtype)
    return (mix, weights) if return_weights else mix


def test_model_through_the_fused_kernel_matches_the_spec(monkeypatch):
    calls = []

    def kernel(*args, **kwargs):
        calls.append(len(args[1]))
        return contract_fused_attnres(*args, **kwargs)

    monkeypatch.setattr(routing_fla, "fused_attnres", kernel)
    monkeypatch.setattr(routing, "fla_unavailable", lambda x: None)
    ids = token_ids()
    for mode, gated in VARIANTS:
        model = random_model(mode, gated).double().train()
        assert routing.resolve_implementation(None, torch.zeros(1)) == "fla"
        expected, expected_weights = reference_forward(model, ids)
        out = model(ids, labels=ids, output_routing_weights=True)
        torch.testing.assert_close(out.logits, expected, atol=1e-5, rtol=0)
        for got, want in zip(out.routing_weights, expected_weights, strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if "_route." in n}
        model.set_routing_implementation("buffer")
        model.zero_grad()
        model(ids, labels=ids).loss.backward()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, dict(model.named_parameters())[name].grad, atol=1e-8, rtol=1e-6)
    assert calls and max(calls) > 2


def test_fla_is_only_used_on_cuda(monkeypatch):
    """By default fla routes only where it can; asked for where it cannot, it says why instead of falling back."""
    assert routing.resolve_implementation(None, torch.zeros(1)) == "buffer"
    monkeypatch.setattr(routing_fla, "fused_attnres", contract_fused_attnres)
    assert routing.resolve_implementation(None, torch.zeros(1)) == "buffer"
    model = random_model("delta")
    model.set_routing_implementation("fla")
    with pytest.raises(ValueError, match="routing_implementation='fla' cannot .*CUDA only.* cpu"):
        model(token_ids())
    monkeypatch.setattr(routing_fla, "fused_attnres", None)
    with pytest.raises(ValueError, match="routing_implementation='fla' cannot .*not installed"):
        model(token_ids())
