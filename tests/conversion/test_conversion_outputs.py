"""What `delta-qwen3 convert` says and leaves behind: interrupts (Ctrl-C, SIGTERM, SIGKILL and the next run), the
default block count, what "exact" means under a dtype cast, JSON without bare NaN, and the documented tokenizer
example. Each test hashes the source before and after: it is never written to."""

import json
import logging
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from helpers.files import tree_digest
from helpers.models import save_tiny_qwen3
from helpers.paths import REPO_ROOT
from helpers.running import isolated_env, last_json_line, run_without_project

import modeling_delta_qwen3.modeling_delta_qwen3 as modeling
from conversion import converter
from delta_qwen3.atomic import write_json, write_json_lines
from delta_qwen3.cli import main
from delta_qwen3.jsonl import json_text
from finetune.loop import MetricsLog

INTERRUPTED = "delta-qwen3 convert: interrupted by {}; unfinished outputs were not kept"


def strict_json(text: str):
    """Parse JSON as other languages do: bare NaN / Infinity are an error, not a number."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def hidden_siblings(out) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_signal_during_conversion_is_one_line_and_exit_130(qwen3_checkpoint, tmp_path, monkeypatch, capsys,
                                                           signal_number):
    """The signal arrives while the staging directory holds the weights: exit 130, one line, nothing left."""
    out = tmp_path / "out"
    before = tree_digest(qwen3_checkpoint)

    def signalled(*args, **kwargs):
        assert hidden_siblings(out) != []  # the weights are in the staging directory
        os.kill(os.getpid(), signal_number)

    monkeypatch.setattr(converter, "write_model_card", signalled)
    handlers = [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)]
    assert main(["convert", str(qwen3_checkpoint), str(out)]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == INTERRUPTED.format(signal_number.name)
    assert not out.exists() and hidden_siblings(out) == []
    assert tree_digest(qwen3_checkpoint) == before
    assert [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)] == handlers  # restored


def test_next_run_removes_what_killed_runs_left(qwen3_checkpoint, tmp_path, caplog):
    """Staging of a process that is gone, or from before process ids were in the name, is removed; a running
    process's is kept; an earlier OUT moved aside is removed once OUT is in place, and kept and reported if not."""
    out = tmp_path / "out"
    dead = [out.with_name(f".out.partial-{name}") for name in ("99999999-0123abcd", "0123abcd")]
    running = out.with_name(f".out.partial-{os.getpid()}-0123abcd")
    for path in [*dead, running]:
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"half")
    orphan = out.with_name(".out.old-0123abcd")  # OUT's replacement was killed between its two renames
    orphan.mkdir()
    before = tree_digest(qwen3_checkpoint)

    with caplog.at_level(logging.WARNING, logger="delta_qwen3.atomic"):
        assert main(["convert", str(qwen3_checkpoint), str(out)]) == 0
    assert hidden_siblings(out) == sorted([orphan.name, running.name])
    assert f"{orphan} holds an earlier out whose replacement was interrupted; rename it to {out}" in caplog.text

    assert main(["convert", str(qwen3_checkpoint), str(out), "--overwrite"]) == 0  # OUT exists: the orphan goes
    assert hidden_siblings(out) == [running.name]
    assert tree_digest(qwen3_checkpoint) == before


def start_conversion(src, out) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "delta_qwen3.cli", "convert", str(src), str(out), "--overwrite"],
        cwd=REPO_ROOT, env=isolated_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def shards_staged(out) -> int:
    """How many weight files the conversion into `out` has begun writing in its staging directory."""
    return sum(len(list(staging.glob("*.safetensors"))) for staging in out.parent.glob(f".{out.name}.partial-*"))


def wait_for_shards(process: subprocess.Popen, out, count: int) -> None:
    """Until the conversion has begun writing its `count`-th weight file (or ended)."""
    while process.poll() is None and shards_staged(out) < count:
        time.sleep(0.0005)


