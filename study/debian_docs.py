"""The GPU study's corpus: the documentation that several Debian packages ship (HTML pages as their text, POD and
plain text as they are), one document per file, written as `study.corpus` writes a corpus, with a manifest of what
it took: each package's version, the bytes of its .deb and of its text.

    python -m study.debian_docs OUT    ->  OUT/documents.jsonl, OUT/tokenizer/, OUT/manifest.json

The packages are fetched with `apt-get download` into a temporary directory (Debian 12's names; run `apt-get update`
first), or read from --debs DIR, where their .deb files were put before. Nothing is installed. The same package
versions give the same documents, byte for byte.
"""

import argparse
import hashlib
import html.parser
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tqdm.auto import tqdm

from delta_qwen3.errors import CommandError
from delta_qwen3.interrupts import run_command

from .corpus import write_corpus

# The documentation of seven packages (README.md's depth study on a GPU says how much text; DIR/manifest.json
# records each package's bytes). One format per package, so that no page is read twice (git-doc ships each page as
# HTML and as text; nodejs-doc its API as HTML and as Markdown).
PACKAGES = ("cppreference-doc-en-html=.html", "libboost1.74-doc=.html", "perl-doc=.pod", "postgresql-doc-15=.html",
            "python-django-doc=.html", "nodejs-doc=.html", "git-doc=.txt")  # fmt: skip
SKIPPED_ELEMENTS = {"script", "style"}  # code and styling, not text
# Elements that a browser shows on lines of their own: the text's line breaks.
BLOCK_ELEMENTS = {"address", "article", "aside", "blockquote", "br", "caption", "dd", "div", "dl", "dt", "figcaption",
                  "figure", "footer", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "li", "main", "nav", "ol",
                  "p", "pre", "section", "table", "td", "th", "title", "tr", "ul"}  # fmt: skip


class _PageText(html.parser.HTMLParser):
    """The text of an HTML page as a browser lays it out: character data outside scripts and styles, entities
    resolved, runs of white space as one space (the markup's indentation is not text) except in `<pre>`, and a line
    break around each block element."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.open = {"skipped": 0, "pre": 0}  # nesting depths (unbalanced markup never takes them below 0)

    def handle_starttag(self, tag, attrs):
        self._element(tag, 1)

    def handle_endtag(self, tag):
        self._element(tag, -1)

    def _element(self, tag: str, step: int) -> None:
        kind = "skipped" if tag in SKIPPED_ELEMENTS else "pre" if tag == "pre" else None
        if kind:
            self.open[kind] = max(0, self.open[kind] + step)
        if tag in BLOCK_ELEMENTS:
            self.parts.append("\n")

    def handle_data(self, data):
        if self.open["skipped"]:
            return
        if not self.open["pre"]:
            data = re.sub(r"\s+", " ", data)
            if not self.parts or self.parts[-1].endswith("\n"):
                data = data.lstrip()
        if data:  # an empty part would hide the line break before it from the next one
            self.parts.append(data)


def html_text(page: str) -> str:
    """`page`'s text (`_PageText`), lines stripped of trailing space and runs of blank lines cut to one."""
    parser = _PageText()
    parser.feed(page)
    parser.close()
    lines = "\n".join(line.rstrip() for line in "".join(parser.parts).splitlines())
    return re.sub(r"\n{3,}", "\n\n", lines).strip()


def package_spec(spec: str) -> tuple[str, str]:
    """NAME=SUFFIX -> (name, suffix): the package, and how its documentation files end."""
    name, _, suffix = spec.partition("=")
    if not name or not suffix.startswith(".") or len(suffix) < 2:
        raise argparse.ArgumentTypeError(f"{spec!r} is not NAME=SUFFIX (e.g. perl-doc=.pod)")
    return name, suffix


def download(names: list[str], directory: Path) -> None:
    """`apt-get download` the packages into `directory`."""
    try:
        done = subprocess.run(["apt-get", "download", *names], cwd=directory, capture_output=True, text=True)
    except FileNotFoundError:
        raise CommandError("apt-get is not installed: on another system, put the .deb files in a directory and "
                           "pass --debs") from None  # fmt: skip
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("E:")] or done.stderr.splitlines()
        raise CommandError(f"apt-get download failed: {errors[-1] if errors else done.returncode} (run apt-get "
                           "update first; --packages names others)")  # fmt: skip


