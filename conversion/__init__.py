"""Qwen3 checkpoint -> DeltaQwen3 checkpoint, streamed shard by shard; model card; Hub publishing."""

from .converter import convert
from .hub import push_to_hub
from .model_card import build_model_card, write_model_card
from .target_config import is_function_preserving
from .verify import verify

__all__ = ["build_model_card", "convert", "is_function_preserving", "push_to_hub", "verify", "write_model_card"]
