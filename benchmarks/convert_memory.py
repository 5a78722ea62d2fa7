"""Peak resident memory of `delta-qwen3 convert` on a synthetic sharded Qwen3 checkpoint.

The conversion streams shard by shard, so its peak should track the largest shard, not the model. This writes a
random Qwen3 checkpoint of several hundred MB in shards (one tensor at a time, never the whole model), converts it
in a fresh process, and reports that process's peak RSS beside its RSS after the imports (torch, Transformers).

    python benchmarks/convert_memory.py [--layers 8] [--hidden 1024] [--shard-mb 100]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

REPO_ROOT = Path(__file__).resolve().parents[1]
MB = 2**20

# Run in a fresh interpreter so that its peak is the conversion's alone. Linux's VmHWM (peak RSS, KiB) belongs to
# the process image; getrusage's ru_maxrss would carry over this parent's peak across fork and exec.
CHILD = """
import json, sys
def status(field):
    return int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith(field + ":")))
from conversion import convert
after_imports_kib = status("VmRSS")
convert(sys.argv[1], sys.argv[2], mode="delta_block")
print(json.dumps(dict(after_imports_kib=after_imports_kib, peak_kib=status("VmHWM"))))
"""


def synthetic_config(layers: int, hidden: int) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=32000, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=hidden // 128, head_dim=64, tie_word_embeddings=False,
    )


def write_synthetic_checkpoint(path: Path, config: Qwen3Config, shard_bytes: int) -> list[int]:
    """Random float32 weights in shards of at most `shard_bytes` (a larger tensor gets a shard of its own), written
    tensor by tensor from the shapes of a meta-device model. Returns the shard sizes in bytes."""
    with torch.device("meta"):
        shapes = {name: p.shape for name, p in Qwen3ForCausalLM(config).state_dict().items()}
    groups: list[list[str]] = [[]]
    sizes = [0]
    for name, shape in shapes.items():
        nbytes = shape.numel() * 4
        if groups[-1] and sizes[-1] + nbytes > shard_bytes:
            groups.append([])
            sizes.append(0)
        groups[-1].append(name)
        sizes[-1] += nbytes
    path.mkdir(parents=True)
    weight_map = {}
    for number, names in enumerate(groups, start=1):
        file = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        save_file({name: torch.randn(shapes[name]) * 0.02 for name in names}, path / file, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(names, file)
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    config.save_pretrained(path)
    return sizes


def peak_rss(src: str, out: str) -> dict:
    result = subprocess.run([sys.executable, "-c", CHILD, src, out], cwd=REPO_ROOT, capture_output=True, text=True,
                            check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--shard-mb", type=int, default=100, help="largest shard size of the synthetic checkpoint")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        src, out = Path(workdir) / "qwen3", Path(workdir) / "delta"
        sizes = write_synthetic_checkpoint(src, synthetic_config(args.layers, args.hidden), args.shard_mb * MB)
        rss = peak_rss(str(src), str(out))
    report = {
        "model_mb": round(sum(sizes) / MB),
        "shards": len(sizes),
        "largest_shard_mb": round(max(sizes) / MB),
        "rss_after_imports_mb": round(rss["after_imports_kib"] / 1024),
        "peak_rss_mb": round(rss["peak_kib"] / 1024),
        "peak_above_imports_mb": round((rss["peak_kib"] - rss["after_imports_kib"]) / 1024),
    }
    for key, value in report.items():
        print(f"{key:>30}: {value}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
