"""Bad output paths, window lengths and model sources in `delta-qwen3 eval`, `ppl`, `routing` and `finetune`:
refused in one line with exit code 2 before anything is computed, with existing files unchanged; and a write that
fails at the end still shows the results, then exits 1."""

import json
import logging
import shutil

import pytest
from helpers.files import tree_digest
from helpers.models import save_routed_model
from helpers.running import run_cli
from helpers.training import tiny_run_args, write_corpus

import eval.models
import eval.perplexity
import eval.routing
import eval.runner
import finetune
import finetune.run
from delta_qwen3.errors import CommandError
from eval.benchmarks import FIXTURES_DIR

NOT_A_HUB_ID = "does not exist (and is not a Hub model id of the form namespace/name)"


@pytest.fixture(scope="module")
def routed_model(tokenizer, tmp_path_factory):
    return save_routed_model(tmp_path_factory.mktemp("routed") / "delta-block", tokenizer, seed=1,
                             routing_mode="delta_block", routing_num_blocks=2)  # fmt: skip


@pytest.fixture(scope="module")
def texts_jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("texts") / "validation.jsonl"
    path.write_text("".join(json.dumps({"text": f"def f{i}(x): return x + {i}"}) + "\n" for i in range(3)))
    return path


@pytest.fixture
def nothing_computed(monkeypatch):
    """Every evaluation fails the test if it runs, and so does loading a model's weights."""

    def computed(*args, **kwargs):
        raise AssertionError("computed before the refusal")

    for module, name in [(eval.runner, "evaluate_model"), (eval.perplexity, "perplexity"),
                         (eval.routing, "routing_statistics"), (eval.models, "load_causal_lm"),
                         (finetune.run, "train")]:  # fmt: skip
        monkeypatch.setattr(module, name, computed)


def refused(argv: list[str], command: str) -> str:
    """Exit code 2, nothing on stdout, and one line naming the problem on stderr: that line."""
    code, stdout, stderr = run_cli(argv)
    assert (code, stdout) == (2, "")
    lines = stderr.strip().splitlines()
    assert lines[-1].startswith(f"delta-qwen3 {command}: error: ")
    return lines[-1]


def earlier_output(tmp_path):
    """A directory holding an earlier result, and its digest."""
    directory = tmp_path / "results"
    directory.mkdir()
    (directory / "earlier.json").write_text('{"perplexity": 12.5}\n')
    return directory, tree_digest(directory)


# --- output paths -----------------------------------------------------------------------------------------------


def test_eval_output_that_is_a_directory_or_under_a_file_is_refused_first(qwen3_checkpoint, tmp_path,
                                                                          nothing_computed):
    directory, before = earlier_output(tmp_path)
    base = ["eval", str(qwen3_checkpoint), "--tasks", "boolq", "--data-dir", str(FIXTURES_DIR), "--device", "cpu"]
    message = refused([*base, "--output", str(directory)], "eval")
    assert message.endswith(f"--output {directory} is a directory; give the path of a file to write")
    file = directory / "earlier.json"
    message = refused([*base, "--output", str(file / "results.json")], "eval")
    assert message.endswith(f"--output {file / 'results.json'} cannot be created: {file} is a file, not a directory")
    assert tree_digest(directory) == before


def test_ppl_output_that_is_a_directory_or_under_a_file_is_refused_first(qwen3_checkpoint, texts_jsonl, tmp_path,
                                                                         nothing_computed):
    directory, before = earlier_output(tmp_path)
    base = ["ppl", str(qwen3_checkpoint), "--data", str(texts_jsonl), "--device", "cpu"]
    assert refused([*base, "--output", str(directory)], "ppl").endswith(f"--output {directory} is a directory; "
                                                                        "give the path of a file to write")
    file = directory / "earlier.json"
    message = refused([*base, "--output", str(file / "sub" / "ppl.json")], "ppl")
    assert message.endswith(f"cannot be created: {file} is a file, not a directory")
    assert tree_digest(directory) == before


