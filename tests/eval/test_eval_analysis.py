"""Perplexity with strided windows and routing analysis (`delta-qwen3 ppl`, `delta-qwen3 routing`)."""

import json
import math
from pathlib import Path

import datasets
import matplotlib.image
import pytest
import torch
import torch.nn.functional as F
from helpers.models import save_routed_model
from helpers.running import run_cli
from transformers import AutoModelForCausalLM

from delta_qwen3.corpus import python_docs_texts
from eval.perplexity import negative_log_likelihood, perplexity

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """Three short passages of real English text."""
    return [text[:120] for text in python_docs_texts()[10:13]]


@pytest.fixture(scope="module")
def texts_jsonl(texts, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("texts") / "validation.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": text}) + "\n" for i, text in enumerate(texts)))
    return path


def stream(tokenizer, texts: list[str]) -> torch.Tensor:
    ids = []
    for text in texts:
        ids += tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
    return torch.tensor(ids)


@pytest.fixture(scope="module")
def qwen3(qwen3_checkpoint):
    return AutoModelForCausalLM.from_pretrained(qwen3_checkpoint).eval()


# --- perplexity ---------------------------------------------------------------------------------------------


def test_one_window_perplexity_is_the_exponentiated_language_modelling_loss(qwen3, tokenizer, texts):
    ids = stream(tokenizer, texts)
    assert len(ids) <= 256
    with torch.no_grad():
        loss = qwen3(input_ids=ids[None], labels=ids[None]).loss
    assert perplexity(qwen3, tokenizer, texts, max_length=256, stride=128) == pytest.approx(math.exp(loss), rel=1e-5)


@pytest.mark.parametrize("max_length, stride", [(32, 12), (24, 24), (16, 3)])
def test_strided_perplexity_scores_each_token_once_with_its_windows_context(qwen3, tokenizer, texts, max_length, stride):
    """Reference, one forward pass per token: token t is scored in the first window that contains it and was not
    scored by an earlier window; that window starts at the smallest multiple of the stride past t - max_length."""
    ids = stream(tokenizer, texts[:1])
    nll, scored_until = [], 1
    for begin in range(0, len(ids) - 1, stride):
        end = min(begin + max_length, len(ids))
        for t in range(max(scored_until, begin + 1), end):
            with torch.no_grad():
                logits = qwen3(input_ids=ids[None, begin:t]).logits[0, -1]
            nll.append(-logits.log_softmax(-1)[ids[t]].item())
        scored_until = end
    expected = math.exp(sum(nll) / len(nll))
    if stride == max_length:  # windows do not overlap: each window's first token has no context and is skipped
        assert len(nll) == len(ids) - math.ceil(len(ids) / stride)
    else:
        assert len(nll) == len(ids) - 1
    assert perplexity(qwen3, tokenizer, texts[:1], max_length=max_length, stride=stride) == pytest.approx(
        expected, rel=1e-5
    )


def one_window_at_a_time(model, ids: torch.Tensor, max_length: int, stride: int) -> tuple[float, int]:
    """The reference: each window in a forward pass of its own, all its positions' logits, the tokens an earlier
    window scored dropped; the summed negative log-likelihood and the tokens scored."""
    total, count, scored_until = 0.0, 0, 1
    for begin in range(0, len(ids) - 1, stride):
        window = ids[begin : begin + max_length]
        with torch.no_grad():
            logits = model(input_ids=window[None]).logits[0, :-1]
        nll = F.cross_entropy(logits, window[1:], reduction="none")[max(scored_until - begin - 1, 0) :]
        total, count, scored_until = total + nll.sum().item(), count + len(nll), begin + len(window)
        if scored_until == len(ids):
            return total, count


@pytest.mark.parametrize("max_length, stride", [(32, 12), (24, 24)])
def test_windows_in_batches_give_the_totals_of_one_window_at_a_time(qwen3, tokenizer, texts, max_length, stride):
    """Batches of up to 4 windows: the summed negative log-likelihood and the token count of one window at a time,
    in fewer forward passes; the last, shorter window runs alone, unpadded."""
    ids = stream(tokenizer, texts)
    expected = one_window_at_a_time(qwen3, ids, max_length, stride)
    shapes = []
    hook = qwen3.register_forward_hook(lambda module, args, kwargs, output: shapes.append(kwargs["input_ids"].shape),
                                       with_kwargs=True)  # fmt: skip
    try:
        total, count = negative_log_likelihood(qwen3, ids, max_length, stride, batch_size=4)
    finally:
        hook.remove()
    assert count == expected[1] and total == pytest.approx(expected[0], rel=1e-5)
    windows = math.ceil((len(ids) - max_length) / stride) + 1
    last = len(ids) - (windows - 1) * stride
    assert last < max_length  # the last window is shorter: it runs alone, unpadded
    assert [tuple(shape) for shape in shapes[-1:]] == [(1, last)] and max(shape[0] for shape in shapes) == 4
    assert sum(shape[0] for shape in shapes) == windows and len(shapes) < windows


