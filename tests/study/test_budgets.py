"""`python -m study.budgets`: one comparison across studies of different lengths, paired by seed."""

import json

import pytest

from study import budgets


def _run(mode, seed, ppl, curve, num_blocks=4):
    return {"mode": mode, "seed": seed, "num_blocks": num_blocks, "layers": 16, "val_ppl": ppl,
            "val_loss_curve": curve}  # fmt: skip


def _study(directory, runs):
    directory.mkdir()
    (directory / "results.json").write_text(json.dumps({"runs": runs}))
    return str(directory)


def test_each_budget_pairs_the_seeds_and_follows_the_loss_gap_step_by_step(tmp_path, capsys):
    long = _study(tmp_path / "long", [
        _run("delta_block", 0, 52.0, [[0, 8.3], [2, 6.0], [4, 5.0]]),
        _run("attnres_block", 0, 50.0, [[0, 8.3], [2, 5.5], [4, 4.9]]),
        _run("delta_block", 1, 49.0, [[0, 8.3], [2, 5.8], [4, 4.7]]),
        _run("attnres_block", 1, 50.0, [[0, 8.3], [2, 5.6], [4, 4.9]]),
        _run("delta_block", 0, 40.0, [[0, 8.3], [4, 4.0]], num_blocks=2),  # another block count: not paired
        _run("baseline", 1, 60.0, [[0, 8.3], [2, 6.1], [4, 5.2]], num_blocks=None),
    ])  # fmt: skip
    short = _study(tmp_path / "short", [
        _run("delta_block", 0, 55.0, [[0, 8.3], [1, 6.5], [2, 5.9]]),
        _run("attnres_block", 0, 50.0, [[0, 8.3], [1, 6.0], [2, 5.8]]),
        _run("attnres_block", 2, 50.0, [[0, 8.3], [1, 6.0], [2, 5.8]]),  # no pair
    ])  # fmt: skip
    out = tmp_path / "out"
    assert budgets.main(["--out", str(out), f"four steps={long}", short]) == 0

    written = json.loads((out / "budgets.json").read_text())
    short_entry, long_entry = written["budgets"]  # in the order of their budgets
    assert (short_entry["label"], short_entry["steps"], short_entry["seeds"]) == ("short", 2, [0])
    assert short_entry["relative_differences"] == pytest.approx([0.1])
    assert short_entry["loss_gap"]["mean"] == pytest.approx([0.5, 0.1])
    assert (long_entry["label"], long_entry["steps"], long_entry["seeds"]) == ("four steps", 4, [0, 1])
    assert long_entry["relative_differences"] == pytest.approx([0.04, -0.02])
    assert (long_entry["mean"], long_entry["below"]) == (pytest.approx(0.01), 1)
    assert long_entry["loss_gap"]["steps"] == [2, 4]
    assert long_entry["loss_gap"]["mean"] == pytest.approx([0.35, -0.05])
    assert long_entry["loss_gap"]["min"] == pytest.approx([0.2, -0.2])
    assert (out / "gap_vs_step.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "four steps (4 steps): seeds +4.0 / -2.0 %; mean +1.0 % [" in printed
    assert "validation-loss gap +0.350 at step 2, +0.350 at step 2, -0.050 at step 4" in printed


def test_a_study_without_results_or_without_pairs_is_one_line(tmp_path, capsys):
    assert budgets.main(["--out", str(tmp_path / "out"), str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"{tmp_path / 'missing'}: no results.json (run `delta-qwen3 study --report-only` on it first)"
    )
    lonely = _study(tmp_path / "lonely", [_run("delta_block", 0, 50.0, [[0, 8.3], [1, 6.0]])])
    assert budgets.main(["--out", str(tmp_path / "out"), lonely]) == 2
    assert capsys.readouterr().err.strip().endswith("lonely: no seed has runs of both delta_block and attnres_block "
                                                    "(4 blocks)")  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_seeds_can_be_limited_to_those_of_another_study(tmp_path):
    runs = [_run(mode, seed, 50.0 + seed, [[0, 8.3], [1, 6.0 + seed]]) for seed in range(3)
            for mode in ("delta_block", "attnres_block")]  # fmt: skip
    studies = [("ten", runs)]
    assert budgets.compare_budgets(studies, "delta_block", "attnres_block", 4, seeds=[0, 2])[0]["seeds"] == [0, 2]
    assert budgets.compare_budgets(studies, "delta_block", "attnres_block", 4)[0]["seeds"] == [0, 1, 2]
