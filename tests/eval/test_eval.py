"""The paper's benchmarks: our lm-eval tasks, the local data files, and `delta-qwen3 eval` end to end on tiny models
with the real harness."""

import io
import json
import math
import shutil
import sys
from contextlib import redirect_stdout
from pathlib import Path

import datasets
import lm_eval
import pytest
import torch
from helpers.files import disk_full_past
from helpers.running import run_cli
from lm_eval.tasks import TaskManager
from lm_eval.tasks._yaml_loader import load_yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from eval.benchmarks import BENCHMARKS, FIXTURES_DIR, PAPER_GROUP, TASKS_DIR, resolve_benchmarks
from eval.local_data import task_config
from eval.runner import load_lm, run_benchmarks
from modeling_delta_qwen3 import DeltaQwen3Config, DeltaQwen3ForCausalLM

PAPER_ORDER = ["hellaswag", "arc_easy", "arc_challenge", "piqa", "winogrande", "boolq", "mmlu", "lambada_openai"]

# The Hub dataset, configuration and evaluated split of lm-eval 0.4.13's built-in task for each benchmark.
HUB_SPLITS = {
    "hellaswag": ("Rowan/hellaswag", None, "validation"),
    "arc_easy": ("allenai/ai2_arc", "ARC-Easy", "test"),
    "arc_challenge": ("allenai/ai2_arc", "ARC-Challenge", "test"),
    "piqa": ("baber/piqa", None, "validation"),
    "winogrande": ("allenai/winogrande", "winogrande_xl", "validation"),
    "boolq": ("aps/super_glue", "boolq", "validation"),
    "mmlu": ("cais/mmlu", "all", "test"),
    "lambada_openai": ("EleutherAI/lambada_openai", "default", "test"),
}

# The fields (and their JSON types) of each of those splits' documents.
HUB_SCHEMAS = {
    "hellaswag": {"ind": int, "activity_label": str, "ctx_a": str, "ctx_b": str, "ctx": str, "endings": list,
                  "source_id": str, "split": str, "split_type": str, "label": str},
    "arc_easy": {"id": str, "question": str, "choices": dict, "answerKey": str},
    "arc_challenge": {"id": str, "question": str, "choices": dict, "answerKey": str},
    "piqa": {"goal": str, "sol1": str, "sol2": str, "label": int},
    "winogrande": {"sentence": str, "option1": str, "option2": str, "answer": str},
    "boolq": {"question": str, "passage": str, "idx": int, "label": int},
    "mmlu": {"question": str, "subject": str, "choices": list, "answer": int},
    "lambada_openai": {"text": str},
}

# lm-eval 0.4.13's own YAML for each benchmark (MMLU: one file per subject).
BUILTIN_YAMLS = {
    "hellaswag": "hellaswag/hellaswag.yaml",
    "arc_easy": "arc/arc_easy.yaml",
    "arc_challenge": "arc/arc_challenge.yaml",
    "piqa": "piqa/piqa.yaml",
    "winogrande": "winogrande/default.yaml",
    "boolq": "super_glue/boolq/default.yaml",
    "lambada_openai": "lambada/lambada_openai.yaml",
}
LM_EVAL_TASKS = Path(lm_eval.__file__).parent / "tasks"


def fixture_documents(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES_DIR / f"{name}.jsonl").read_text().splitlines()]


def fake_hub_load_dataset(path, name=None, split=None, **kwargs):
    """`datasets.load_dataset` for the eight Hub datasets, serving the fixture documents: the network boundary."""
    benchmark = next(b for b, (hub_path, hub_name, _) in HUB_SPLITS.items() if (hub_path, hub_name) == (path, name))
    documents = datasets.Dataset.from_list(fixture_documents(benchmark))
    return documents if split is not None else datasets.DatasetDict({HUB_SPLITS[benchmark][2]: documents})


# --- the task definitions -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PAPER_ORDER)
def test_fixture_documents_have_the_hub_schema(name):
    documents = fixture_documents(name)
    assert 6 <= len(documents) <= 10
    for document in documents:
        assert {field: type(value) for field, value in document.items()} == HUB_SCHEMAS[name]
    if name.startswith("arc"):
        for document in documents:
            assert set(document["choices"]) == {"text", "label"}
            assert document["answerKey"] in document["choices"]["label"]