@pytest.mark.slow
def test_ppl_command_reads_text_jsonl_and_hub_data_alike(qwen3, qwen3_checkpoint, tokenizer, texts, texts_jsonl,
                                                         tmp_path, monkeypatch):
    expected = perplexity(qwen3, tokenizer, texts, max_length=64, stride=32)
    options = ["--max-length", "64", "--stride", "32", "--batch-size", "3", "--device", "cpu"]

    output = tmp_path / "ppl.json"
    code, stdout, stderr = run_cli(["ppl", str(qwen3_checkpoint), "--data", str(texts_jsonl), "--output", str(output),
                                    *options])
    assert code == 0, stderr
    result = json.loads(stdout)
    assert result == json.loads(output.read_text())
    assert result["documents"] == 3 and result["perplexity"] == pytest.approx(expected, rel=1e-6)

    text_file = tmp_path / "one.txt"
    text_file.write_text(texts[0])
    code, stdout, _ = run_cli(["ppl", str(qwen3_checkpoint), "--data", str(text_file), *options])
    assert code == 0
    assert json.loads(stdout)["perplexity"] == pytest.approx(perplexity(qwen3, tokenizer, texts[:1], 64, 32), rel=1e-6)

    requested = []

    def load_dataset(path, name=None, split=None, **kwargs):  # the network boundary
        requested.append((path, name, split))
        return datasets.Dataset.from_list([{"text": text} for text in ["", *texts]])  # empty lines are dropped

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    code, stdout, _ = run_cli(["ppl", str(qwen3_checkpoint), "--data", "Salesforce/wikitext", "--config",
                               "wikitext-2-raw-v1", "--split", "test", *options])
    assert code == 0
    assert requested == [("Salesforce/wikitext", "wikitext-2-raw-v1", "test")]
    assert json.loads(stdout)["perplexity"] == pytest.approx(expected, rel=1e-6)


def _error(argv: list[str], command: str) -> str:
    code, stdout, stderr = run_cli(argv)
    assert code == 2 and stdout == ""
    assert "\n" + f"delta-qwen3 {command}: error: " in "\n" + stderr  # a line of its own, after any loading progress
    return stderr


