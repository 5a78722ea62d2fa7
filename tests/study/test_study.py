"""`delta-qwen3 study`: the grid of runs, the summary over seeds, a study that, killed part-way and run again (runs
side by side, as on a GPU), ends with exactly the results of one that ran through, and the corpora it trains on."""

import html
import json
import os
import re
import subprocess
import sys

import pytest
from helpers.files import disk_full_past
from helpers.paths import REPO_ROOT

from delta_qwen3.atomic import write_json
from delta_qwen3.cli import build_parser, main
from delta_qwen3.corpus import python_docs_texts
from finetune.config import parse_args
from finetune.model import build_model_config
from study import debian_docs, python_docs
from study.cli import _shared_finetune_args, check_same_study, study_record
from study.grid import Run, expand_grid
from study.report import (
    early_loss,
    format_band_table,
    format_seed_table,
    format_table,
    mean_interval_95,
    paired_comparisons,
    summarise,
)
from study.runs import StudySettings, finetune_command


def test_the_grid_gives_block_counts_to_the_block_modes_only():
    runs = expand_grid(["baseline", "delta_block"], [4, 8], [0, 1], [2, 4])
    assert [run.name for run in runs[:6]] == ["baseline-L4-s0", "baseline-L4-s1", "delta_block-b2-L4-s0",
                                              "delta_block-b2-L4-s1", "delta_block-b4-L4-s0", "delta_block-b4-L4-s1"]  # fmt: skip
    assert len(runs) == 12 and Run("delta_block", 8, 1, 4).group == "delta_block-b4-L8"


def test_the_summary_is_the_mean_and_spread_over_seeds():
    results = [{"mode": "delta", "num_blocks": None, "layers": 4, "seed": seed, "group": "delta-L4", "val_ppl": ppl,
                "mean_max_weight_multi_source": weight, "mean_max_weight": weight, "tokens_per_s": 100.0}
               for seed, ppl, weight in [(0, 10.0, 0.5), (1, 12.0, 0.7)]]  # fmt: skip
    entry = summarise(results)["delta-L4"]
    assert entry["seeds"] == [0, 1]
    assert entry["val_ppl"] == {"mean": 11.0, "std": pytest.approx(2**0.5), "min": 10.0, "max": 12.0,
                                "values": [10.0, 12.0]}  # fmt: skip
    assert entry["mean_max_weight_multi_source"]["mean"] == pytest.approx(0.6)
    assert "11.00 ± 1.41" in format_table(summarise(results), {}).splitlines()[1]


