"""`make demo`'s job end to end at a tiny budget, as `python -m demo` in a fresh process: every step runs and the
summary holds what the README's table shows, without a single Hub request though the Hub is reachable (its data,
tokenizer and models are built locally); a step that fails ends the demo with one line, not a traceback."""

import json
import subprocess
import sys

import pytest
from helpers.hub_server import online_env, recording_hub
from helpers.paths import REPO_ROOT
from helpers.running import isolated_env


def run_demo(*options: str, timeout: int = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    env = (env or isolated_env()) | {"PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "demo", *options], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


@pytest.mark.slow
def test_the_demo_runs_every_step_and_summarises_three_models(tmp_path):
    with recording_hub() as hub:
        completed = run_demo("--pretrain-steps", "8", "--steps", "4", "--out", str(tmp_path / "demo"),
                             env=online_env(isolated_env(), hub))  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert hub.requests == []
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert summary["conversion_max_logit_difference"] == 0.0
    models = summary["models"]
    assert list(models) == ["base", "baseline fine-tuned", "delta_block fine-tuned"]
    assert all(values["perplexity"] > 1 and 0 <= values["benchmark_average"] <= 1 for values in models.values())
    assert 0 < models["delta_block fine-tuned"]["mean_max_weight_multi_source"] <= 1
    assert "mean_max_weight_multi_source" not in models["baseline fine-tuned"]
    assert (tmp_path / "demo" / "eval" / "routing" / "routing_heatmap.png").is_file()
    table = completed.stdout[completed.stdout.index("=== [5/5]"):]
    assert "delta_block fine-tuned" in table and "largest logit difference 0.000e+00" in table


@pytest.mark.slow
def test_a_failing_step_ends_the_demo_with_one_line(tmp_path):
    # Blocks longer than the base model's positions: finetune refuses them, and the demo stops there.
    completed = run_demo("--seq-len", "100000", "--out", str(tmp_path / "demo"), timeout=300)
    assert completed.returncode == 1
    assert "Traceback" not in completed.stderr
    last = completed.stderr.strip().splitlines()[-1]
    assert last.startswith("demo: error: `") and "exited with status 2 (its message is above)" in last
    assert "finetune: error: --seq-len 100000 is beyond the model's max_position_embeddings" in completed.stderr