def test_ppl_bad_input_is_named(qwen3_checkpoint, texts_jsonl, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": 3}\n')
    assert f"{bad} line 2: field 'text' is a int, not a string" in _error(
        ["ppl", str(qwen3_checkpoint), "--data", str(bad)], "ppl"
    )
    missing = tmp_path / "missing.jsonl"
    assert f"--data {missing} does not exist" in _error(["ppl", str(qwen3_checkpoint), "--data", str(missing)], "ppl")
    assert "--stride 40 is longer than the window (--max-length 20)" in _error(
        ["ppl", str(qwen3_checkpoint), "--data", str(texts_jsonl), "--max-length", "20", "--stride", "40"], "ppl"
    )
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    assert f"MODEL {broken}: {broken / 'config.json'} is not valid JSON" in _error(
        ["ppl", str(broken), "--data", str(texts_jsonl)], "ppl")


# --- routing ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def routed_models(tokenizer, tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("routed")
    return [
        save_routed_model(root / "delta-block", tokenizer, seed=1, routing_mode="delta_block", routing_num_blocks=2),
        save_routed_model(root / "attnres-full", tokenizer, seed=2, routing_mode="attnres_full"),
    ]


def expected_statistics(model_dir: Path, tokenizer, texts: list[str], max_length: int) -> dict:
    """From the model's own `output_routing_weights`, all windows' tokens together."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=True).eval()
    ids = stream(tokenizer, texts)
    per_point = None
    for begin in range(0, len(ids), max_length):
        with torch.no_grad():
            weights = model(input_ids=ids[None, begin : begin + max_length], output_routing_weights=True).routing_weights
        window = [w[0].double() for w in weights]
        per_point = window if per_point is None else [torch.cat(pair) for pair in zip(per_point, window)]
    return {
        "num_tokens": len(ids),
        "num_sources": [w.shape[-1] for w in per_point],
        "max": [w.max(-1).values.mean().item() for w in per_point],
        "entropy": [-torch.special.xlogy(w, w).sum(-1).mean().item() for w in per_point],
        "weights": [w.mean(0).tolist() for w in per_point],
    }


def check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 200 and image.shape[1] > 300
    assert image[..., :3].std() > 0.05  # not a blank canvas


@pytest.mark.slow
def test_routing_command_writes_statistics_matching_the_models_routing_weights(routed_models, tokenizer, texts,
                                                                               texts_jsonl, tmp_path):
    out = tmp_path / "routing"
    models = [str(path) for path in routed_models]
    code, stdout, stderr = run_cli(["routing", *models, "--data", str(texts_jsonl), "--out", str(out),
                                    "--max-length", "48", "--device", "cpu"])
    assert code == 0, stderr
    assert sorted(p.name for p in out.iterdir()) == ["routing.json", "routing_heatmap.png", "routing_max_weight.png"]
    report = json.loads((out / "routing.json").read_text())
    assert report["documents"] == 3 and list(report["models"]) == models
    assert json.loads(stdout) == {model: report["models"][model]["mean_max_weight"] for model in models}

    delta_block, attnres_full = (report["models"][model] for model in models)
    assert delta_block["routing_mode"] == "delta_block" and attnres_full["routing_mode"] == "attnres_full"
    # 4 layers: sublayers 1..7 are routed; AttnRes adds the final point.
    assert [p["name"] for p in delta_block["points"]] == ["0.mlp", "1.attn", "1.mlp", "2.attn", "2.mlp", "3.attn",
                                                           "3.mlp"]
    assert [p["sublayer"] for p in attnres_full["points"]] == list(range(1, 9))
    assert attnres_full["points"][-1]["name"] == "final"
    # Delta Block with 2 blocks: the embedding alone until the first block's delta joins at layer 2.
    assert [p["num_sources"] for p in delta_block["points"]] == [1, 1, 1, 2, 2, 2, 2]

    for model_dir, stats in zip(routed_models, (delta_block, attnres_full)):
        expected = expected_statistics(model_dir, tokenizer, texts, max_length=48)
        assert stats["num_tokens"] == expected["num_tokens"]
        assert [p["num_sources"] for p in stats["points"]] == expected["num_sources"]
        assert [p["mean_max_weight"] for p in stats["points"]] == pytest.approx(expected["max"], abs=1e-6)
        assert [p["mean_entropy"] for p in stats["points"]] == pytest.approx(expected["entropy"], abs=1e-6)
        for point, weights in zip(stats["points"], expected["weights"]):
            assert point["mean_weights"] == pytest.approx(weights, abs=1e-6)
        assert stats["mean_max_weight"] == pytest.approx(sum(expected["max"]) / len(expected["max"]), abs=1e-9)
        assert stats["mean_entropy"] == pytest.approx(sum(expected["entropy"]) / len(expected["entropy"]), abs=1e-9)
        multi = [m for m, n in zip(expected["max"], expected["num_sources"]) if n > 1]
        assert stats["mean_max_weight_multi_source"] == pytest.approx(sum(multi) / len(multi), abs=1e-9)
        for point, n, entropy in zip(stats["points"], expected["num_sources"], expected["entropy"]):
            expected_sharpness = None if n == 1 else pytest.approx(1 - entropy / math.log(n), abs=1e-6)
            assert point["entropy_sharpness"] == expected_sharpness
        multi = [p for p in stats["points"] if p["num_sources"] > 1]
        thirds = [multi[: -(-len(multi) // 3)], multi[-(-len(multi) // 3) : len(multi) - len(multi) // 3],
                  multi[len(multi) - len(multi) // 3 :]]  # fmt: skip
        for band, members in zip(("early", "middle", "late"), thirds, strict=True):
            assert stats["bands"][band]["entropy_sharpness"] == pytest.approx(
                sum(p["entropy_sharpness"] for p in members) / len(members), abs=1e-12)
        # Random queries make routing clearly sharper than uniform at some multi-source point.
        assert any(p["mean_max_weight"] > 1.2 / p["num_sources"] for p in stats["points"] if p["num_sources"] > 1)

    check_png(out / "routing_heatmap.png")
    check_png(out / "routing_max_weight.png")


def test_routing_bad_input_is_named(qwen3_checkpoint, routed_models, texts_jsonl, tmp_path):
    stderr = _error(["routing", str(qwen3_checkpoint), "--data", str(texts_jsonl), "--out", str(tmp_path / "r"),
                     "--device", "cpu"], "routing")
    assert "is a 'qwen3' model, not DeltaQwen3: it has no routing weights" in stderr
    missing = tmp_path / "nowhere.txt"
    stderr = _error(["routing", str(routed_models[0]), "--data", str(missing), "--out", str(tmp_path / "r")], "routing")
    assert f"--data {missing} does not exist" in stderr
    stderr = _error(["routing", str(routed_models[0]), str(routed_models[0]), "--data", str(texts_jsonl),
                     "--out", str(tmp_path / "r")], "routing")
    assert "model given more than once" in stderr
    assert not (tmp_path / "r").exists()
