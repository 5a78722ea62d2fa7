"""Tiny models with random weights: Qwen3 shapes small enough for many CPU forward and backward passes, and
DeltaQwen3 models whose routing parameters are random and non-zero, so that routing changes what they compute."""

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from modeling_delta_qwen3 import DeltaQwen3Config, DeltaQwen3ForCausalLM
from modeling_delta_qwen3.routing_modes import ROUTING_MODES

from .spec_reference import randomize_routing

TINY_VOCAB = 512
MODES = list(ROUTING_MODES)
# Five layers, so that 2 and 3 blocks give uneven blocks; weights large enough that routing changes the logits.
SHAPE = dict(num_hidden_layers=5, initializer_range=0.1)
# (mode, gated): every mode, and the gate where it exists.
VARIANTS = [(mode, gated) for mode in MODES for gated in ((False, True) if ROUTING_MODES[mode].gateable else (False,))]


def tiny_qwen3_config(**overrides) -> Qwen3Config:
    """A Qwen3 shape small enough for many CPU forward and backward passes."""
    fields = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    fields.update(overrides)
    return Qwen3Config(**fields)


def save_tiny_qwen3(path: Path, tokenizer, seed: int = 0, max_shard_size: str = "100KB", **overrides) -> Path:
    """Save a random tiny `Qwen3ForCausalLM` as the Hub would serve it: sharded safetensors, tokenizer,
    generation config."""
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(tiny_qwen3_config(**overrides)).eval()
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=2, do_sample=False)
    model.save_pretrained(path, max_shard_size=max_shard_size)
    tokenizer.save_pretrained(path)
    return path


def save_random_delta(path: Path, mode: str, **overrides) -> DeltaQwen3ForCausalLM:
    """Save a tiny DeltaQwen3 in routing `mode` (gated in the delta modes, 2 blocks) whose routing parameters are all
    random and non-zero (`randomize_routing`), so that routing changes what it computes; returns the model.
    `overrides` change the Qwen3 shape."""
    fields = tiny_qwen3_config(initializer_range=0.1, **overrides).to_dict()
    fields.pop("model_type")
    gated = ROUTING_MODES[mode].gateable
    torch.manual_seed(0)
    model = DeltaQwen3ForCausalLM(DeltaQwen3Config(**fields, routing_mode=mode, routing_gate=gated, routing_num_blocks=2))
    randomize_routing(model.eval())
    model.save_pretrained(path)
    return model


def with_scalar_gates(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state_dict` with every routing gate 0-d, as the checkpoint format's first version held it (SPEC section 4)."""
    return {name: t.reshape(()) if name.endswith("_route.gate") else t for name, t in state_dict.items()}


def write_scalar_gates(path: Path) -> list[str]:
    """Rewrite the checkpoint in `path` with its routing gates 0-d (`with_scalar_gates`); the names of the gates."""
    rewritten = []
    for file in path.glob("*.safetensors"):
        tensors = load_file(file)
        save_file(with_scalar_gates(tensors), file, metadata={"format": "pt"})
        rewritten += [name for name in tensors if name.endswith("_route.gate")]
    return rewritten


def gate_shapes(path: Path) -> set[tuple[int, ...]]:
    """The shapes of the routing gates in the checkpoint in `path`."""
    tensors = {name: t for file in path.glob("*.safetensors") for name, t in load_file(file).items()}
    return {tuple(t.shape) for name, t in tensors.items() if name.endswith("_route.gate")}


def save_routed_model(path: Path, tokenizer, seed: int, **routing) -> Path:
    """A random tiny DeltaQwen3 whose routing queries are random too, so that routing is far from uniform."""
    torch.manual_seed(seed)
    fields = tiny_qwen3_config().to_dict()
    fields.pop("model_type")
    model = DeltaQwen3ForCausalLM(DeltaQwen3Config(**fields, **routing))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".query"):
                parameter.normal_(0.0, 0.3)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def delta_config(mode: str = "delta_block", gated: bool = False, **overrides) -> DeltaQwen3Config:
    fields = tiny_qwen3_config(**{**SHAPE, **overrides}).to_dict()
    fields.pop("model_type")
    return DeltaQwen3Config(**fields, routing_mode=mode, routing_gate=gated, routing_num_blocks=2)


def random_model(mode: str, gated: bool = False, seed: int = 0, scale: float = 0.3) -> DeltaQwen3ForCausalLM:
    torch.manual_seed(seed)
    model = DeltaQwen3ForCausalLM(delta_config(mode, gated)).eval()
    randomize_routing(model, seed, scale)
    return model


def token_ids(batch: int = 2, seq: int = 11, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 512, (batch, seq), generator=torch.Generator().manual_seed(seed))