def test_routing_out_that_is_a_file_or_holds_an_earlier_report_is_refused_first(routed_model, texts_jsonl, tmp_path,
                                                                                nothing_computed):
    base = ["routing", str(routed_model), "--data", str(texts_jsonl), "--device", "cpu", "--out"]
    file = tmp_path / "routing.txt"
    file.write_text("mine\n")
    assert refused([*base, str(file)], "routing").endswith(f"--out {file} exists and is not a directory")
    assert file.read_text() == "mine\n"
    out = tmp_path / "report"
    out.mkdir()
    (out / "routing.json").write_text('{"models": {}}\n')
    (out / "notes.txt").write_text("mine\n")
    before = tree_digest(out)
    message = refused([*base, str(out)], "routing")
    assert message.endswith(f"--out {out} already holds routing.json from an earlier run (pass --overwrite to replace)")
    assert tree_digest(out) == before


def test_routing_overwrite_replaces_only_the_report(routed_model, texts_jsonl, tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    (out / "routing.json").write_text('{"models": {}}\n')
    (out / "notes.txt").write_text("mine\n")
    code, stdout, stderr = run_cli(["routing", str(routed_model), "--data", str(texts_jsonl), "--out", str(out),
                                    "--max-length", "16", "--device", "cpu", "--overwrite"])  # fmt: skip
    assert code == 0, stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "routing.json", "routing_heatmap.png",
                                                     "routing_max_weight.png"]  # fmt: skip
    assert (out / "notes.txt").read_text() == "mine\n"
    assert list(json.loads((out / "routing.json").read_text())["models"]) == [str(routed_model)]


def taking_the_path(path, result):
    """A stand-in evaluation that returns `result` after another process has taken `path` (a directory now)."""

    def evaluate(*args, **kwargs):
        path.mkdir(parents=True)
        return result

    return evaluate


def write_failure(stderr: str, command: str, option: str, path) -> None:
    assert stderr.strip().splitlines()[-1] == (
        f"delta-qwen3 {command}: error: could not write {option} {path}: Is a directory (the results are printed above)"
    )


def test_eval_prints_the_table_when_the_results_cannot_be_written(qwen3_checkpoint, tmp_path, monkeypatch):
    output = tmp_path / "results.json"
    scores = {"tasks": {"boolq": {"metric": "acc", "value": 0.625, "stderr": 0.18, "documents": 8}}, "average": 0.625}
    monkeypatch.setattr(eval.runner, "evaluate_model", taking_the_path(output, scores))
    code, stdout, stderr = run_cli(["eval", str(qwen3_checkpoint), "--tasks", "boolq", "--data-dir",
                                    str(FIXTURES_DIR), "--output", str(output), "--device", "cpu"])  # fmt: skip
    assert code == 1
    assert stdout.splitlines()[3].split() == [str(qwen3_checkpoint), "62.5", "62.5"]
    write_failure(stderr, "eval", "--output", output)


def test_ppl_prints_the_result_when_it_cannot_be_written(qwen3_checkpoint, texts_jsonl, tmp_path, monkeypatch):
    output = tmp_path / "ppl.json"
    monkeypatch.setattr(eval.perplexity, "perplexity", taking_the_path(output, 7.25))
    code, stdout, stderr = run_cli(["ppl", str(qwen3_checkpoint), "--data", str(texts_jsonl), "--output", str(output),
                                    "--device", "cpu"])  # fmt: skip
    assert code == 1
    assert json.loads(stdout)["perplexity"] == 7.25
    write_failure(stderr, "ppl", "--output", output)


