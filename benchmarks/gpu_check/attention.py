"""The attention section: sdpa (and flash-attention 2 where installed) against eager attention in the model, on a
left-padded batch."""

import copy
import math

import torch

from benchmarks.gpu_check.comparing import (
    FLOAT32_TOLERANCE,
    bfloat16_limits,
    check_groups,
    check_ids,
    errors,
    float32_without_tf32,
    random_delta,
    training_pass,
)
from benchmarks.gpu_check.profiles import Profile
from benchmarks.gpu_check.running import SectionRecord


def left_padded(ids: torch.Tensor) -> torch.Tensor:
    """An attention mask that left-pads the second row by a quarter of its length."""
    mask = torch.ones_like(ids)
    mask[1, : ids.shape[1] // 4] = 0
    return mask


def attention_backends(profile: Profile, section: SectionRecord) -> dict[str, torch.dtype]:
    """The attention implementations to compare with eager, each in the dtype it is run in: sdpa in both,
    flash-attention 2 (CUDA, half precision only) where installed."""
    from transformers.utils import is_flash_attn_2_available

    backends = {"sdpa float32": torch.float32, "sdpa bfloat16": torch.bfloat16}
    if profile.device == "cuda" and is_flash_attn_2_available():
        backends["flash_attention_2 bfloat16"] = torch.bfloat16
    else:
        section.not_run("flash_attention_2", "flash-attention 2 is not installed" if profile.device == "cuda"
                        else "flash-attention 2 runs on CUDA only")
    return backends


def check_attention(profile: Profile, section: SectionRecord) -> None:
    """Per mode, each backend's training pass on a left-padded batch against eager attention's: in float32 within
    float32's tolerance, in bfloat16 within what eager attention in bfloat16 is off by (`bfloat16_limits`)."""
    from modeling_delta_qwen3.routing_modes import ROUTING_MODES

    backends = attention_backends(profile, section)
    ids = check_ids(profile)
    mask = left_padded(ids)
    for mode in ROUTING_MODES:
        model = random_delta(profile, mode, routing_implementation="buffer").train()  # no kernel autotuning here
        models = {torch.float32: model, torch.bfloat16: copy.deepcopy(model).to(torch.bfloat16)}
        results = {}
        for dtype, model in models.items():
            model.set_attn_implementation("eager")
            with float32_without_tf32():
                results[dtype] = training_pass(model, ids, mask)
        yardstick = errors(results[torch.bfloat16], results[torch.float32])
        section.figure(f"{mode} bfloat16 eager", yardstick)
        for label, dtype in backends.items():
            models[dtype].set_attn_implementation(label.split()[0])
            with float32_without_tf32():
                found = errors(training_pass(models[dtype], ids, mask), results[torch.float32])
            limits = dict.fromkeys(found, FLOAT32_TOLERANCE) if dtype == torch.float32 else bfloat16_limits(yardstick)
            check_groups(section, f"{mode} {label}", found, limits)
            if not all(map(math.isfinite, found.values())):
                section.figure(f"qwen3 {label}: gradients finite", plain_qwen3_gradients_finite(profile, label, ids, mask))


def plain_qwen3_gradients_finite(profile: Profile, label: str, ids: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether Hugging Face's Qwen3 of the check shape, through the same attention backend on the same batch, gets
    finite gradients: False says a non-finite result is the backend's (PyTorch's or the GPU library's), not
    routing's."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    backend, dtype = label.split()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**profile.check_shape, attn_implementation=backend))
    model = model.to(profile.device, getattr(torch, dtype)).train()
    model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
    return all(p.grad.isfinite().all().item() for p in model.parameters() if p.grad is not None)
