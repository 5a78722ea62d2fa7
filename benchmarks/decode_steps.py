"""What routing adds to each decoding step: DeltaQwen3 against Hugging Face's `Qwen3ForCausalLM`, token by token.

`routing_overhead.py` times whole generations, one model after the other; on a shared machine its decoding ratio
moves by several percent from run to run. Here both models share their common weights (so only routing differs)
and each keeps its own KV cache, and their decoding steps alternate, one token each, so that each pair of steps
sees the same machine; the prompt's forward passes alternate likewise. Reported, as medians over those pairs: the
milliseconds the variant adds to the prompt's forward pass and to a decoding step, and the ratio of Qwen3's step
time to the variant's. CPU, float32.

    python benchmarks/decode_steps.py                       # Delta AttnRes and Delta Block at the Qwen3-0.6B shape
    python benchmarks/decode_steps.py --modes delta --steps 100
"""

import argparse
import statistics
import time
from types import SimpleNamespace

import torch
from transformers import DynamicCache

from modeling_delta_qwen3.modeling_delta_qwen3 import CACHE_NAME

# Run as a script: this folder is on the path.
from routing_overhead import QWEN3_06B, SMALL, _share_base_weights, build, keep_freed_memory


PROMPT_REPEATS = 7


def _timed(model: torch.nn.Module, **inputs) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    logits = model(**inputs, use_cache=True, logits_to_keep=1).logits
    return time.perf_counter() - start, logits[:, -1:].argmax(-1)


def compare(mode: str, shape: dict, prompt_length: int, steps: int) -> dict:
    """Milliseconds the variant adds to the prompt's forward pass and to the median decoding step, and the ratios."""
    settings = SimpleNamespace(device="cpu", dtype=torch.float32)
    models = {"qwen3": build(shape, None, False, settings).eval(), mode: build(shape, mode, False, settings).eval()}
    _share_base_weights(*models.values())
    prompt = torch.randint(0, shape["vocab_size"], (1, prompt_length))
    prefill, step_times, state = {name: [] for name in models}, {name: [] for name in models}, {}
    with torch.no_grad():
        for repeat in range(PROMPT_REPEATS):
            for name, model in list(models.items())[:: 1 if repeat % 2 else -1]:
                cache = DynamicCache(config=model.config)
                seconds, token = _timed(model, input_ids=prompt, **{CACHE_NAME: cache})
                prefill[name].append(seconds)
                state[name] = (cache, token)
        for step in range(steps):
            for name in list(models)[:: 1 if step % 2 else -1]:
                cache, token = state[name]
                position = torch.tensor([[prompt_length + step]])
                seconds, token = _timed(models[name], input_ids=token, position_ids=position, **{CACHE_NAME: cache})
                step_times[name].append(seconds)
                state[name] = (cache, token)
    pairs = list(zip(step_times["qwen3"], step_times[mode]))
    return {
        "prompt_ms_more": 1000 * statistics.median(v - q for q, v in zip(prefill["qwen3"], prefill[mode])),
        "step_ms_more": 1000 * statistics.median(variant - qwen3 for qwen3, variant in pairs),
        "step_ratio": statistics.median(qwen3 / variant for qwen3, variant in pairs),
        "qwen3_step_ms": 1000 * statistics.median(step_times["qwen3"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="delta,delta_block")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--shape", default="qwen3-0.6b", choices=["qwen3-0.6b", "small"])
    args = parser.parse_args(argv)
    keep_freed_memory()
    shape = QWEN3_06B if args.shape == "qwen3-0.6b" else {**SMALL, "num_hidden_layers": 4}
    for mode in args.modes.split(","):
        result = compare(mode, shape, args.prompt, args.steps)
        print(
            f"{mode}: prompt +{result['prompt_ms_more']:.1f} ms, step +{result['step_ms_more']:.1f} ms "
            f"(Qwen3 {result['qwen3_step_ms']:.1f} ms), step ratio {result['step_ratio']:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
