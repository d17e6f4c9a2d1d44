"""The viewer and the report, on the seeded store of ``test_view``: the report's CSS is
inlined unescaped and carries no "read-only" badge; step charts have whole-number ticks, full legends and a
dash per line; a run without episodes shows its scores, steps and checkpoints instead of an empty table; the
teacher is named ``default`` or by its checkpoint, not by a cache path; the run page says which teacher scores
exist; an episode's status is not repeated as its stop reason. (The computed font in Chromium is checked in
``test_view_browser.py``.)"""

from __future__ import annotations

import re

from fastapi.testclient import TestClient
from test_view import seeded  # noqa: F401 (a fixture)
from view_seed import TEACHER

from agentmem.view import svg
from agentmem.view.app import create_app
from agentmem.view.render import model_label, stylesheet
from agentmem.view.report import report_html
from store.engine import open_read_only


def ticks(chart: str) -> list[str]:
    return re.findall(r'class="tick" text-anchor="middle">([^<]*)<', chart)


def test_step_charts_have_whole_number_ticks():
    two_steps = svg.line_chart([svg.Series("loss", [(1.0, 0.5), (2.0, 0.4)])], title="t", x_label="step",
                               y_label="loss", integer_x=True)
    assert ticks(two_steps) == ["1", "2"]
    one_eval = svg.line_chart([svg.Series("F1", [(2.0, 0.5)], [(0.4, 0.6)])], title="t", x_label="step",
                              y_label="F1", y_range=(0.0, 1.0), integer_x=True)
    assert ticks(one_eval) == ["1", "2", "3"]
    many = svg.line_chart([svg.Series("loss", [(float(s), 1.0) for s in range(1, 38)])], title="t", x_label="step",
                          y_label="loss", integer_x=True)
    assert ticks(many) == ["0", "10", "20", "30", "40"]


def test_legend_shows_full_labels_and_coinciding_lines_differ():
    label = "approx KL (policy vs sampler), per token"  # 40 characters: was cut at 28
    same = [(1.0, 0.3), (2.0, 0.2)]
    chart = svg.line_chart([svg.Series("kd_loss", same), svg.Series("loss", same), svg.Series(label, same)],
                           title="t", x_label="step", y_label="loss", integer_x=True)
    assert f'class="legend">{label}</text>' in chart
    lines = re.findall(r'<polyline points="([^"]*)" fill="none" stroke="[^"]*" stroke-width="1.5"([^/]*)/>', chart)
    assert len(lines) == 3 and len({points for points, _ in lines}) == 1  # drawn over each other ...
    assert len({dash for _, dash in lines}) == 3  # ... each with its own dash pattern
    height = int(re.search(r'<svg class="chart" width="\d+" height="(\d+)"', chart).group(1))
    assert height == 240 + 3 * svg.LEGEND_ROW  # the legend has its own rows under the plot


def test_report_inlines_css_unescaped_and_has_no_read_only_badge(seeded):  # noqa: F811
    url, seed, _ = seeded
    store = open_read_only(url)
    html = report_html(store, seed.rollout.id)
    store.dispose()
    style = html.split("<style>", 1)[1].split("</style>", 1)[0]
    assert style == stylesheet() and "&#34;" not in style and '"Segoe UI"' in style
    assert 'class="ro"' not in html and "read-only</span>" not in html


def test_a_run_without_episodes_shows_steps_and_checkpoints_not_an_empty_table(seeded):  # noqa: F811
    url, seed, _ = seeded
    store = open_read_only(url)
    report = report_html(store, seed.distill.id)
    page = TestClient(create_app(store)).get(f"/runs/{seed.distill.id}").text
    store.dispose()
    for html in (report, page):
        assert 'class="episodes"' not in html and "F1 of 0 scored episodes" not in html
        assert "<b>training steps</b> 3" in html
        assert f'<span title="/tmp/ck/step-3">{seed.trained.id[:10]} (step 3)</span>' in html
    assert "has no episodes of its own" in page


def test_rollout_page_says_which_teacher_scores_exist(seeded):  # noqa: F811
    url, seed, _ = seeded
    store = open_read_only(url)
    page = TestClient(create_app(store)).get(f"/runs/{seed.rollout.id}").text
    store.dispose()
    aligned = sum(1 for (_, context) in seed.scores if context.value == "aligned")
    persistent = sum(1 for (_, context) in seed.scores if context.value == "persistent")
    assert (f'{aligned} calls under aligned · <span title="{TEACHER}">teacher</span>; '
            f'{persistent} calls under persistent · <span title="{TEACHER}">teacher</span>') in page
    assert 'class="episodes"' in page  # a rollout still lists its episodes


def test_teacher_is_named_default_or_by_checkpoint_not_by_cache_path():
    assert model_label("/root/.cache/agentmem/models/SmolLM2-135M-Instruct") == "default"
    assert model_label("default") == "default"
    assert model_label("/tmp/ck/step-3") == "step-3"


def test_episode_status_is_not_repeated_as_its_stop_reason(seeded):  # noqa: F811
    url, seed, _ = seeded
    store = open_read_only(url)
    page = TestClient(create_app(store)).get(f"/episodes/{seed.episodes[0].id}").text
    store.dispose()
    assert "<b>status</b> answered</span>" in page and "answered (answered)" not in page