def test_each_mode_is_paired_with_the_baseline_and_its_attnres_counterpart_of_its_depth_and_seed():
    def result(mode, layers, seed, ppl, blocks=None):
        group = f"{mode}{f'-b{blocks}' if blocks else ''}-L{layers}"
        return {"mode": mode, "num_blocks": blocks, "layers": layers, "seed": seed, "group": group, "val_ppl": ppl,
                "tokens_per_s": 1.0}  # fmt: skip

    results = [result("baseline", 4, 0, 100.0), result("baseline", 4, 1, 200.0), result("baseline", 8, 0, 50.0),
               result("delta", 4, 0, 90.0), result("delta", 4, 1, 210.0), result("delta", 8, 0, 40.0),
               result("delta", 8, 1, 45.0), result("attnres_full", 4, 1, 175.0), result("attnres_full", 4, 0, 75.0),
               result("delta_block", 4, 0, 80.0, 2), result("attnres_block", 4, 0, 64.0, 2),
               result("attnres_block", 4, 0, 100.0, 4)]  # fmt: skip
    paired = paired_comparisons(results)
    # Seed 1 at 8 layers has no baseline to pair with; a block mode meets its counterpart of the same block count.
    assert set(paired) == {"delta-L4 vs baseline-L4", "delta-L8 vs baseline-L8", "delta-L4 vs attnres_full-L4",
                           "attnres_full-L4 vs baseline-L4", "delta_block-b2-L4 vs baseline-L4",
                           "delta_block-b2-L4 vs attnres_block-b2-L4", "attnres_block-b2-L4 vs baseline-L4",
                           "attnres_block-b4-L4 vs baseline-L4"}  # fmt: skip
    versus_baseline = paired["delta-L4 vs baseline-L4"]
    assert versus_baseline["relative_differences"] == pytest.approx([-0.1, 0.05]) and versus_baseline["seeds"] == [0, 1]
    assert versus_baseline["mean"] == pytest.approx(-0.025) and versus_baseline["below"] == 1
    # Two pairs: mean -0.025, standard deviation 0.15 / sqrt(2), so mean ± 12.706 * 0.075.
    assert versus_baseline["interval95"] == pytest.approx([-0.025 - 0.952950, -0.025 + 0.952950])
    assert paired["delta-L8 vs baseline-L8"] == {
        "mode": "delta", "against": "baseline", "num_blocks": None, "layers": 8, "seeds": [0],
        "relative_differences": [pytest.approx(-0.2)], "mean": pytest.approx(-0.2), "interval95": None, "below": 1,
        "pairs": 1,
    }  # fmt: skip
    # Seeds in order whatever the order of the results: 90/75 and 210/175.
    assert paired["delta-L4 vs attnres_full-L4"]["relative_differences"] == pytest.approx([0.2, 0.2])
    assert paired["delta-L4 vs attnres_full-L4"]["below"] == 0
    assert paired["delta_block-b2-L4 vs attnres_block-b2-L4"]["relative_differences"] == pytest.approx([0.25])
    rows = format_table(summarise(results), paired).splitlines()
    delta_row = next(row for row in rows if row.startswith("delta ") and "| 4 " in row)
    assert "-2.5 % [-97.8, +92.8] (1/2 below)" in delta_row and "+20.0 % [+20.0, +20.0] (0/2 below)" in delta_row


def test_the_mean_paired_difference_has_students_95_percent_interval():
    # Ten pairs 1..10: mean 5.5, standard error 3.02765 / sqrt(10), t(9) = 2.262.
    assert mean_interval_95([float(i) for i in range(1, 11)]) == pytest.approx([5.5 - 2.16570, 5.5 + 2.16570], abs=1e-4)
    half = 1.960 * 0.50637 / 40**0.5  # forty pairs: the normal's quantile
    assert mean_interval_95([0.0, 1.0] * 20) == pytest.approx([0.5 - half, 0.5 + half], abs=1e-4)
    assert mean_interval_95([0.3]) is None


def test_the_sharpness_per_depth_band_is_summarised_over_seeds():
    def result(seed, late):
        bands = {band: {"mean_max_weight": 0.5, "max_above_uniform": 0.25, "entropy_sharpness": 0.1}
                 for band in ("early", "middle")}  # fmt: skip
        bands["late"] = {"mean_max_weight": late, "max_above_uniform": 0.5, "entropy_sharpness": 0.3}
        return {"mode": "delta", "num_blocks": None, "layers": 4, "seed": seed, "group": "delta-L4", "val_ppl": 10.0,
                "tokens_per_s": 1.0, "bands": bands}  # fmt: skip

    entry = summarise([result(0, 0.4), result(1, 0.6)])["delta-L4"]
    assert entry["bands"]["late"]["mean_max_weight"]["mean"] == pytest.approx(0.5)
    assert entry["bands"]["early"]["entropy_sharpness"]["values"] == [0.1, 0.1]
    row = format_band_table(summarise([result(0, 0.4)])).splitlines()[1]
    assert [cell.strip() for cell in row.split(" | ")[2:]] == [
        "0.500 / 0.250 / 0.100", "0.500 / 0.250 / 0.100", "0.400 / 0.500 / 0.300"]