def _builtin_task_on_fixtures(name: str, manager: TaskManager, subject: str | None = None):
    relative = f"mmlu/default/mmlu_{subject}.yaml" if subject else BUILTIN_YAMLS[name]
    config = load_yaml(LM_EVAL_TASKS / relative, resolve_func=True, recursive=True)
    config.pop("tag", None)
    split = config.get("test_split") or config["validation_split"]
    hub = (config["dataset_path"], config.get("dataset_name"), split)
    config.update(
        dataset_path="json",
        dataset_name=None,
        dataset_kwargs={"data_files": {split: str(FIXTURES_DIR / f"{name}.jsonl")}},
        training_split=None,
        validation_split=split if split == "validation" else None,
        fewshot_split=None,
    )
    return manager.load([config])["tasks"][config["task"]], hub


def _requests(task, document) -> tuple:
    choices = task.doc_to_choice(document) if task.config.output_type == "multiple_choice" else None
    return task.fewshot_context(document, 0), choices, task.doc_to_target(document)


@pytest.mark.parametrize("benchmark", BENCHMARKS, ids=lambda b: b.name)
def test_tasks_build_the_same_requests_as_lm_evals_builtin_tasks(benchmark):
    """Same Hub split, same prompt, choices and target per document: our numbers compare with published ones."""
    manager = TaskManager(include_defaults=False)
    ours = manager.load([task_config(benchmark, FIXTURES_DIR)])["tasks"][benchmark.task]
    documents = list(ours.eval_docs)
    subjects = sorted({d["subject"] for d in documents}) if benchmark.name == "mmlu" else [None]
    compared = 0
    for subject in subjects:
        builtin, hub = _builtin_task_on_fixtures(benchmark.name, manager, subject)
        # lm-eval splits MMLU into one task per subject configuration; ours reads the "all" configuration
        assert hub == (HUB_SPLITS[benchmark.name] if subject is None else ("cais/mmlu", subject, "test"))
        for ours_document, builtin_document in zip(documents, builtin.eval_docs, strict=True):
            if subject is None or ours_document["subject"] == subject:
                assert _requests(ours, ours_document) == _requests(builtin, builtin_document)
                compared += 1
    assert compared == len(documents) == 8
    config = task_config(benchmark)
    assert (config["dataset_path"], config["dataset_name"]) == HUB_SPLITS[benchmark.name][:2]
    assert config["num_fewshot"] == 0


def test_paper_group_lists_the_eight_tasks_in_the_papers_order():
    group = load_yaml(TASKS_DIR / f"{PAPER_GROUP}.yaml", resolve_func=False)
    assert group["task"] == [f"dq3_{name}" for name in PAPER_ORDER]
    assert [b.name for b in resolve_benchmarks("paper")] == PAPER_ORDER
    assert [b.name for b in resolve_benchmarks("boolq, dq3_piqa,boolq")] == ["boolq", "piqa"]


# --- checkpoints --------------------------------------------------------------------------------------------


def _delta_from_qwen3(qwen3_dir: Path) -> DeltaQwen3ForCausalLM:
    """A gated Delta Block model holding the Qwen3 weights, routing parameters at their initial values."""
    qwen3 = AutoModelForCausalLM.from_pretrained(qwen3_dir)
    fields = qwen3.config.to_dict()
    fields.pop("model_type")
    config = DeltaQwen3Config(**fields, routing_gate=True, routing_mode="delta_block", routing_num_blocks=2)
    model = DeltaQwen3ForCausalLM(config)
    loaded = model.load_state_dict(qwen3.state_dict(), strict=False)
    assert not loaded.unexpected_keys and all("_route." in key for key in loaded.missing_keys)
    return model


@pytest.fixture(scope="module")
def converted_checkpoint(qwen3_checkpoint, tokenizer, tmp_path_factory) -> Path:
    model = _delta_from_qwen3(qwen3_checkpoint)
    assert all(p.abs().sum() == 0 for n, p in model.named_parameters() if n.endswith((".gate", ".query")))
    path = tmp_path_factory.mktemp("converted") / "delta-qwen3"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def perturbed_checkpoint(qwen3_checkpoint, tokenizer, tmp_path_factory) -> Path:
    """The converted model with its routing switched on (unit gates, random queries): a different function."""
    model = _delta_from_qwen3(qwen3_checkpoint)
    torch.manual_seed(3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".gate"):
                parameter.fill_(1.0)
            elif name.endswith(".query"):
                parameter.normal_(0.0, 1.0)
    path = tmp_path_factory.mktemp("perturbed") / "delta-qwen3-routed"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def paper_run(qwen3_checkpoint, converted_checkpoint, tmp_path_factory):
    """`delta-qwen3 eval` on the eight tasks' fixture files for the Qwen3 source and the converted model."""
    output = tmp_path_factory.mktemp("eval") / "results.json"
    models = [str(qwen3_checkpoint), str(converted_checkpoint)]
    code, stdout, stderr = run_cli(
        ["eval", *models, "--data-dir", str(FIXTURES_DIR), "--output", str(output), "--device", "cpu"]
    )
    assert code == 0, stderr
    return json.loads(output.read_text()), stdout, models


