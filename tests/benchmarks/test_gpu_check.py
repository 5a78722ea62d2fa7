"""`python -m benchmarks.gpu_check`: its CPU rehearsal runs every section of the GPU check and passes, so the check
cannot rot while no GPU runs it; a section that fails, raises or runs out of time is recorded as such, the others
still run, and the report is on disk throughout; bad options end with one line."""

import json
import subprocess
import sys
import time

import pytest
from helpers.paths import REPO_ROOT
from helpers.running import isolated_env

from benchmarks.gpu_check import attention, comparing, driver, performance, profiles, running
from benchmarks.gpu_check import report as reporting
from modeling_delta_qwen3.routing_modes import ROUTING_MODES


@pytest.mark.slow
def test_the_rehearsal_runs_every_section_and_passes(tmp_path):
    # Budgets times four: a loaded test machine must not turn a slow section into a timeout.
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--out", str(tmp_path), "--rehearsal",
               "--budget-scale", "4"]
    env = isolated_env() | {"PYTHONPATH": str(REPO_ROOT)}
    completed = subprocess.run(command, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                               text=True, timeout=900)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    sections = report["sections"]
    assert list(sections) == list(driver.SECTIONS) and report["passed"] is True
    assert report["settings"]["rehearsal"] is True and report["settings"]["device"] == "cpu"
    assert sections["serving"]["status"] == "skipped" and sections["serving"]["checks"] == []
    assert sections["serving"]["reason"].startswith("vLLM is not installed in this interpreter")
    for name in driver.SECTIONS[:-1]:
        assert sections[name]["status"] == "pass", (name, sections[name])
        assert sections[name]["checks"] and all(check["pass"] for check in sections[name]["checks"])
    implementations = {check["name"].split(":")[0] for check in sections["implementations"]["checks"]}
    assert implementations == {f"{mode} {dtype} {name}" for mode in ROUTING_MODES
                               for dtype in ("float32", "bfloat16")
                               for name in ("buffer", "compiled", "fused", "fused grouped")}
    assert sections["implementations"]["not_run"]["fla"].startswith("flash-linear-attention is not installed")
    check_performance_rehearsal(sections["performance"])
    assert all(len(sections["learning"]["figures"][f"{mode} losses"]) == 20 for mode in ("baseline", "delta_block"))
    table = (tmp_path / "gpu_check.md").read_text()
    assert table in completed.stdout and "all sections passed or were skipped" in table
    assert [line.split(" | ")[0] for line in table.splitlines()[2:8]] == [f"| {name}" for name in driver.SECTIONS]
    goals = sections["performance"]["goals"]
    assert f"| goals met: {sum(goal['met'] for goal in goals)} of 21 (below); not run: kernels, " in table
    assert "Goals (reported, not checked):" in table and "| training_long: delta fused / qwen3 | " in table


