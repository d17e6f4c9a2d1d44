"""Helpers shared by the viewer's tests: the seeded store (``conftest.py``'s ``seeded``), an
HTML parser that collects token spans and diff parts, and a fingerprint of a SQLite file to show a read
left it unchanged."""

from __future__ import annotations

import hashlib
from html.parser import HTMLParser
from pathlib import Path

import sqlalchemy as sa
from view_seed import seed_view_store

from agentmem.testing.tiny_models import tiny_tokenizer
from store.engine import make_engine, open_store
from store.migrations import upgrade


class Collect(HTMLParser):
    """Elements of interest, in document order: token spans per output, diff parts per call."""

    def __init__(self):
        super().__init__()
        self.outputs: list[list[dict]] = []  # per heat-mapped output: its token spans' attributes and text
        self.diffs: list[list[tuple[str, str]]] = []  # per call: (tag, text) of each part
        self._in: list[str] = []
        self._tok: dict | None = None
        self._part: list | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = a.get("class") or ""
        if "tokens" in cls.split():
            self.outputs.append([])
        if tag == "span" and cls == "tok":
            self._tok = {**a, "text": ""}
        if cls == "diff":
            self.diffs.append([])
        if self.diffs and tag in ("ins", "del", "span") and self._tok is None and cls != "tok" and self._part is None \
                and "diff" in self._in:
            self._part = [tag, ""]
        self._in.append(cls)

    def handle_endtag(self, tag):
        if self._in:
            self._in.pop()
        if tag == "span" and self._tok is not None:
            self.outputs[-1].append(self._tok)
            self._tok = None
        elif self._part is not None and tag == self._part[0]:
            self.diffs[-1].append(tuple(self._part))
            self._part = None

    def handle_data(self, data):
        if self._tok is not None:
            self._tok["text"] += data
        if self._part is not None:
            self._part[1] += data


def seed_view(tmp_path_factory):
    """(database URL, what was seeded, tokenizer folder) of the ``seeded`` fixture: the store is written once per
    module, then only read."""
    folder = tmp_path_factory.mktemp("view")
    url = f"sqlite:///{folder / 'view.db'}"
    upgrade(make_engine(url))
    writer = open_store(url)
    tok = tiny_tokenizer()
    tok.save_pretrained(folder / "tok")
    seed = seed_view_store(writer, str(folder / "tok"), lambda text: tok(text)["input_ids"])
    writer.dispose()
    return url, seed, folder


def parse(html: str) -> Collect:
    """The token spans and diff parts of a page."""
    c = Collect()
    c.feed(html)
    return c


def file_state(url: str) -> tuple[dict, dict]:
    """The SHA-256 of a SQLite database's files (WAL and journal included) and the row count of each table."""
    path = Path(url.removeprefix("sqlite:///"))
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in path.parent.glob(path.name + "*")}
    engine = sa.create_engine(f"sqlite:///file:{path}?mode=ro&uri=true")
    with engine.connect() as conn:
        tables = [r[0] for r in conn.exec_driver_sql("select name from sqlite_master where type = 'table'")]
        counts = {t: conn.exec_driver_sql(f'select count(*) from "{t}"').scalar() for t in tables}
    engine.dispose()
    return digests, counts