def test_each_seeds_perplexity_is_shown_with_its_loss_a_tenth_of_the_way_through():
    curve = [[0, 8.3], [100, 6.6], [200, 6.1], [300, 5.6], [2000, 4.0]]
    assert early_loss(curve) == (200, 6.1)
    assert early_loss([[0, 8.3], [25, 7.0]]) == (25, 7.0)  # the evaluation nearest, whatever the budget
    runs = [{"mode": "baseline", "num_blocks": None, "layers": 16, "seed": seed, "group": "baseline-L16",
             "val_ppl": ppl, "val_loss_curve": curve} for seed, ppl in ((0, 52.45), (3, 80.5))]  # fmt: skip
    runs.append({**runs[0], "mode": "delta", "group": "delta-L16", "val_ppl": 51.0})
    rows = format_seed_table(runs).splitlines()
    assert [cell.strip() for cell in rows[0].split(" | ")] == ["mode", "layers", "seed 0", "seed 3"]
    assert [cell.strip() for cell in rows[1].split(" | ")] == ["baseline", "16", "52.5 (6.10)", "80.5 (6.10)"]
    assert [cell.strip() for cell in rows[2].split(" | ")] == ["delta", "16", "51.0 (6.10)", "-"]


@pytest.mark.parametrize("mode", ["delta", "attnres_full"])
def test_the_modes_without_blocks_train_shallower_than_the_default_block_count(tmp_path, tokenizer, mode):
    """The command a study starts for a 2-layer run in a mode without blocks builds its model (the block count it
    does not use fits the depth), where the study has no way to set that count."""
    settings = StudySettings(tmp_path, ["python"], "tiny", ["--data", "d", "--tokenizer", "t"], None, 32, "cpu")
    (tmp_path / "run").mkdir()
    command = finetune_command(Run(mode, 2, 0), settings, tmp_path / "run")
    assert command[:3] == ["python", "-m", "finetune"] and "--num-blocks" not in command
    model_config = build_model_config(parse_args(command[3:]), tokenizer)
    assert (model_config.routing_mode, model_config.num_hidden_layers, model_config.routing_num_blocks) == (mode, 2, 2)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--", "--data", "d", "--seed", "3"], "--seed: set by the study for each run; leave it out"),
        (["--depths", "2", "--modes", "delta_block", "--", "--data", "d"],
         "--num-blocks 4 must be between 1 and the depth, here 2"),
        (["--seeds", "1", "1", "--", "--data", "d"], "--seeds must be distinct, got [1, 1]"),
        (["--modes", "delta_block", "baseline", "--", "--data", "d", "--tokenizer", "t", "--routing-init", "released"],
         "--routing-init released needs a routing mode: the baseline has no routing"),
        (["--modes", "delta", "attnres_full", "--", "--data", "d", "--tokenizer", "t", "--gate"],
         "--gate needs a delta mode (delta, delta_block), not --mode attnres_full"),
    ],
)  # fmt: skip
def test_bad_study_options_are_one_line_and_exit_2(tmp_path, capsys, extra, message):
    assert main(["study", "--out", str(tmp_path / "study"), *extra]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"delta-qwen3 study: error: {message}")
    assert not (tmp_path / "study").exists()


def test_options_that_only_some_modes_take_are_taken_by_a_study_of_those_modes(tmp_path):
    args = build_parser().parse_args(["study", "--out", str(tmp_path / "study"), "--modes", "delta_block", "delta",
                                      "--", "--data", "d", "--tokenizer", "t", "--routing-init", "released", "--gate"])  # fmt: skip
    shared, config = _shared_finetune_args(args)
    assert shared[-3:] == ["--routing-init", "released", "--gate"] and config.released_routing and config.gate


def build_deb(directory, name: str, version: str, files: dict[str, str]):
    """A Debian package of `files` (path -> text), as apt-get names its download."""
    root = directory / f"{name}-root"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(f"Package: {name}\nVersion: {version}\nArchitecture: all\n"
                                             "Maintainer: Nobody <nobody@example.org>\nDescription: test\n")  # fmt: skip
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    deb = directory / f"{name}_{version.replace(':', '%3a')}_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)], check=True,
                   capture_output=True)  # fmt: skip
    return deb


