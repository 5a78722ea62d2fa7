"""How a `finetune` run ends when it cannot go on: options refused before anything is loaded, divergence, a resume
with other settings, interrupts, bad input found before training; each with one line on stderr, its exit status,
and the run directory as it was."""

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.files import disk_full_past, file_hashes
from helpers.models import save_tiny_qwen3
from helpers.training import log_lines, run_env, tiny_run_args, weights

import finetune
from delta_qwen3.errors import RunError
from finetune.config import (
    DATA_CONTENT,
    INVOCATION_OPTIONS,
    MODEL_CONFIGURATION,
    RESUMABLE_OPTIONS,
    FinetuneConfig,
    resume_changes,
)
from finetune.loop import DivergenceWatch


def failed(argv: list[str], capsys, exit_code: int = 2) -> str:
    """Run the command, expect `exit_code`; return its one line on stderr (progress bars aside)."""
    assert finetune.main(argv) == exit_code
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("finetune:")]
    assert len(lines) == 1
    return lines[0]


# --- options refused before anything is loaded -------------------------------------------------------------------


@pytest.mark.parametrize("seq_len", ["0", "1"])
def test_seq_len_has_one_lower_bound(tmp_path, jsonl_corpus, capsys, seq_len):
    argv = tiny_run_args(jsonl_corpus, tmp_path / "out", "--model", str(tmp_path / "model"), "--seq-len", seq_len)
    assert failed(argv, capsys) == (
        f"finetune: error: --seq-len must be at least 2 (one prediction needs two tokens), got {seq_len}"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--model", "m", "--routing-init", "released"],
         "--preset, --model-config, --num-blocks, --gate and --routing-init only apply with --from-scratch"),
        (["--from-scratch", "--preset", "tiny", "--tokenizer", "t", "--mode", "baseline", "--routing-init", "released"],
         "--routing-init released needs a routing mode: the baseline has no routing"),
    ],
)  # fmt: skip
def test_released_routing_initialisation_needs_a_new_model_with_routing(tmp_path, jsonl_corpus, capsys, extra,
                                                                        message):  # fmt: skip
    assert failed(tiny_run_args(jsonl_corpus, tmp_path / "out", *extra), capsys) == f"finetune: error: {message}"
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
def test_learning_rates_that_cannot_train_are_refused(tmp_path, jsonl_corpus, capsys, option, value, message):
    argv = tiny_run_args(jsonl_corpus, tmp_path / "out", "--model", str(tmp_path / "model"), option, value)
    assert failed(argv, capsys) == f"finetune: error: {message}"
    assert not (tmp_path / "out").exists()


def test_fsdp_asked_for_where_accelerate_does_not_shard_is_refused(tmp_path, jsonl_corpus, capsys, monkeypatch):
    """`accelerate launch --config_file finetune/accelerate_fsdp.yaml` on CPU processes: accelerate shards with FSDP
    on GPUs only, so it would train unsharded copies; the run is refused before anything is written."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    argv = tiny_run_args(jsonl_corpus, tmp_path / "out", "--model", str(tmp_path / "model"))
    assert failed(argv, capsys) == (
        "finetune: error: FSDP was asked for, but accelerate runs this launch as NO with 1 process(es): it shards "
        "with FSDP on GPUs only; on the CPU launch without the FSDP configuration (accelerate launch --cpu "
        "--num_processes 2 -m finetune ...)"
    )
    assert not (tmp_path / "out").exists()


# --- divergence --------------------------------------------------------------------------------------------------


def test_divergence_stops_the_run_before_anything_non_finite_is_saved(tmp_path, jsonl_corpus, delta_checkpoint, capsys):
    out = tmp_path / "out"
    # At this rate the first step is finite and the second one's loss overflows to a NaN gradient norm.
    argv = tiny_run_args(jsonl_corpus, out, "--model", str(delta_checkpoint), "--lr", "1e6", "--max-steps", "6",
                         "--save-every", "1", "--keep-checkpoints", "1")  # fmt: skip
    assert finetune.main([*argv, "--stop-after-step", "1"]) == 0
    capsys.readouterr()
    checkpoint = file_hashes(out / "checkpoints")
    assert {name.split("/")[0] for name in checkpoint} == {"step_00000001"}

    assert failed([*argv, "--resume"], capsys, exit_code=1) == (
        "finetune: error: training diverged: the loss or gradient norm is not finite at step 2; nothing from that "
        "step on was validated or saved (a lower --lr may help)"
    )
    assert file_hashes(out / "checkpoints") == checkpoint  # the last finite checkpoint is neither rotated nor touched
    assert not (out / "model").exists()
    assert [line["step"] for line in log_lines(out) if "loss" in line] == [1, 2]  # the diverged step is in the log


class Processes:
    """Two processes' `DivergenceWatch`es, as `accelerator.gather` shows them to each other."""

    def __init__(self, scaler=None):
        self.scaler, self.device = scaler, "cpu"
        self.watches = [DivergenceWatch(self), DivergenceWatch(self)]

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.cat([watch.first_step for watch in self.watches])


