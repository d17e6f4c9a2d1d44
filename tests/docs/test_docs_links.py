"""Every relative link in README.md and docs/*.md names a file that exists and, with ``#anchor``, a heading of
that file (GitHub's anchors: the heading in lower case, punctuation but hyphens dropped, spaces as hyphens)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    out, fenced = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} +(.*)", line)):
            text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda g: g.group(1) or "", m.group(1).strip())
            out.add(re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-"))
    return out


def test_relative_links_and_their_anchors_resolve():
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked here
            name, _, anchor = target.partition("#")
            path = (doc.parent / name).resolve() if name else doc
            if not path.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert broken == []


def test_cited_result_records_exist_and_parse():
    """Each ``bench/results/...json`` record that README.md or a doc cites is a committed JSON file."""
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for rel in sorted(set(re.findall(r"bench/results/[\w./-]+\.json", doc.read_text(encoding="utf-8")))):
            path = ROOT / rel
            if not path.is_file():
                missing.append(f"{doc.name}: {rel}")
            else:
                json.loads(path.read_text(encoding="utf-8"))
    assert missing == []
