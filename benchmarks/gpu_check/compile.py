"""The compile section: `torch.compile(fullgraph=True)`, a training step's loss and gradients, and generation,
against eager."""

import torch

from benchmarks.gpu_check.comparing import (
    FLOAT32_TOLERANCE,
    check_groups,
    check_ids,
    errors,
    float32_without_tf32,
    greedy,
    random_delta,
    relative_error,
    training_pass,
)
from benchmarks.gpu_check.profiles import Profile
from benchmarks.gpu_check.running import SectionRecord

# Compiling takes time in proportion to the layers: three, in two blocks of two layers and one, have each mechanism
# of every mode, and a block of several layers (vLLM's compilation on the CPU got that wrong: docs/SERVING.md).
COMPILED_LAYERS = 3


def check_compiled_training(profile: Profile, section: SectionRecord, mode: str) -> None:
    model = random_delta(profile, mode, num_hidden_layers=COMPILED_LAYERS).train()
    ids = check_ids(profile)
    with float32_without_tf32():
        eager = training_pass(model, ids)
        compiled = torch.compile(model, backend=profile.compile_backend, fullgraph=True)
        check_groups(section, f"{mode} training", errors(training_pass(compiled, ids), eager),
                     dict.fromkeys(eager, FLOAT32_TOLERANCE))


def check_compiled_generation(profile: Profile, section: SectionRecord, mode: str) -> None:
    """Greedy generation with the model's forward compiled: the same tokens, and logits within float32's
    tolerance."""
    model = random_delta(profile, mode, num_hidden_layers=COMPILED_LAYERS).eval()
    ids = check_ids(profile)[:1, :8]
    with float32_without_tf32(), torch.no_grad():
        eager = greedy(model, ids, disable_compile=True)
        model.forward = torch.compile(model.forward, backend=profile.compile_backend, fullgraph=True)
        compiled = greedy(model, ids)
    section.check(f"{mode} generation: tokens that differ", (compiled.sequences != eager.sequences).sum().item(), 0)
    section.check(f"{mode} generation: logits", relative_error(torch.stack(compiled.logits), torch.stack(eager.logits)),
                  FLOAT32_TOLERANCE)


def check_compile(profile: Profile, section: SectionRecord) -> None:
    """Training in the profile's modes and generation in the first: each compilation takes tens of seconds."""
    section.figure("backend", profile.compile_backend)
    for mode in profile.compile_modes:
        torch._dynamo.reset()
        check_compiled_training(profile, section, mode)
    torch._dynamo.reset()
    check_compiled_generation(profile, section, profile.compile_modes[0])
