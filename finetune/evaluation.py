"""What the run measures besides its training loss: validation loss over the held-out blocks (routing sharpness is
`delta_qwen3.sharpness`)."""

import math

import torch
import torch.nn.functional as F


@torch.no_grad()
def validation_nll(
    model: torch.nn.Module, blocks: torch.Tensor, batch_size: int, rank: int, world_size: int, device
) -> torch.Tensor:
    """`[summed negative log-likelihood, predicted tokens]` (float64) of process `rank`'s share of `blocks`.

    Process `rank` takes blocks `rank, rank + world_size, ...`. Every process runs the same number of batches
    (FSDP needs every process in every forward pass): where the blocks do not divide evenly, the missing ones are
    replaced by block 0 with weight 0. Summing the results over processes covers every block exactly once.
    """
    count = len(blocks)
    indices = torch.arange(rank, -(-count // world_size) * world_size, world_size)
    weights = (indices < count).double()
    indices = torch.where(indices < count, indices, 0)
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    predicted = blocks.shape[1] - 1
    for batch_indices, batch_weights in zip(indices.split(batch_size), weights.split(batch_size), strict=True):
        input_ids = blocks[batch_indices].to(device)
        logits = model(input_ids=input_ids, use_cache=False).logits.float()
        nll = F.cross_entropy(logits[:, :-1].flatten(0, 1), input_ids[:, 1:].flatten(), reduction="none")
        per_block = nll.view(len(input_ids), predicted).double().sum(1)
        totals[0] += (per_block * batch_weights.to(device)).sum()
        totals[1] += batch_weights.sum() * predicted
    return totals


def loss_and_perplexity(totals: torch.Tensor) -> dict[str, float]:
    """Mean loss per predicted token and its perplexity, from `validation_nll` totals summed over processes."""
    loss = (totals[0] / totals[1]).item()
    return {"val_loss": loss, "val_ppl": math.exp(loss)}
