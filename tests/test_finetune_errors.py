"""How a `finetune` run ends when it cannot go on: options refused before anything is loaded, divergence, a resume
with other options, interrupts; each with one line on stderr, its exit status, and the run directory as it was."""

import pytest
from finetune_fixtures import tiny_run_args, write_corpus

import finetune


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "python_docs.jsonl")


def refused(argv: list[str], capsys) -> str:
    """Run the command, expect exit status 2; return its one line on stderr."""
    assert finetune.main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    return lines[0]


@pytest.mark.parametrize("seq_len", ["0", "1"])
def test_seq_len_has_one_lower_bound(tmp_path, corpus, capsys, seq_len):
    argv = tiny_run_args(corpus, tmp_path / "out", "--model", str(tmp_path / "model"), "--seq-len", seq_len)
    assert refused(argv, capsys) == (
        f"finetune: error: --seq-len must be at least 2 (one prediction needs two tokens), got {seq_len}"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--lr", "nan", "--lr must be a finite number, got nan"),
        ("--lr", "inf", "--lr must be a finite number, got inf"),
        ("--lr", "-0.001", "--lr must not be negative, got -0.001"),
        ("--lr-routing", "nan", "--lr-routing must be a finite number, got nan"),
        ("--lr-routing", "-1", "--lr-routing must not be negative, got -1.0"),
        ("--min-lr-ratio", "5", "--min-lr-ratio must be between 0 and 1 (a fraction of the peak rate), got 5.0"),
        ("--min-lr-ratio", "-0.1", "--min-lr-ratio must be between 0 and 1 (a fraction of the peak rate), got -0.1"),
    ],
)
def test_learning_rates_that_cannot_train_are_refused(tmp_path, corpus, capsys, option, value, message):
    argv = tiny_run_args(corpus, tmp_path / "out", "--model", str(tmp_path / "model"), option, value)
    assert refused(argv, capsys) == f"finetune: error: {message}"
    assert not (tmp_path / "out").exists()
