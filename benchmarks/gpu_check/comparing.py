"""What the correctness sections share: comparing a candidate's results with the expected ones, within float32's
tolerance or bfloat16's limits, and the small random models and token ids they compare on."""

import contextlib
from collections.abc import Iterator

import torch

from benchmarks.gpu_check.profiles import Profile
from benchmarks.gpu_check.running import SectionRecord

# Relative errors: the largest absolute difference over the largest absolute expected value, per compared group
# (logits, routing weights, loss, routing parameters' gradients, the other gradients).
# float32 without TF32: the tolerance lies well above what summation order alone moves a result by (most in the
# AttnRes modes, whose replacement routing amplifies rounding through depth) and well below what a wrong formula
# does; benchmarks/README.md, "GPU self-check", has both as measured.
FLOAT32_TOLERANCE = 2e-4
# In bfloat16, a candidate is compared with float32's result and may be off by at most this many times what the
# reference implementation (or eager attention) in bfloat16 is off by, plus the floor: rounding to bfloat16 at other
# places moves a result by as much as that rounding itself, while a wrong computation is off by far more.
BFLOAT16_FACTOR, BFLOAT16_FLOOR = 3.0, 0.05


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    expected = expected.detach().double()
    difference = (got.detach().double() - expected).abs().max()
    scale = expected.abs().max()
    return (difference / scale).item() if scale > 0 else difference.item()


def training_pass(model, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """One forward and backward pass of `model` on `ids`: the groups that `errors` compares, flattened. Padding
    (where `attention_mask` has zeros) is neither compared nor scored, nor is the prediction made at a padded
    position (of the token after it): attention backends fill padded positions each their own way."""
    real = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    scored = real & torch.cat([real[:, :1], real[:, :-1]], dim=1)  # labels are shifted onto the position before
    model.zero_grad(set_to_none=True)
    out = model(ids, attention_mask=attention_mask, labels=ids.masked_fill(~scored, -100), output_routing_weights=True)
    out.loss.backward()
    gradients = [(name, p.grad.flatten()) for name, p in model.named_parameters() if p.grad is not None]
    return {
        "logits": out.logits[real].detach(),
        "routing_weights": torch.cat([weights[real].flatten() for weights in out.routing_weights]).detach(),
        "loss": out.loss.detach(),
        "routing_gradients": torch.cat([g for name, g in gradients if "_route." in name]),
        "other_gradients": torch.cat([g for name, g in gradients if "_route." not in name]),
    }


def errors(got: dict, expected: dict) -> dict[str, float]:
    return {name: relative_error(got[name], expected[name]) for name in expected}


def bfloat16_limits(yardstick: dict[str, float]) -> dict[str, float]:
    return {name: BFLOAT16_FACTOR * error + BFLOAT16_FLOOR for name, error in yardstick.items()}


def check_groups(section: SectionRecord, label: str, found: dict[str, float], limits: dict[str, float]) -> None:
    """One check per compared group; the errors and limits are kept in full under the label too."""
    for name, error in found.items():
        section.check(f"{label}: {name}", error, limits[name])


@contextlib.contextmanager
def float32_without_tf32() -> Iterator[None]:
    """Full float32 matrix products (no TF32 on GPUs that have it), restored afterwards."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def random_delta(profile: Profile, mode: str, **overrides):
    """A DeltaQwen3 of the check shape in `mode` (gated in the delta modes), its routing parameters random so
    that routing changes what it computes, on the profile's device in float32."""
    from modeling_delta_qwen3 import DeltaQwen3Config, DeltaQwen3ForCausalLM
    from modeling_delta_qwen3.routing_modes import ROUTING_MODES
    from delta_qwen3.routing_parameters import randomize_routing

    torch.manual_seed(0)
    fields = profile.check_shape | overrides
    gated = ROUTING_MODES[mode].gateable
    config = DeltaQwen3Config(**fields, routing_mode=mode, routing_gate=gated, routing_num_blocks=2)
    model = DeltaQwen3ForCausalLM(config)
    randomize_routing(model)
    return model.to(profile.device)


def check_ids(profile: Profile, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, profile.check_shape["vocab_size"], profile.check_tokens, generator=generator).to(
        profile.device)


def greedy(model, ids: torch.Tensor, **kwargs):
    return model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=2, eos_token_id=None,
                          output_logits=True, return_dict_in_generate=True, **kwargs)
