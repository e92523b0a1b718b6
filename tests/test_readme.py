"""The README stays a front door (issue 30): at most 250 lines, and every link in it leads
somewhere: a file of the repository and, for a link with #anchor, a heading of that file
whose GitHub anchor it is."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 250
LINK = re.compile(r"\]\(([^)\s]+)\)")


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but - and _ dropped,
    spaces as -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.*)", line)):
            out.add(github_anchor(m.group(1)))
    return out


def local_links(text: str) -> list[str]:
    return [u for u in LINK.findall(text) if not re.match(r"[a-z]+://", u)]


def test_github_anchor_reads_headings_as_github_does():
    assert github_anchor("Many prompts: generate_many, stream_many") == "many-prompts-generate_many-stream_many"
    assert github_anchor("The block against its peers (float32, 2 cores)") == \
        "the-block-against-its-peers-float32-2-cores"
    assert local_links("[a](docs/x.md#y) [b](https://e.org) ![c](docs/demo.png)") == ["docs/x.md#y", "docs/demo.png"]


def test_readme_is_at_most_250_lines():
    n = len(README.read_text().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines, the bound is {MAX_LINES}: move detail to docs/"


def test_every_readme_link_leads_somewhere():
    broken = []
    for link in local_links(README.read_text()):
        path, _, anchor = link.partition("#")
        target = ROOT / path
        if not target.exists():
            broken.append(f"{link}: no file {path}")
        elif anchor and anchor not in anchors(target):
            broken.append(f"{link}: no heading of {path} has the anchor #{anchor}")
    assert not broken, "README links that lead nowhere:\n" + "\n".join(broken)
