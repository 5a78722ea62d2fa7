"""Serving speed under vLLM: DeltaQwen3 against Qwen3 of the same shape, in one run of vLLM's offline engine.

Every model serves the same fixed prompts (different lengths, greedy, a fixed number of new tokens each): output
tokens per second over the whole batch, and the time to the first token of one prompt alone; medians over
`--rounds` after a warm-up, the engines all started first and then taking turns in every round, so that the drift of
a shared machine falls on all of them alike. Each DeltaQwen3 goes through vLLM's Transformers modeling backend, its model code loaded
as remote code; its ratios are taken against Qwen3 through the same backend (`model_impl="transformers"`, the
routing's own cost) and against vLLM's native Qwen3 (what a user gives up against the plain model). Random weights,
the routing parameters at their init: the speed does not depend on their values.

vLLM runs in its own environment, which `make test` creates as `.venv-vllm`:

    python benchmarks/serving.py --enforce-eager --rounds 5 --output benchmarks/results/vllm-cpu-float32-eager.json
    python benchmarks/serving.py --modes delta     # vLLM's default (compiled) mode, which delta_block refuses on the CPU
    python benchmarks/serving.py --quick --enforce-eager     # a smoke run

Targets (issue "Serve DeltaQwen3 with vLLM"), against Qwen3 through the Transformers backend: output throughput
>= 0.95 (Delta Block) and >= 0.90 (Delta AttnRes).
"""

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from delta_qwen3.jsonl import json_text
from modeling_delta_qwen3 import DeltaQwen3Config, DeltaQwen3ForCausalLM
from modeling_delta_qwen3.routing_modes import ROUTING_MODES

ROOT = Path(__file__).resolve().parents[1]
RUNNER = Path(__file__).with_name("vllm_runner.py")
TARGETS = {"delta_block": 0.95, "delta": 0.90}
LABELS = {name: mode.title for name, mode in ROUTING_MODES.items()}
SHAPES = {
    # Qwen3-0.6B's width (28 layers there) and a smaller vocabulary.
    "medium": dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=64,
                   intermediate_size=3072, vocab_size=8192, num_hidden_layers=8, max_position_embeddings=1024),
    "small": dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=768,
                  vocab_size=4096, num_hidden_layers=8, max_position_embeddings=1024),
    # vLLM's CPU attention needs a head size of 32 or more: the tests' 16 is refused.
    "tiny": dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=64, intermediate_size=128,
                 vocab_size=512, num_hidden_layers=4, max_position_embeddings=1024),
}