@pytest.mark.slow
def test_fault_injection_sigterm_and_sigkill_then_a_second_run(tmp_path, tokenizer):
    """SIGTERM or SIGKILL while the conversion writes its weights (after a seeded random number of its ~100 shards),
    then the same command again: SIGTERM ends with exit 130 and one line, SIGKILL as killed; the next run succeeds,
    no staging or moved-aside directory remains, and the source is unchanged."""
    src = save_tiny_qwen3(tmp_path / "src", tokenizer, max_shard_size="20KB", num_hidden_layers=16)
    out = tmp_path / "out"
    before = tree_digest(src)
    assert main(["convert", str(src), str(out)]) == 0
    expected_files = sorted(p.name for p in out.iterdir())
    shards = len([name for name in expected_files if name.endswith(".safetensors")])
    assert shards > 60  # enough that the signal lands while shards remain to be written

    rng = random.Random(22)
    for signal_number in (signal.SIGTERM,) * 3 + (signal.SIGKILL,):
        process = start_conversion(src, out)
        wait_for_shards(process, out, rng.randint(1, shards // 3))
        process.send_signal(signal_number)
        _, err = process.communicate(timeout=120)
        if signal_number == signal.SIGTERM:
            assert process.returncode == 130 and "Traceback" not in err, err
            assert err.splitlines()[-1] == INTERRUPTED.format("SIGTERM")
        else:
            assert process.returncode == -signal.SIGKILL
        assert main(["convert", str(src), str(out), "--overwrite"]) == 0
        assert hidden_siblings(out) == [] and sorted(p.name for p in out.iterdir()) == expected_files
        assert tree_digest(src) == before


def test_output_equal_to_source_names_the_real_problem(qwen3_checkpoint, tmp_path, capsys):
    """`convert q3 q3` must not suggest --overwrite, which is refused too."""
    src = shutil.copytree(qwen3_checkpoint, tmp_path / "q3")
    before = tree_digest(src)
    for options in ([], ["--overwrite"]):
        assert main(["convert", str(src), str(src), *options]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"delta-qwen3 convert: error: OUT {src} is inside SRC {src}; the source is never written")
        assert "--overwrite" not in err
    assert tree_digest(src) == before and hidden_siblings(src) == []


@pytest.mark.parametrize("mode", ["delta_block", "delta", "attnres_block"])
def test_default_block_count_fits_a_shallow_model(tmp_path, tokenizer, mode):
    src = save_tiny_qwen3(tmp_path / "two-layers", tokenizer, num_hidden_layers=2)
    before = tree_digest(src)
    assert main(["convert", str(src), str(tmp_path / "out"), "--mode", mode]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["routing_num_blocks"] == 2
    assert tree_digest(src) == before


def test_default_block_count_is_the_documented_4_where_the_model_allows(qwen3_checkpoint, tmp_path):
    assert main(["convert", str(qwen3_checkpoint), str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["routing_num_blocks"] == 4


@pytest.mark.slow
def test_dtype_cast_is_named_beside_exact(qwen3_checkpoint, tmp_path, capsys):
    """A float32 source cast to bfloat16 computes the same function with rounded weights: both are said."""
    before = tree_digest(qwen3_checkpoint)
    out = tmp_path / "bf16"
    assert main(["convert", str(qwen3_checkpoint), str(out), "--dtype", "bfloat16", "--verify"]) == 0
    printed = capsys.readouterr().out
    caveat = ("computes exactly what the source computes at the source's precision (float32); its weights were cast "
              "to bfloat16, so its outputs differ from the source's by that rounding")
    assert f"The converted model {caveat}." in printed
    difference = re.search(r"Largest logit difference on the probe batch: (\S+) \(the bfloat16 rounding", printed)
    assert difference and float(difference[1]) > 1e-4  # the cast's rounding, far above float32 noise
    assert f"it {caveat}; fine-tuning" in (out / "README.md").read_text()

    assert main(["convert", str(qwen3_checkpoint), str(tmp_path / "f32"), "--dtype", "float32", "--verify"]) == 0
    printed = capsys.readouterr().out  # no cast: no caveat, and the difference is exactly 0
    assert "The converted model computes exactly what the source computes.\n" in printed
    assert "Largest logit difference on the probe batch: 0.000e+00\n" in printed
    assert tree_digest(qwen3_checkpoint) == before


def test_json_outputs_write_null_for_non_finite_numbers(tmp_path):
    values = {"loss": math.nan, "perplexity": math.inf, "points": [1.5, -math.inf], "nested": {"x": (math.nan,)}}
    expected = {"loss": None, "perplexity": None, "points": [1.5, None], "nested": {"x": [None]}}
    assert strict_json(json_text(values)) == expected
    write_json(tmp_path / "result.json", values)
    assert strict_json((tmp_path / "result.json").read_text()) == expected
    write_json_lines(tmp_path / "lines.jsonl", [values])
    assert strict_json((tmp_path / "lines.jsonl").read_text()) == expected

    accelerator = SimpleNamespace(log=lambda values, step: None, is_main_process=True)
    MetricsLog(tmp_path / "train_log.jsonl", accelerator).write(3, {"loss": math.nan, "lr": 1e-3})
    assert strict_json((tmp_path / "train_log.jsonl").read_text()) == {"step": 3, "loss": None, "lr": 1e-3}


@pytest.mark.slow
def test_documented_example_loads_the_tokenizer_without_a_prompt(qwen3_checkpoint, tmp_path, tokenizer):
    """The class docstring's example, run with stdin closed where the project cannot be imported: no question
    about custom code, and the converted checkpoint's tokenizer encodes as the source's."""
    out = converter.convert(qwen3_checkpoint, tmp_path / "out")
    before = tree_digest(out)
    example = [line.strip()[4:] for line in modeling.DeltaQwen3ForCausalLM.__doc__.splitlines()
               if line.strip().startswith(">>> ")]
    assert any("AutoTokenizer.from_pretrained" in line for line in example)
    code = "".join(f"{line.replace('path/or/repo', str(out))}\n" for line in example)
    result = run_without_project(code + "import json; print(json.dumps(tokenizer('def f(x):').input_ids))", tmp_path)
    assert "custom code" not in result.stdout + result.stderr
    assert last_json_line(result.stdout) == tokenizer("def f(x):").input_ids
    assert tree_digest(out) == before
