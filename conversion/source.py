"""The source of a conversion: a local Qwen3 checkpoint directory or a Hub model id, checked before anything is
written. Only headers are read here; tensors are streamed later, shard by shard."""

import json
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub

from delta_qwen3.checkpoints import check_tokenizer_files, local_directory, read_safetensors_header
from delta_qwen3.errors import CommandError

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
# Files carried unchanged from the source into the converted checkpoint.
CARRIED_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "LICENSE",
    "LICENSE.txt",
    "NOTICE",
)
# What a Hub download fetches: the weights, the config, the carried files, the card (for its license). Nothing else:
# some repositories also hold pickled or GGUF weights of many gigabytes.
DOWNLOAD_PATTERNS = ["config.json", "*.safetensors", WEIGHTS_INDEX_NAME, "README.md", *CARRIED_FILES]
FLOAT_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


@dataclass(frozen=True)
class SourceCheckpoint:
    """A validated Qwen3 checkpoint on local disk.

    `shards` maps each safetensors file name to its tensors, name -> (safetensors dtype, shape), in file order.
    `repo_id` is the Hub id it was downloaded from, or None for a local directory.
    """

    path: Path
    config: dict
    shards: dict[str, dict[str, tuple[str, tuple[int, ...]]]]
    sharded: bool
    repo_id: str | None = None

    @property
    def tensors(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Every tensor of the checkpoint, name -> (dtype, shape)."""
        return {name: info for shard in self.shards.values() for name, info in shard.items()}

    @property
    def dtype(self) -> str:
        """The torch name of the dtype the weights are stored in (that of the embedding)."""
        return FLOAT_DTYPES[self.tensors["model.embed_tokens.weight"][0]]


def resolve_source(src: str | Path, revision: str | None = None, token: str | None = None,
                   cache_dir: str | Path | None = None) -> tuple[Path, str | None]:
    """The local directory of `src` and, when it is a Hub id, that id. Hub ids are downloaded (or found in the
    cache) by `huggingface_hub.snapshot_download`, which honours `HF_HUB_OFFLINE`, `HF_HOME` and `HF_TOKEN`."""
    path = local_directory(src, "SRC")
    if path is not None:
        return path, None
    try:
        local = huggingface_hub.snapshot_download(
            repo_id=str(src), revision=revision, token=token, cache_dir=cache_dir, allow_patterns=DOWNLOAD_PATTERNS
        )
    except Exception as error:  # the network boundary: any failure there is bad input for the command
        raise CommandError(f"SRC {src} is not a local directory and could not be fetched from the Hub: {error}")
    return Path(local).resolve(), str(src)


def read_qwen3_config(path: Path) -> dict:
    """`config.json` of a dense, unquantised Qwen3 checkpoint; anything else is refused with its reason."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CommandError(f"SRC {path} is not a checkpoint: it has no config.json")
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CommandError(f"SRC {path}: config.json is not valid JSON ({error})")
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type == "qwen3_moe":
        raise CommandError(
            f"SRC {path} is a Qwen3-MoE checkpoint (model_type 'qwen3_moe'): mixture-of-experts is a different "
            "architecture; only dense Qwen3 (model_type 'qwen3') can be converted"
        )
    if model_type == "delta_qwen3":
        raise CommandError(f"SRC {path} is already a DeltaQwen3 checkpoint (model_type 'delta_qwen3')")
    if model_type != "qwen3":
        raise CommandError(
            f"SRC {path} has model_type {model_type!r}; only Qwen3 (model_type 'qwen3') can be converted"
        )
    quantization = config.get("quantization_config")
    if quantization is not None:  # a null one, as some tools write, says the checkpoint is not quantised
        method = quantization.get("quant_method", "unknown") if isinstance(quantization, dict) else "unknown"
        raise CommandError(f"SRC {path} is quantised ({method}); convert the unquantised checkpoint")
    return config


def shard_files(path: Path) -> tuple[list[str], bool]:
    """The safetensors files holding the weights, and whether the checkpoint is sharded (has an index)."""
    index_file = path / WEIGHTS_INDEX_NAME
    if index_file.is_file():
        try:
            weight_map = json.loads(index_file.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as error:  # ValueError: not JSON, or not UTF-8
            raise CommandError(f"SRC {path}: {WEIGHTS_INDEX_NAME} is not a valid index ({error!r})")
        if not isinstance(weight_map, dict) or not all(isinstance(name, str) for name in weight_map.values()):
            raise CommandError(f"SRC {path}: {WEIGHTS_INDEX_NAME} is not a valid index (its weight_map is not an "
                               "object of tensor names to file names)")  # fmt: skip
        files = list(dict.fromkeys(weight_map.values()))
        missing = [name for name in files if not (path / name).is_file()]
        if missing:
            raise CommandError(f"SRC {path}: {WEIGHTS_INDEX_NAME} names missing shard(s) {', '.join(missing)}")
        return files, True
    if (path / WEIGHTS_NAME).is_file():
        return [WEIGHTS_NAME], False
    others = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
    found = f" (found {', '.join(others)}; only safetensors weights are read)" if others else ""
    raise CommandError(f"SRC {path} is not a checkpoint: it has no {WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME}{found}")


def open_source(src: str | Path, revision: str | None = None, token: str | None = None,
                cache_dir: str | Path | None = None) -> SourceCheckpoint:
    """Resolve `src`, check that it is a Qwen3 checkpoint and read the headers of all its shards. Its tokenizer
    files, carried into the output unchanged, are checked too: a broken one is named now, not by the first load of
    the converted checkpoint."""
    path, repo_id = resolve_source(src, revision, token, cache_dir)
    config = read_qwen3_config(path)
    check_tokenizer_files(path, "SRC")
    files, sharded = shard_files(path)
    shards = {name: read_safetensors_header(path / name) for name in files}
    for name, shard in shards.items():
        odd = sorted({dtype for dtype, _ in shard.values()} - FLOAT_DTYPES.keys())
        if odd:
            raise CommandError(f"{path / name} holds {', '.join(odd)} tensors; only float32/float16/bfloat16 weights "
                               "can be converted")
    source = SourceCheckpoint(path=path, config=config, shards=shards, sharded=sharded, repo_id=repo_id)
    if "model.embed_tokens.weight" not in source.tensors:
        raise CommandError(f"SRC {path} is not a Qwen3 checkpoint: it has no model.embed_tokens.weight")
    return source
