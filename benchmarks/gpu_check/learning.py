"""The learning section: a short pre-training of plain Qwen3 and Delta Block on Python's documentation, as the
demo pre-trains its base model: both losses fall."""

import json
import tempfile
from pathlib import Path

from benchmarks.gpu_check.profiles import Profile
from benchmarks.gpu_check.running import SectionRecord
from delta_qwen3.corpus import SMALL_BASE_CONFIG, pretraining_inputs, split_python_docs


def falling(losses: list[float]) -> float:
    """The mean loss of the last fifth of the steps over that of the first fifth."""
    fifth = max(1, len(losses) // 5)
    return (sum(losses[-fifth:]) / fifth) / (sum(losses[:fifth]) / fifth)


def pretrain(profile: Profile, run_dir: Path, mode: str, data: Path, inputs: tuple[Path, Path]) -> list[float]:
    """Pre-train a model of the shape and with the tokenizer of `inputs` (`pretraining_inputs`) in `mode` on `data`
    with `finetune`, in this process, as the demo pre-trains its base model; its loss at every step."""
    import finetune

    learning = profile.learning
    tokenizer_dir, config_file = inputs
    # The demo's validation options (demo/journey.py's `finetune_command` says why), so that both train on the same
    # documents.
    options = ["--from-scratch", "--mode", mode, "--model-config", str(config_file), "--tokenizer", str(tokenizer_dir),
               "--data", str(data), "--output-dir", str(run_dir), "--seq-len", str(learning["seq_len"]),
               "--batch-size", str(learning["batch"]), "--max-steps", str(learning["steps"]),
               "--lr", str(learning["lr"]), "--warmup-steps", str(learning["warmup"]), "--log-every", "1",
               "--val-blocks", "16", "--val-interval", "5", "--eval-every", "100", "--save-every", "0", "--overwrite",
               *(["--num-blocks", "2"] if mode != "baseline" else [])]  # fmt: skip
    if finetune.main(options) != 0:
        raise RuntimeError(f"finetune failed for {mode} (its message is in gpu_check.log)")
    log = (run_dir / "train_log.jsonl").read_text().splitlines()
    return [entry["loss"] for entry in map(json.loads, log) if "loss" in entry]


def check_learning(profile: Profile, section: SectionRecord) -> None:
    """Plain Qwen3 (baseline) and Delta Block pre-trained alike on the demo's pre-training split, from the demo's
    base model (`SMALL_BASE_CONFIG`, with the profile's changes): each one's last fifth of losses at most 0.95 of its
    first fifth, a limit that a model that learns passes with room (benchmarks/results/gpu-check-h200/learning.json
    has what the GPU profile reaches)."""
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        corpus = split_python_docs(work)
        inputs = pretraining_inputs(work, corpus["pretrain"], SMALL_BASE_CONFIG | profile.learning["model"])
        for mode in ("baseline", "delta_block"):
            losses = pretrain(profile, work / mode, mode, corpus["pretrain"], inputs)
            section.figure(f"{mode} losses", losses)
            section.check(f"{mode}: last fifth of losses / first fifth", falling(losses), 0.95)
