"""A model's forward and backward results by name, and their comparison: what the routing implementations' tests
compare."""

import torch


def run(model, ids, grad: bool = True) -> dict[str, torch.Tensor]:
    """Logits, routing weights, and with `grad` the loss and every parameter's gradient, by name."""
    model.zero_grad()
    with torch.set_grad_enabled(grad):
        out = model(ids, labels=ids, output_routing_weights=True)
    results = {"logits": out.logits.detach()}
    results |= {f"weights.{i}": w.detach() for i, w in enumerate(out.routing_weights)}
    if grad:
        out.loss.backward()
        results["loss"] = out.loss.detach()
        results |= {f"grad.{name}": p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return results


def assert_all_close(got: dict, expected: dict, tolerance: float) -> None:
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=tolerance, rtol=tolerance, msg=lambda m, name=name: f"{name}: {m}")
