"""Runs checkpoints under vLLM's offline engine, one after another in one process, and writes what each produced.

It runs in an environment that has vLLM but not this project (vLLM pins its own Transformers), so it imports only
vLLM and the standard library; the checkpoints' model code is loaded as remote code. The tests and
`benchmarks/serving.py` build the checkpoints and compute what to expect in the project's environment, then run:

    VLLM_PYTHON benchmarks/vllm_runner.py JOB.json RESULTS.json

JOB.json: `{"engine": {LLM keyword arguments shared by every run}, "runs": [{"name", "model", "dtype",
"model_impl", "prompts": [[token ids], ...], "max_tokens", "prompt_logprobs" (optional), "timing_repeats"
(optional)}, ...]}`. RESULTS.json: `{name: {"tokens": [[new token ids], ...], "architecture", "start_seconds",
...}}`, written after every run so that a failed run leaves the earlier ones.
"""

import gc
import json
import os
import statistics
import sys
import time

# The engine core runs in this process: no spawned interpreter to start per model, and one start per checkpoint.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from vllm import LLM, SamplingParams  # noqa: E402


def greedy(max_tokens: int, prompt_logprobs: int | None = None) -> SamplingParams:
    """Greedy decoding of exactly `max_tokens` tokens, as `generate(do_sample=False, eos_token_id=None)`."""
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, prompt_logprobs=prompt_logprobs)


def as_inputs(prompts: list[list[int]]) -> list[dict]:
    return [{"prompt_token_ids": ids} for ids in prompts]


def prompt_logprobs_of(output) -> list[float]:
    """The log-probability vLLM gave each prompt token after the first, given the tokens before it."""
    ids = output.prompt_token_ids
    return [position[ids[i]].logprob for i, position in enumerate(output.prompt_logprobs) if position is not None]


def timings(llm: LLM, prompts: list[list[int]], max_tokens: int, repeats: int) -> dict:
    """Median over `repeats` of the whole batch's generation time (throughput) and of one prompt's time to its first
    token, after one warm-up of each."""
    batch, single = as_inputs(prompts), as_inputs(prompts[:1])
    llm.generate(batch, greedy(max_tokens), use_tqdm=False)
    llm.generate(single, greedy(1), use_tqdm=False)
    batch_seconds, first_token_seconds = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        llm.generate(batch, greedy(max_tokens), use_tqdm=False)
        batch_seconds.append(time.perf_counter() - start)
        start = time.perf_counter()
        llm.generate(single, greedy(1), use_tqdm=False)
        first_token_seconds.append(time.perf_counter() - start)
    seconds = statistics.median(batch_seconds)
    return {
        "batch_seconds": seconds,
        "output_tokens_per_second": len(prompts) * max_tokens / seconds,
        "time_to_first_token_seconds": statistics.median(first_token_seconds),
    }


def run(engine: dict, spec: dict) -> dict:
    """Start an engine for one checkpoint, generate greedily and, if asked, time it; the engine is freed after."""
    start = time.perf_counter()
    llm = LLM(model=spec["model"], dtype=spec["dtype"], model_impl=spec.get("model_impl", "auto"), **engine)
    result = {"start_seconds": time.perf_counter() - start}
    config = llm.llm_engine.model_config
    result["architecture"] = config.architecture
    result["model_impl"] = str(config.model_impl)
    outputs = llm.generate(as_inputs(spec["prompts"]), greedy(spec["max_tokens"], spec.get("prompt_logprobs")),
                           use_tqdm=False)
    result["tokens"] = [list(output.outputs[0].token_ids) for output in outputs]
    if spec.get("prompt_logprobs") is not None:
        result["prompt_logprobs"] = [prompt_logprobs_of(output) for output in outputs]
    if spec.get("timing_repeats"):
        result |= timings(llm, spec["prompts"], spec["max_tokens"], spec["timing_repeats"])
    del llm
    gc.collect()
    return result


def main(job_path: str, results_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    results = {}
    for spec in job["runs"]:
        results[spec["name"]] = run(job["engine"], spec)
        with open(results_path, "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
