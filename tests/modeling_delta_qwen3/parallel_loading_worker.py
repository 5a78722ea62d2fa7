"""Run under `torchrun --nproc_per_node 2` with how to shard, a JSON path and checkpoint directories: loads each
checkpoint the way Transformers shards it while loading (`fsdp`: FSDP2, `from_pretrained(...,
distributed_config=DistributedConfig(fsdp_size=2))`; `tp`: tensor parallelism, `from_pretrained(...,
tp_plan="auto")`) and unsharded, both in float64 (so that a difference is the sharding's, not float32's rounding in
another order), and writes, from rank 0, per checkpoint the sharded model's class, how many of its
parameters this process holds only a part of, the largest difference of its logits from the unsharded model's, and
both models' greedy tokens."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM
from transformers.distributed import DistributedConfig

SHARDING = {"fsdp": lambda: {"distributed_config": DistributedConfig(fsdp_size=2)}, "tp": lambda: {"tp_plan": "auto"}}
ids = torch.arange(3, 16).view(1, -1)


def local_shape(parameter: torch.Tensor) -> torch.Size:
    return parameter.to_local().shape if hasattr(parameter, "to_local") else parameter.shape


def compare(path: str, sharding: str) -> dict:
    load = dict(trust_remote_code=True, dtype=torch.float64)
    sharded = AutoModelForCausalLM.from_pretrained(path, **load, **SHARDING[sharding]())
    expected = AutoModelForCausalLM.from_pretrained(path, **load)
    whole = dict(expected.named_parameters())
    partial = sum(local_shape(p) != whole[name].shape for name, p in sharded.named_parameters())
    with torch.no_grad():
        difference = (sharded(ids).logits - expected(ids).logits).abs().max().item()
    greedy = dict(max_new_tokens=8, do_sample=False, pad_token_id=2, eos_token_id=None)
    tokens = [model.generate(ids, **greedy)[0, ids.shape[1] :].tolist() for model in (sharded, expected)]
    return {"class": type(sharded).__name__, "partial": partial, "difference": difference, "tokens": tokens}


sharding, result, *paths = sys.argv[1:]
report = {Path(path).name: compare(path, sharding) for path in paths}
if dist.get_rank() == 0:
    with open(result, "w") as file:
        json.dump(report, file)
