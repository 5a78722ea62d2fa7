"""Run under `torchrun --nproc_per_node 2` with a checkpoint directory and a JSON path: loads the checkpoint the way
Transformers shards it while loading (`from_pretrained(..., distributed_config=DistributedConfig(fsdp_size=2))`)
and writes, from rank 0, the largest difference of its logits from the unsharded model's, or the error's message."""

import json
import sys

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM
from transformers.distributed import DistributedConfig

path, result = sys.argv[1:3]
ids = torch.arange(3, 16).view(1, -1)
try:
    sharded = AutoModelForCausalLM.from_pretrained(
        path, trust_remote_code=True, distributed_config=DistributedConfig(fsdp_size=2)
    )
except ValueError as error:
    report = {"error": str(error)}
else:
    with torch.no_grad():
        logits = sharded(ids).logits
        expected = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)(ids).logits
    report = {"difference": (logits - expected).abs().max().item(), "class": type(sharded).__name__}
if not dist.is_initialized() or dist.get_rank() == 0:
    with open(result, "w") as file:
        json.dump(report, file)
