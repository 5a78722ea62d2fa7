"""The serving section, where vLLM is installed (here, or in the interpreter of `--vllm-python`): its greedy tokens
equal `generate`'s, in vLLM's default (compiled) and eager modes; else skipped, saying why."""

import importlib.util
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.gpu_check.comparing import greedy, random_delta
from benchmarks.gpu_check.profiles import Profile
from benchmarks.gpu_check.running import SectionRecord, Skipped


def vllm_interpreter(requested: Path | None) -> Path:
    if requested is not None:
        return requested
    if importlib.util.find_spec("vllm") is None:
        raise Skipped("vLLM is not installed in this interpreter (--vllm-python names one that has it)")
    return Path(sys.executable)


def save_serving_models(profile: Profile, root: Path, modes: list[str]) -> dict:
    """Per mode, a random DeltaQwen3 of the shape vLLM's serving tests use, saved with its code."""
    from benchmarks.serving import SHAPES

    shape = {**SHAPES["tiny"], "num_hidden_layers": 4}
    made = {}
    for mode in modes:
        model = random_delta(profile, mode, **shape).eval()
        model.save_pretrained(root / mode)
        made[mode] = (root / mode, model)
    return made


def vllm_job(models: dict, prompts: list[list[int]], enforce_eager: bool, device: str) -> dict:
    engine = dict(max_model_len=256, max_num_seqs=len(prompts), kv_cache_memory_bytes=256 << 20, seed=0,
                  trust_remote_code=True, enforce_eager=enforce_eager, skip_tokenizer_init=True)
    if device == "cuda":
        engine["gpu_memory_utilization"] = 0.3  # this process holds some GPU memory too
    runs = [{"name": mode, "model": str(path), "dtype": "float32", "model_impl": "transformers", "prompts": prompts,
             "max_tokens": 8} for mode, (path, _) in models.items()]  # fmt: skip
    return {"engine": engine, "runs": runs}


def check_serving(profile: Profile, section: SectionRecord, vllm_python: Path | None) -> None:
    """Greedy tokens from vLLM (its Transformers backend, the model code loaded as remote code) against
    `generate`'s, in both delta modes, in vLLM's eager and default modes (on the CPU delta_block refuses the
    latter: docs/SERVING.md)."""
    from modeling_delta_qwen3.routing_modes import ROUTING_MODES
    from benchmarks.serving import fixed_prompts, run_vllm

    python = vllm_interpreter(vllm_python)
    prompts = fixed_prompts(4, 4, 16, 512)
    with tempfile.TemporaryDirectory() as work:
        models = save_serving_models(profile, Path(work), ["delta_block", "delta"])
        expected = {mode: [greedy(model, torch.tensor([p], device=profile.device)).sequences[0, len(p):].tolist()
                           for p in prompts] for mode, (_, model) in models.items()}  # fmt: skip
        for enforce_eager in (True, False):
            engine_mode = "eager" if enforce_eager else "default"
            refused = profile.device == "cpu" and not enforce_eager
            served = {m: v for m, v in models.items()
                      if not (refused and ROUTING_MODES[m].miscompiled_on_cpu_before_torch_2_14)}
            if served != models:
                section.not_run(f"delta_block {engine_mode}", "refused on the CPU (docs/SERVING.md)")
            results = run_vllm(python, vllm_job(served, prompts, enforce_eager, profile.device), Path(work))
            for mode in served:
                differing = sum(got != want for got, want in zip(results[mode]["tokens"], expected[mode], strict=True))
                section.check(f"{mode} vLLM {engine_mode}: prompts whose tokens differ", differing, 0)
