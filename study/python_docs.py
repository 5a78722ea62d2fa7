"""The CPU study's corpus: the reStructuredText sources of Python's documentation (Debian's `python3.11-doc`,
`apt-get install python3.11-doc`), one document per file, written as `study.corpus` writes a corpus (shuffled with
a fixed seed, with a BPE tokenizer trained on them).

    python -m study.python_docs OUT    ->  OUT/documents.jsonl, OUT/tokenizer/
"""

import argparse
import sys
from pathlib import Path

from delta_qwen3.errors import CommandError
from delta_qwen3.interrupts import run_command
from delta_qwen3.texts import open_documents

from .corpus import write_corpus

SOURCES = Path("/usr/share/doc/python3.11/html/_sources")


def prepare(out: Path, sources: Path, vocab_size: int) -> None:
    if not sources.is_dir():
        raise CommandError(f"{sources} does not exist: install Debian's python3.11-doc, or pass --sources")
    write_corpus(out, [text for text in open_documents(str(sources), option="--sources") if text.strip()], vocab_size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m study.python_docs", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--sources", type=Path, default=SOURCES, help=f"default: {SOURCES}")
    parser.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args(argv)
    return run_command("study.python_docs", lambda: prepare(args.out, args.sources, args.vocab_size))


if __name__ == "__main__":
    sys.exit(main())