@pytest.mark.parametrize("scaler", [None, "fp16 loss scaler"])
def test_every_process_stops_at_a_non_finite_value_any_process_saw(scaler):
    processes = Processes(scaler)
    finite, infinite = torch.tensor(1.0), torch.tensor(float("inf"))
    for step, bad_norm in ((1, False), (2, True), (3, False)):
        processes.watches[0].observe(step, {"loss": finite, "grad_norm": infinite if bad_norm else finite})
        processes.watches[1].observe(step, {"loss": finite, "grad_norm": finite})
    if scaler is None:
        for watch in processes.watches:
            with pytest.raises(RunError, match="not finite at step 2;"):
                watch.check()
    else:  # under fp16 loss scaling an infinite gradient norm makes the scaler skip the step: no divergence
        for watch in processes.watches:
            watch.check()
    processes.watches[1].observe(4, {"loss": torch.tensor(float("nan")), "grad_norm": finite})
    for watch in processes.watches:
        with pytest.raises(RunError, match=f"not finite at step {4 if scaler else 2};"):
            watch.check()


# --- resuming ----------------------------------------------------------------------------------------------------


def test_the_options_that_may_change_on_resume_are_options():
    names = {spec.name for spec in FinetuneConfig.__dataclass_fields__.values()}
    assert RESUMABLE_OPTIONS <= names and INVOCATION_OPTIONS <= names
    assert not RESUMABLE_OPTIONS & INVOCATION_OPTIONS
    # An option the recorded settings lack was added after the run started, which ran as its default does: the
    # default resumes, another value is refused; a setting that is no option at all is refused.
    assert resume_changes({"seq_len": 32}, {"seq_len": 32, "routing_init": "zero"}) == ([], [])
    assert resume_changes({"seq_len": 32}, {"routing_init": "released", "seq_len": 32}) == (
        ["--routing-init zero -> released"],
        [],
    )
    assert resume_changes({"seq_len": 32}, {"seq_len": 32, "new_option": 1}) == (
        ["--new-option (not recorded) -> 1"],
        [],
    )
    # The model configuration is one entry: its changed values, or only the names of changed lists and mappings.
    saved = {MODEL_CONFIGURATION: {"rms_norm_eps": 1e-06, "layer_types": ["full_attention"], "head_dim": 16}}
    current = {MODEL_CONFIGURATION: {"rms_norm_eps": 1e-05, "layer_types": [], "tie_word_embeddings": True}}
    assert resume_changes(saved, current) == (
        ["model configuration (head_dim 16 -> (not set); layer_types; rms_norm_eps 1e-06 -> 1e-05; "
         "tie_word_embeddings (not set) -> True)"],
        [],
    )  # fmt: skip
    assert resume_changes(saved, saved) == ([], [])
    # What the data holds is refused when it changes, named as such; where the data is, is not.
    saved, current = {"data": "a", DATA_CONTENT: "Hub dataset a"}, {"data": "b", DATA_CONTENT: "Hub dataset b"}
    assert resume_changes(saved, current) == (["what the data holds (Hub dataset a -> Hub dataset b)"], ["--data a -> b"])


