"""Real English text that is on every machine (Python's own documentation), a tokenizer trained on it, and a Qwen3
shape small enough to pre-train on it.

Used by the demo, the GPU check's learning section and the tests, so that nothing needs the network.
"""

import random
from pathlib import Path

from pydoc_data.topics import topics
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from .atomic import write_json_lines
from .jsonl import json_text, read_json_lines

SPECIAL_TOKENS = {"bos_token": "<|bos|>", "eos_token": "<|endoftext|>", "pad_token": "<|pad|>", "unk_token": "<|unk|>"}
# A Qwen3 shape small enough to pre-train on a CPU on `split_python_docs`' pre-training split, and its tokenizer's
# vocabulary: the demo's base model, and the model the GPU check's learning section pre-trains.
SMALL_BASE_CONFIG = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)
SMALL_VOCAB_SIZE = 2048


def python_docs_texts() -> list[str]:
    """The help topics of Python's documentation, one document each, in a fixed order."""
    return [topics[key].strip() for key in sorted(topics)]


def train_bpe_tokenizer(texts: list[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `texts`, as an ordinary Transformers tokenizer."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL_TOKENS)


def split_python_docs(out: Path) -> dict[str, Path]:
    """Python's documentation, split by document: pre-training, fine-tuning (held out from pre-training) and
    validation (held out from both), each written to `out`/data/NAME.jsonl, one document a line."""
    texts = python_docs_texts()
    random.Random(0).shuffle(texts)
    n = len(texts)
    parts = {"pretrain": texts[: n // 2], "finetune": texts[n // 2 : 4 * n // 5], "validation": texts[4 * n // 5 :]}
    return {
        name: write_json_lines(out / "data" / f"{name}.jsonl", ({"text": text} for text in part))
        for name, part in parts.items()
    }


def pretraining_inputs(out: Path, pretrain: Path, model_config: dict, vocab_size: int = SMALL_VOCAB_SIZE
                       ) -> tuple[Path, Path]:
    """What `finetune --from-scratch` takes as --tokenizer and --model-config: a byte-level BPE tokenizer trained on
    the documents of `pretrain` (JSON lines), saved in `out`/tokenizer, and `model_config` in
    `out`/base-config.json."""
    tokenizer_dir = out / "tokenizer"
    texts = [document["text"] for _, document in read_json_lines(pretrain)]
    train_bpe_tokenizer(texts, vocab_size).save_pretrained(tokenizer_dir)
    config_file = out / "base-config.json"
    config_file.write_text(json_text(model_config))
    return tokenizer_dir, config_file
