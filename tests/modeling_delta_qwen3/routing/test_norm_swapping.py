"""Serving stacks swap a model's RMSNorm modules for their own kernels: vLLM 0.34's Transformers backend rewrites
the model with torch.fx and replaces every module whose traced forward is an RMSNorm, the routing points' norms
among them, with a module of its own that has a `weight` parameter under the same name (filled by the checkpoint)
and its own forward; Transformers' `use_kernels` replaces the forward of every `Qwen3RMSNorm` on CUDA. Neither may
change the routing. The routing reads a point's norm weight and never calls the norm module, so any module there
that holds the same weight computes the same model: that is what these tests pin down, in every mode and routing
implementation that runs on the CPU."""

import pytest
import torch
from helpers.models import save_random_delta
from torch import nn

from modeling_delta_qwen3.routing_modes import ROUTING_MODES
from modeling_delta_qwen3.routing import IMPLEMENTATIONS
from modeling_delta_qwen3.routing_points import RoutingPoint

PROMPT = torch.tensor([[5, 17, 99, 230, 41, 8, 77, 3]])


class WeightOnlyNorm(nn.Module):
    """A swapped-in norm as a serving stack builds it: a `weight` parameter of its own, filled from the state dict,
    and a forward that must never run."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x):
        raise AssertionError("the routing called its norm module")


@pytest.mark.parametrize("mode", ROUTING_MODES)
def test_routing_point_norms_swapped_for_other_modules_compute_the_same_model(tmp_path, mode):
    model = save_random_delta(tmp_path / "model", mode)
    state = model.state_dict()
    expected, swapped = {}, 0
    with torch.no_grad():
        for implementation, routes in IMPLEMENTATIONS.items():
            if routes.unavailable(PROMPT) is None:
                model.set_routing_implementation(implementation)
                expected[implementation] = model(PROMPT).logits
        for module in model.modules():
            if isinstance(module, RoutingPoint):
                module.norm = WeightOnlyNorm(module.norm.weight.shape[0])
                swapped += 1
        model.load_state_dict(state, strict=True)
        for implementation, logits in expected.items():
            model.set_routing_implementation(implementation)
            torch.testing.assert_close(model(PROMPT).logits, logits, atol=0, rtol=0, msg=implementation)
    assert swapped == 2 * model.config.num_hidden_layers - 1 + ROUTING_MODES[mode].final_point