def test_resume_refuses_settings_that_change_the_run_and_keeps_the_log_unrepeated(
    tmp_path, jsonl_corpus, delta_checkpoint, tokenizer, capsys
):
    out = tmp_path / "out"
    argv = tiny_run_args(jsonl_corpus, out, "--model", str(delta_checkpoint), "--max-steps", "4", "--save-every", "2")
    assert finetune.main([*argv, "--stop-after-step", "3"]) == 0
    settings = json.loads((out / "run_config.json").read_text())
    assert settings["model"] == str(delta_checkpoint) and settings["seq_len"] == 32
    assert (settings["num_processes"], settings["mixed_precision"]) == (1, "no")
    assert not INVOCATION_OPTIONS & settings.keys()
    before = file_hashes(out)

    # A plain Qwen3 model after a delta run (its checkpoint would not even load), and another block length.
    qwen3 = save_tiny_qwen3(tmp_path / "qwen3", tokenizer)
    capsys.readouterr()
    message = failed([*argv, "--resume", "--model", str(qwen3), "--seq-len", "16"], capsys)
    assert message == (
        f"finetune: error: --resume: these settings differ from those the run in {out} started with, and would "
        f"change what is trained or on what: --model {delta_checkpoint} -> {qwen3}; model configuration "
        "(architectures; auto_map; hidden_size 32 -> 64; intermediate_size 64 -> 128; layer_types; model_type "
        "delta_qwen3 -> qwen3; num_attention_heads 2 -> 4; num_hidden_layers 2 -> 4; num_key_value_heads 1 -> 2; "
        "routing_gate False -> (not set); routing_mode delta -> (not set); routing_num_blocks 2 -> (not set)); "
        "--seq-len 32 -> 16 (start a new run with another --output-dir, or with --overwrite)"
    )
    assert failed([*argv, "--resume", "--max-steps", "1"], capsys) == (
        "finetune: error: --max-steps 1 is before the step of the checkpoint to resume (2)"
    )
    assert file_hashes(out) == before

    # The log had steps 1 to 3 when the run stopped; resuming from step 2 logs step 3 again, after dropping it.
    assert finetune.main([*argv, "--resume", "--max-steps", "5", "--log-every", "2"]) == 0
    assert "resuming with changed options: --log-every 1 -> 2; --max-steps 4 -> 5" in capsys.readouterr().out
    assert [line["step"] for line in log_lines(out) if "loss" in line] == [1, 2, 4, 5]
    assert json.loads((out / "run_config.json").read_text()) == {**settings, "max_steps": 5, "log_every": 2}


def test_resume_compares_what_the_model_configuration_file_says_not_where_it_is(
    tmp_path, jsonl_corpus, tokenizer, capsys
):  # fmt: skip
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    shape = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 2,
             "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 64, "rms_norm_eps": 1e-6}  # fmt: skip
    config_file = tmp_path / "shape.json"
    config_file.write_text(json.dumps(shape))
    out = tmp_path / "out"
    scratch = ["--from-scratch", "--mode", "delta", "--tokenizer", str(tmp_path / "tokenizer"), "--save-every", "2"]
    argv = tiny_run_args(jsonl_corpus, out, *scratch, "--max-steps", "4")
    assert finetune.main([*argv, "--model-config", str(config_file), "--stop-after-step", "3"]) == 0
    recorded = json.loads((out / "run_config.json").read_text())[MODEL_CONFIGURATION]
    assert (recorded["model_type"], recorded["routing_mode"], recorded["hidden_size"]) == ("delta_qwen3", "delta", 32)
    before = file_hashes(out)

    # The same path, another model: refused.
    config_file.write_text(json.dumps({**shape, "rms_norm_eps": 1e-5}))
    capsys.readouterr()
    assert failed([*argv, "--model-config", str(config_file), "--resume"], capsys) == (
        f"finetune: error: --resume: these settings differ from those the run in {out} started with, and would "
        "change what is trained or on what: model configuration (rms_norm_eps 1e-06 -> 1e-05) (start a new run "
        "with another --output-dir, or with --overwrite)"
    )
    assert file_hashes(out) == before

    # Another path, the same model: resumed.
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(shape))
    assert finetune.main([*argv, "--model-config", str(moved), "--resume", "--stop-after-step", "3"]) == 0
    assert f"resuming with changed options: --model-config {config_file} -> {moved}" in capsys.readouterr().out

    # A run recorded before the model configuration was: resumed, saying what cannot be checked.
    settings = json.loads((out / "run_config.json").read_text())
    del settings[MODEL_CONFIGURATION]
    (out / "run_config.json").write_text(json.dumps(settings))
    assert finetune.main([*argv, "--model-config", str(moved), "--resume"]) == 0
    assert "does not record the model configuration" in capsys.readouterr().out
    assert json.loads((out / "run_config.json").read_text())[MODEL_CONFIGURATION] == recorded


