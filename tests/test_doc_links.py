"""Links between the project's pages: every relative link names a file that exists, and every #anchor a heading of
its page (GitHub's slugs), so that renaming a file or a heading cannot leave a dead link behind."""
import re
from pathlib import Path

import pytest

from tests.pages import ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").glob("*/README.md"),
                *(ROOT / "results").glob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped (hyphens and underscores kept),
    spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def links(page: Path):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def test_slugs_follow_githubs_rules():
    assert slug("Why softmax does not learn the protocol, and what the short convolution buys") == \
        "why-softmax-does-not-learn-the-protocol-and-what-the-short-convolution-buys"
    assert slug("Why gated-delta sat at the no-recall loss, and `--decay-init long`") == \
        "why-gated-delta-sat-at-the-no-recall-loss-and---decay-init-long"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_between_pages_resolves(page):
    dead = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            dead.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            dead.append(f"{target}: no heading with that anchor in {linked.relative_to(ROOT)}")
    assert not dead, f"{page.relative_to(ROOT)}: " + "; ".join(dead)
