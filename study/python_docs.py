"""The CPU study's corpus: the reStructuredText sources of Python's documentation (Debian's `python3.11-doc`,
`apt-get install python3.11-doc`), one document per file, in an order drawn from a fixed seed so that the held-out
documents (every tenth, from the first) sample the whole manual; and a BPE tokenizer trained on them.

    python -m study.python_docs OUT    ->  OUT/documents.jsonl, OUT/tokenizer/
"""

import argparse
import random
import sys
from pathlib import Path

from delta_qwen3.atomic import staged_directory, write_json_lines
from delta_qwen3.corpus import train_bpe_tokenizer
from delta_qwen3.errors import CommandError
from delta_qwen3.interrupts import run_command
from delta_qwen3.output_paths import reporting_write_failure
from delta_qwen3.texts import open_documents

SOURCES = Path("/usr/share/doc/python3.11/html/_sources")


def prepare(out: Path, sources: Path, vocab_size: int) -> None:
    if not sources.is_dir():
        raise CommandError(f"{sources} does not exist: install Debian's python3.11-doc, or pass --sources")
    texts = [text for text in open_documents(str(sources), option="--sources") if text.strip()]
    random.Random(0).shuffle(texts)
    tokenizer = train_bpe_tokenizer(texts, vocab_size)
    with reporting_write_failure("OUT", out, "what could not be written was not kept"):
        write_json_lines(out / "documents.jsonl", ({"text": text} for text in texts))
        with staged_directory(out / "tokenizer") as staging:
            tokenizer.save_pretrained(staging)
    print(f"{len(texts)} documents, {sum(map(len, texts)) / 1e6:.1f} MB -> {out}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m study.python_docs", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--sources", type=Path, default=SOURCES, help=f"default: {SOURCES}")
    parser.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args(argv)
    return run_command("study.python_docs", lambda: prepare(args.out, args.sources, args.vocab_size))


if __name__ == "__main__":
    sys.exit(main())
