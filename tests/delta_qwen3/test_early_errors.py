"""Errors come early and blame the right thing: everything a command will need is checked before its first long
step (a file read only after training, a program it starts, the Hub it publishes to, a model it analyses last), and
each failure names its real cause and path (a broken tokenizer file by its name, not as a model that could not
load; a program that could not start, not as a failed write)."""

import json
import shutil

import huggingface_hub
import huggingface_hub.constants
import pytest
from helpers.running import run_cli
from helpers.training import tiny_run_args

import finetune
import study.runs


def one_line(argv: list[str], code: int = 2) -> str:
    status, stdout, stderr = run_cli(argv)
    assert (status, stdout) == (code, "")
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def study_argv(out, corpus, tokenizer, *options: str) -> list[str]:
    return ["study", "--out", str(out), "--modes", "baseline", "--depths", "1", "--seeds", "0", *options, "--",
            "--data", str(corpus), "--tokenizer", str(tokenizer), "--seq-len", "32", "--batch-size", "2",
            "--val-blocks", "2", "--max-steps", "2"]  # fmt: skip


# --- checked before the first long step ---------------------------------------------------------------------------


def test_a_study_checks_what_it_scores_with_and_how_it_starts_runs_before_training(corpus, routed_model, tmp_path,
                                                                                   nothing_started):
    out = tmp_path / "study"
    missing = tmp_path / "held-out.jsonl"
    assert one_line(study_argv(out, corpus, routed_model, "--validation-data", str(missing))) == (
        f"delta-qwen3 study: error: --validation-data {missing} does not exist"
    )
    assert one_line(study_argv(out, corpus, routed_model, "--launcher", "no-such-python")) == (
        "delta-qwen3 study: error: --launcher no-such-python: no-such-python is not a program that can be started "
        "(not on PATH, or not an executable file)"
    )
    assert not out.exists()


def test_a_program_that_cannot_start_is_not_reported_as_a_failed_write(corpus, routed_model, tmp_path, monkeypatch):
    """A launcher that was there when the study started and is gone when a run starts."""
    launcher = tmp_path / "python"
    launcher.symlink_to(shutil.which("python3") or shutil.which("python"))

    def vanished(*args, **kwargs):
        launcher.unlink()
        return start_training(*args, **kwargs)

    start_training = study.runs.start_training
    monkeypatch.setattr(study.runs, "start_training", vanished)
    code, stdout, stderr = run_cli(study_argv(tmp_path / "study", corpus, routed_model, "--launcher", str(launcher)))
    assert code == 1 and stdout.startswith(f"$ {launcher} -m finetune ")  # the command it was to run
    assert stderr.strip().splitlines()[-1] == (
        f"delta-qwen3 study: error: run baseline-L1-s0: could not start finetune with {launcher} (--launcher): No "
        "such file or directory"
    )


def test_routing_refuses_a_model_without_routing_before_any_model_runs(routed_model, qwen3_checkpoint, corpus,
                                                                       tmp_path, nothing_started):
    line = one_line(["routing", str(routed_model), str(qwen3_checkpoint), "--data", str(corpus), "--out",
                     str(tmp_path / "report")])  # fmt: skip
    assert line == (f"delta-qwen3 routing: error: MODEL {qwen3_checkpoint} is a 'qwen3' model, not DeltaQwen3: it has "
                    "no routing weights")  # fmt: skip
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize("hub", ["no token", "offline", "not an id"])
def test_a_publication_that_cannot_happen_is_refused_before_converting_or_training(hub, qwen3_checkpoint, corpus,
                                                                                   delta_checkpoint, tmp_path,
                                                                                   monkeypatch, capsys, nothing_started):
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_token" if hub != "no token" else None)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", hub == "offline")
    repo = "someone/model" if hub != "not an id" else "someone/model/extra"
    message = {
        "no token": f"--push-to-hub {repo} needs a Hub token to publish with: log in with `hf auth login`, set "
                    "HF_TOKEN, or pass --token where the command has it",
        "offline": f"--push-to-hub {repo}: HF_HUB_OFFLINE is set, so nothing can be published; unset it, or publish "
                   "later with `delta-qwen3 push`",
        "not an id": f"--push-to-hub {repo} is not a Hub repository id of the form namespace/name",
    }[hub]  # fmt: skip
    line = one_line(["convert", str(qwen3_checkpoint), str(tmp_path / "converted"), "--push-to-hub", repo])
    assert line.startswith(f"delta-qwen3 convert: error: {message}")
    capsys.readouterr()
    assert finetune.main(tiny_run_args(corpus, tmp_path / "run", "--model", str(delta_checkpoint), "--push-to-hub",
                                       repo)) == 2  # fmt: skip
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"finetune: error: {message}")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_tracker_that_is_not_installed_is_refused_before_training(corpus, delta_checkpoint, tmp_path, capsys,
                                                                    nothing_started):
    from accelerate.utils import is_wandb_available

    if is_wandb_available():
        pytest.skip("wandb is installed")
    assert finetune.main(tiny_run_args(corpus, tmp_path / "run", "--model", str(delta_checkpoint), "--report-to",
                                       "wandb")) == 2  # fmt: skip
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "finetune: error: --report-to wandb: wandb is not installed (pip install wandb)"
    )
    assert not (tmp_path / "run").exists()


# --- the real cause, and its path -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "file, content, reason",
    [
        ("tokenizer.json", '{"version": "1.0", "model": 5}',
         "the tokenizer file {path} cannot be read as a tokenizer (data did not match any variant of untagged enum "
         "ModelUntagged at line 1 column 30)"),
        ("tokenizer_config.json", '{"model_max_length": 512,', "the tokenizer file {path} is not valid JSON "
         "(Expecting property name enclosed in double quotes: line 1 column 26 (char 25))"),
    ],
)  # fmt: skip
def test_a_broken_tokenizer_file_is_named_not_blamed_on_the_model(file, content, reason, routed_model, corpus,
                                                                  tmp_path, capsys, nothing_started):
    model = shutil.copytree(routed_model, tmp_path / "model")
    (model / file).write_text(content)
    reason = reason.format(path=model / file)
    for argv in (["ppl", str(model), "--data", str(corpus)],
                 ["routing", str(model), "--data", str(corpus), "--out", str(tmp_path / "report")],
                 ["eval", str(model), "--tasks", "boolq", "--output", str(tmp_path / "results.json")]):  # fmt: skip
        assert one_line(argv) == f"delta-qwen3 {argv[0]}: error: MODEL {model}: {reason}"
    capsys.readouterr()
    assert finetune.main(tiny_run_args(corpus, tmp_path / "run", "--model", str(model))) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"finetune: error: --model {model}: {reason}"
    assert finetune.main(tiny_run_args(corpus, tmp_path / "run", "--model", str(routed_model), "--tokenizer",
                                       str(model))) == 2  # fmt: skip
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"finetune: error: --tokenizer {model}: {reason}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_broken_config_file_is_named(routed_model, corpus, tmp_path, nothing_started):
    model = shutil.copytree(routed_model, tmp_path / "model")
    (model / "config.json").write_text(json.dumps([1, 2]))
    assert one_line(["ppl", str(model), "--data", str(corpus)]) == (
        f"delta-qwen3 ppl: error: MODEL {model}: config.json holds a JSON list, not an object of configuration fields"
    )