def test_resume_compares_what_the_data_and_the_tokenizer_hold_not_where_they_are(
    tmp_path, jsonl_corpus, tokenizer, capsys
):  # fmt: skip
    data, tokenizer_dir = tmp_path / "data.jsonl", tmp_path / "tokenizer"
    data_copy, tokenizer_copy = tmp_path / "elsewhere" / "data.jsonl", tmp_path / "elsewhere" / "tokenizer"
    for data_path, tokenizer_path in ((data, tokenizer_dir), (data_copy, tokenizer_copy)):
        data_path.parent.mkdir(exist_ok=True)
        data_path.write_bytes(jsonl_corpus.read_bytes())
        tokenizer.save_pretrained(tokenizer_path)
    out = tmp_path / "out"
    scratch = ["--from-scratch", "--mode", "delta", "--preset", "tiny", "--save-every", "2", "--max-steps", "4"]
    argv = tiny_run_args(data, out, *scratch, "--tokenizer", str(tokenizer_dir))
    assert finetune.main([*argv, "--stop-after-step", "3"]) == 0
    before = file_hashes(out)
    capsys.readouterr()

    # The same paths, other contents: refused, the run directory untouched.
    data.write_bytes(jsonl_corpus.read_bytes()[:-200] + b"\n")
    assert re.fullmatch(
        "finetune: error: --resume: these settings differ from those the run in .* started with, and would change "
        r"what is trained or on what: what the data holds \(1 file of \d+ bytes, blake2b [0-9a-f]{16} -> 1 file of "
        r"\d+ bytes, blake2b [0-9a-f]{16}\) \(start a new run with another --output-dir, or with --overwrite\)",
        failed([*argv, "--resume"], capsys),
    )
    data.write_bytes(jsonl_corpus.read_bytes())
    rules = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    merges = rules["model"]["merges"]
    merges[0], merges[1] = merges[1], merges[0]  # the same vocabulary, another tokenisation
    (tokenizer_dir / "tokenizer.json").write_text(json.dumps(rules))
    assert re.search(
        r"or on what: the tokenizer's vocabulary, rules and special tokens \(blake2b [0-9a-f]{16} -> blake2b "
        r"[0-9a-f]{16}\) \(start",
        failed([*argv, "--resume"], capsys),
    )
    assert file_hashes(out) == before

    # Copies elsewhere of what the run started with: resumed.
    moved = [*argv, "--data", str(data_copy), "--tokenizer", str(tokenizer_copy)]
    assert finetune.main([*moved, "--resume"]) == 0
    assert (
        f"resuming with changed options: --data {data} -> {data_copy}; --tokenizer {tokenizer_dir} -> {tokenizer_copy}"
        in capsys.readouterr().out
    )


