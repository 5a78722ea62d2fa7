"""Where a model comes from: a local checkpoint directory or a Hub model id, told apart and checked before anything
is loaded, so that every command says the same thing about a path that does not exist or is not a checkpoint
(rather than the Hub's text about repository ids, or a tokenizer's about sentencepiece).

The commands load a model's configuration and a tokenizer here (`load_model_config`, `load_tokenizer`), and never
run code that a checkpoint ships unless the user passed `--trust-remote-code`: DeltaQwen3 and Qwen3 checkpoints
always load with the installed classes, and a checkpoint of another type whose `auto_map` names Python files of its
own is refused in one line without the flag. Transformers is always given an explicit `trust_remote_code`, so it
never asks on the terminal either.
"""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from huggingface_hub.utils import HFValidationError, validate_repo_id
from safetensors import SafetensorError, safe_open

from .errors import CommandError

CONFIG_NAME = "config.json"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
TOKENIZER_FILE_NAME = "tokenizer.json"
# The tokenizer files that are JSON: each is parsed before the tokenizer loads, so that a broken one is named.
TOKENIZER_JSON_FILES = (TOKENIZER_FILE_NAME, TOKENIZER_CONFIG_NAME, "special_tokens_map.json", "added_tokens.json",
                        "vocab.json")  # fmt: skip
# The model types whose classes this project installs or Transformers itself defines for it: checkpoints of these
# types load with those classes, whatever code they ship.
INSTALLED_MODEL_TYPES = ("delta_qwen3", "qwen3")
TRUST_REMOTE_CODE = "--trust-remote-code"


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


def read_config_fields(src: str | Path, option: str) -> dict:
    """What the `config.json` of model `src` says, read as data (no code runs): a local file is parsed here, naming
    it when it is not a JSON object; a Hub id's file is fetched alone."""
    path = local_directory(src, option)
    if path is not None:
        file = path / CONFIG_NAME
        if not file.is_file():
            raise CommandError(f"{option} {src} is not a checkpoint: it has no {CONFIG_NAME}")
        try:
            fields = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:  # ValueError: not JSON, or not UTF-8
            raise CommandError(f"{option} {src}: {file} is not valid JSON ({error})") from None
    else:
        from transformers import PretrainedConfig

        with loading(f"{option} {src} ({CONFIG_NAME})"):
            fields, _ = PretrainedConfig.get_config_dict(str(src))
    if not isinstance(fields, dict):
        raise CommandError(f"{option} {src}: {CONFIG_NAME} holds a JSON {type(fields).__name__}, not an object of "
                           "configuration fields")  # fmt: skip
    return fields


def shipped_code(auto_map) -> list[str]:
    """The Python files an `auto_map` names (`module.Class`, or `repo--module.Class` for another repository's)."""
    references = []
    for value in (auto_map or {}).values() if isinstance(auto_map, dict) else []:
        references += [value] if isinstance(value, str) else [ref for ref in value or [] if isinstance(ref, str)]
    return sorted({f"{reference.split('--')[-1].rsplit('.', 1)[0]}.py" for reference in references})


def remote_code_allowed(fields: dict, src: str | Path, option: str, trust_remote_code: bool) -> bool:
    """The `trust_remote_code` to give Transformers for the model whose `config.json` says `fields`: False for the
    types the installed classes build (`INSTALLED_MODEL_TYPES`) and for those Transformers knows, whatever code
    the checkpoint ships; for another type whose `auto_map` names code of its own, True only with the user's
    `--trust-remote-code`, and without it a `CommandError` naming the files that would run."""
    from transformers import CONFIG_MAPPING

    model_type = fields.get("model_type")
    if model_type in INSTALLED_MODEL_TYPES or (isinstance(model_type, str) and model_type in CONFIG_MAPPING):
        return False
    code = shipped_code(fields.get("auto_map"))
    if code and not trust_remote_code:
        raise CommandError(
            f"{option} {src} is a {model_type!r} model whose classes are defined by Python code it ships "
            f"({', '.join(code)}, named by auto_map in {CONFIG_NAME}); that code runs only with {TRUST_REMOTE_CODE} "
            "(pass it if you trust the checkpoint)"
        )
    return bool(code) and trust_remote_code


def load_model_config(src: str | Path, option: str, trust_remote_code: bool = False, subject: str | None = None):
    """The configuration of model `src` (Hub id or directory), checked first (`check_model_source`) and loaded with
    the installed classes, or with the checkpoint's own code only as `remote_code_allowed` allows. A loader's
    failure is one line naming `subject` (default: the option and `src`)."""
    from transformers import AutoConfig

    from .model_shapes import check_model_fields

    check_model_source(src, option)
    fields = read_config_fields(src, option)
    trust = remote_code_allowed(fields, src, option, trust_remote_code)
    check_model_fields(fields, f"{option} {src} (its {CONFIG_NAME})")
    with loading(subject or f"{option} {src}"):
        return AutoConfig.from_pretrained(str(src), trust_remote_code=trust)


def check_tokenizer_files(src: str | Path, option: str) -> None:
    """Refuse a local tokenizer whose files cannot be what they claim, naming the file: a JSON file that is not
    JSON, and a `tokenizer.json` that the tokenizers library cannot read."""
    path = local_directory(src, option)
    if path is None:
        return
    for name in TOKENIZER_JSON_FILES:
        file = path / name
        if not file.is_file():
            continue
        try:
            json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise CommandError(f"{option} {src}: the tokenizer file {file} is not valid JSON ({error})") from None
    if (path / TOKENIZER_FILE_NAME).is_file():
        from tokenizers import Tokenizer

        try:
            Tokenizer.from_file(str(path / TOKENIZER_FILE_NAME))
        except Exception as error:  # the tokenizers library raises its own `Exception`s
            reason = " ".join(str(error).split())
            raise CommandError(f"{option} {src}: the tokenizer file {path / TOKENIZER_FILE_NAME} cannot be read as "
                               f"a tokenizer ({reason})") from None  # fmt: skip


def load_tokenizer(src: str | Path, option: str, trust_remote_code: bool = False):
    """The tokenizer of `src` (a tokenizer or model directory, or a Hub id): its files checked first
    (`check_tokenizer_files`); code it ships (an `auto_map` in `tokenizer_config.json`) runs only with
    `trust_remote_code`, and without it a tokenizer that needs its code is refused in one line."""
    from transformers import AutoTokenizer

    check_tokenizer_files(src, option)
    try:
        with loading(f"the tokenizer of {option} {src}"):
            return AutoTokenizer.from_pretrained(str(src), trust_remote_code=trust_remote_code)
    except CommandError as error:
        if not trust_remote_code and "trust_remote_code" in str(error):
            raise CommandError(
                f"{option} {src}: its tokenizer is defined by Python code it ships (auto_map in "
                f"{TOKENIZER_CONFIG_NAME} or {CONFIG_NAME}), which runs only with {TRUST_REMOTE_CODE} (pass it if "
                "you trust the checkpoint)"
            ) from None
        raise


def check_vocabulary(tokenizer, vocab_size: int, tokenizer_subject: str, model_subject: str) -> None:
    """Refuse a tokenizer with more tokens than the model's embedding has rows: its last ids could not be
    embedded, and would fail deep inside PyTorch at the first batch that holds one."""
    if len(tokenizer) > vocab_size:
        raise CommandError(
            f"{tokenizer_subject} has {len(tokenizer)} tokens, more than the {vocab_size} rows of {model_subject}'s "
            "embedding (vocab_size): the ids beyond them cannot be embedded"
        )
