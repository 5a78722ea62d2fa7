"""Transformers' own parallelism while loading, two CPU processes with gloo: FSDP2 (`distributed_config`) and tensor
parallelism (`tp_plan="auto"`) shard every mode's checkpoint, gated too, one of the checkpoint format's first
version (0-d gates) and what `delta-qwen3 convert` writes, with no step of the user's own, and the sharded model
computes the unsharded logits and greedy tokens."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
from helpers.models import VARIANTS, random_model, write_scalar_gates
from helpers.running import isolated_env
from transformers import PreTrainedModel

from conversion import convert

pytestmark = pytest.mark.oldest_end

WORKER = Path(__file__).with_name("parallel_loading_worker.py")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, qwen3_checkpoint) -> list[Path]:
    root = tmp_path_factory.mktemp("parallel")
    paths = []
    for mode, gated in VARIANTS:
        paths.append(root / f"{mode}{'-gated' if gated else ''}")
        random_model(mode, gated).save_pretrained(paths[-1])
    paths.append(root / "delta_block-gated-0d-gates")
    random_model("delta_block", gated=True).save_pretrained(paths[-1])
    assert write_scalar_gates(paths[-1])
    paths.append(convert(qwen3_checkpoint, root / "converted", mode="delta_block", num_blocks=2))
    return paths


NO_FSDP_LOADING = pytest.mark.skipif(
    not hasattr(PreTrainedModel, "maybe_distribute_model"),
    reason=f"Transformers {transformers.__version__} has no FSDP sharding while loading",
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "sharding, sharded_class",
    [pytest.param("fsdp", "FSDPDeltaQwen3ForCausalLM", marks=NO_FSDP_LOADING), ("tp", "DeltaQwen3ForCausalLM")],
)
def test_sharded_while_loading_computes_the_unsharded_logits_and_tokens(tmp_path, checkpoints, sharding, sharded_class):
    report_path = tmp_path / "report.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(WORKER),
               sharding, str(report_path), *map(str, checkpoints)]  # fmt: skip
    completed = subprocess.run(command, env=isolated_env(), capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-4000:]
    report = json.loads(report_path.read_text())
    assert list(report) == [path.name for path in checkpoints]
    for name, result in report.items():
        assert result["class"] == sharded_class, name
        assert result["partial"] > 0, name  # really sharded: this process holds only part of some parameters
        assert result["difference"] < 1e-12, name  # in float64
        sharded_tokens, tokens = result["tokens"]
        assert sharded_tokens == tokens and len(tokens) == 8, name