def test_a_checkpoint_that_cannot_load_leaves_the_run_as_it_was_and_names_the_one_before(
    tmp_path, jsonl_corpus, delta_checkpoint, tokenizer, capsys
):  # fmt: skip
    out = tmp_path / "out"
    argv = tiny_run_args(jsonl_corpus, out, "--model", str(delta_checkpoint), "--max-steps", "4", "--save-every", "1")
    assert finetune.main([*argv, "--stop-after-step", "3"]) == 0
    checkpoints = out / "checkpoints"
    # What a user may keep beside the checkpoints is neither a checkpoint nor rotated away.
    shutil.copytree(checkpoints / "step_00000002", checkpoints / "step_00000002.bak")
    (checkpoints / "step_notes.txt").write_text("notes")
    model = checkpoints / "step_00000003" / "model.safetensors"
    intact = model.read_bytes()
    model.write_bytes(intact[: len(intact) // 2])
    before = file_hashes(out)
    capsys.readouterr()

    message = failed([*argv, "--resume", "--max-steps", "5"], capsys)
    assert message.startswith(f"finetune: error: could not load the checkpoint to resume, {checkpoints / 'step_00000003'}: ")
    assert message.endswith(
        "; either the run started with another model (resume with the options it started with), or the checkpoint "
        f"is damaged (truncated?): moved out of {checkpoints}, --resume then continues from the checkpoint of step 2 "
        f"({checkpoints / 'step_00000002'})"
    )
    assert file_hashes(out) == before  # run_config.json still says --max-steps 4; the log still has step 3

    # A run whose settings are not recorded cannot be checked; another model is refused when its checkpoint loads.
    model.write_bytes(intact)
    settings = (out / "run_config.json").read_bytes()
    (out / "run_config.json").unlink()
    qwen3 = save_tiny_qwen3(tmp_path / "qwen3", tokenizer)
    before = file_hashes(out)
    capsys.readouterr()
    assert "Error(s) in loading state_dict" in failed([*argv, "--model", str(qwen3), "--resume"], capsys)
    assert file_hashes(out) == before
    (out / "run_config.json").write_bytes(settings)
    (out / "run_config.json").write_text("[]")
    assert failed([*argv, "--resume"], capsys) == (
        f"finetune: error: {out / 'run_config.json'} holds a JSON list, not the run's settings (an object); they "
        "cannot be compared"
    )
    (out / "run_config.json").write_bytes(settings)

    assert finetune.main([*argv, "--resume"]) == 0
    assert f"resuming from {checkpoints / 'step_00000003'} (step 3)" in capsys.readouterr().out
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "step_00000002.bak", "step_00000003", "step_00000004", "step_notes.txt"]


@pytest.mark.parametrize(
    "fields, message",
    [
        ("[1, 2]", "--model-config {path} holds a JSON list, not an object of configuration fields"),
        ('{"num_hidden_layers": "2"}', "--model-config {path}: num_hidden_layers must be a positive whole number, got "
         "'2'"),
        ('{"vocab_size": "512"}', "--model-config {path}: vocab_size must be a positive whole number, got '512'"),
        ('{"tie_word_embeddings": "yes"}', "--model-config {path}: invalid model configuration: Validation error for "
         "field 'tie_word_embeddings': TypeError: Field 'tie_word_embeddings' expected bool, got str (value: 'yes')"),
    ],
)  # fmt: skip
def test_a_hand_edited_model_configuration_file_is_one_line(tmp_path, jsonl_corpus, tokenizer, capsys, fields,
                                                            message):
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    (tmp_path / "shape.json").write_text(fields)
    argv = tiny_run_args(jsonl_corpus, tmp_path / "out", "--from-scratch", "--mode", "delta", "--tokenizer",
                         str(tmp_path / "tokenizer"), "--model-config", str(tmp_path / "shape.json"))  # fmt: skip
    assert failed(argv, capsys) == f"finetune: error: {message.format(path=tmp_path / 'shape.json')}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "save_every, written, outcome",
    [
        ("1", "the checkpoint {out}/checkpoints/step_00000001",
         "stopped at step 1; no checkpoint was saved, so --resume starts again from step 0"),
        ("0", "--output-dir {out}",
         "the final model was not saved; no checkpoint was saved, so --resume starts again from step 0"),
    ],
)  # fmt: skip
def test_a_disk_that_fills_is_one_line_saying_what_resume_continues_from(tmp_path, jsonl_corpus, delta_checkpoint,
                                                                         capsys, save_every, written, outcome):
    out = tmp_path / "out"
    argv = tiny_run_args(jsonl_corpus, out, "--model", str(delta_checkpoint), "--max-steps", "1", "--save-every",
                         save_every)  # fmt: skip
    with disk_full_past(100_000):  # the settings, the log and the held-out text fit; the weights (200 kB) do not
        message = failed(argv, capsys, exit_code=1)
    assert message == (
        f"finetune: error: could not write {written.format(out=out)}: Error while serializing: I/O error: File too "
        f"large (os error 27) ({outcome})"
    )
    assert [p.name for p in out.rglob("*") if p.is_dir()] == []  # nor the directory made for the checkpoint
    assert [p.name for p in out.rglob(".*")] == []


def test_a_disk_that_fills_during_the_optimizer_state_is_one_line_naming_the_checkpoint(tmp_path, jsonl_corpus,
                                                                                        delta_checkpoint, capsys):
    # PyTorch's file writer, which saves the optimizer state, reports the failure without its cause.
    out = tmp_path / "out"
    argv = tiny_run_args(jsonl_corpus, out, "--model", str(delta_checkpoint), "--max-steps", "1", "--save-every", "1")
    with disk_full_past(300_000):  # the checkpoint's weights (210 kB) fit; its optimizer state (440 kB) does not
        message = failed(argv, capsys, exit_code=1)
    assert message == (
        f"finetune: error: could not write the checkpoint {out / 'checkpoints' / 'step_00000001'}: File too large "
        "(stopped at step 1; no checkpoint was saved, so --resume starts again from step 0)"
    )
    assert [p.relative_to(out) for p in out.rglob("*") if p.is_dir()] == []  # nor the directory made for it
    assert [p.name for p in out.rglob(".*")] == []


