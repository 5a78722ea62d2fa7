"""A study's corpus on disk, as `study.python_docs` and `study.debian_docs` write it: the documents in an order
drawn from a fixed seed, so that the held-out documents (every tenth, from the first) sample the whole of it, and a
BPE tokenizer trained on them.

    OUT/documents.jsonl, OUT/tokenizer/[, OUT/manifest.json]
"""

import random
import sys
from pathlib import Path

from delta_qwen3.atomic import staged_directory, write_json, write_json_lines
from delta_qwen3.corpus import train_bpe_tokenizer
from delta_qwen3.output_paths import reporting_write_failure


def write_corpus(out: Path, texts: list[str], vocab_size: int, manifest: dict | None = None) -> None:
    """Shuffle `texts` in place (seed 0), train the tokenizer, write both, and the manifest last, if given: a
    manifest stands for a corpus that was written whole."""
    random.Random(0).shuffle(texts)
    tokenizer = train_bpe_tokenizer(texts, vocab_size)
    with reporting_write_failure("OUT", out, "what could not be written was not kept"):
        write_json_lines(out / "documents.jsonl", ({"text": text} for text in texts))
        with staged_directory(out / "tokenizer") as staging:
            tokenizer.save_pretrained(staging)
        if manifest is not None:
            write_json(out / "manifest.json", manifest)
    print(f"{len(texts)} documents, {sum(map(len, texts)) / 1e6:.1f} MB -> {out}", file=sys.stderr)