def test_routing_prints_the_summary_when_the_report_cannot_be_written(routed_model, texts_jsonl, tmp_path,
                                                                      monkeypatch):
    out = tmp_path / "report"
    statistics = eval.routing.routing_statistics

    def taking_out(*args, **kwargs):
        (out / "routing.json").mkdir()  # the report's path became a directory meanwhile
        (out / "routing.json" / "theirs.txt").write_text("taken\n")
        return statistics(*args, **kwargs)

    monkeypatch.setattr(eval.routing, "routing_statistics", taking_out)
    code, stdout, stderr = run_cli(["routing", str(routed_model), "--data", str(texts_jsonl), "--out", str(out),
                                    "--max-length", "16", "--device", "cpu"])  # fmt: skip
    assert code == 1
    assert list(json.loads(stdout)) == [str(routed_model)]
    assert stderr.strip().splitlines()[-1].startswith(f"delta-qwen3 routing: error: could not write --out {out}")
    assert (out / "routing.json" / "theirs.txt").read_text() == "taken\n"


# --- window lengths ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "length, message",
    [
        ("100000", "--max-length 100000 is beyond the max_position_embeddings (256) of {model}"),
        ("257", "--max-length 257 is beyond the max_position_embeddings (256) of {model}"),
        ("1", "--max-length 1 is too short: a window needs at least 2 tokens"),
    ],
)
@pytest.mark.parametrize("command", ["ppl", "routing"])
def test_window_beyond_the_models_positions_or_too_short_is_refused(command, length, message, routed_model,
                                                                    texts_jsonl, tmp_path, nothing_computed):
    out = ["--out", str(tmp_path / "report")] if command == "routing" else []
    line = refused([command, str(routed_model), "--data", str(texts_jsonl), "--max-length", length, *out], command)
    assert line.endswith(message.format(model=routed_model))
    assert not (tmp_path / "report").exists()


# --- model sources ----------------------------------------------------------------------------------------------