# --- bad input found before training -----------------------------------------------------------------------------

TOO_SMALL = '{"text": "def f(): pass"}\n' * 10  # 100 tokens: not even the validation blocks


def test_a_run_that_fails_before_training_writes_nothing(tmp_path, jsonl_corpus, delta_checkpoint, capsys):
    (tmp_path / "small.jsonl").write_text(TOO_SMALL)
    out = tmp_path / "new" / "out"
    argv = tiny_run_args(tmp_path / "small.jsonl", out, "--model", str(delta_checkpoint))
    assert "is too small" in failed(argv, capsys)
    assert not (tmp_path / "new").exists()

    # --overwrite of an earlier run removes nothing of it when the new run cannot start.
    earlier = tmp_path / "earlier"
    assert finetune.main(tiny_run_args(jsonl_corpus, earlier, "--model", str(delta_checkpoint), "--max-steps", "2",
                                       "--save-every", "1")) == 0  # fmt: skip
    before = file_hashes(earlier)
    argv = tiny_run_args(tmp_path / "small.jsonl", earlier, "--model", str(delta_checkpoint), "--overwrite")
    assert "is too small" in failed(argv, capsys)
    assert file_hashes(earlier) == before


# --- interrupts --------------------------------------------------------------------------------------------------

SIGNAL_MID_RUN = dict(max_steps=60, signal_after=12)  # steps of the run; the logged step after which it is signalled


def run_finetune(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "finetune", *argv], env=run_env(), capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def signal_mid_training(argv: list[str], out, signal_number: int) -> subprocess.CompletedProcess:
    """Start the run, send `signal_number` once its log shows step `SIGNAL_MID_RUN["signal_after"]`, wait for it."""
    process = subprocess.Popen([sys.executable, "-m", "finetune", *argv], env=run_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 240
    while process.poll() is None and time.monotonic() < deadline:
        log = out / "train_log.jsonl"
        logged = re.findall(r'"step":\s*(\d+)', log.read_text()) if log.exists() else []
        if logged and int(logged[-1]) >= SIGNAL_MID_RUN["signal_after"]:
            process.send_signal(signal_number)
            break
        time.sleep(0.01)
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, jsonl_corpus, delta_checkpoint):
    out = tmp_path_factory.mktemp("uninterrupted") / "out"
    result = run_finetune(interrupt_run_args(jsonl_corpus, out, delta_checkpoint))
    assert result.returncode == 0, result.stderr
    return out


def interrupt_run_args(jsonl_corpus, out, delta_checkpoint) -> list[str]:
    return tiny_run_args(jsonl_corpus, out, "--model", str(delta_checkpoint), "--max-steps",
                         str(SIGNAL_MID_RUN["max_steps"]), "--save-every", "5", "--eval-every", "1000")  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_training_then_resume_ends_bit_identical(
    tmp_path, jsonl_corpus, delta_checkpoint, uninterrupted, signal_number
):
    out = tmp_path / "out"
    argv = interrupt_run_args(jsonl_corpus, out, delta_checkpoint)
    interrupted = signal_mid_training(argv, out, signal_number)
    assert interrupted.returncode == 130, interrupted.stderr
    assert "Traceback" not in interrupted.stderr
    name = signal.Signals(signal_number).name
    last_line = interrupted.stderr.strip().splitlines()[-1].split("\r")[-1]
    match = re.fullmatch(
        rf"finetune: interrupted by {name}; stopped at step (\d+); continue with --resume \(from the checkpoint of "
        r"step (\d+)\)",
        last_line,
    )
    assert match, last_line
    stopped, checkpoint = map(int, match.groups())
    assert SIGNAL_MID_RUN["signal_after"] <= stopped < SIGNAL_MID_RUN["max_steps"]
    # The latest checkpoint; the signal may have come during the save of step `stopped`.
    assert sorted(p.name for p in (out / "checkpoints").iterdir())[-1] == f"step_{checkpoint:08d}"
    assert stopped - 5 <= checkpoint <= stopped
    assert not (out / "model").exists()

    resumed = run_finetune([*argv, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    expected, final = weights(uninterrupted / "model"), weights(out / "model")
    assert final.keys() == expected.keys()
    assert all(torch.equal(final[name], expected[name]) for name in expected)
    steps = [line["step"] for line in log_lines(out) if "loss" in line]
    assert steps == list(range(1, SIGNAL_MID_RUN["max_steps"] + 1))