def fixture_debs(directory) -> dict[str, list[str]]:
    """Two documentation packages holding Python's help topics: `alpha-doc` as HTML pages (with a script, a style,
    entities, and the markup's indentation around inline elements and a `<pre>`), `beta-doc` as POD files beside an HTML page and an empty
    POD file that are not its documents. Returns the texts each package's documents must give."""
    directory.mkdir()
    topics = [re.sub(r"\n{3,}", "\n\n", re.sub(r"[ \t]+\n", "\n", text)) for text in python_docs_texts()]
    pages = {f"usr/share/doc/alpha-doc/html/topic{number}.html": (
        f"<html><head><title>Topic {number}</title><style>p {{ margin: 0 }}</style>"
        f"<script>if (a < b) {{ show('<p>') }}</script></head>\n<body>\n    <h1>\n      <a href='#'> Topic</a> &amp;\n        {number}</h1>\n"
        f"    <pre>{html.escape(text)}</pre>\n</body></html>") for number, text in enumerate(topics[:40])}  # fmt: skip
    build_deb(directory, "alpha-doc", "1:2.0-1", pages)
    pods = {f"usr/share/perl/pod/topic{number}.pod": text for number, text in enumerate(topics[40:])}
    build_deb(directory, "beta-doc", "5.0", {**pods, "usr/share/doc/beta-doc/index.html": "<p>not read</p>",
                                             "usr/share/perl/pod/empty.pod": "\n"})  # fmt: skip
    return {"alpha-doc": [f"Topic {number}\n\nTopic & {number}\n\n{text}" for number, text in enumerate(topics[:40])],
            "beta-doc": topics[40:]}  # fmt: skip


FIXTURE_PACKAGES = ["--packages", "alpha-doc=.html", "beta-doc=.pod"]


def test_the_debian_corpus_is_the_packages_text_the_same_every_time_with_what_it_took(tmp_path):
    expected = fixture_debs(tmp_path / "debs")
    for out in ("corpus", "again"):
        assert debian_docs.main([str(tmp_path / out), "--debs", str(tmp_path / "debs"), *FIXTURE_PACKAGES,
                                 "--vocab-size", "300"]) == 0  # fmt: skip
    documents = [json.loads(line)["text"] for line in (tmp_path / "corpus" / "documents.jsonl").open()]
    assert sorted(documents) == sorted(expected["alpha-doc"] + expected["beta-doc"])
    manifest = json.loads((tmp_path / "corpus" / "manifest.json").read_text())
    alpha, beta = (tmp_path / "debs" / "alpha-doc_1%3a2.0-1_all.deb"), (tmp_path / "debs" / "beta-doc_5.0_all.deb")
    assert [{key: entry[key] for key in ("package", "version", "suffix", "deb", "deb_bytes", "documents",
                                         "text_bytes")} for entry in manifest["packages"]] == [  # fmt: skip
        {"package": "alpha-doc", "version": "1:2.0-1", "suffix": ".html", "deb": alpha.name,
         "deb_bytes": alpha.stat().st_size, "documents": 40,
         "text_bytes": sum(len(text.encode()) for text in expected["alpha-doc"])},
        {"package": "beta-doc", "version": "5.0", "suffix": ".pod", "deb": beta.name, "deb_bytes": beta.stat().st_size,
         "documents": len(expected["beta-doc"]), "text_bytes": sum(len(text.encode()) for text in expected["beta-doc"])},
    ]  # fmt: skip
    assert (manifest["documents"], manifest["vocab_size"]) == (len(documents), 300)
    for name in ("documents.jsonl", "manifest.json", "tokenizer/tokenizer.json"):
        assert (tmp_path / "corpus" / name).read_bytes() == (tmp_path / "again" / name).read_bytes()


