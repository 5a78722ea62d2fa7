"""The fine-tuning tests' module fixtures: a corpus on disk and a tiny DeltaQwen3 checkpoint."""

from pathlib import Path

import pytest
from helpers.training import save_tiny_delta, write_corpus


@pytest.fixture(scope="module")
def jsonl_corpus(tmp_path_factory) -> Path:
    """Python's documentation as a JSON-lines file."""
    return write_corpus(tmp_path_factory.mktemp("corpus") / "python_docs.jsonl")


@pytest.fixture(scope="module")
def delta_checkpoint(tmp_path_factory, tokenizer) -> Path:
    """A tiny ungated delta-mode checkpoint with its tokenizer."""
    return save_tiny_delta(tmp_path_factory.mktemp("delta") / "tiny-delta", tokenizer)
