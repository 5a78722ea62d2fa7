"""Publish a DeltaQwen3 checkpoint directory (converted or fine-tuned) to the Hugging Face Hub."""

import json
from pathlib import Path

from huggingface_hub import HfApi
from transformers.dynamic_module_utils import get_relative_imports

from delta_qwen3.errors import CommandError
from modeling_delta_qwen3 import DeltaQwen3Config

from .model_card import write_model_card

# Never published: staging leftovers and caches.
IGNORE_PATTERNS = [".*", "**/.*", "__pycache__", "**/__pycache__/**", "*.pyc"]


def missing_model_code(directory: Path, auto_map: dict) -> list[str]:
    """The Python files that `auto_map` names, or that those import relatively, which `directory` lacks."""
    pending = [f"{reference.split('.')[0]}.py" for reference in auto_map.values()]
    seen, missing = set(), []
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if (directory / name).is_file():
            pending += [f"{module}.py" for module in get_relative_imports(directory / name)]
        else:
            missing.append(name)
    return sorted(missing)


def check_delta_checkpoint(directory: Path) -> DeltaQwen3Config:
    """The config of the DeltaQwen3 checkpoint in `directory`, refusing anything that would not load from the Hub
    with `trust_remote_code=True`: another model type, no safetensors weights, missing model code."""
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise CommandError(f"DIR {directory} is not a checkpoint: it has no config.json")
    model_type = json.loads(config_file.read_text()).get("model_type")
    if model_type != DeltaQwen3Config.model_type:
        hint = " (convert it first with `delta-qwen3 convert`)" if model_type == "qwen3" else ""
        raise CommandError(f"DIR {directory} has model_type {model_type!r}, not 'delta_qwen3'{hint}")
    if not any(directory.glob("*.safetensors")):
        raise CommandError(f"DIR {directory} has no safetensors weights")
    config = DeltaQwen3Config.from_pretrained(directory)
    missing = missing_model_code(directory, config.auto_map) if config.auto_map else ["auto_map in config.json"]
    if missing:
        raise CommandError(f"DIR {directory} lacks the model code for trust_remote_code ({', '.join(missing)})")
    return config


def push_to_hub(
    directory: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    token: str | None = None,
    base_model: str | None = None,
) -> str:
    """Upload the DeltaQwen3 checkpoint `directory` to the Hub model repository `repo_id` (created if needed) and
    return the commit URL. A directory without a `README.md` first gets a model card (naming `base_model` if
    given); an existing card is published as it is."""
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise CommandError(f"DIR {directory} is not a directory")
    config = check_delta_checkpoint(directory)
    if not (directory / "README.md").exists():
        description = f"A DeltaQwen3 checkpoint{f' derived from `{base_model}`' if base_model else ''}."
        write_model_card(directory, config, model_id=repo_id, description=description, base_model=base_model)
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=directory,
            repo_type="model",
            commit_message="Upload DeltaQwen3 checkpoint",
            ignore_patterns=IGNORE_PATTERNS,
        )
    except Exception as error:  # the network boundary: authentication, permissions, connectivity
        raise CommandError(f"could not publish {directory} to {repo_id}: {error}")
    return commit.commit_url