@pytest.mark.parametrize(
    "packages, message",
    [
        (["gamma-doc=.txt"], "--debs {debs} has 0 .deb files of gamma-doc (gamma-doc_*.deb), not one"),
        (["alpha-doc=.txt"], "alpha-doc_1%3a2.0-1_all.deb has no text in files ending with .txt"),
    ],
)
def test_a_package_that_is_missing_or_has_no_such_documents_is_one_line_and_writes_nothing(tmp_path, capsys,
                                                                                          packages, message):  # fmt: skip
    fixture_debs(tmp_path / "debs")
    out = tmp_path / "corpus"
    assert debian_docs.main([str(out), "--debs", str(tmp_path / "debs"), "--packages", *packages]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == f"study.debian_docs: error: {message.format(debs=tmp_path / 'debs')}" and not out.exists()


def test_a_package_spec_without_a_suffix_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        debian_docs.main([str(tmp_path / "corpus"), "--packages", "perl-doc"])
    assert exit_.value.code == 2
    assert "'perl-doc' is not NAME=SUFFIX (e.g. perl-doc=.pod)" in capsys.readouterr().err.splitlines()[-1]


@pytest.fixture(scope="module")
def shared_options(tmp_path_factory) -> list[str]:
    """The rehearsal of the GPU study's command on the CPU: its corpus written by `study.debian_docs` from fixture
    packages, and the finetune options of the GPU study at a tiny size."""
    base = tmp_path_factory.mktemp("study-inputs")
    fixture_debs(base / "debs")
    assert debian_docs.main([str(base / "corpus"), "--debs", str(base / "debs"), *FIXTURE_PACKAGES,
                             "--vocab-size", "512"]) == 0  # fmt: skip
    return ["--data", str(base / "corpus" / "documents.jsonl"), "--tokenizer", str(base / "corpus" / "tokenizer"),
            "--seq-len", "32", "--batch-size", "4", "--val-blocks", "8", "--max-steps", "6", "--warmup-steps", "2",
            "--lr", "3e-3", "--log-every", "2", "--eval-every", "3", "--save-every", "2"]  # fmt: skip


def study(out, shared: list[str], *extra: str, jobs: int = 1) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "delta_qwen3.cli", "study", "--out", str(out), "--modes", "baseline",
               "delta_block", "--depths", "2", "--seeds", "0", "--num-blocks", "2", "--jobs", str(jobs), "--",
               *shared, *extra]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def comparable(results: dict) -> list[dict]:
    """Everything a run reports but its speed."""
    return [{k: v for k, v in run.items() if k != "tokens_per_s"} for run in results["runs"]]


@pytest.mark.slow
def test_a_study_stopped_part_way_resumes_to_the_results_of_one_that_ran_through(tmp_path, shared_options):
    whole = study(tmp_path / "whole", shared_options)
    assert whole.returncode == 0, whole.stderr
    expected = json.loads((tmp_path / "whole" / "results.json").read_text())
    assert [run["group"] for run in expected["runs"]] == ["baseline-L2", "delta_block-b2-L2"]
    assert expected["runs"][1]["mean_max_weight_multi_source"] is not None
    assert [step for step, _ in expected["runs"][0]["val_loss_curve"]] == [0, 3, 6]
    # Two layers in two blocks: two points with two sources, too few for three depth bands.
    assert [point["num_sources"] for point in expected["runs"][1]["points"]] == [1, 2, 2]
    assert expected["runs"][1]["bands"] == {}
    assert expected["paired"]["delta_block-b2-L2 vs baseline-L2"]["pairs"] == 1
    for name in ("ppl_vs_depth.png", "routing_sharpness_by_band.png", "paired_differences.png", "val_loss_curves.png"):
        assert (tmp_path / "whole" / name).read_bytes()[:4] == b"\x89PNG"
    assert "baseline" in whole.stdout and "delta_block (2 blocks)" in whole.stdout
    logged = [json.loads(line) for line in whole.stderr.splitlines() if line.startswith('{"run": ')]
    assert logged == [{"run": run["group"] + "-s0", "val_ppl": run["val_ppl"], "tokens_per_s": run["tokens_per_s"]}
                      for run in expected["runs"]]  # fmt: skip

    # Side by side, as on a GPU: both runs start, the first to stop ends the study, and they resume to the results
    # of runs one after the other.
    stopped = study(tmp_path / "split", shared_options, "--stop-after-step", "3", jobs=2)
    assert stopped.returncode == 1
    assert re.fullmatch(r"delta-qwen3 study: error: run (baseline-L2-s0|delta_block-b2-L2-s0) stopped before its "
                        r"last step \(--stop-after-step\); run the study again without it to continue",
                        stopped.stderr.splitlines()[-1])  # fmt: skip
    logs = [tmp_path / "split" / "runs" / name / "finetune.log" for name in ("baseline-L2-s0", "delta_block-b2-L2-s0")]
    assert all(log.read_text().startswith("$ ") and "--stop-after-step 3" in log.read_text() for log in logs)
    resumed = study(tmp_path / "split", shared_options, jobs=2)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in "".join(log.read_text() for log in logs) and "-m finetune" not in resumed.stdout
    assert comparable(json.loads((tmp_path / "split" / "results.json").read_text())) == comparable(expected)

    # Finished runs are read back, not run again.
    results = sorted((tmp_path / "split" / "runs").glob("*/result.json"))
    stamps = [path.stat().st_mtime_ns for path in results]
    again = study(tmp_path / "split", shared_options)
    assert again.returncode == 0 and "-m finetune" not in again.stdout
    assert [path.stat().st_mtime_ns for path in results] == stamps


