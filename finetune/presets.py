"""Model shapes for `--from-scratch`: the paper's sizes and tiny ones that train on a CPU.

The paper names its models by parameter count but does not publish every shape. The shapes below are Qwen3-style
(grouped-query attention, head dimension 128 from 533M up, SwiGLU MLP, tied embeddings below 8B) and chosen so that
the parameter count, embeddings included, matches the name with the Qwen3 vocabulary of 151,936 tokens. The two
Qwen3 presets are the published Qwen3 shapes. A run's vocabulary comes from its tokenizer, so with another
tokenizer the counts differ by the embedding size. Routing adds `~4·D` parameters per layer, which is negligible.
"""

_TINY_ATTENTION = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)

PRESETS: dict[str, dict] = {
    # ~0.2M parameters besides the embeddings: unit tests, CPU demos and the CPU depth study (`delta-qwen3 study`).
    "tiny": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, max_position_embeddings=1024, **_TINY_ATTENTION
    ),
    # ~1.6M parameters besides the embeddings at 8 layers: a wider CPU shape, twice the width of `tiny`.
    "mini": dict(
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
    ),
    # ~6.3M parameters besides the embeddings: a CPU demo that learns visibly in minutes, and the GPU depth study
    # (docs/results.md, "Reproduce on a GPU") at 8 and 16 layers.
    "small": dict(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
    ),
    # ~217M parameters.
    "220M": dict(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=16,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=4096,
    ),
    # ~533M parameters: Qwen3-0.6B's layer shape with 24 instead of 28 layers.
    "533M": dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=4096,
    ),
    # ~1031M parameters.
    "1044M": dict(
        hidden_size=1536,
        intermediate_size=4608,
        num_hidden_layers=26,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=4096,
    ),
    # ~596M parameters: the published Qwen3-0.6B shape.
    "qwen3-0.6b": dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
    ),
    # ~8.19B parameters: the published Qwen3-8B shape (untied embeddings).
    "qwen3-8b": dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
    ),
}

# Fields every preset shares unless it says otherwise (Qwen3's own values).
PRESET_DEFAULTS = dict(
    tie_word_embeddings=True, rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6}
)


def preset_fields(name: str) -> dict:
    """The Qwen3 configuration fields of preset `name` (without vocabulary or special tokens)."""
    return {**PRESET_DEFAULTS, **PRESETS[name]}
