"""The benchmark scripts run end to end and report what the README quotes (their timings are not asserted)."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from helpers.environments import require_environment
from helpers.paths import REPO_ROOT, VLLM_PATH
from helpers.running import isolated_env

from benchmarks.routing_overhead import (
    SMALL,
    TRAFFIC_BATCHES,
    VARIANTS,
    Settings,
    _Traffic,
    build,
    dispatched_operations,
    measure_operations,
    measure_traffic,
    saved_activation_bytes,
)
from modeling_delta_qwen3 import routing_fused
from modeling_delta_qwen3.routing_op import route, route_backward


@pytest.mark.slow
def test_routing_overhead_quick_run_reports_every_eager_figure(tmp_path):
    output = tmp_path / "results.json"
    command = [sys.executable, "benchmarks/routing_overhead.py", "--quick", "--training-pairs", "1", "--figures",
               "memory,training,decoding", "--output", str(output)]
    env = isolated_env() | {"PYTHONPATH": str(REPO_ROOT)}
    completed = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(output.read_text())
    assert results["settings"]["training_pairs"] == 1
    labels = [label for label, _, _ in VARIANTS]
    for figure in ("training", "decoding"):
        assert set(labels) <= set(results[figure]) and results[figure]["qwen3"] == 1.0
        assert all(results[figure][label] > 0 for label in labels)
        assert set(results[figure]["by_build_order"]) == set(labels[1:])
        for label, orders in results[figure]["by_build_order"].items():  # --quick: one build order, the ratio's own
            assert set(orders) == {"qwen3_first"} and results[figure][label] == pytest.approx(orders["qwen3_first"])
    for ratios in results["memory"].values():
        assert ratios["qwen3"] == 1.0 and 1.0 <= ratios["delta_block"] <= 1.05
    assert all(label in completed.stdout for label in labels)


@pytest.mark.slow
def test_routing_overhead_compiled_training_reports_ratio_and_compile_time(tmp_path):
    output = tmp_path / "results.json"
    command = [sys.executable, "benchmarks/routing_overhead.py", "--quick", "--training-pairs", "1", "--figures",
               "compiled_training", "--variants", "delta_block", "--output", str(output)]
    env = isolated_env() | {"PYTHONPATH": str(REPO_ROOT)}
    completed = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(output.read_text())["compiled_training"]
    assert results["qwen3"] == 1.0 and results["delta_block"] > 0
    assert set(results["by_build_order"]["delta_block"]) == {"qwen3_first"}
    assert set(results["compile_seconds"]) == {"qwen3", "delta_block"}
    assert all(seconds > 0 for seconds in results["compile_seconds"].values())
    assert "compiled train tok/s" in completed.stdout and "first compiled training step" in completed.stdout


def test_routing_overhead_measures_the_chosen_part_of_the_table(tmp_path):
    output = tmp_path / "results.json"
    command = [sys.executable, "benchmarks/routing_overhead.py", "--quick", "--figures", "memory",
               "--variants", "delta_block", "--output", str(output)]
    env = isolated_env() | {"PYTHONPATH": str(REPO_ROOT)}
    completed = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(output.read_text())
    assert set(results) == {"settings", "memory", "targets_missed"}
    assert [set(ratios) for ratios in results["memory"].values()] == [{"qwen3", "delta_block", "qwen3_bytes"}] * 2
    assert [line.split(" ")[0] for line in completed.stdout.splitlines()[2:4]] == ["qwen3", "delta_block"]

    command[command.index("--variants") + 1] = "delta_block,deltablock"
    completed = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 2 and "unknown deltablock: choose from delta, delta+gate, delta_block," in completed.stderr

    command[command.index("--variants") + 1] = "delta_block"
    completed = subprocess.run([*command, "--training-pairs", "0"], cwd=REPO_ROOT, env=env, capture_output=True,
                               text=True, timeout=600)
    assert completed.returncode == 2 and "--training-pairs: must be at least 1, got 0" in completed.stderr


@pytest.mark.slow
def test_decode_steps_reports_every_mode():
    command = [sys.executable, "-m", "benchmarks.decode_steps", "--shape", "small", "--rounds", "1", "--prompt", "8"]
    completed = subprocess.run(command, cwd=REPO_ROOT, env=isolated_env(), capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = completed.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["delta", "delta_block"]
    assert all(0 < float(line.split("generation ratio ")[1].split()[0]) for line in lines)


@pytest.mark.slow
def test_conversion_memory_stays_near_the_largest_shard():
    command = [sys.executable, "benchmarks/convert_memory.py", "--layers", "12", "--hidden", "256", "--shard-mb", "8"]
    completed = subprocess.run(command, cwd=REPO_ROOT, env=isolated_env(), capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    assert report["shards"] > 4
    # Streaming: the conversion holds about one shard at a time, never the whole model.
    assert report["peak_above_imports_mb"] < report["model_mb"] / 2, report


def test_serving_refuses_delta_block_in_the_compiled_mode():
    """delta_block refuses vLLM's compiled mode on the CPU (tests/serving/test_vllm.py): the benchmark says so up
    front."""
    command = [sys.executable, "benchmarks/serving.py", "--modes", "delta_block,delta"]
    completed = subprocess.run(command, cwd=REPO_ROOT, env=isolated_env() | {"PYTHONPATH": str(REPO_ROOT)},
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2
    assert completed.stderr.splitlines()[-1] == (
        "serving.py: error: delta_block refuses vLLM's compiled mode on the CPU under PyTorch before 2.14, which "
        "vLLM's CPU build pins (docs/SERVING.md): add --enforce-eager, or leave it out of --modes"
    )


@pytest.mark.slow
def test_serving_quick_run_reports_every_ratio(tmp_path):
    require_environment(VLLM_PATH)
    output = tmp_path / "results.json"
    command = [sys.executable, "benchmarks/serving.py", "--quick", "--enforce-eager", "--modes", "delta_block",
               "--output", str(output)]
    env = isolated_env() | {"PYTHONPATH": str(REPO_ROOT), "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    completed = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(output.read_text())
    assert results["settings"]["compiled"] is False and results["settings"]["rounds"] == 1
    assert {name: run["architecture"] for name, run in results["runs"].items()} == {
        "qwen3_native": "Qwen3ForCausalLM", "qwen3_transformers": "TransformersForCausalLM",
        "delta_block": "TransformersForCausalLM",
    }
    assert set(results["ratios"]["delta_block"]) == {
        f"{figure}_vs_qwen3_{impl}" for figure in ("throughput", "first_token") for impl in ("transformers", "native")
    }
    assert all(ratio > 0 for ratio in results["ratios"]["delta_block"].values())
    assert results["prompts_with_qwen3_tokens"] == {"delta_block": 4}
    assert "Delta Block: throughput" in completed.stdout


def test_dispatched_operations_counts_each_operation_below_autograd_views_included():
    x = torch.ones(2, 2, requires_grad=True)
    assert dispatched_operations(lambda: x.view(-1).mul(2).sum()) == 3  # view, mul, sum

    settings = Settings(device="cpu", dtype=torch.float32, batch=2, seq=16, depths=[2, 4], train_layers=2,
                        training_pairs=1, decode_shape={}, prompt=8, new_tokens=1, decode_runs=1,
                        keep_freed_memory=False, variants=[v for v in VARIANTS if v[0] in ("qwen3", "delta_block")])  # fmt: skip
    first, again = measure_operations(settings), measure_operations(settings)
    assert first == again  # exact: no noise to average away
    for step in ("training", "decoding"):
        for layers in (2, 4):
            counts = first[step][layers]
            assert counts["qwen3"] == 1.0 and counts["delta_block"] > 1.0  # routing adds operations
            assert isinstance(counts["qwen3_operations"], int) and counts["qwen3_operations"] > 0
        assert first[step][4]["qwen3_operations"] > first[step][2]["qwen3_operations"]  # more layers, more


def test_traffic_counts_each_operand_once_views_nothing_and_overwritten_arguments_as_written_only():
    x, y = torch.ones(4, 8), torch.zeros(4, 8)  # 128 bytes each
    with _Traffic() as traffic:
        x.view(-1)
        x.mul(2)
    assert (traffic.read, traffic.written) == (128, 128)
    with _Traffic() as traffic:
        y.copy_(x)
    assert (traffic.read, traffic.written) == (128, 128)
    with _Traffic() as traffic:
        y.add_(x)
    assert (traffic.read, traffic.written) == (256, 128)


def test_traffic_counts_the_routing_operations_sources_as_far_and_as_often_as_their_kernels_read_them():
    sources, w = torch.randn(5, 3, 8), torch.randn(8)  # a buffer of 5 slots of 3 tokens, of which 2 are read
    with _Traffic() as traffic:
        out, weights = route(sources, 2, None, w, None, None, 1e-6)
    assert traffic.read == 2 * 3 * 8 * 4 + 8 * 4  # two slots and the query, not the buffer
    assert traffic.written == 3 * 8 * 4 + 3 * 2 * 4
    grad_out, read = torch.ones_like(out), sources[:2]
    with _Traffic() as traffic:
        route_backward(grad_out, read, 2, None, w, None, weights, 1e-6)
    assert traffic.read == 2 * (2 * 3 * 8 * 4) + 3 * 8 * 4 + 8 * 4 + 3 * 2 * 4  # the sources twice, G, w, weights
    assert traffic.written == 2 * 3 * 8 * 4 + 8 * 4  # their gradients and w's (the gate's: none)
    mix, group_logits = torch.randn(3, 8), torch.randn(3, 3)  # a partial mixture of 3 sources, for 3 tokens
    with _Traffic() as traffic:
        route(sources, 5, None, w, None, None, 1e-6, 3, mix, group_logits)
    assert traffic.read == 2 * 3 * 8 * 4 + 8 * 4 + 3 * 8 * 4 + 3 * 3 * 4  # slots 3 and 4, w, the partial ones


def test_traffic_figure_is_routings_excess_over_qwen3_and_the_fused_operation_moves_less(monkeypatch):
    def traffic(implementation: str) -> dict:
        settings = Settings(device="cpu", dtype=torch.bfloat16, batch=1, seq=16, depths=[2], train_layers=2,
                            training_pairs=1, decode_shape={}, prompt=8, new_tokens=1, decode_runs=1,
                            keep_freed_memory=False, variants=[v for v in VARIANTS if v[0] in ("qwen3", "delta")],
                            traffic_shape={**SMALL, "num_hidden_layers": 12},
                            routing_implementation=implementation)  # fmt: skip
        return measure_traffic(settings)

    buffer, fused = traffic("buffer"), traffic("fused")
    assert buffer == traffic("buffer")  # counted: no noise
    for batch in TRAFFIC_BATCHES:
        for step in ("forward", "backward"):
            qwen3, delta = buffer[batch][step]["qwen3"], buffer[batch][step]["delta"]
            assert qwen3["routing_bytes"] == 0 and qwen3["ratio"] == 1.0
            assert delta["read"] + delta["written"] - qwen3["read"] - qwen3["written"] == delta["routing_bytes"] > 0
            # The fused operation reads each source once per point where the buffer's operations read and write more.
            assert 0 < fused[batch][step]["delta"]["routing_bytes"] < delta["routing_bytes"]
    # In the long batch, groups of points read the sources together: less than each point reading them all.
    monkeypatch.setattr(routing_fused, "GROUP_OPERATIONS_BYTES", float("inf"))
    per_point = traffic("fused")
    for step in ("forward", "backward"):
        grouped, alone = (traffic["8x4096"][step]["delta"]["routing_bytes"] for traffic in (fused, per_point))
        assert grouped < 0.9 * alone, (step, grouped, alone)
    assert per_point["4x512"] == fused["4x512"]  # too short a batch to group at 12 layers
    # Groups keep their partial mixtures for the backward pass: memory is what grouping costs.
    saved = {name: result["8x4096"]["saved_activations"] for name, result in (("grouped", fused), ("alone", per_point))}
    assert saved["grouped"]["qwen3"] == saved["alone"]["qwen3"] == 1.0
    assert saved["grouped"]["delta"] > saved["alone"]["delta"] > 1.0


def test_saved_activations_are_counted_on_the_meta_device_as_on_the_cpu():
    """Storages told apart by identity, not by address, which the meta device does not have."""
    settings = Settings(device="cpu", dtype=torch.float32, batch=1, seq=16, depths=[2], train_layers=2,
                        training_pairs=1, decode_shape={}, prompt=8, new_tokens=1, decode_runs=1,
                        keep_freed_memory=False, routing_implementation="fused")  # fmt: skip
    shape = {**SMALL, "num_hidden_layers": 3}
    sizes = {}
    for device in ("cpu", "meta"):
        with torch.device(device):
            model = build(shape, "delta", True, replace(settings, device=device))
        model.config._attn_implementation = "eager"  # sdpa keeps other tensors on the CPU than on the meta device
        sizes[device] = saved_activation_bytes(model, torch.zeros(2, 16, dtype=torch.long, device=device))
    assert sizes["cpu"] == sizes["meta"] > 0


def test_routing_overhead_routes_with_the_implementation_asked_for(tmp_path):
    output = tmp_path / "results.json"
    command = [sys.executable, "benchmarks/routing_overhead.py", "--quick", "--figures", "memory",
               "--variants", "delta", "--output", str(output)]  # fmt: skip
    env = isolated_env() | {"PYTHONPATH": str(REPO_ROOT)}
    memory = {}
    for implementation in ("buffer", "reference"):
        completed = subprocess.run([*command, "--routing-implementation", implementation], cwd=REPO_ROOT, env=env,
                                   capture_output=True, text=True, timeout=600)  # fmt: skip
        assert completed.returncode == 0, completed.stderr[-3000:]
        results = json.loads(output.read_text())
        assert results["settings"]["routing_implementation"] == implementation
        memory[implementation] = results["memory"]["8"]["delta"]
    assert memory["reference"] > 1.5 * memory["buffer"]  # the reference re-stacks every source at every point

    completed = subprocess.run([*command, "--routing-implementation", "fla"], cwd=REPO_ROOT, env=env,
                               capture_output=True, text=True, timeout=600)  # fmt: skip
    assert completed.returncode == 2
    assert completed.stderr.splitlines()[-1] == (
        "routing_overhead.py: error: --routing-implementation fla cannot run here: flash-linear-attention is not "
        "installed (pip install 'flash-linear-attention>=0.6,<0.7')"
    )
