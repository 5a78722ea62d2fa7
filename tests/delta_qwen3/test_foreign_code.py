"""Nothing runs that the user did not ask to run: Python files that a checkpoint ships (an `auto_map` in its
`config.json` or `tokenizer_config.json`) are imported by no command without `--trust-remote-code`, and no state
file of a fine-tuning run is unpickled in full on `--resume`. Each planted file creates a marker file when it runs;
the marker must never appear."""

import json
import shutil
import textwrap

import pytest
import torch
from helpers.files import tree_digest
from helpers.running import run_cli
from helpers.training import tiny_run_args

import finetune
from eval.benchmarks import FIXTURES_DIR

# The planted module: a marker at import, then a working model class of its own type (a Qwen3 under another name),
# so that with --trust-remote-code the command runs through.
PLANTED_MODULE = '''
import pathlib
pathlib.Path({marker!r}).touch()

from transformers import Qwen3Config, Qwen3ForCausalLM


class PlantedConfig(Qwen3Config):
    model_type = "planted_qwen"


class PlantedForCausalLM(Qwen3ForCausalLM):
    config_class = PlantedConfig
'''


@pytest.fixture
def marker(tmp_path):
    """Where planted code leaves its mark when it runs."""
    return tmp_path / "MARKER"


def plant(directory, marker, name: str = "planted") -> None:
    (directory / f"{name}.py").write_text(PLANTED_MODULE.format(marker=str(marker)))


def foreign_checkpoint(tmp_path, qwen3_checkpoint, marker):
    """A working Qwen3 checkpoint recast as a model type of its own, whose classes its planted code defines."""
    model = shutil.copytree(qwen3_checkpoint, tmp_path / "foreign")
    config = json.loads((model / "config.json").read_text())
    config.update(model_type="planted_qwen", architectures=["PlantedForCausalLM"],
                  auto_map={"AutoConfig": "planted.PlantedConfig", "AutoModelForCausalLM": "planted.PlantedForCausalLM"})  # fmt: skip
    (model / "config.json").write_text(json.dumps(config))
    plant(model, marker)
    return model


def with_tokenizer_code(directory, marker, own_class: bool):
    """`directory` whose tokenizer_config.json names planted code for its tokenizer: as its own class, which
    Transformers cannot build without it, or beside a class that Transformers has."""
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    tokenizer_config["auto_map"] = {"AutoTokenizer": [None, "planted.PlantedTokenizer"]}
    if own_class:
        tokenizer_config["tokenizer_class"] = "PlantedTokenizer"
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    plant(directory, marker)
    with (directory / "planted.py").open("a") as module:
        module.write(textwrap.dedent('''
            from transformers import PreTrainedTokenizerFast


            class PlantedTokenizer(PreTrainedTokenizerFast):
                pass
        '''))
    return directory


def command_options(command, tmp_path, texts):
    return {
        "eval": ["--tasks", "boolq", "--data-dir", str(texts.parent / "tasks"), "--output",
                 str(tmp_path / "results.json"), "--limit", "2"],
        "ppl": ["--data", str(texts), "--max-length", "16"],
        "routing": ["--data", str(texts), "--max-length", "16", "--out", str(tmp_path / "report")],
    }[command]  # fmt: skip


@pytest.fixture
def texts(tmp_path):
    path = tmp_path / "data" / "texts.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps({"text": f"def f{i}(x): return x + {i}"}) + "\n" for i in range(4)))
    (tmp_path / "data" / "tasks").mkdir()
    shutil.copy(FIXTURES_DIR / "boolq.jsonl", tmp_path / "data" / "tasks")
    return path