def check_performance_rehearsal(performance: dict) -> None:
    """The performance section's figures at the rehearsal's shapes (2 layers, width 64, bfloat16): every variant
    with both eager implementations, the compiled parts with `fused`, the CUDA-only parts named as not measured."""
    figures = performance["figures"]
    assert set(figures) == {"shape", "memory", "memory_long", "training", "training_long", "routing_op_bandwidth",
                            "decoding", "decoding_static_cache_eager", "compiled_training"}
    both = {"buffer", "fused"}
    for memory in ("memory", "memory_long"):
        assert {kind: {label: set(ratios) for label, ratios in by_variant.items()}
                for kind, by_variant in figures[memory].items()} == {  # peak memory: CUDA only
            "saved_activations": {"delta_block": both, "delta": both}}
    timed = {"training": both, "training_long": both, "decoding": both, "decoding_static_cache_eager": {"fused"}}
    for figure, implementations in timed.items():
        assert {label: set(figures[figure][label]) for label in ("delta_block", "delta")} == dict.fromkeys(
            ("delta_block", "delta"), implementations), figure
        assert set(figures[figure]["first_call_seconds"]) == {"qwen3"} | {
            f"{label} {name}" for label in ("delta_block", "delta") for name in implementations}
    assert set(figures["compiled_training"]) == {"delta_block", "first_call_seconds", "qwen3_tokens_per_s"}
    assert figures["shape"]["training_long_tokens"] == [1, 64]
    # What each routing operation must move, in bytes, at 1 x 64 tokens of width 64: bfloat16 sources, residual,
    # output and gradients, float32 w, routing weights and its gradient.
    bandwidth = figures["routing_op_bandwidth"]
    tokens, width = 64, 64
    for label, sources in (("delta_block", 2), ("delta", 4)):
        assert bandwidth[label]["sources"] == sources
        hidden = tokens * width * 2
        assert bandwidth[label]["route"]["bytes"] == sources * hidden + 2 * hidden + width * 4 + tokens * sources * 4
        assert bandwidth[label]["route_backward"]["bytes"] == (
            hidden + 2 * sources * hidden + 2 * width * 4 + tokens * sources * 4)
        assert bandwidth[label]["copy"]["bytes"] == 2 * sources * hidden
        for name in ("route", "route_backward", "copy"):
            assert bandwidth[label][name]["bytes_per_s"] > 0
            assert bandwidth[label][name]["of_memory_bandwidth"] == "not measured on cpu"
    assert bandwidth["memory_bandwidth_bytes_per_s"] == "not measured on cpu"
    assert performance["not_run"]["kernels"].startswith("not measured on cpu: ")
    assert performance["not_run"]["decoding_cuda_graphs"].startswith("not measured on cpu: ")
    # Every measured ratio beside its goal, none of them a check that can fail.
    goals = {goal["name"]: goal for goal in performance["goals"]}
    assert len(goals) == 21
    assert goals["saved_activations_long: delta fused / qwen3"]["goal"] == 1.15
    assert goals["training_long: delta fused / qwen3"]["value"] == figures["training_long"]["delta"]["fused"]
    assert goals["training_long: delta fused / qwen3"]["goal"] == 0.90
    assert goals["saved_activations: delta_block buffer / qwen3"]["passes_if"] == "value <= goal"
    assert all(goal["met"] == (goal["value"] >= goal["goal"] if goal["passes_if"] == "value >= goal"
                               else goal["value"] <= goal["goal"]) for goal in goals.values())
    assert {check["name"] for check in performance["checks"]} == {f"{name}: measured" for name in goals} | {
        f"decoding_static_cache_eager: {label} fused / qwen3: measured" for label in ("delta_block", "delta")}


def test_a_section_that_fails_raises_or_times_out_is_recorded_and_the_others_still_run(tmp_path):
    run = running.Run(tmp_path, {"settings": {}, "sections": {}})
    on_disk = {}

    def passes(section):
        on_disk.update(json.loads((tmp_path / "gpu_check.json").read_text())["sections"])
        section.check("a figure", 1.0, 2.0)

    def skips(section):
        raise running.Skipped("not here")

    functions = {
        "raises": lambda section: 1 / 0,
        "times_out": lambda section: time.sleep(30),
        "fails": lambda section: section.check("too large", 3.0, 2.0),
        "passes": passes,
        "skips": skips,
    }
    budgets = dict.fromkeys(functions, 0.5)
    with (tmp_path / "log").open("w") as log:
        running.run_sections(run, functions, budgets, log)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    statuses = {name: data["status"] for name, data in report["sections"].items()}
    assert statuses == {"raises": "error", "times_out": "timeout", "fails": "fail", "passes": "pass",
                        "skips": "skipped"}
    assert report["passed"] is False
    assert report["sections"]["raises"]["reason"] == "ZeroDivisionError: division by zero"
    assert report["sections"]["times_out"]["reason"] == "ran out of its 0.5 s"
    assert report["sections"]["times_out"]["seconds"] < 5
    assert report["sections"]["fails"]["checks"] == [{"name": "too large", "value": 3.0, "limit": 2.0,
                                                      "passes_if": "value <= limit", "pass": False,
                                                      "at_seconds": 0.0}]
    # While a section ran, the report on disk held the sections before it, and said which one was running.
    assert [on_disk[name]["status"] for name in functions] == ["error", "timeout", "fail", "running", "waiting"]
    table = reporting.table(run)
    assert "| fails | fail |" in table and "failed: too large = 3 (needs <= 2)" in table
    assert "some sections did not pass" in table


@pytest.mark.parametrize("options,message", [
    (["--sections", "compile,bogus"], "argument --sections: unknown section bogus: choose from implementations, "),
    (["--budget-scale", "0"], "argument --budget-scale: must be above 0, got 0"),
    (["--vllm-python", "/no/such/python"], "--vllm-python /no/such/python does not exist"),
])
def test_bad_options_end_with_one_line(tmp_path, capsys, options, message):
    with pytest.raises(SystemExit) as exit_info:
        driver.main(["--out", str(tmp_path / "out"), "--rehearsal", *options])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m benchmarks.gpu_check: error: ") and message in err
    assert not (tmp_path / "out").exists()


