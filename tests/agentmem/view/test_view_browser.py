"""`agentmem view` in a real browser: the CLI serves a seeded store on 127.0.0.1, headless Chromium loads
each page, and the DOM it builds has one heat-map element per action token with the stored value, the exact
memory diff, a 404 page for an unknown id; screenshots are real PNGs; the store is unchanged afterwards.

Skips (with the reason) where no Chromium binary is installed: `apt-get install -y chromium`."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from view_helpers import file_state, parse

from agentmem.records import TeacherContext

ROOT = Path(__file__).resolve().parents[3]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (apt-get install -y chromium)")]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(seeded):
    url = seeded[0]
    port = free_port()
    env = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "cli.app", "view", "--db", url, "--port", str(port)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(base + "/", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"agentmem view did not start: {proc.communicate()[1][-2000:]}")
        time.sleep(0.3)
    yield base
    proc.terminate()
    proc.wait(timeout=30)


def chromium(tmp_path: Path, *args: str) -> str:
    profile = tmp_path / f"profile-{time.monotonic_ns()}"
    done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_browser_dom_has_the_heat_map_and_the_diff(server, seeded, tmp_path):
    _, seed, _ = seeded
    ep = seed.episodes[0]
    dom = chromium(tmp_path, "--dump-dom", f"{server}/episodes/{ep.id}?context=persistent&metric=reverse_kl")
    found = parse(dom)
    scored = [c for c in seed.calls[ep.id] if (c.id, TeacherContext.persistent) in seed.scores]
    assert [len(o) for o in found.outputs] == [c.output_tokens for c in scored]
    for inv, spans in zip(scored, found.outputs, strict=True):
        assert [float(s["data-value"]) for s in spans] == [
            float(v) for v in seed.scores[inv.id, TeacherContext.persistent].reverse_kl]
    assert found.diffs[1] == [("span", "Bob lives in "), ("ins", "Bergen now. Alice works in "), ("span", "Oslo.")]
    runs = chromium(tmp_path, "--dump-dom", f"{server}/")
    assert seed.rollout.id[:10] in runs and seed.distill.id[:10] in runs


def test_browser_unknown_id_is_a_404_page(server, tmp_path):
    dom = chromium(tmp_path, "--dump-dom", f"{server}/episodes/ffffffffffff")
    assert "404 · not found" in dom and "no episode with id" in dom
    assert httpx.get(f"{server}/episodes/ffffffffffff").status_code == 404


def test_browser_screenshots_of_every_page_and_no_writes(server, seeded, tmp_path):
    url, seed, _ = seeded
    before = file_state(url)
    ep = seed.episodes[0].id
    for name, path in [("runs", "/"), ("run", f"/runs/{seed.rollout.id}"), ("episode", f"/episodes/{ep}"),
                       ("compare", f"/episodes/{ep}/compare"), ("training", f"/runs/{seed.distill.id}/training"),
                       ("evals", "/evals")]:
        png = tmp_path / f"{name}.png"
        chromium(tmp_path, f"--screenshot={png}", "--window-size=1280,1600", server + path)
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
    assert file_state(url) == before


def test_report_is_drawn_in_the_viewers_font(seeded, tmp_path):
    """The report's inlined CSS applies: Chromium computes the body's font family from it (an HTML-escaped
    stylesheet leaves the default serif font)."""
    from agentmem.view.report import report_html
    from store.engine import open_read_only

    url, seed, _ = seeded
    store = open_read_only(url)
    html = report_html(store, seed.rollout.id)
    store.dispose()
    probe = ("<script>document.body.setAttribute('data-font', getComputedStyle(document.body).fontFamily)"
             "</script></body>")
    page = tmp_path / "report.html"
    page.write_text(html.replace("</body>", probe), encoding="utf-8")
    dom = chromium(tmp_path, "--dump-dom", page.as_uri())
    font = dom.split('data-font="', 1)[1].split('"', 1)[0]
    assert font.startswith("system-ui, -apple-system"), font
