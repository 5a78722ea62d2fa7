"""An interrupt at any instant leaves no half-made output: a staged output is removed from the instant it exists
(an interrupt right after its directory is made), together with the directories made for it; a second interrupt
while it is removed waits until it is gone; and the renames that put a finished output in place, with the removal
of the one it replaces, finish before the interrupt is delivered."""

import os
import signal
import time
from pathlib import Path

import pytest
from helpers.training import save_tiny_delta, tiny_run_args, write_corpus

import finetune
from delta_qwen3 import atomic
from delta_qwen3.atomic import RETIRED_MARK, STAGING_MARK, atomic_output, staged_directory
from delta_qwen3.cli import main
from delta_qwen3.interrupts import Interrupted


@pytest.fixture
def interrupt_once_made(monkeypatch):
    """The first staging directory (or file) made is followed at once by SIGINT's `Interrupted`, as when the
    signal arrives on the next instruction."""
    mkdir, state = Path.mkdir, {"fired": False}

    def mkdir_then_interrupt(self, *args, **kwargs):
        mkdir(self, *args, **kwargs)
        if STAGING_MARK in self.name and not state["fired"]:
            state["fired"] = True
            raise Interrupted("SIGINT")

    monkeypatch.setattr(Path, "mkdir", mkdir_then_interrupt)
    return state


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if STAGING_MARK in p.name or RETIRED_MARK in p.name)


def signal_now() -> None:
    """SIGINT to this process, then a moment for its handler to run."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)


def test_a_staged_directory_interrupted_the_instant_it_exists_leaves_nothing(tmp_path, interrupt_once_made):
    with pytest.raises(Interrupted):
        with staged_directory(tmp_path / "new" / "deeper" / "out"):
            raise AssertionError("not reached")
    assert interrupt_once_made["fired"]
    assert list(tmp_path.iterdir()) == []  # the parents made for it are gone too


def test_a_staged_file_interrupted_leaves_neither_it_nor_its_parents(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with atomic_output(tmp_path / "new" / "results.json") as temporary:
            temporary.write_text("{}")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_a_second_interrupt_waits_until_the_half_made_output_is_removed(tmp_path, monkeypatch):
    rmtree = atomic.shutil.rmtree

    def interrupted_again(path, *args, **kwargs):
        signal_now()  # Ctrl-C pressed again while the first one's cleanup runs
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(atomic.shutil, "rmtree", interrupted_again)
    with pytest.raises(KeyboardInterrupt):
        with staged_directory(tmp_path / "out") as staging:
            (staging / "weights").write_bytes(b"w" * 1000)
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_while_the_replaced_output_is_removed_waits_for_it(tmp_path, monkeypatch):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    remove = atomic._remove

    def interrupted(path):
        signal_now()
        remove(path)

    monkeypatch.setattr(atomic, "_remove", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with staged_directory(target) as staging:
            (staging / "new.txt").write_text("new")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert [p.name for p in target.iterdir()] == ["new.txt"]


def test_convert_interrupted_the_instant_its_output_is_staged_keeps_nothing(qwen3_checkpoint, tmp_path, capsys,
                                                                            interrupt_once_made):
    out = tmp_path / "new" / "DeltaQwen3"
    assert main(["convert", str(qwen3_checkpoint), str(out), "--num-blocks", "2"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "delta-qwen3 convert: interrupted by SIGINT; unfinished outputs were not kept"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("save_every", ["1", "0"])  # a checkpoint, or the final model
def test_finetune_interrupted_the_instant_a_checkpoint_or_the_model_is_staged_keeps_nothing_of_it(
    save_every, tmp_path, tokenizer, capsys, interrupt_once_made
):  # fmt: skip
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    model = save_tiny_delta(tmp_path / "model", tokenizer)
    out = tmp_path / "run"
    assert finetune.main(tiny_run_args(corpus, out, "--model", str(model), "--max-steps", "1", "--save-every",
                                       save_every)) == 130  # fmt: skip
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("finetune: interrupted by SIGINT; ")
    assert leftovers(out) == []
    assert not (out / "model").exists() and not (out / "checkpoints" / "step_00000001").exists()
    assert not (out / "checkpoints").exists() or list((out / "checkpoints").iterdir()) == []
