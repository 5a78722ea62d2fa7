"""Publish a DeltaQwen3 checkpoint directory (converted or fine-tuned) to the Hugging Face Hub."""

import json
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
from huggingface_hub import CommitOperationAdd, HfApi
from huggingface_hub.utils import HFValidationError, filter_repo_objects, validate_repo_id
from transformers.dynamic_module_utils import get_relative_imports

from delta_qwen3.checkpoints import loading
from delta_qwen3.errors import CommandError
from modeling_delta_qwen3 import DeltaQwen3Config

from .model_card import build_model_card

# Never published: staging leftovers and caches.
IGNORE_PATTERNS = [".*", "**/.*", "__pycache__", "**/__pycache__/**", "*.pyc"]
CARD_NAME = "README.md"


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
    with loading(f"DIR {directory}"):  # a config.json edited by hand may be anything
        fields = json.loads(config_file.read_text())
    model_type = fields.get("model_type") if isinstance(fields, dict) else None
    if model_type != DeltaQwen3Config.model_type:
        hint = " (convert it first with `delta-qwen3 convert`)" if model_type == "qwen3" else ""
        raise CommandError(f"DIR {directory} has model_type {model_type!r}, not 'delta_qwen3'{hint}")
    if not any(directory.glob("*.safetensors")):
        raise CommandError(f"DIR {directory} has no safetensors weights")
    with loading(f"DIR {directory}"):
        config = DeltaQwen3Config.from_pretrained(directory)
    missing = missing_model_code(directory, config.auto_map) if config.auto_map else ["auto_map in config.json"]
    if missing:
        raise CommandError(f"DIR {directory} lacks the model code for trust_remote_code ({', '.join(missing)})")
    return config


def check_publishable(repo_id: str, option: str, token: str | None = None) -> None:
    """Refuse, before a long conversion or training run, a publication that cannot happen at its end: a repository
    id that is not `namespace/name`, the Hub switched off (`HF_HUB_OFFLINE`), or no token to publish with."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise CommandError(f"{option} {repo_id} is not a Hub repository id of the form namespace/name ({error})") \
            from None
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        raise CommandError(f"{option} {repo_id}: HF_HUB_OFFLINE is set, so nothing can be published; unset it, or "
                           "publish later with `delta-qwen3 push`")  # fmt: skip
    if (token or huggingface_hub.get_token()) is None:
        raise CommandError(f"{option} {repo_id} needs a Hub token to publish with: log in with `hf auth login`, set "
                           "HF_TOKEN, or pass --token where the command has it")  # fmt: skip


def folder_operations(directory: Path, card: str | None = None) -> list[CommitOperationAdd]:
    """One upload operation per file of `directory` (without `IGNORE_PATTERNS`), plus `card` as its `README.md`
    when given: the card is uploaded from memory, so the directory is never written to."""
    files = sorted(path.relative_to(directory).as_posix() for path in directory.rglob("*") if path.is_file())
    kept = filter_repo_objects(files, ignore_patterns=IGNORE_PATTERNS if card is None else [*IGNORE_PATTERNS, CARD_NAME])
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=directory / name) for name in kept]
    if card is not None:
        operations.append(CommitOperationAdd(path_in_repo=CARD_NAME, path_or_fileobj=card.encode()))
    return operations


def upload_folder(directory: Path, repo_id: str, *, private: bool = False, token: str | None = None,
                  card: str | None = None, commit_message: str = "Upload DeltaQwen3 checkpoint") -> str:
    """Upload `directory` (and `card`, see `folder_operations`) to the Hub model repository `repo_id`, created if
    needed, in one commit; return the commit URL. Any failure at the Hub is a `CommandError` naming both."""
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        commit = api.create_commit(repo_id, folder_operations(directory, card), commit_message=commit_message,
                                   repo_type="model")
    except Exception as error:  # the network boundary: authentication, permissions, connectivity
        raise CommandError(f"could not publish {directory} to {repo_id}: {error}")
    return commit.commit_url


def push_to_hub(
    directory: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    token: str | None = None,
    base_model: str | None = None,
) -> str:
    """Upload the DeltaQwen3 checkpoint `directory` to the Hub model repository `repo_id` (created if needed) and
    return the commit URL. A directory without a `README.md` is published with a model card (naming `base_model`
    if given), which is not written into `directory`; an existing card is published as it is."""
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise CommandError(f"DIR {directory} is not a directory")
    config = check_delta_checkpoint(directory)
    card = None
    if not (directory / CARD_NAME).exists():
        description = f"A DeltaQwen3 checkpoint{f' derived from `{base_model}`' if base_model else ''}."
        card = str(build_model_card(config, model_id=repo_id, description=description, base_model=base_model))
    return upload_folder(directory, repo_id, private=private, token=token, card=card)
