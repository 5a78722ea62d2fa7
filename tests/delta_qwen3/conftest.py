"""The fixtures of the tests of what every command shares: a routed DeltaQwen3 model, a freshly initialised one to
fine-tune, a corpus, and commands whose long steps fail the test if they start."""

from pathlib import Path

import pytest
from helpers.models import save_routed_model
from helpers.training import save_tiny_delta, write_corpus

import eval.models
import eval.perplexity
import eval.routing
import eval.runner
import finetune.run
import study.runs
from conversion import converter


@pytest.fixture(scope="module")
def routed_model(tokenizer, tmp_path_factory) -> Path:
    """A tiny Delta Block checkpoint whose routing is far from uniform, with its tokenizer."""
    return save_routed_model(tmp_path_factory.mktemp("routed") / "delta-block", tokenizer, seed=1,
                             routing_mode="delta_block", routing_num_blocks=2)  # fmt: skip


@pytest.fixture(scope="module")
def delta_checkpoint(tmp_path_factory, tokenizer) -> Path:
    """A tiny ungated delta-mode checkpoint, small enough to fine-tune in a second."""
    return save_tiny_delta(tmp_path_factory.mktemp("delta") / "tiny-delta", tokenizer)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Python's documentation as a JSON-lines file."""
    return write_corpus(tmp_path_factory.mktemp("corpus") / "python_docs.jsonl")


@pytest.fixture
def nothing_started(monkeypatch):
    """Every long step (an evaluation, loading a model to score, training, building the model to train, a study's
    runs, converting the weights) fails the test if it starts: what is refused must be refused before."""

    def started(*args, **kwargs):
        raise AssertionError("a long step started before the refusal")

    for module, name in [(eval.runner, "evaluate_model"), (eval.perplexity, "perplexity"),
                         (eval.routing, "routing_statistics"), (eval.models, "load_causal_lm"),
                         (finetune.run, "train"), (finetune.run, "build_model"), (study.runs, "start_training"),
                         (converter, "write_weights")]:  # fmt: skip
        monkeypatch.setattr(module, name, started)