def truncated_copy(checkpoint, tmp_path):
    """A copy of `checkpoint` with its first safetensors file cut in half: the copy and that file."""
    copy = shutil.copytree(checkpoint, tmp_path / "truncated")
    shard = sorted(copy.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    return copy, shard


def bad_sources(tmp_path, checkpoint):
    """(model path, the end of the message naming it) for a missing path, a directory without config.json (but
    with a tokenizer) and a truncated weights file."""
    missing = tmp_path / "no-such-model"
    no_config = shutil.copytree(checkpoint, tmp_path / "no-config")
    (no_config / "config.json").unlink()
    truncated, shard = truncated_copy(checkpoint, tmp_path)
    return [
        (missing, f"{missing} {NOT_A_HUB_ID}"),
        (no_config, f"{no_config} is not a checkpoint: it has no config.json"),
        (truncated, f"{truncated}: {shard} is not a readable safetensors file (corrupt or truncated?): Error while deserializing "
                    "header: incomplete metadata, file not fully covered"),
    ]  # fmt: skip


@pytest.mark.parametrize("command", ["eval", "ppl", "routing"])
def test_unusable_model_sources_are_named_before_any_work(command, routed_model, texts_jsonl, tmp_path,
                                                          nothing_computed):
    options = {
        "eval": ["--tasks", "boolq", "--data-dir", str(FIXTURES_DIR), "--output", str(tmp_path / "results.json")],
        "ppl": ["--data", str(texts_jsonl)],
        "routing": ["--data", str(texts_jsonl), "--out", str(tmp_path / "report")],
    }[command]
    for model, message in bad_sources(tmp_path, routed_model):
        before = tree_digest(model) if model.exists() else None
        assert refused([command, str(model), *options], command).endswith(message)
        assert (tree_digest(model) if model.exists() else None) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no-config", "truncated"]


def test_loading_the_configuration_first_names_a_foreign_model(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "config.json").write_text('{"model_type": "no_such_architecture"}')
    with pytest.raises(CommandError, match=f"could not load model '{foreign}': ValueError: .*"
                                                       "no_such_architecture"):  # fmt: skip
        eval.models.load_causal_lm(str(foreign))


def test_finetune_names_unusable_model_sources_before_training(qwen3_checkpoint, tmp_path, capsys, nothing_computed):
    corpus = write_corpus(tmp_path / "corpus.txt")
    (tmp_path / "models").mkdir()
    for model, message in bad_sources(tmp_path / "models", qwen3_checkpoint):
        before = tree_digest(model) if model.exists() else None
        assert finetune.main(tiny_run_args(corpus, tmp_path / "out", "--model", str(model), "--max-steps", "1")) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"finetune: error: --model {message}"
        assert (tree_digest(model) if model.exists() else None) == before
        assert not (tmp_path / "out" / "train_log.jsonl").exists()


def test_lm_eval_is_given_the_loaded_model_without_warnings(qwen3_checkpoint, caplog):
    with caplog.at_level(logging.WARNING):
        lm = eval.runner.load_lm(str(qwen3_checkpoint), batch_size=1, device="cpu")
    assert [record.getMessage() for record in caplog.records if record.name.startswith("lm_eval")] == []
    assert lm.model.config.model_type == "qwen3" and not lm.model.training


def test_finetune_names_a_model_that_fails_to_load_as_ppl_does(qwen3_checkpoint, texts_jsonl, tmp_path, capsys):
    """A checkpoint that passes the checks before loading and fails in the loader: one line from both commands,
    with the loader's reason, naming what failed (a broken tokenizer file by its path), and nothing written."""
    broken = {name: shutil.copytree(qwen3_checkpoint, tmp_path / name) for name in ("tokenizer", "config", "shape")}
    (broken["tokenizer"] / "tokenizer.json").write_text('{"version": "1.0", "model": 5}')
    for name, field, value in (("config", "hidden_size", "64"), ("shape", "intermediate_size", 96)):
        config = json.loads((broken[name] / "config.json").read_text())
        (broken[name] / "config.json").write_text(json.dumps({**config, field: value}))
    reasons = {
        "tokenizer": "the tokenizer file {model}/tokenizer.json cannot be read as a tokenizer (data did not match any "
                     "variant of untagged enum ModelUntagged at line 1 column 30)",
        "config": "hidden_size must be a positive whole number, got '64'",
        "shape": "RuntimeError: You set `ignore_mismatched_sizes` to `False`, thus raising an error. For details look "
                 "at the above report!",
    }  # fmt: skip
    corpus = write_corpus(tmp_path / "corpus.txt")
    for name, model in broken.items():
        reason = reasons[name].format(model=model)
        assert finetune.main(tiny_run_args(corpus, tmp_path / "out", "--model", str(model))) == 2
        named = {"tokenizer": f"{model}", "config": f"{model} (its config.json)"}.get(name)
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"finetune: error: --model {named}: {reason}" if named
            else f"finetune: error: could not load --model {model}: {reason}"
        )
        assert refused(["ppl", str(model), "--data", str(texts_jsonl)], "ppl") == (
            f"delta-qwen3 ppl: error: MODEL {named}: {reason}" if named
            else f"delta-qwen3 ppl: error: could not load model '{model}': {reason}"
        )
    assert not (tmp_path / "out").exists()


NOT_UTF8 = b'{"text": "def f(): pass"}\n{"text": "na\xefve"}\n'


@pytest.mark.parametrize("command", ["ppl", "routing", "finetune"])
def test_a_data_file_that_is_not_utf8_is_one_line_naming_it_and_its_line(command, routed_model, tmp_path, capsys,
                                                                         nothing_computed):
    data = tmp_path / "texts.jsonl"
    data.write_bytes(NOT_UTF8)
    message = f"{data} line 2 is not UTF-8 text (invalid continuation byte at byte 38)"
    if command == "finetune":
        assert finetune.main(tiny_run_args(data, tmp_path / "out", "--model", str(routed_model))) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"finetune: error: {message}"
    else:
        options = ["--out", str(tmp_path / "out")] if command == "routing" else []
        assert refused([command, str(routed_model), "--data", str(data), *options], command) == (
            f"delta-qwen3 {command}: error: {message}"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["texts.jsonl"]