def save_models(root: Path, shape: dict, modes: list[str]) -> dict[str, Path]:
    """A random Qwen3 of `shape` and, per routing mode, a gated DeltaQwen3 (as `convert` makes) with its weights."""
    torch.manual_seed(0)
    config = Qwen3Config(**shape, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    qwen3 = Qwen3ForCausalLM(config)
    qwen3.save_pretrained(root / "qwen3")
    paths = {"qwen3": root / "qwen3"}
    fields = config.to_dict()
    fields.pop("model_type")
    for mode in modes:
        gated = ROUTING_MODES[mode].gateable
        delta = DeltaQwen3ForCausalLM(DeltaQwen3Config(**fields, routing_mode=mode, routing_gate=gated))
        delta.load_state_dict(qwen3.state_dict(), strict=False)
        delta.save_pretrained(root / mode)
        paths[mode] = root / mode
    return paths


def fixed_prompts(count: int, shortest: int, longest: int, vocab_size: int) -> list[list[int]]:
    """`count` prompts of random token ids (a fixed seed), their lengths evenly spread from `shortest` to
    `longest`."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.linspace(shortest, longest, count).round().int().tolist()
    return [torch.randint(3, vocab_size, (length,), generator=generator).tolist() for length in lengths]


def job(paths: dict[str, Path], args: argparse.Namespace, prompts: list[list[int]]) -> dict:
    engine = dict(max_model_len=args.max_model_len, max_num_seqs=len(prompts), kv_cache_memory_bytes=256 << 20,
                  seed=0, trust_remote_code=True, enforce_eager=args.enforce_eager,
                  # The prompts are token ids, and the checkpoints have no tokenizer; the rounds would find the
                  # prompts' KV cache from the warm-up, and time no prefill.
                  skip_tokenizer_init=True, enable_prefix_caching=False)
    common = dict(dtype=args.dtype, prompts=prompts, max_tokens=args.new_tokens)
    runs = [
        {"name": "qwen3_native", "model": str(paths["qwen3"]), "model_impl": "vllm"} | common,
        {"name": "qwen3_transformers", "model": str(paths["qwen3"]), "model_impl": "transformers"} | common,
    ]
    runs += [{"name": mode, "model": str(path), "model_impl": "transformers"} | common
             for mode, path in paths.items() if mode != "qwen3"]
    return {"engine": engine, "runs": runs, "timing_rounds": args.rounds}


def run_vllm(vllm_python: Path, job_spec: dict, workdir: Path) -> dict:
    """Run the job in vLLM's environment, where this project is not importable; the runs' results."""
    job_path, results_path = workdir / "job.json", workdir / "results.json"
    job_path.write_text(json.dumps(job_spec))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    completed = subprocess.run([str(vllm_python), str(RUNNER), str(job_path), str(results_path)], cwd=workdir,
                               env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if completed.returncode != 0:
        raise SystemExit(f"vLLM failed ({completed.returncode}):\n{completed.stderr[-5000:]}")
    return json.loads(results_path.read_text())


def ratios(results: dict, mode: str) -> dict:
    """Output throughput and time-to-first-token ratios of `mode` against both Qwen3 runs (higher is better for
    both: the time ratio is Qwen3's time over the mode's)."""
    mine = results[mode]
    out = {}
    for baseline in ("qwen3_transformers", "qwen3_native"):
        theirs = results[baseline]
        out[f"throughput_vs_{baseline}"] = mine["output_tokens_per_second"] / theirs["output_tokens_per_second"]
        out[f"first_token_vs_{baseline}"] = theirs["time_to_first_token_seconds"] / mine["time_to_first_token_seconds"]
    return out


def vllm_version(vllm_python: Path) -> str:
    code = "from importlib.metadata import version; print(version('vllm-cpu'))"
    return subprocess.run([str(vllm_python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", type=Path, default=ROOT / ".venv-vllm" / "bin" / "python")
    parser.add_argument("--modes", default="delta_block,delta")
    parser.add_argument("--shape", default="medium", choices=list(SHAPES))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--shortest", type=int, default=16)
    parser.add_argument("--longest", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--enforce-eager", action="store_true", help="vLLM's eager mode instead of its compiled one")
    parser.add_argument("--quick", action="store_true", help="tiny shape, 4 short prompts, 1 round: a smoke run")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.shape, args.prompts, args.shortest, args.longest, args.new_tokens, args.rounds = "tiny", 4, 4, 16, 8, 1
    modes = args.modes.split(",")
    refusing = [mode for mode in modes
                if mode in ROUTING_MODES and ROUTING_MODES[mode].miscompiled_on_cpu_before_torch_2_14]
    if refusing and not args.enforce_eager:
        parser.error(f"{', '.join(refusing)} refuses vLLM's compiled mode on the CPU under PyTorch before 2.14, which "
                     "vLLM's CPU build pins (docs/SERVING.md): add --enforce-eager, or leave it out of --modes")
    if not args.vllm_python.exists():
        raise SystemExit(f"{args.vllm_python} does not exist: `make test` creates vLLM's environment")
    shape = SHAPES[args.shape]
    prompts = fixed_prompts(args.prompts, args.shortest, args.longest, shape["vocab_size"])
    with tempfile.TemporaryDirectory() as workdir:
        paths = save_models(Path(workdir), shape, modes)
        results = run_vllm(args.vllm_python, job(paths, args, prompts), Path(workdir))
    report = {
        "settings": {
            "vllm": vllm_version(args.vllm_python), "device": "cpu", "dtype": args.dtype, "shape": args.shape,
            "compiled": not args.enforce_eager, "prompts": args.prompts, "prompt_lengths": [len(p) for p in prompts],
            "new_tokens": args.new_tokens, "rounds": args.rounds, "torch_threads": torch.get_num_threads(),
        },
        "runs": {name: {key: value for key, value in run.items() if key != "tokens"} for name, run in results.items()},
        "ratios": {mode: ratios(results, mode) for mode in modes},
        # A gated delta mode's checkpoint, its gates zero as `convert` leaves them, computes what Qwen3 computes:
        # how many prompts get Qwen3's greedy tokens (random weights make near-ties, which rounding can flip).
        "prompts_with_qwen3_tokens": {mode: sum(map(list.__eq__, results[mode]["tokens"],
                                                    results["qwen3_transformers"]["tokens"])) for mode in modes},
    }
    report["targets_missed"] = [
        mode for mode, target in TARGETS.items()
        if mode in modes and report["ratios"][mode]["throughput_vs_qwen3_transformers"] < target
    ]
    for mode in modes:
        r = report["ratios"][mode]
        print(f"{LABELS[mode]}: throughput {r['throughput_vs_qwen3_transformers']:.3f} of Qwen3 (Transformers "
              f"backend), {r['throughput_vs_qwen3_native']:.3f} of native Qwen3; time to first token "
              f"{r['first_token_vs_qwen3_transformers']:.3f} / {r['first_token_vs_qwen3_native']:.3f}")
    if args.output:
        args.output.write_text(json_text(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
