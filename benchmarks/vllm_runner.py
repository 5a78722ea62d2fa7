"""Runs checkpoints under vLLM's offline engine, one after another in one process, and writes what each produced.

It runs in an environment that has vLLM but not this project (vLLM pins its own Transformers), so it imports only
vLLM and the standard library; the checkpoints' model code is loaded as remote code. The tests and
`benchmarks/serving.py` build the checkpoints and compute what to expect in the project's environment, then run:

    VLLM_PYTHON benchmarks/vllm_runner.py JOB.json RESULTS.json

JOB.json: `{"engine": {LLM keyword arguments shared by every run}, "runs": [{"name", "model", "dtype",
"model_impl", "prompts": [[token ids], ...], "max_tokens", "prompt_logprobs" (optional)}, ...], "timing_rounds"
(optional)}`. RESULTS.json: `{name: {"tokens": [[new token ids], ...], "architecture", "start_seconds", ...}}`,
written after every engine start so that a failed one leaves the earlier results. With `timing_rounds`, every
engine is kept and then timed in turns with the others (`timed_rounds`); without, each is freed before the next
starts.
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


def batch_seconds(llm: LLM, prompts: list[list[int]], max_tokens: int) -> float:
    start = time.perf_counter()
    llm.generate(as_inputs(prompts), greedy(max_tokens), use_tqdm=False)
    return time.perf_counter() - start


def timed_rounds(engines: dict[str, tuple[LLM, dict]], rounds: int) -> dict[str, dict]:
    """Per engine, the median over `rounds` of its whole batch's generation time (throughput) and of its first
    prompt's time to the first token alone, after a warm-up of each. The engines take turns within each round, in
    reversed order every other round, so that the drift of a shared machine falls on all of them alike."""
    seconds = {name: {"batch": [], "first_token": []} for name in engines}
    for round_index in range(rounds + 1):  # round 0 is the warm-up
        order = list(engines) if round_index % 2 else list(reversed(engines))
        for name in order:
            llm, spec = engines[name]
            batch = batch_seconds(llm, spec["prompts"], spec["max_tokens"])
            first_token = batch_seconds(llm, spec["prompts"][:1], 1)
            if round_index:
                seconds[name]["batch"].append(batch)
                seconds[name]["first_token"].append(first_token)
    timings = {}
    for name, (_, spec) in engines.items():
        batch = statistics.median(seconds[name]["batch"])
        timings[name] = {
            "batch_seconds": batch,
            "output_tokens_per_second": len(spec["prompts"]) * spec["max_tokens"] / batch,
            "time_to_first_token_seconds": statistics.median(seconds[name]["first_token"]),
        }
    return timings


def start(engine: dict, spec: dict) -> tuple[LLM, dict]:
    """An engine for one checkpoint, and its greedy outputs for the run's prompts."""
    started = time.perf_counter()
    llm = LLM(model=spec["model"], dtype=spec["dtype"], model_impl=spec.get("model_impl", "auto"), **engine)
    result = {"start_seconds": time.perf_counter() - started}
    config = llm.llm_engine.model_config
    result["architecture"] = config.architecture
    result["model_impl"] = str(config.model_impl)
    outputs = llm.generate(as_inputs(spec["prompts"]), greedy(spec["max_tokens"], spec.get("prompt_logprobs")),
                           use_tqdm=False)
    result["tokens"] = [list(output.outputs[0].token_ids) for output in outputs]
    if spec.get("prompt_logprobs") is not None:
        result["prompt_logprobs"] = [prompt_logprobs_of(output) for output in outputs]
    return llm, result


def main(job_path: str, results_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    rounds = job.get("timing_rounds", 0)
    results, engines = {}, {}
    for spec in job["runs"]:
        llm, results[spec["name"]] = start(job["engine"], spec)
        with open(results_path, "w") as f:
            json.dump(results, f)
        if rounds:  # kept, to be timed in turns with the others
            engines[spec["name"]] = (llm, spec)
        else:
            del llm
            gc.collect()
    for name, timing in timed_rounds(engines, rounds).items() if rounds else ():
        results[name] |= timing
    with open(results_path, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
