"""Run under `torchrun --nproc_per_node 2`: every mode sharded with FSDP2 (`fully_shard` per decoder layer, CPU and
gloo; the gates as they are) against the same model unsharded, routed by the CPU's default and by the fused
operation (the default on a GPU) with its grouped reads wherever the points' queries are known up front (here: only
unsharded). Rank 0 writes, per implementation and mode, the largest loss difference, gradient difference (relative
to each gradient's largest entry) and whether the gathered state is the same, as JSON."""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from modeling_delta_qwen3 import DeltaQwen3Config, DeltaQwen3ForCausalLM, routing_fused

IMPLEMENTATIONS = (None, "fused")  # None: the default (`buffer` on the CPU)


def differences(mode: str, implementation: str | None) -> dict:
    torch.manual_seed(0)
    config = DeltaQwen3Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, routing_mode=mode, routing_num_blocks=2,
        routing_gate=mode.startswith("delta"), routing_implementation=implementation,
    )
    # float64, so that the comparison sees the maths and not float32 rounding: unsharded, the routing points'
    # queries are known up front and their gradients are summed in another order than sharded.
    reference = DeltaQwen3ForCausalLM(config).double()
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if "_route." in name:
                param.normal_(0.0 if name.endswith("weight") else 0.5, 0.3).add_(1.0 if name.endswith("weight") else 0)
    sharded = DeltaQwen3ForCausalLM(config).double()
    sharded.load_state_dict(reference.state_dict())
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    loss = reference(ids, labels=ids).loss
    loss.backward()
    for layer in sharded.model.layers:
        fully_shard(layer)
    fully_shard(sharded)
    sharded_loss = sharded(ids, labels=ids).loss
    sharded_loss.backward()
    grads = dict(reference.named_parameters())
    worst = 0.0
    for name, param in sharded.named_parameters():
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        expected_grad = grads[name].grad
        # Relative to the gradient's largest entry, or to 1e-6 where the gradient is zero but for rounding (a point
        # with one source: its softmax is 1 whatever its query), which implementations round differently.
        difference = (grad - expected_grad).abs().max() / max(expected_grad.abs().max().item(), 1e-6)
        worst = max(worst, difference.item())
    gathered = {name: t.full_tensor() for name, t in sharded.state_dict().items()}
    expected = reference.state_dict()
    same_state = gathered.keys() == expected.keys() and all(torch.equal(gathered[k], expected[k]) for k in expected)
    return {"loss": abs(sharded_loss.item() - loss.item()), "grad": worst, "same_state": same_state}


if __name__ == "__main__":
    dist.init_process_group("gloo")
    routing_fused.GROUP_OPERATIONS_BYTES = -(2**62)  # grouped reads wherever they can be, at this small shape
    modes = ("delta", "delta_block", "attnres_full", "attnres_block")
    results = {str(implementation): {mode: differences(mode, implementation) for mode in modes}
               for implementation in IMPLEMENTATIONS}  # fmt: skip
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as handle:
            json.dump(results, handle)
    dist.destroy_process_group()
