"""No user file is lost to a command's own outputs: an output that is, lies inside or holds one of the command's
inputs is refused in one line before any work; and an output is locked for as long as a command writes it, so that
two commands started at once into one output cannot both proceed (the second is refused, naming the first), with a
lock that a killed command left behind taken over, and every lock released however its command ends."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers.files import tree_digest
from helpers.paths import REPO_ROOT
from helpers.running import run_cli
from helpers.training import log_lines, run_env, tiny_run_args, write_corpus

import finetune
import finetune.run
from delta_qwen3.output_paths import LOCK_NAME, lock_path
from eval.benchmarks import FIXTURES_DIR


@pytest.fixture
def inputs(tmp_path, tokenizer):
    """A data directory (Python's documentation, one text file each), a task directory and a tokenizer."""
    data = write_corpus(tmp_path / "data")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "boolq.jsonl").write_text((FIXTURES_DIR / "boolq.jsonl").read_text())
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    return data, tasks, tmp_path / "tokenizer"


def refused(argv: list[str]) -> str:
    """`delta-qwen3 ARGV` exits 2 with nothing on stdout: its stderr."""
    code, stdout, stderr = run_cli(argv)
    assert (code, stdout) == (2, "")
    return stderr


# --- an output that is an input ----------------------------------------------------------------------------------


def test_an_output_that_is_an_input_is_refused_before_any_work(routed_model, delta_checkpoint, inputs, tmp_path,
                                                               capsys):
    data, tasks, tokenizer = inputs
    text = data / "000.txt"
    before = {path: tree_digest(path) for path in (data, tasks, routed_model, delta_checkpoint)}
    cases = [
        (["ppl", str(routed_model), "--data", str(text), "--output", str(text)],
         f"--output {text}: {text} is --data {text}, which this command reads"),
        (["eval", str(routed_model), "--tasks", "boolq", "--data-dir", str(tasks), "--output", str(tasks / "boolq.jsonl")],
         f"--output {tasks / 'boolq.jsonl'}: {tasks / 'boolq.jsonl'} would be written inside --data-dir {tasks}"),
        (["eval", str(routed_model), "--tasks", "boolq", "--data-dir", str(tasks), "--output",
          str(routed_model / "config.json")],
         f"--output {routed_model / 'config.json'}: {routed_model / 'config.json'} would be written inside MODEL "
         f"{routed_model}"),
        (["routing", str(routed_model), "--data", str(data), "--out", str(data)],
         f"--out {data}: {data / 'routing.json'} would be written inside --data {data}"),
        (["routing", str(routed_model), "--data", str(text), "--out", str(routed_model)],
         f"--out {routed_model}: {routed_model / 'routing.json'} would be written inside MODEL {routed_model}"),
    ]  # fmt: skip
    for argv, message in cases:
        stderr = refused([*argv, "--device", "cpu"])
        assert len(stderr.strip().splitlines()) == 1
        assert message in stderr
        assert "choose another" in stderr
    for argv, message in [
        (["finetune", *tiny_run_args(data, data, "--model", str(delta_checkpoint))],
         f"--output-dir {data}: {data / 'checkpoints'} would be written inside --data {data}"),
        (["finetune", *tiny_run_args(data / "000.txt", tmp_path / "run", "--model", str(tmp_path / "run" / "model"))],
         None),
        (["finetune", *tiny_run_args(data, tmp_path / "run", "--model", str(delta_checkpoint), "--tokenizer",
                                     str(tmp_path / "run" / "model"))], None),
    ]:  # fmt: skip
        if message is None:  # an input inside the run's outputs: its model, here
            (tmp_path / "run" / "model").mkdir(parents=True, exist_ok=True)
        capsys.readouterr()
        assert finetune.main(argv[1:]) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith("finetune: error: --output-dir") and "choose another --output-dir" in line
        if message is not None:
            assert message in line
    assert {path: tree_digest(path) for path in before} == before
    assert not (data / LOCK_NAME).exists() and not (data / "train_log.jsonl").exists()


def test_a_study_writes_nothing_over_what_it_reads(inputs, tmp_path):
    data, _, tokenizer = inputs
    out = tmp_path / "study"
    (out / "runs").mkdir(parents=True)
    scored = out / "runs" / "scored.jsonl"
    scored.write_text('{"text": "def f(): pass"}\n')
    code, _, stderr = run_cli(["study", "--out", str(out), "--validation-data", str(scored), "--",
                               "--data", str(data), "--tokenizer", str(tokenizer)])  # fmt: skip
    assert code == 2
    assert stderr.strip() == (
        f"delta-qwen3 study: error: --out {out}: {out / 'runs'}, which this command writes, holds --validation-data "
        f"{scored}, which it reads; choose another --out, so that no input is overwritten"
    )


# --- one command at a time in one output -------------------------------------------------------------------------

HOLD_LOCK = """
import sys
from delta_qwen3.output_paths import output_lock
with output_lock("the output", sys.argv[1], inside=sys.argv[2] == "inside"):
    print("locked", flush=True)
    sys.stdin.read()
"""


