"""Shared fixtures: a tokenizer trained on Python's documentation and a tiny Qwen3 checkpoint with random weights.
What the tests share besides fixtures is in the `helpers` package beside this file."""

from pathlib import Path

import pytest
from helpers.models import TINY_VOCAB, save_tiny_qwen3

from delta_qwen3.corpus import python_docs_texts, train_bpe_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return train_bpe_tokenizer(python_docs_texts(), vocab_size=TINY_VOCAB)


@pytest.fixture(scope="session")
def qwen3_checkpoint(tmp_path_factory, tokenizer) -> Path:
    """A sharded tiny Qwen3 checkpoint on disk. Treat it as read-only: it is shared by the session."""
    return save_tiny_qwen3(tmp_path_factory.mktemp("qwen3") / "tiny-qwen3", tokenizer)


def pytest_report_header(config):
    import transformers

    return f"transformers {transformers.__version__} ({Path(transformers.__file__).parent})"
