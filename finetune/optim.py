"""AdamW as in the paper (betas 0.9 / 0.95, weight decay 0.1) with a warm-up-then-cosine schedule.

Parameter groups:
- `decay`: matrices (embeddings, projections, LoRA adapters), with weight decay at `--lr`.
- `no_decay`: norm gains and biases, at `--lr` without decay: decay would pull a gain towards 0, not towards its
  neutral value 1.
- `routing`: queries, routing norm gains and gates, at `--lr-routing` without decay. Decay would pull each query
  towards 0, i.e. towards uniform routing, working against the sharp routing the method learns; it would pull each
  gate towards 0, switching routing off; and the gains as above. `--routing-init released` decays them as the
  paper's released code does, to compare the two.
"""

import math

import torch
from torch.optim import AdamW
from torch.optim.lr_scheduler import LambdaLR

from modeling_delta_qwen3.routing_points import gate_in_format

from .config import FinetuneConfig
from .model import is_routing_parameter

BETAS = (0.9, 0.95)


def parameter_groups(
    model: torch.nn.Module, lr: float, lr_routing: float, weight_decay: float, routing_weight_decay: float
) -> list[dict]:
    """The trainable parameters in the three groups above; each group carries its `name`."""
    groups = {
        "decay": dict(lr=lr, weight_decay=weight_decay),
        "no_decay": dict(lr=lr, weight_decay=0.0),
        "routing": dict(lr=lr_routing, weight_decay=routing_weight_decay),
    }
    members: dict[str, list] = {name: [] for name in groups}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        group = "routing" if is_routing_parameter(name) else "decay" if parameter.ndim >= 2 else "no_decay"
        members[group].append(parameter)
    return [dict(name=name, params=members[name], **groups[name]) for name in groups if members[name]]


def build_optimizer(model: torch.nn.Module, config: FinetuneConfig) -> AdamW:
    groups = parameter_groups(model, config.lr, config.routing_lr, config.weight_decay, config.routing_weight_decay)
    optimizer = AdamW(groups, betas=BETAS, eps=1e-8)
    optimizer.register_load_state_dict_post_hook(_gate_moments_in_format)
    return optimizer


def _gate_moments_in_format(optimizer: AdamW) -> None:
    """Runs saved before the routing gates became `[1]` (SPEC section 4) hold the gates' moments 0-d, which AdamW
    cannot step with a `[1]` gradient: shaped as the gates now are, so that such a run resumes."""
    for state in optimizer.state.values():
        for moment in ("exp_avg", "exp_avg_sq"):
            if moment in state:
                state[moment] = gate_in_format(state[moment])


def lr_factor(step: int, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """The learning-rate multiplier of optimiser step `step + 1`: linear warm-up to 1, then cosine decay to
    `min_lr_ratio` at the end of the run."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_schedule(optimizer: AdamW, config: FinetuneConfig) -> LambdaLR:
    """Stepped once per optimiser step; it applies the same multiplier to every group's own peak rate."""
    return LambdaLR(optimizer, lambda step: lr_factor(step, config.warmup_steps, config.max_steps, config.min_lr_ratio))
