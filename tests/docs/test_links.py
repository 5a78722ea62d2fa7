"""The documentation holds together: every relative link of the README, of `docs/` and of the benchmarks' pages
names a file that exists, and a link to a section names a heading (or an `<a id>`) of that file; and the README
stays a front door, its two commands on its first screen."""

import re
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

PAGES = sorted([REPO_ROOT / "README.md", *(REPO_ROOT / "docs").glob("*.md"), *(REPO_ROOT / "benchmarks").rglob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.MULTILINE)
EXPLICIT_ANCHOR = re.compile(r'<a id="([^"]+)"></a>')
CODE_BLOCK = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
README_LINES = 250
FIRST_SCREEN = 40


def slug(heading: str) -> str:
    """The anchor a Markdown renderer such as GitHub's gives a heading: lower case, punctuation dropped, spaces as
    hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = CODE_BLOCK.sub("", page.read_text())
    return {slug(heading) for heading in HEADING.findall(text)} | set(EXPLICIT_ANCHOR.findall(text))


def broken_links(page: Path) -> list[str]:
    text = CODE_BLOCK.sub("", page.read_text())
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no such section")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO_ROOT)))
def test_every_link_leads_somewhere(page):
    assert not broken_links(page)


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[here](#title) [gone](#nowhere) [file](missing.md) [web](https://example.org)\n")
    assert broken_links(page) == ["#nowhere: no such section", "missing.md: no such file"]


def test_headings_give_the_anchors_a_renderer_does():
    assert slug("One operation per routing point (`fused`)") == "one-operation-per-routing-point-fused"
    assert slug("vLLM on GPUs (0.34)") == "vllm-on-gpus-034"


def test_the_readme_is_a_front_door():
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_LINES, "move detail to a page of docs/ and link to it"
    first_screen = "\n".join(lines[:FIRST_SCREEN])
    assert "make demo" in first_screen and "make test" in first_screen
