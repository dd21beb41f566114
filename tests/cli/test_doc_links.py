"""Every link in README.md and docs/ works from a clone: a file of the repository (and the
heading it names), or a public web page. Nothing outside the repository (such as the
workspace's shared/ folder, which a user's clone does not have) and no local server."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")


def links(path: Path) -> list[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    return _LINK.findall(_CODE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M):
        base = slug(m.group(1))
        anchor, n = base, 1
        while anchor in found:  # GitHub numbers repeated headings
            anchor, n = f"{base}-{n}", n + 1
        found.add(anchor)
    return found


def check(source: Path, target: str) -> str | None:
    """Why ``target`` (a link in ``source``) does not resolve, or None."""
    parts = urlsplit(target)
    if parts.scheme in ("http", "https"):
        host = parts.hostname or ""
        if host in ("localhost", "") or host.endswith((".local", ".internal")):
            return "not a public page"
        try:
            if not ipaddress.ip_address(host).is_global:
                return "not a public address"
        except ValueError:
            pass
        return None if "." in host else "not a public host name"
    if parts.scheme == "mailto":
        return None
    if parts.scheme:
        return f"scheme {parts.scheme!r} is not a page"
    path = unquote(parts.path)
    dest = (source.parent / path).resolve() if path else source
    if not dest.is_relative_to(REPO):
        return "points outside the repository"
    if not dest.exists():
        return "no such file in the repository"
    if parts.fragment and dest.suffix == ".md" and parts.fragment not in anchors(dest):
        return f"no heading #{parts.fragment} in {dest.relative_to(REPO)}"
    return None


def test_the_checker_catches_what_a_clone_lacks() -> None:
    readme = REPO / "README.md"
    assert check(readme, "../shared/seeds/x.txt") == "points outside the repository"
    assert check(readme, "docs/nope.md") == "no such file in the repository"
    assert check(readme, "docs/client.md#no-such-heading")
    assert check(readme, "http://127.0.0.1:4171/") == "not a public address"
    assert check(readme, "https://nsq.io/clients/building_client_libraries.html") is None
    assert slug("Partitions, order, replay, tracing (Youzan's extensions)") == (
        "partitions-order-replay-tracing-youzans-extensions"
    )


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves(doc: Path) -> None:
    broken = [(t, why) for t in links(doc) if (why := check(doc, t)) is not None]
    assert broken == [], f"{doc.relative_to(REPO)}: {broken}"