def holding_lock(target, inside: bool) -> subprocess.Popen:
    """Another process holding the lock of `target` until its stdin closes."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(target), "inside" if inside else "beside"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=run_env())  # fmt: skip
    assert holder.stdout.readline() == "locked\n"
    return holder


def released(holder: subprocess.Popen) -> None:
    holder.stdin.close()
    assert holder.wait(timeout=60) == 0


def test_a_command_into_an_output_in_use_is_refused_naming_the_other(routed_model, delta_checkpoint, inputs, tmp_path,
                                                                     capsys, qwen3_checkpoint):
    data, tasks, tokenizer = inputs
    text = str(data / "000.txt")
    cases = [
        (["convert", str(qwen3_checkpoint), str(tmp_path / "converted"), "--num-blocks", "2"], "OUT",
         tmp_path / "converted", False),
        (["ppl", str(routed_model), "--data", text, "--output", str(tmp_path / "ppl.json"), "--max-length", "16"],
         "--output", tmp_path / "ppl.json", False),
        (["eval", str(routed_model), "--tasks", "boolq", "--data-dir", str(tasks), "--output",
          str(tmp_path / "eval.json"), "--limit", "2"], "--output", tmp_path / "eval.json", False),
        (["routing", str(routed_model), "--data", text, "--out", str(tmp_path / "report"), "--max-length", "16"],
         "--out", tmp_path / "report", True),
        (["eval", "export-data", str(tmp_path / "benchmarks"), "--tasks", "boolq"], "DIR", tmp_path / "benchmarks",
         True),
        (["study", "--out", str(tmp_path / "study"), "--", "--data", str(data), "--tokenizer", str(tokenizer)],
         "--out", tmp_path / "study", True),
        (["finetune", *tiny_run_args(data, tmp_path / "run", "--model", str(delta_checkpoint), "--max-steps", "1")],
         "--output-dir", tmp_path / "run", True),
    ]  # fmt: skip
    for argv, option, target, inside in cases:
        holder = holding_lock(target, inside)
        try:
            if argv[0] == "finetune":
                capsys.readouterr()
                assert finetune.main(argv[1:]) == 2
                stderr = capsys.readouterr().err
                program = "finetune"
            else:
                code, stdout, stderr = run_cli(argv)
                assert (code, stdout) == (2, "")
                program = f"delta-qwen3 {argv[0]}"
            line = stderr.strip().splitlines()[-1]
            assert line.startswith(f"{program}: error: {option} {target} is in use by another command (process "
                                   f"{holder.pid} on ")  # fmt: skip
            assert line.endswith(f"; its lock is {lock_path(target, inside)}): wait for it to end, or choose another "
                                 f"{option}")  # fmt: skip
            assert not (target / "routing.json").exists() and not (target / "train_log.jsonl").exists()
        finally:
            released(holder)
        assert not lock_path(target, inside).exists()
    assert finetune.main(cases[-1][0][1:]) == 0  # once the other has ended
    assert not lock_path(tmp_path / "run", True).exists()


@pytest.mark.slow
def test_two_runs_started_at_once_into_one_directory_do_not_both_proceed(inputs, delta_checkpoint, tmp_path):
    data, _, _ = inputs
    out = tmp_path / "run"
    command = [sys.executable, "-m", "finetune", *tiny_run_args(data, out, "--model", str(delta_checkpoint),
                                                                "--max-steps", "12", "--save-every", "4")]  # fmt: skip
    runs = [subprocess.Popen(command, env=run_env(), cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]  # fmt: skip
    results = [(run.wait(timeout=600), *run.communicate()) for run in runs]
    assert sorted(code for code, _, _ in results) == [0, 2]
    _, _, stderr = next(result for result in results if result[0] == 2)
    # Refused by the lock while the other runs or, where one process starts after the other has ended (a loaded
    # machine), by the finished run it finds; the lock itself is tested with a held lock above.
    assert (f"finetune: error: --output-dir {out} is in use by another command (process " in stderr
            or f"{out} already holds a final model; pass --overwrite to replace it" in stderr), stderr[-500:]
    steps = [line["step"] for line in log_lines(out) if "loss" in line]
    assert steps == list(range(1, 13))  # one run's log, not two interleaved
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000008", "step_00000012"]
    assert not (out / LOCK_NAME).exists()


def test_a_lock_left_by_a_killed_command_is_taken_over_with_a_notice(inputs, delta_checkpoint, tmp_path, capsys):
    data, _, _ = inputs
    out = tmp_path / "run"
    holder = holding_lock(out, inside=True)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    assert (out / LOCK_NAME).read_text().startswith(f"process {holder.pid} on ")
    assert finetune.main(tiny_run_args(data, out, "--model", str(delta_checkpoint), "--max-steps", "1")) == 0
    notice = [line for line in capsys.readouterr().err.splitlines() if "taking over the lock" in line]
    assert len(notice) == 1 and notice[0].startswith(f"--output-dir {out}: taking over the lock of process "
                                                     f"{holder.pid} on ")  # fmt: skip
    assert notice[0].endswith(", which ended without releasing it")
    assert not (out / LOCK_NAME).exists()


def test_the_lock_is_released_however_the_command_ends(inputs, delta_checkpoint, tmp_path, capsys, monkeypatch):
    data, _, _ = inputs
    out = tmp_path / "new" / "run"
    argv = tiny_run_args(data, out, "--model", str(delta_checkpoint), "--max-steps", "1")
    # Refused after the lock was taken: the directories made for the lock go with it.
    assert finetune.main([*argv, "--seq-len", "100000"]) == 2
    assert not (tmp_path / "new").exists()

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)

    monkeypatch.setattr(finetune.run, "train", interrupted)
    assert finetune.main(argv) == 130
    assert not (out / LOCK_NAME).exists()
    monkeypatch.undo()
    assert finetune.main(argv) == 0
    assert not (out / LOCK_NAME).exists()
    assert json.loads((out / "run_config.json").read_text())["max_steps"] == 1
