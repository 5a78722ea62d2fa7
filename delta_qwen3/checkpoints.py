"""Where a model comes from: a local checkpoint directory or a Hub model id, told apart and checked before anything
is loaded, so that every command says the same thing about a path that does not exist or is not a checkpoint
(rather than the Hub's text about repository ids, or a tokenizer's about sentencepiece)."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from huggingface_hub.utils import HFValidationError, validate_repo_id
from safetensors import SafetensorError, safe_open

from .errors import CommandError

CONFIG_NAME = "config.json"


def looks_like_hub_id(src: str) -> bool:
    """`namespace/name`, the form every Qwen3 repository has; anything else is taken as a local path."""
    if src.count("/") != 1 or src.startswith((".", "~")):
        return False
    try:
        validate_repo_id(src)
    except HFValidationError:
        return False
    return True


def local_directory(src: str | Path, option: str) -> Path | None:
    """The resolved local directory `src` names, or None when it names a Hub model instead; a file, or a path
    that neither exists nor is a Hub id, is refused with `option` (the command-line name of `src`) in the message."""
    path = Path(src).expanduser()
    if path.exists():
        if not path.is_dir():
            raise CommandError(f"{option} {src} is a file, not a checkpoint directory")
        return path.resolve()
    if not looks_like_hub_id(str(src)):
        raise CommandError(f"{option} {src} does not exist (and is not a Hub model id of the form namespace/name)")
    return None


def read_safetensors_header(file: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) of every tensor in a safetensors file, reading only its header. A truncated or
    corrupt file is refused here, naming it, before any weights are read."""
    try:
        with safe_open(file, framework="pt") as f:
            return {name: (f.get_slice(name).get_dtype(), tuple(f.get_slice(name).get_shape())) for name in f.keys()}
    except (SafetensorError, OSError) as error:
        raise CommandError(f"{file} is not a readable safetensors file (corrupt or truncated?): {error}") from None


def check_model_source(src: str | Path, option: str) -> None:
    """Refuse, before loading, a model that cannot load: a missing path that is no Hub id, a file, a directory
    without `config.json`, or one whose safetensors files are truncated or corrupt. Hub ids are left to the
    loader (it downloads them)."""
    path = local_directory(src, option)
    if path is None:
        return
    if not (path / CONFIG_NAME).is_file():
        raise CommandError(f"{option} {src} is not a checkpoint: it has no {CONFIG_NAME}")
    for file in sorted(path.glob("*.safetensors")):
        try:
            read_safetensors_header(file)
        except CommandError as error:
            raise CommandError(f"{option} {src}: {error}") from None


@contextmanager
def loading(subject: str, advice: str = "") -> Iterator[None]:
    """Loaders (Transformers, tokenizers, accelerate, torch) raise OSError, ValueError, KeyError, RuntimeError,
    their own types... for a source they cannot use: one line naming `subject`, the error, and `advice`."""
    try:
        yield
    except Exception as error:
        reason = " ".join(str(error).split())
        raise CommandError(f"could not load {subject}: {type(error).__name__}: {reason}"
                           + (f"; {advice}" if advice else "")) from error  # fmt: skip
