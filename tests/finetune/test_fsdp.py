"""FSDP2 (what `accelerate` uses with `fsdp_version: 2`) shards DeltaQwen3 per decoder layer and computes the same
loss and gradients as the unsharded model, in every mode, gated too, routed by the CPU's default and by the fused
operation, the GPU's. Runs on the CPU with two processes and gloo."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.running import isolated_env


@pytest.mark.slow
def test_fsdp2_sharded_gradients_equal_unsharded(tmp_path):
    result = tmp_path / "fsdp.json"
    worker = Path(__file__).with_name("fsdp_worker.py")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(worker), str(result)]
    completed = subprocess.run(command, env=isolated_env(), capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-4000:]
    by_implementation = json.loads(result.read_text())
    assert set(by_implementation) == {"None", "fused"}
    for implementation, differences in by_implementation.items():
        assert set(differences) == {"delta", "delta_block", "attnres_full", "attnres_block"}
        for mode, difference in differences.items():
            assert difference["loss"] < 1e-12, (implementation, mode)
            assert difference["grad"] < 1e-10, (implementation, mode)
            assert difference["same_state"], (implementation, mode)  # gathered and saved as the format says