@pytest.mark.parametrize("command", ["eval", "ppl", "routing"])
def test_code_a_checkpoint_ships_runs_only_with_trust_remote_code(command, qwen3_checkpoint, tmp_path, texts,
                                                                  marker):
    model = foreign_checkpoint(tmp_path, qwen3_checkpoint, marker)
    before = tree_digest(model)
    code, stdout, stderr = run_cli([command, str(model), *command_options(command, tmp_path, texts), "--device", "cpu"])
    assert (code, stdout) == (2, "")
    assert stderr.strip().splitlines()[-1] == (
        f"delta-qwen3 {command}: error: MODEL {model} is a 'planted_qwen' model whose classes are defined by Python "
        "code it ships (planted.py, named by auto_map in config.json); that code runs only with --trust-remote-code "
        "(pass it if you trust the checkpoint)"
    )
    assert not marker.exists()
    assert tree_digest(model) == before
    assert not (tmp_path / "report").exists() and not (tmp_path / "results.json").exists()

    # The user's opt-in runs it, as Transformers' trust_remote_code=True does (routing then finds no routing in it).
    code, stdout, stderr = run_cli([command, str(model), *command_options(command, tmp_path, texts), "--device", "cpu",
                                    "--trust-remote-code"])  # fmt: skip
    assert marker.exists()
    assert code == 0 if command != "routing" else "it has no routing weights" in stderr, stderr


@pytest.mark.parametrize("command", ["ppl", "routing"])
def test_a_deltaqwen3_checkpoint_loads_with_the_installed_classes_whatever_code_it_ships(command, routed_model,
                                                                                       tmp_path, texts, marker):
    """Its model files and a tokenizer of its own are left unimported: the installed classes build it."""
    model = with_tokenizer_code(shutil.copytree(routed_model, tmp_path / "model"), marker, own_class=False)
    for module in model.glob("*_delta_qwen3.py"):
        module.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n" + module.read_text())
    code, stdout, stderr = run_cli([command, str(model), *command_options(command, tmp_path, texts), "--device", "cpu"])
    assert code == 0, stderr
    assert not marker.exists()


def test_finetune_runs_no_code_a_model_or_tokenizer_ships(qwen3_checkpoint, tmp_path, texts, marker, capsys):
    model = foreign_checkpoint(tmp_path, qwen3_checkpoint, marker)
    assert finetune.main(tiny_run_args(texts, tmp_path / "out", "--model", str(model))) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"finetune: error: --model {model} is a 'planted_qwen' model; expected a DeltaQwen3 or Qwen3 checkpoint"
    )
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    for file in qwen3_checkpoint.glob("tokenizer*.json"):
        shutil.copy(file, tokenizer)
    with_tokenizer_code(tokenizer, marker, own_class=True)
    argv = tiny_run_args(texts, tmp_path / "out", "--model", str(qwen3_checkpoint), "--tokenizer", str(tokenizer))
    assert finetune.main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"finetune: error: --tokenizer {tokenizer}: its tokenizer is defined by Python code it ships (auto_map in "
        "tokenizer_config.json or config.json), which runs only with --trust-remote-code (pass it if you trust the "
        "checkpoint)"
    )
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


class Planted:
    """Unpickled in full, it creates `marker`; `torch.load(weights_only=True)` refuses it."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.mark.parametrize("state_file", ["custom_checkpoint_0.pkl", "optimizer.bin", "random_states_0.pkl"])
def test_resume_unpickles_no_object_planted_in_a_checkpoint(state_file, corpus, delta_checkpoint, tmp_path,
                                                            marker, capsys):
    out = tmp_path / "out"
    argv = tiny_run_args(corpus, out, "--model", str(delta_checkpoint), "--max-steps", "3", "--save-every", "2")
    assert finetune.main([*argv, "--stop-after-step", "2"]) == 0
    checkpoint = out / "checkpoints" / "step_00000002"
    state = torch.load(checkpoint / state_file, weights_only=False)
    torch.save({"planted": Planted(marker), "state": state}, checkpoint / state_file)
    capsys.readouterr()
    code = finetune.main([*argv, "--resume"])
    assert not marker.exists()
    if state_file != "random_states_0.pkl":  # accelerate carries on without random states it cannot read
        assert code == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith(f"finetune: error: could not load the checkpoint to resume, {checkpoint}: ")
        assert "Weights only load failed" in line
