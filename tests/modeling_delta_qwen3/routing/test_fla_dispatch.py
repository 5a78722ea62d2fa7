"""The `"fla"` routing implementation: flash-linear-attention's real `fused_attnres` kernels, run on the CPU by
Triton's interpreter in a fresh interpreter (`tests/modeling_delta_qwen3/routing/fla_kernel_on_cpu.py`, with `.venv-fla`, which `make test`
builds: fla-core 0.6.0 and Triton 3.7.1, the version PyTorch 2.13's CUDA wheels pin), compute the spec's function
forward and backward, alone and through the model; and the model refuses fla where it cannot run, saying why."""

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.environments import require_environment
from helpers.models import random_model, token_ids
from helpers.paths import FLA_PATH, REPO_ROOT
from helpers.running import isolated_env

from modeling_delta_qwen3 import routing, routing_fla

KERNEL_SCRIPT = Path(__file__).with_name("fla_kernel_on_cpu.py")

# Relative errors in float32 (largest absolute difference over the largest absolute expected value). The kernel
# against fla's PyTorch reference and against the formula in float64: 8e-7 forward and 4e-6 backward measured.
KERNEL_TOLERANCE = 1e-5
# The model through the kernel against the "reference" implementation: the largest absolute logit difference
# (logits of magnitude about 3) and the routing parameters' gradients relative to the largest of them. Replacement
# routing (AttnRes) has no residual stream to damp float32 rounding through depth: measured up to 1.6e-6 and 1.6e-6
# in the delta modes, 9.9e-6 and 1.7e-5 in the AttnRes modes, where the buffer implementation differs from the
# reference by up to 1e-5 in logits too (the kernel's backward rounds a few times more than fla's reference).
MODEL_TOLERANCES = {  # mode: (logits, gradients)
    "delta": (5e-6, 2e-5),
    "delta_block": (5e-6, 2e-5),
    "attnres_full": (2e-5, 5e-5),
    "attnres_block": (2e-5, 5e-5),
}
WEIGHTS_TOLERANCE = 5e-6  # routing weights, absolute: measured up to 1.7e-6


@pytest.fixture(scope="module")
def kernel_report() -> dict:
    require_environment(FLA_PATH)
    env = isolated_env() | {"PYTHONPATH": f"{FLA_PATH}{os.pathsep}{REPO_ROOT}", "TRITON_INTERPRET": "1"}
    completed = subprocess.run([sys.executable, str(KERNEL_SCRIPT)], cwd=REPO_ROOT,
                               env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-5000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_kernel_computes_the_formula_forward_and_backward(kernel_report):
    for comparison in ("kernel_vs_naive", "kernel_vs_float64", "naive_vs_float64"):
        errors = kernel_report["kernel"][comparison]
        assert errors["forward"] < KERNEL_TOLERANCE and errors["backward"] < KERNEL_TOLERANCE, (comparison, errors)


@pytest.mark.slow
def test_the_model_through_the_kernel_matches_the_reference_implementation(kernel_report):
    assert set(kernel_report["model"]) == set(MODEL_TOLERANCES)
    for mode, (logits_tolerance, grad_tolerance) in MODEL_TOLERANCES.items():
        errors = kernel_report["model"][mode]
        assert errors["logits_max_abs"] < logits_tolerance, (mode, errors)
        assert errors["weights_max_abs"] < WEIGHTS_TOLERANCE, (mode, errors)
        assert errors["routing_grad_relative"] < grad_tolerance and errors["routing_parameters"] > 0, (mode, errors)
        assert errors["kernel_calls"] == errors["routing_points"], (mode, errors)  # each point through the kernel
    # Some points read more sources than one tile of four holds.
    assert max(errors["most_sources"] for errors in kernel_report["model"].values()) > 4


def test_fla_is_only_used_when_asked_for(monkeypatch):
    """fla never routes by default, not even where it can; asked for where it cannot, it says why instead of falling
    back."""
    assert routing.resolve_implementation(None, torch.zeros(1)) == "buffer"
    monkeypatch.setattr(routing_fla, "fused_attnres", lambda *args, **kwargs: None)  # as if installed
    assert routing.resolve_implementation(None, torch.zeros(1)) == "buffer"
    model = random_model("delta")
    model.set_routing_implementation("fla")
    with pytest.raises(ValueError, match="routing_implementation='fla' cannot .*CUDA only.* cpu"):
        model(token_ids())
    monkeypatch.setattr(routing_fla, "fused_attnres", None)
    advice = re.escape("not installed (pip install 'flash-linear-attention>=0.6,<0.7')")  # the setup.cfg extra's
    with pytest.raises(ValueError, match=f"routing_implementation='fla' cannot .*{advice}"):
        model(token_ids())

    def runs_here(x):
        return None

    monkeypatch.setattr(routing, "fla_unavailable", runs_here)  # as on CUDA with fla installed
    monkeypatch.setitem(routing.IMPLEMENTATIONS, "fla", dataclasses.replace(routing.IMPLEMENTATIONS["fla"],
                                                                             unavailable=runs_here))
    assert routing.resolve_implementation(None, torch.zeros(1)) == "buffer"
    assert routing.resolve_implementation(None, torch.zeros(1), checkpointing=True) == "compiled"
    assert routing.resolve_implementation("fla", torch.zeros(1)) == "fla"