# --- end to end ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_eval_writes_results_and_the_table_for_all_eight_tasks(paper_run):
    results, stdout, models = paper_run
    assert results["tasks"] == PAPER_ORDER
    assert results["metrics"] == {b.name: b.metric for b in BENCHMARKS}
    assert list(results["models"]) == models
    for scores in results["models"].values():
        assert list(scores["tasks"]) == PAPER_ORDER
        for name, task in scores["tasks"].items():
            assert task["metric"] == results["metrics"][name]
            assert task["documents"] == 8
            assert (8 * task["value"]) == pytest.approx(round(8 * task["value"]), abs=1e-9)
            assert task["stderr"] == pytest.approx(math.sqrt(task["value"] * (1 - task["value"]) / 7))
        assert scores["average"] == pytest.approx(sum(t["value"] for t in scores["tasks"].values()) / 8)

    lines = stdout.splitlines()
    assert lines[0].split() == ["Model", "HellaSwag", "ARC-E", "ARC-C", "PIQA", "WinoG", "BoolQ", "MMLU", "LAMBADA", "Avg"]
    assert lines[1].split() == ["metric", *(b.metric for b in BENCHMARKS), "mean"]
    for line, (model, scores) in zip(lines[3:], results["models"].items(), strict=True):
        values = [scores["tasks"][name]["value"] for name in PAPER_ORDER] + [scores["average"]]
        assert line.split() == [model, *(f"{100 * v:.1f}" for v in values)]


@pytest.mark.slow
def test_converted_gated_checkpoint_scores_exactly_like_its_qwen3_source(
    paper_run, qwen3_checkpoint, converted_checkpoint, perturbed_checkpoint
):
    results, _, (source, converted) = paper_run
    assert results["models"][converted] == results["models"][source]

    # Below the accuracies, the harness's log-likelihoods agree too (one task of each request shape: multiple
    # choice, multiple contexts, last word), while a model with its routing switched on is told apart.
    manager = TaskManager(include_defaults=False)
    requests = []
    for benchmark in resolve_benchmarks("hellaswag,winogrande,lambada_openai"):
        task = manager.load([task_config(benchmark, FIXTURES_DIR)])["tasks"][benchmark.task]
        task.build_all_requests(rank=0, world_size=1)
        requests += task.instances
    assert len(requests) == 8 * 4 + 8 * 2 + 8

    def loglikelihoods(model: Path) -> torch.Tensor:
        scores = load_lm(str(model), batch_size=8, device="cpu").loglikelihood(requests, disable_tqdm=True)
        return torch.tensor([loglikelihood for loglikelihood, _ in scores], dtype=torch.float64)

    reference = loglikelihoods(qwen3_checkpoint)
    torch.testing.assert_close(loglikelihoods(converted_checkpoint), reference, rtol=0, atol=1e-4)
    assert (loglikelihoods(perturbed_checkpoint) - reference).abs().max() > 0.1