@pytest.fixture
def tokenizer_dir(tmp_path, tokenizer) -> str:
    """A tokenizer directory, which the study reads to record what the tokenizer holds."""
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    return str(tmp_path / "tokenizer")


def finished_run(out, run: Run) -> dict:
    """The result of `run`, written into study directory `out` as a run that finished writes it."""
    (out / "runs" / run.name).mkdir(parents=True)
    result = {**run.to_dict(), "group": run.group, "val_ppl": 12.5, "tokens_per_s": 10.0,
              "val_loss_curve": [[0, 3.0], [5, 2.5]]}  # fmt: skip
    (out / "runs" / run.name / "result.json").write_text(json.dumps(result))
    return result


def test_report_only_summarises_the_finished_runs_and_names_the_others(tmp_path, tokenizer_dir, capsys):
    out = tmp_path / "study"
    options = ["study", "--out", str(out), "--modes", "baseline", "--depths", "2", "--seeds", "0", "1", "--report-only",
               "--", "--data", "d", "--tokenizer", tokenizer_dir]  # fmt: skip
    assert main(options) == 2
    assert f"--out {out} has no finished run of this study yet" in capsys.readouterr().err
    result = finished_run(out, Run("baseline", 2, 0))
    assert main(options) == 0
    captured = capsys.readouterr()
    assert "not finished yet, left out: baseline-L2-s1" in captured.err
    assert "12.50 ± 0.00" in captured.out
    assert json.loads((out / "results.json").read_text())["runs"] == [result]
    assert not (out / "runs" / "baseline-L2-s1").exists()  # nothing was trained


def test_results_that_cannot_be_written_are_printed_then_one_line(tmp_path, tokenizer_dir, capsys):
    out = tmp_path / "study"
    finished_run(out, Run("baseline", 2, 0))
    with disk_full_past(2_000):  # results.json fits; a picture does not
        assert main(["study", "--out", str(out), "--modes", "baseline", "--depths", "2", "--seeds", "0",
                     "--report-only", "--", "--data", "d", "--tokenizer", tokenizer_dir]) == 1  # fmt: skip
    captured = capsys.readouterr()
    assert "12.50 ± 0.00" in captured.out
    assert captured.err.splitlines()[-1] == (
        f"delta-qwen3 study: error: could not write --out {out}: File too large (the results are printed above)"
    )
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "runs"]


