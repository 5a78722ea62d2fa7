"""Routing adds almost no autograd memory, and what it adds grows linearly with depth. Saved-tensor bytes are
exact, so unlike speed they can be asserted; the figures in the README come from `benchmarks/routing_overhead.py`
at the full shape."""

import pytest
import torch

from benchmarks.routing_overhead import SMALL, VARIANTS, Settings, build, saved_activation_bytes

LIMITS = {"delta_block": 1.05, "delta": 1.15, "attnres_block": 1.15, "attnres_full": 1.15}


@pytest.fixture(scope="module")
def ratios() -> dict[int, dict[str, float]]:
    settings = Settings("cpu", torch.float32, 2, 128, [12, 28], 12, 0, SMALL, 0, 0, 0, False)
    ids = torch.randint(0, SMALL["vocab_size"], (settings.batch, settings.seq), generator=torch.Generator().manual_seed(0))
    result = {}
    for layers in settings.depths:
        shape = {**SMALL, "num_hidden_layers": layers}
        sizes = {label: saved_activation_bytes(build(shape, mode, gated, settings), ids) for label, mode, gated in VARIANTS}
        result[layers] = {label: size / sizes["qwen3"] for label, size in sizes.items()}
    return result


@pytest.mark.parametrize("label", [label for label, _, _ in VARIANTS[1:]])
def test_saved_activation_ratio_is_small_and_linear_in_depth(ratios, label):
    limit = LIMITS[label.split("+")[0]]
    for layers in (12, 28):
        assert 1.0 <= ratios[layers][label] <= limit, (layers, ratios[layers][label])
    assert ratios[28][label] - ratios[12][label] <= 0.03


def test_gate_costs_no_memory(ratios):
    for layers in (12, 28):
        assert ratios[layers]["delta+gate"] == ratios[layers]["delta"]
        assert ratios[layers]["delta_block+gate"] == ratios[layers]["delta_block"]