@pytest.mark.slow
def test_boolq_accuracy_matches_the_models_own_log_likelihoods(paper_run, qwen3_checkpoint):
    """An independent computation of one task: per passage, does " yes" or " no" get the higher log-likelihood?"""
    results, _, _ = paper_run
    model = AutoModelForCausalLM.from_pretrained(qwen3_checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(qwen3_checkpoint)
    correct = 0
    for document in fixture_documents("boolq"):
        context = f"{document['passage']}\nQuestion: {document['question']}?\nAnswer:"
        context_ids = tokenizer.encode(context)
        scores = []
        for answer in (" no", " yes"):
            ids = tokenizer.encode(context + answer)
            with torch.no_grad():
                logprobs = model(torch.tensor([ids])).logits[0].log_softmax(-1)
            scores.append(sum(logprobs[i - 1, ids[i]].item() for i in range(len(context_ids), len(ids))))
        correct += int(scores.index(max(scores)) == document["label"])
    assert results["models"][str(qwen3_checkpoint)]["tasks"]["boolq"]["value"] == correct / 8


@pytest.mark.slow
def test_the_hub_path_reads_the_hub_splits_and_scores_like_the_data_dir(paper_run, qwen3_checkpoint, monkeypatch):
    results, _, _ = paper_run
    requested = []

    def load_dataset(path, name=None, split=None, **kwargs):
        requested.append((path, name))
        return fake_hub_load_dataset(path, name, split, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    hub = run_benchmarks([str(qwen3_checkpoint)], tasks="winogrande,hellaswag", batch_size=4)
    assert sorted(requested) == [HUB_SPLITS["hellaswag"][:2], HUB_SPLITS["winogrande"][:2]]
    assert hub["data"] == "hub"
    local = results["models"][str(qwen3_checkpoint)]["tasks"]
    assert hub["models"][str(qwen3_checkpoint)]["tasks"] == {k: local[k] for k in ("winogrande", "hellaswag")}


@pytest.mark.slow
def test_lm_eval_command_line_runs_the_group_from_the_include_path(
    paper_run, converted_checkpoint, monkeypatch, tmp_path
):
    """`lm_eval --include_path eval/tasks --tasks delta_qwen3_paper` with remote code, as the README shows."""
    from lm_eval.__main__ import cli_evaluate

    results, _, _ = paper_run
    monkeypatch.setattr(datasets, "load_dataset", fake_hub_load_dataset)
    monkeypatch.setattr(sys, "argv", [
        "lm_eval", "--model", "hf", "--model_args", f"pretrained={converted_checkpoint},trust_remote_code=True",
        "--include_path", str(TASKS_DIR), "--tasks", PAPER_GROUP, "--device", "cpu", "--batch_size", "8",
        "--output_path", str(tmp_path),
    ])
    with redirect_stdout(io.StringIO()):
        cli_evaluate()
    (written,) = tmp_path.rglob("results_*.json")
    harness = json.loads(written.read_text())["results"]
    ours = results["models"][str(converted_checkpoint)]["tasks"]
    for benchmark in BENCHMARKS:
        assert harness[benchmark.task][f"{benchmark.metric},none"] == ours[benchmark.name]["value"]


@pytest.mark.slow
def test_eval_with_a_subset_of_tasks_and_a_limit(qwen3_checkpoint, tmp_path):
    output = tmp_path / "out" / "subset.json"
    code, stdout, stderr = run_cli([
        "eval", str(qwen3_checkpoint), "--tasks", "boolq,piqa", "--limit", "3", "--batch-size", "2",
        "--data-dir", str(FIXTURES_DIR), "--output", str(output), "--device", "cpu",
    ])
    assert code == 0, stderr
    results = json.loads(output.read_text())
    assert results["tasks"] == ["boolq", "piqa"] and results["limit"] == 3
    tasks = results["models"][str(qwen3_checkpoint)]["tasks"]
    assert [task["documents"] for task in tasks.values()] == [3, 3]
    assert stdout.splitlines()[0].split() == ["Model", "BoolQ", "PIQA", "Avg"]
    assert [p.name for p in output.parent.iterdir()] == ["subset.json"]  # no temporary file left behind


# --- export-data --------------------------------------------------------------------------------------------


def test_export_data_writes_one_file_per_task_from_the_hub_splits(monkeypatch, tmp_path):
    requested = []

    def load_dataset(path, name=None, split=None, **kwargs):
        requested.append((path, name, split))
        return fake_hub_load_dataset(path, name, split, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    code, stdout, stderr = run_cli(["eval", "export-data", str(tmp_path / "data")])
    assert code == 0, stderr
    assert sorted(requested) == sorted(HUB_SPLITS.values())
    assert json.loads(stdout)["documents"] == {name: 8 for name in PAPER_ORDER}
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == sorted(f"{n}.jsonl" for n in PAPER_ORDER)
    for name in PAPER_ORDER:
        exported = [json.loads(line) for line in (tmp_path / "data" / f"{name}.jsonl").read_text().splitlines()]
        assert exported == fixture_documents(name)

    code, _, _ = run_cli(["eval", "export-data", str(tmp_path / "boolq-only"), "--tasks", "boolq"])
    assert code == 0
    assert [p.name for p in (tmp_path / "boolq-only").iterdir()] == ["boolq.jsonl"]


def test_export_data_that_cannot_be_written_is_one_line_keeping_the_files_before(monkeypatch, tmp_path):
    monkeypatch.setattr(datasets, "load_dataset", fake_hub_load_dataset)
    data = tmp_path / "data"
    with disk_full_past(1_600):  # MMLU's documents fit; BoolQ's do not
        code, stdout, stderr = run_cli(["eval", "export-data", str(data), "--tasks", "mmlu,boolq"])
    assert (code, stdout) == (1, "")
    assert stderr.splitlines()[-1] == (f"delta-qwen3 eval: error: could not write DIR {data}: File too large (the "
                                       "files of the tasks before it are kept)")  # fmt: skip
    assert sorted(p.name for p in data.iterdir()) == ["mmlu.jsonl"]


# --- bad input ----------------------------------------------------------------------------------------------


@pytest.fixture
def data_dir(tmp_path) -> Path:
    """A writable copy of the fixture data."""
    return Path(shutil.copytree(FIXTURES_DIR, tmp_path / "data"))


def _edit_line(path: Path, number: int, edit) -> None:
    lines = path.read_text().splitlines()
    lines[number - 1] = edit(lines[number - 1])
    path.write_text("\n".join(lines) + "\n")


def _drop(field: str, subfield: str | None = None):
    def edit(line: str) -> str:
        document = json.loads(line)
        holder = document if subfield is None else document[field]
        del holder[subfield or field]
        return json.dumps(document)

    return edit


def _eval_error(argv: list[str]) -> str:
    code, stdout, stderr = run_cli(argv)
    assert code == 2 and stdout == ""
    assert "\n" + "delta-qwen3 eval: error: " in "\n" + stderr  # a line of its own, after any loading progress
    return stderr


def test_unknown_task_is_an_error(data_dir):
    stderr = _eval_error(["eval", "any-model", "--tasks", "boolq,squad", "--data-dir", str(data_dir)])
    assert "unknown task 'squad'" in stderr and "known tasks: paper, hellaswag" in stderr


def test_missing_data_file_is_named(data_dir):
    (data_dir / "mmlu.jsonl").unlink()
    stderr = _eval_error(["eval", "any-model", "--data-dir", str(data_dir)])
    assert f"data file {data_dir / 'mmlu.jsonl'} is missing (task mmlu reads it)" in stderr


@pytest.mark.parametrize(
    "file, line, edit, message",
    [
        ("piqa.jsonl", 3, _drop("sol2"), "piqa.jsonl line 3 lacks field 'sol2', which task piqa needs"),
        ("arc_easy.jsonl", 5, _drop("choices", "label"), "arc_easy.jsonl line 5 lacks field 'choices.label'"),
        ("hellaswag.jsonl", 8, _drop("ctx_b"), "hellaswag.jsonl line 8 lacks field 'ctx_b'"),
        ("boolq.jsonl", 2, lambda line: line[:-1], "boolq.jsonl line 2 is not valid JSON"),
        ("lambada_openai.jsonl", 1, lambda line: "[1, 2]", "lambada_openai.jsonl line 1 is not a JSON object"),
    ],
)
def test_data_file_lines_without_the_tasks_fields_are_named(data_dir, file, line, edit, message):
    _edit_line(data_dir / file, line, edit)
    stderr = _eval_error(["eval", "any-model", "--data-dir", str(data_dir)])
    assert message in stderr


def test_data_file_that_is_not_utf8_is_named_with_its_line(data_dir):
    path = data_dir / "boolq.jsonl"
    first, *rest = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(first + b'{"question": "\xff"}\n' + b"".join(rest[1:]))
    stderr = _eval_error(["eval", "any-model", "--tasks", "boolq", "--data-dir", str(data_dir)])
    assert stderr.splitlines()[-1] == (
        f"delta-qwen3 eval: error: {path} line 2 is not UTF-8 text (invalid start byte at byte {len(first) + 14})"
    )


def test_model_that_fails_to_load_is_an_error(data_dir, tmp_path):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no_such_architecture"}')
    stderr = _eval_error(["eval", str(broken), "--tasks", "boolq", "--data-dir", str(data_dir), "--device", "cpu"])
    assert f"could not load model '{broken}'" in stderr and "no_such_architecture" in stderr


def test_export_data_needs_exactly_one_directory():
    stderr = _eval_error(["eval", "export-data"])
    assert "usage: delta-qwen3 eval export-data DIR" in stderr