def test_without_a_gpu_the_full_check_points_to_the_rehearsal(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(driver.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        driver.main(["--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == ("python -m benchmarks.gpu_check: error: no CUDA GPU is visible to PyTorch "
                                       "here: --rehearsal runs the check on the CPU\n")


def test_a_non_finite_attention_result_is_checked_against_plain_qwen3(monkeypatch):
    # On an H200, PyTorch's cuDNN attention gave non-finite gradients on a left-padded batch in bfloat16, to plain
    # Qwen3 as well: the section records whether Qwen3 shares a failure, so the report says whose it is.
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    profile = profiles.REHEARSAL
    ids = comparing.check_ids(profile)
    mask = attention.left_padded(ids)
    assert attention.plain_qwen3_gradients_finite(profile, "sdpa bfloat16", ids, mask) is True

    def poisoned(*args, **kwargs):
        output, weights = sdpa_attention_forward(*args, **kwargs)
        return output * float("nan"), weights

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", poisoned)
    assert attention.plain_qwen3_gradients_finite(profile, "sdpa bfloat16", ids, mask) is False
    section = running.SectionRecord({})
    attention.check_attention(profile, section)
    failed = {check["name"].rsplit(":", 1)[0] for check in section.data["checks"] if not check["pass"]}
    assert failed == {f"{mode} sdpa {dtype}" for mode in ROUTING_MODES for dtype in ("float32", "bfloat16")}
    assert section.data["figures"]["qwen3 sdpa float32: gradients finite"] is False
    assert section.data["figures"]["qwen3 sdpa bfloat16: gradients finite"] is False


# In a fresh interpreter: in a test worker that has run other tests, the garbage collection between parts can run
# finalizers of earlier tests' objects, and one that cancels the process's alarm (signal.alarm(0)) cancels the
# budget's timer with it.
BUDGET_SCRIPT = """
import json, sys, time
from pathlib import Path
from benchmarks.gpu_check import running
from benchmarks.gpu_check.performance import record_goal

run, ran = running.Run(Path(sys.argv[1]), {"settings": {}, "sections": {}}), []

def performance(section):
    running.run_parts(section, {
        "raises": lambda: 1 / 0,
        "measures": lambda: record_goal(section, "training", "delta", "training: delta / qwen3", 0.9),
        "runs_out": lambda: time.sleep(30),
        "after": lambda: ran.append("after"),
    })

with (Path(sys.argv[1]) / "log").open("w") as log:
    running.run_sections(run, {"performance": performance}, {"performance": 1.0}, log)
print(json.dumps({"data": run.sections()["performance"], "ran": ran}))
"""


def test_the_performance_parts_after_a_budget_runs_out_are_not_run_and_an_error_is_recorded(tmp_path):
    completed = subprocess.run([sys.executable, "-c", BUDGET_SCRIPT, str(tmp_path)], cwd=REPO_ROOT,
                               env=isolated_env() | {"PYTHONPATH": str(REPO_ROOT)}, capture_output=True, text=True,
                               timeout=120)  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    data, ran = result["data"], result["ran"]
    assert data["status"] == "fail" and data["seconds"] < 5 and not ran
    assert data["errors"] == {"raises": "ZeroDivisionError: division by zero"}
    assert [(check["name"], check["pass"]) for check in data["checks"]] == [
        ("raises: errors", False), ("training: delta / qwen3: measured", True)]
    assert data["goals"] == [{"name": "training: delta / qwen3", "value": 0.9, "goal": 0.85,
                              "passes_if": "value >= goal", "met": True}]
    assert data["not_run"] == {"runs_out": "the section's time budget ran out during it",
                               "after": "the section's time budget ran out before it"}


def test_gpu_activity_counts_the_kernels_and_the_busy_time_within_the_profiled_step():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def event(name, start, end, device=DeviceType.CUDA, annotation=False):
        return SimpleNamespace(name=name, device_type=device, is_user_annotation=annotation,
                               time_range=SimpleNamespace(start=start, end=end))

    step = performance.PROFILED_STEP
    events = [
        event(step, 100, 200, DeviceType.CPU, annotation=True),
        event(step, 100, 200, annotation=True),  # the step's range on the GPU's timeline: not an activity
        event("aten::mm", 100, 110, DeviceType.CPU),
        event("gemm", 110, 130),
        event("softmax", 120, 140),  # overlaps the one before: busy 110-140
        event("Memcpy DtoD (Device -> Device)", 150, 160),  # busy, not a kernel
        event("Memset (Device)", 155, 158),  # within the copy
        event("tail", 190, 230),  # past the step's end: only its first 10 count
        event("before", 50, 90),  # before the step: not counted
    ]
    assert performance.gpu_activity(events, step) == {"kernels": 3, "gpu_busy": (30 + 10 + 10) / 100}