def find_deb(directory: Path, name: str) -> Path:
    """The one .deb of package `name` in `directory` (apt-get names them NAME_VERSION_ARCH.deb)."""
    found = sorted(directory.glob(f"{name}_*.deb"))
    if len(found) != 1:
        raise CommandError(f"--debs {directory} has {len(found)} .deb files of {name} ({name}_*.deb), not one")
    return found[0]


def deb_documents(deb: Path, suffix: str) -> tuple[str, list[str]]:
    """The package's version, and the text of each file of it whose name ends with `suffix`, in the archive's order
    (fixed for a given .deb), empty ones left out."""
    try:
        version = subprocess.run(["dpkg-deb", "--field", str(deb), "Version"], capture_output=True, text=True,
                                 check=True).stdout.strip()  # fmt: skip
        listing = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    except FileNotFoundError:
        raise CommandError("dpkg-deb is not installed (Debian's dpkg reads .deb files)") from None
    except subprocess.CalledProcessError as error:
        raise CommandError(f"{deb} is not a Debian package: {error.stderr.strip()}") from None
    texts = []
    try:
        with listing, tarfile.open(fileobj=listing.stdout, mode="r|") as archive:
            for member in archive:
                if member.isfile() and member.name.endswith(suffix):
                    text = archive.extractfile(member).read().decode("utf-8", errors="replace")
                    text = html_text(text) if suffix in (".html", ".htm") else text.strip()
                    if text:
                        texts.append(text)
    except tarfile.TarError as error:
        raise CommandError(f"dpkg-deb could not read {deb}: {error}") from None
    if listing.returncode != 0:
        raise CommandError(f"dpkg-deb could not read {deb}")
    return version, texts


def collect(packages: list[tuple[str, str]], debs: Path) -> tuple[list[str], list[dict]]:
    """Every package's documents, in the order of `packages`, and what each gave (the manifest's entries, also
    logged as JSON lines)."""
    texts, entries = [], []
    for name, suffix in tqdm(packages, desc="packages", unit="package"):
        deb = find_deb(debs, name)
        version, documents = deb_documents(deb, suffix)
        if not documents:
            raise CommandError(f"{deb.name} has no text in files ending with {suffix}")
        entry = {"package": name, "version": version, "suffix": suffix, "deb": deb.name,
                 "deb_bytes": deb.stat().st_size, "deb_sha256": hashlib.sha256(deb.read_bytes()).hexdigest(),
                 "documents": len(documents), "text_bytes": sum(len(text.encode()) for text in documents)}  # fmt: skip
        tqdm.write(json.dumps(entry), file=sys.stderr)
        texts += documents
        entries.append(entry)
    return texts, entries


def prepare(out: Path, packages: list[tuple[str, str]], debs: Path | None, vocab_size: int) -> None:
    with tempfile.TemporaryDirectory(prefix="debian-docs-") as temporary:
        if debs is None:
            debs = Path(temporary)
            download([name for name, _ in packages], debs)
        elif not debs.is_dir():
            raise CommandError(f"--debs {debs} is not a directory")
        texts, entries = collect(packages, debs)
    manifest = {"packages": entries, "documents": len(texts),
                "text_bytes": sum(entry["text_bytes"] for entry in entries), "vocab_size": vocab_size}  # fmt: skip
    write_corpus(out, texts, vocab_size, manifest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m study.debian_docs", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--packages", nargs="+", type=package_spec, default=[package_spec(p) for p in PACKAGES],
                        metavar="NAME=SUFFIX", help=f"default: {' '.join(PACKAGES)}")  # fmt: skip
    parser.add_argument("--debs", type=Path, default=None,
                        help="directory of the packages' .deb files (default: apt-get download them)")  # fmt: skip
    parser.add_argument("--vocab-size", type=int, default=8192)
    args = parser.parse_args(argv)
    return run_command("study.debian_docs", lambda: prepare(args.out, args.packages, args.debs, args.vocab_size))


if __name__ == "__main__":
    sys.exit(main())
