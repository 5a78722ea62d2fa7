"""Text for perplexity and routing analysis: a text file, a JSON-lines file or a Hub dataset, as one token
stream."""

from pathlib import Path

import datasets
import torch

from delta_qwen3.errors import CommandError
from delta_qwen3.jsonl import read_json_lines

_FILE_SUFFIXES = (".txt", ".jsonl", ".json")


def _jsonl_texts(path: Path, text_field: str) -> list[str]:
    texts = []
    for number, document in read_json_lines(path):
        if not isinstance(document.get(text_field), str):
            raise CommandError(f"{path} line {number} lacks the text field {text_field!r}")
        texts.append(document[text_field])
    return texts


def _hub_texts(dataset_id: str, config: str | None, split: str, text_field: str) -> list[str]:
    try:
        dataset = datasets.load_dataset(dataset_id, config, split=split)
    except Exception as error:  # the Hub client raises many types for unknown ids, configs and splits
        raise CommandError(f"could not load dataset {dataset_id!r}: {type(error).__name__}: {error}") from error
    if text_field not in dataset.column_names:
        raise CommandError(f"dataset {dataset_id!r} has no field {text_field!r}; it has {dataset.column_names}")
    return dataset[text_field]


def load_texts(
    source: str,
    *,
    text_field: str = "text",
    split: str = "validation",
    config: str | None = None,
    limit: int | None = None,
) -> list[str]:
    """Documents from `source`: a `.txt` file (one document), a `.jsonl` file (one document per line, in
    `text_field`) or a Hub dataset id (`config`, `split`, `text_field`). Empty documents are dropped."""
    path = Path(source)
    if path.is_file():
        texts = _jsonl_texts(path, text_field) if path.suffix in (".jsonl", ".json") else [path.read_text()]
    elif path.suffix in _FILE_SUFFIXES or path.exists():
        raise CommandError(f"data file {path} does not exist or is not a file")
    else:
        texts = _hub_texts(source, config, split, text_field)
    texts = [text for text in texts if text.strip()][:limit]
    if not texts:
        raise CommandError(f"{source} has no non-empty documents")
    return texts


def token_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """All documents' tokens in one 1-D stream, each document followed by the end-of-text token when the tokenizer
    has one, as in packed pre-training."""
    separator = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids = []
    for text in texts:
        ids += tokenizer(text)["input_ids"] + separator
    return torch.tensor(ids, dtype=torch.long)
