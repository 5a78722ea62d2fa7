"""The implementations section: every routing implementation that runs here against the reference, forward and
backward, in every routing mode, in float32 (TF32 off) and bfloat16."""

import contextlib
from collections.abc import Iterator

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


def routing_implementations(profile: Profile, section: SectionRecord) -> list[str]:
    """The implementations to compare with the reference: every other one that runs here (fla's kernel only on
    CUDA with the package)."""
    from modeling_delta_qwen3.routing import IMPLEMENTATIONS

    names = []
    for name, implementation in IMPLEMENTATIONS.items():
        if name == "reference":
            continue
        if (reason := implementation.unavailable(torch.zeros(1, device=profile.device))) is None:
            names.append(name)
        else:
            section.not_run(name, reason)
    return names


@contextlib.contextmanager
def routing_as(model: torch.nn.Module, variant: str) -> Iterator[None]:
    """Route `model` with `variant`: an implementation's name, or "fused grouped", the fused implementation with
    its points in groups (grouped reads, which only long batches get otherwise)."""
    from modeling_delta_qwen3 import routing_fused

    name, _, grouped = variant.partition(" ")
    model.set_routing_implementation(name)
    threshold = routing_fused.GROUP_OPERATIONS_BYTES
    if grouped:
        routing_fused.GROUP_OPERATIONS_BYTES = -(2**62)
    try:
        yield
    finally:
        routing_fused.GROUP_OPERATIONS_BYTES = threshold


def check_implementations(profile: Profile, section: SectionRecord) -> None:
    """Per mode and dtype, each implementation's training pass (and the fused one's with grouped reads) against the
    reference implementation's: in float32 against the float32 reference; in bfloat16 against the float32
    reference, within what the bfloat16 reference is off by itself (`bfloat16_limits`)."""
    from modeling_delta_qwen3.routing_modes import ROUTING_MODES

    names = routing_implementations(profile, section)
    variants = [*names, *(["fused grouped"] if "fused" in names else [])]
    ids = check_ids(profile)
    for mode in ROUTING_MODES:
        model = random_delta(profile, mode).train()
        with float32_without_tf32():
            model.set_routing_implementation("reference")
            exact = training_pass(model, ids)
            for variant in variants:
                with routing_as(model, variant):
                    check_groups(section, f"{mode} float32 {variant}", errors(training_pass(model, ids), exact),
                                 dict.fromkeys(exact, FLOAT32_TOLERANCE))
        model.to(torch.bfloat16).set_routing_implementation("reference")
        yardstick = errors(training_pass(model, ids), exact)
        section.figure(f"{mode} bfloat16 reference", yardstick)
        for variant in variants:
            with routing_as(model, variant):
                check_groups(section, f"{mode} bfloat16 {variant}", errors(training_pass(model, ids), exact),
                             bfloat16_limits(yardstick))