def test_a_corpus_that_cannot_be_written_is_one_line_and_not_kept_half_written(tmp_path, capsys):
    (tmp_path / "sources").mkdir()
    (tmp_path / "sources" / "topic.txt").write_text(python_docs_texts()[0])  # 1.1 kB
    out = tmp_path / "corpus"
    with disk_full_past(3_000):  # the documents fit; the tokenizer (its vocabulary alone) does not
        assert python_docs.main([str(out), "--sources", str(tmp_path / "sources"), "--vocab-size", "300"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"study.python_docs: error: could not write OUT {out}: File too large (os error 27) (what could not be written "
        "was not kept)"
    )
    assert sorted(p.name for p in out.iterdir()) == ["documents.jsonl"]


def test_runs_trained_with_other_settings_are_refused_not_reported_as_this_studys(tmp_path, tokenizer_dir, capsys):
    out = tmp_path / "study"
    finished_run(out, Run("baseline", 2, 0))
    grid = ["study", "--out", str(out), "--modes", "baseline", "--depths", "2", "--seeds", "0", "--report-only"]
    started = ["--data", "d", "--tokenizer", tokenizer_dir, "--lr", "1e-3", "--seq-len", "32"]

    # A study directory of an earlier release records nothing: said, and reported.
    assert main([*grid, "--", *started]) == 0
    assert f"{out / 'study.json'} is missing (the study started with an earlier release)" in capsys.readouterr().err

    args = build_parser().parse_args([*grid, "--", *started])
    write_json(out / "study.json", study_record(args, _shared_finetune_args(args)[1]))
    same = ["--seq-len=32", "--lr", "0.001", "--tokenizer", tokenizer_dir, "--data", "d"]
    assert main([*grid, "--", *same]) == 0
    capsys.readouterr()
    assert main([*grid, "--preset", "mini", "--", *started, "--lr", "3e-3", "--max-steps", "5"]) == 2
    assert capsys.readouterr().err == (
        f"delta-qwen3 study: error: --out {out} holds runs trained and scored with other settings: --lr 0.001 -> "
        "0.003; --max-steps 1000 -> 5; --preset tiny -> mini (run the study with the settings it started with, or "
        "give another --out)\n"
    )

    # Before any run has trained, nothing holds the settings: they may change.
    (out / "runs" / "baseline-L2-s0" / "result.json").unlink()
    other = build_parser().parse_args([*grid, "--", "--data", "d", "--tokenizer", tokenizer_dir])
    check_same_study(out, study_record(other, _shared_finetune_args(other)[1]))


def test_a_tokenizer_changed_in_place_is_refused_for_the_runs_trained_with_it(tmp_path, tokenizer_dir, capsys):
    out = tmp_path / "study"
    finished_run(out, Run("baseline", 2, 0))
    command = ["study", "--out", str(out), "--modes", "baseline", "--depths", "2", "--seeds", "0", "--", "--data", "d",
               "--tokenizer", tokenizer_dir]  # fmt: skip
    assert main(command) == 0  # the finished run read back, and the settings recorded
    capsys.readouterr()

    rules_file = tmp_path / "tokenizer" / "tokenizer.json"
    rules = json.loads(rules_file.read_text())
    merges = rules["model"]["merges"]
    merges[0], merges[1] = merges[1], merges[0]  # the same vocabulary, another tokenisation
    rules_file.write_text(json.dumps(rules))
    assert main(command) == 2
    assert re.fullmatch(
        rf"delta-qwen3 study: error: --out {re.escape(str(out))} holds runs trained and scored with other settings: "
        r"the tokenizer's vocabulary, rules and special tokens \(blake2b [0-9a-f]{16} -> blake2b [0-9a-f]{16}\) "
        r"\(run the study with the settings it started with, or give another --out\)\n",
        capsys.readouterr().err,
    )

    # A study directory of an earlier release does not record the tokenizer: said, not refused.
    recorded = json.loads((out / "study.json").read_text())
    del recorded["tokenizer_content"]
    write_json(out / "study.json", recorded)
    assert main(command) == 0
    assert (f"{out / 'study.json'} does not record the tokenizer's vocabulary, rules and special tokens (the study "
            "started with an earlier release): it cannot be checked") in capsys.readouterr().err  # fmt: skip
