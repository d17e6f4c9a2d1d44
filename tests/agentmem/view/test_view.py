"""`agentmem view` and `agentmem report` on a seeded store: every page renders, the token heat map has one
element per action token holding exactly the stored value, the memory diff has exactly the inserted and
deleted words, unknown ids give a 404 page, the run table sorts and filters in SQL, the report is one file
with no external references (its CSS inlined unescaped, no "read-only" badge), and no page writes to the store.
Step charts have whole-number ticks, full legends and a dash per line; a run without episodes shows its scores,
steps and checkpoints; a teacher is named ``default`` or by its checkpoint, not by a cache path; a rollout's page
says which teacher scores exist; an episode's status is not repeated as its stop reason."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from view_helpers import file_state, parse
from view_seed import TEACHER, seed_view_store

from agentmem.records import TeacherContext
from agentmem.testing.tiny_models import tiny_tokenizer
from agentmem.view import svg
from agentmem.view.app import create_app
from agentmem.view.diff import word_diff
from agentmem.view.render import model_label, stylesheet
from agentmem.view.report import report_html, write_report
from envs.metrics import mean_interval
from store import repository as repo
from store.engine import open_read_only
from store.errors import ReadOnlyDatabase, StoreError

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def client(seeded):
    store = open_read_only(seeded[0])
    yield TestClient(create_app(store))
    store.dispose()


def pages(seed) -> list[str]:
    ep = seed.episodes[0].id
    return ["/", "/?page=2", "/evals", f"/runs/{seed.rollout.id}", f"/runs/{seed.rollout.id}?sort=f1&desc=1&status=answered",
            f"/runs/{seed.distill.id}/training", f"/runs/{seed.eval_run.id}/training", f"/runs/{seed.rollout.id}/training",
            f"/episodes/{ep}", f"/episodes/{ep}?context=persistent&metric=reverse_kl", f"/episodes/{ep}/compare",
            f"/episodes/{seed.episodes[2].id}", "/static/style.css"]


def test_every_page_renders(client, seeded):
    _, seed, _ = seeded
    for path in pages(seed):
        r = client.get(path)
        assert r.status_code == 200, (path, r.text[-500:])
    runs = client.get("/").text
    for run in (seed.rollout, seed.distill, seed.eval_run):
        assert f'href="/runs/{run.id}"' in runs
    lo, hi = mean_interval([1.0, 0.5])
    assert f"[{lo:.3f}, {hi:.3f}]" in runs and "0.750" in runs  # mean F1 of the scored episodes, and its interval
    assert seed.checkpoint.id[:10] in runs  # the rollout's policy version
    assert f'href="/runs/{seed.distill.id}/training"' in runs and 'href="/evals"' in runs
    failed = client.get(f"/episodes/{seed.episodes[2].id}").text
    assert "BackendError: out of memory" in failed and "no teacher scores" in failed


def test_heat_map_has_one_element_per_action_token_with_the_stored_value(client, seeded):
    _, seed, folder = seeded
    ep = seed.episodes[0]
    calls = seed.calls[ep.id]
    tok = tiny_tokenizer()
    for query, context, field in [("", TeacherContext.aligned, "token_logprobs"),
                                  ("?context=persistent&metric=reverse_kl", TeacherContext.persistent, "reverse_kl"),
                                  (f"?teacher={TEACHER}&context=aligned&metric=logprob", TeacherContext.aligned,
                                   "token_logprobs")]:
        html = client.get(f"/episodes/{ep.id}{query}").text
        outputs = parse(html).outputs
        scored = [c for c in calls if (c.id, context) in seed.scores]
        assert len(outputs) == len(scored)
        for inv, spans in zip(scored, outputs, strict=True):
            stored = getattr(seed.scores[inv.id, context], field)
            assert len(spans) == inv.output_tokens == len(stored)
            assert [float(s["data-value"]) for s in spans] == [float(v) for v in stored]  # exact, not rounded
            assert all(f"{float(v):.4f}" in s["title"] for s, v in zip(spans, stored, strict=True))
            assert [s["text"] for s in spans] == [tok.decode([i]) for i in inv.output_ids]
            assert "".join(s["text"] for s in spans) == inv.output_text
        if context is TeacherContext.persistent:
            assert "not scored under this teacher and context" in html  # step 0 has aligned scores only
        assert 'class="legend"' in html


def test_memory_diff_has_exactly_the_inserted_and_deleted_words(client, seeded):
    _, seed, _ = seeded
    html = client.get(f"/episodes/{seed.episodes[0].id}").text
    diffs = parse(html).diffs
    assert diffs[0] == [("ins", "Bob lives in Oslo.")]
    assert diffs[1] == [("span", "Bob lives in "), ("ins", "Bergen now. Alice works in "), ("span", "Oslo.")]
    assert diffs[2] == [("span", "Bob lives in Bergen now. Alice works in Oslo.")]
    parts = word_diff("keep old words\nhere", "keep new words\nhere too")
    assert [(p.op, p.words) for p in parts] == [("equal", ("keep",)), ("delete", ("old",)), ("insert", ("new",)),
                                                ("equal", ("words", "here")), ("insert", ("too",))]
    assert "".join(p.text for p in parts if p.op != "delete") == "keep new words\nhere too"
    assert word_diff("", "") == []


def test_compare_shows_two_score_sets_side_by_side(client, seeded):
    _, seed, _ = seeded
    ep = seed.episodes[1]
    html = client.get(f"/episodes/{ep.id}/compare?context_a=aligned&context_b=persistent&metric=reverse_kl").text
    outputs = parse(html).outputs
    calls = seed.calls[ep.id]
    assert len(outputs) == len(calls) + len(calls) - 1  # step 0 has no persistent scores
    # in call order: step 0 (A only: no persistent scores), then A and B for every later call
    values = [[float(s["data-value"]) for s in spans] for spans in outputs]
    expected = [seed.scores[calls[0].id, TeacherContext.aligned].reverse_kl]
    for inv in calls[1:]:
        expected += [seed.scores[inv.id, TeacherContext.aligned].reverse_kl,
                     seed.scores[inv.id, TeacherContext.persistent].reverse_kl]
    assert values == [[float(v) for v in e] for e in expected]
    assert "A: aligned" in html and "B: persistent" in html


def test_unknown_ids_and_bad_queries_give_error_pages(client, seeded):
    _, seed, _ = seeded
    ep = seed.episodes[0].id
    for path in ["/runs/ffffffffffff", "/runs/ffffffffffff/training", "/episodes/ffffffffffff",
                 "/episodes/ffffffffffff/compare", "/no/such/page", f"/episodes/{ep}?teacher=nobody",
                 "/static/nothing.css"]:
        r = client.get(path)
        assert r.status_code == 404, path
        assert "text/html" in r.headers["content-type"] and "404" in r.text, path
    assert "no run with id &#39;ffffffffffff&#39;" in client.get("/runs/ffffffffffff").text
    for path in [f"/episodes/{ep}?metric=colour", f"/episodes/{ep}?context=upside_down", "/?page=0",
                 f"/runs/{seed.rollout.id}?sort=question"]:
        r = client.get(path)
        assert r.status_code == 400 and "bad request" in r.text, path


def test_run_table_sorts_filters_and_counts_in_sql(client, seeded):
    _, seed, _ = seeded
    rid = seed.rollout.id

    def rows(query: str) -> list[str]:
        return re.findall(r'<a href="/episodes/([0-9a-f]+)">', client.get(f"/runs/{rid}{query}").text)

    ids = [e.id for e in seed.episodes]
    assert rows("") == ids  # task order
    assert rows("?sort=f1&desc=1") == ids  # 1.0, 0.5, then the failed one (no F1) last
    assert rows("?sort=f1") == [ids[1], ids[0], ids[2]]
    assert rows("?status=failed") == [ids[2]]
    assert rows("?q=TASK-1") == [ids[1]]
    assert rows(f"?q={ids[2][:8]}") == [ids[2]]
    assert rows("?q=100%25") == []
    store = open_read_only(seeded[0])
    with store.session() as s:
        stats = {e.episode.id: e for e in repo.list_episode_stats(s, rid, sort="tokens", descending=True)}
        assert repo.count_episodes(s, rid, status="answered") == 2
    store.dispose()
    for ep_id, calls in seed.calls.items():
        assert stats[ep_id].calls == len(calls)
        assert stats[ep_id].tokens == sum(c.prompt_tokens + c.output_tokens for c in calls)
    assert stats[ids[2]].calls == stats[ids[2]].tokens == 0
    html = client.get(f"/runs/{rid}").text
    assert html.count('class="bar"') == 10 and "F1 of 2 scored episodes" in html


def test_training_page_plots_steps_and_evals(client, seeded):
    _, seed, _ = seeded
    html = client.get(f"/runs/{seed.distill.id}/training").text
    for title in ("loss parts", "KL", "clip fraction", "throughput", "eval F1"):
        assert f">{title}" in html
    assert "loss: step 2, 1</title>" in html and "clip fraction: step 3, 0.3</title>" in html
    assert "tokens/s: step 3, 1500</title>" in html and "ce_loss: step 1, 0.5</title>" in html
    assert "step 3, 0.5 [0.4, 0.6]</title>" in html  # the trained checkpoint's eval, with its interval
    evals = client.get("/evals").text
    assert "F1 on synthetic" in evals and evals.count("<tr>") == 3


def test_no_page_writes_to_the_store(seeded):
    url, seed, _ = seeded
    before = file_state(url)
    store = open_read_only(url)
    client = TestClient(create_app(store))
    for path in pages(seed) + ["/runs/ffffffffffff", f"/episodes/{seed.episodes[0].id}?metric=bad"]:
        client.get(path)
    with store.session() as s, pytest.raises((ReadOnlyDatabase, StoreError, sa.exc.OperationalError)):
        repo.insert_run(s, seed.rollout.model_copy(update={"id": "x" * 32}))
        s.commit()
    store.dispose()
    assert file_state(url) == before


def test_report_is_one_self_contained_file(seeded, tmp_path):
    url, seed, _ = seeded
    store = open_read_only(url)
    out = write_report(store, seed.rollout.id[:8], tmp_path / "r" / "report.html")
    store.dispose()
    html = out.read_text()
    assert "<link" not in html and "<script" not in html and "src=" not in html
    assert not re.search(r"(href|src|url)\s*[=(]\s*[\"']?(https?:|//|/)", html)  # no external or absolute refs
    assert "<style>" in html and ".tok {" in html and html.count("<svg") == 1  # histogram (no training steps)
    for ep in seed.episodes:
        assert f'id="episode-{ep.id}"' in html and f'href="#episode-{ep.id}"' in html
    outputs = parse(html).outputs
    scored = [c for ep in seed.episodes[:2] for c in seed.calls[ep.id]]
    assert [len(o) for o in outputs] == [c.output_tokens for c in scored]
    store = open_read_only(url)
    training = write_report(store, seed.distill.id, tmp_path / "t.html").read_text()
    store.dispose()
    assert 'id="training"' in training and training.count("<svg") == 5  # 4 step charts, eval F1: no histogram


def agentmem(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1", "AGENTMEM_DEBUG": ""}
    return subprocess.run([sys.executable, "-m", "cli.app", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_cli_report_and_errors(seeded, tmp_path):
    url, seed, _ = seeded
    done = agentmem("report", "--run", seed.rollout.id, "--out", str(tmp_path / "x.html"), "--full-episodes", "1", "--db", url)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "x.html").read_text().count('class="episode"') == 1
    missing = agentmem("report", "--run", "ffffffff", "--out", str(tmp_path / "y.html"), "--db", url)
    assert missing.returncode == 1 and missing.stderr.strip() == "error: no run with id 'ffffffff' (see `agentmem runs`)"
    nodb = agentmem("view", "--db", str(tmp_path / "none.db"))
    assert nodb.returncode == 1 and nodb.stderr.startswith("error: no database at ")
    assert not (tmp_path / "none.db").exists()
    helptext = agentmem("view", "--help").stdout
    assert all(f in helptext for f in ("--host", "--port", "--db", "--tokenizer", "127.0.0.1", "8000"))


def test_tokens_without_a_tokenizer_show_ids(seeded, tmp_path):
    url, seed, _ = seeded
    store = open_read_only(url)
    client = TestClient(create_app(store, tokenizer=str(tmp_path / "no-tokenizer-here")))
    html = client.get(f"/episodes/{seed.episodes[0].id}").text
    store.dispose()
    inv = seed.calls[seed.episodes[0].id][0]
    assert [s["text"] for s in parse(html).outputs[0]] == [f"‹{i}›" for i in inv.output_ids]
    assert "their tokens show as ids" in html
    assert np.isfinite([float(s["data-value"]) for s in parse(html).outputs[0]]).all()


def test_viewer_reads_on_both_databases(store, tmp_path):
    """The repository reads behind the pages, through a read-only store, on SQLite and Postgres."""
    tok = tiny_tokenizer()
    tok.save_pretrained(tmp_path / "tok")
    seed = seed_view_store(store, str(tmp_path / "tok"), lambda text: tok(text)["input_ids"])
    rid, ids = seed.rollout.id, [e.id for e in seed.episodes]
    ro = open_read_only(store.engine.url.render_as_string(hide_password=False))
    with ro.session() as s:
        assert [e.episode.id for e in repo.list_episode_stats(s, rid, sort="f1", descending=True)] == ids
        assert [e.episode.id for e in repo.list_episode_stats(s, rid, sort="f1")] == [ids[1], ids[0], ids[2]]
        assert [e.episode.id for e in repo.list_episode_stats(s, rid, sort="calls", limit=1, offset=2)] == [ids[1]]
        assert repo.count_episodes(s, rid, search="TASK-1") == 1 and repo.count_episodes(s, rid, search="%") == 0
        assert repo.count_episodes(s, rid, status="failed") == 1
        assert sorted(repo.episode_f1s(s, [rid])[rid]) == [0.5, 1.0]
        assert repo.run_policy_versions(s, [rid, seed.distill.id]) == {rid: [seed.checkpoint.id]}
        calls = [c.id for cs in seed.calls.values() for c in cs]
        assert repo.teacher_score_keys(s, calls) == [(TEACHER, TeacherContext.aligned),
                                                     (TEACHER, TeacherContext.persistent)]
        assert [r.run.id for r in repo.list_runs(s, 1, 1)] == [seed.distill.id] and repo.count_runs(s) == 3
        assert [r.f1 for r in repo.list_eval_results(s, checkpoint_ids=[seed.trained.id])] == [0.5]
        assert [r.id for r in repo.list_runs_of_kind(s, seed.distill.kind)] == [seed.distill.id]
    with ro.session() as s, pytest.raises((ReadOnlyDatabase, sa.exc.DBAPIError)):
        repo.insert_run(s, seed.rollout.model_copy(update={"id": "y" * 32}))
        s.commit()
    ro.dispose()


def test_training_charts_show_the_dynamics_when_steps_log_them():
    from agentmem.records import TrainStep
    from agentmem.view.training import step_charts

    def step(k: int, **metrics) -> tuple[int, TrainStep]:
        return k, TrainStep(run_id="r", step=k, loss=1.0, tokens=10, lr=1e-5, seconds=1.0,
                            metrics={"kd_loss": 0.5, "rl_loss": 0.1, **metrics})

    live = [step(k, rl_groups=4.0, rl_live_fraction=0.25 * k, **{"out_len/answer": 3.0 + k, "eos_first/answer": 0.1,
                                                               "empty/answer": 0.0, "kl_teacher": 0.2})
            for k in (1, 2)]
    html = "".join(step_charts(live))
    assert "RL signal (share of live groups)" in html and "first-token EOS answer" in html
    assert "mean length answer" in html and "KL to teacher" in html
    plain = "".join(step_charts([step(1), step(2)]))  # a run that logged no dynamics gets no empty dynamics charts
    assert "RL signal" not in plain and "first-token EOS" not in plain


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


def test_report_inlines_css_unescaped_and_has_no_read_only_badge(seeded):
    url, seed, _ = seeded
    store = open_read_only(url)
    html = report_html(store, seed.rollout.id)
    store.dispose()
    style = html.split("<style>", 1)[1].split("</style>", 1)[0]
    assert style == stylesheet() and "&#34;" not in style and '"Segoe UI"' in style
    assert 'class="ro"' not in html and "read-only</span>" not in html


def test_a_run_without_episodes_shows_steps_and_checkpoints_not_an_empty_table(seeded):
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


def test_rollout_page_says_which_teacher_scores_exist(seeded):
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


def test_episode_status_is_not_repeated_as_its_stop_reason(seeded):
    url, seed, _ = seeded
    store = open_read_only(url)
    page = TestClient(create_app(store)).get(f"/episodes/{seed.episodes[0].id}").text
    store.dispose()
    assert "<b>status</b> answered</span>" in page and "answered (answered)" not in page


def test_evals_of_different_levels_are_different_lines_with_a_legend_and_a_knobs_column():
    """Two levels of one model are two lines (a legend names each) and the table says each row's knobs; a
    trained checkpoint is named by its id, as the runs page names a run whose --model was that id."""
    from datetime import datetime, timezone

    from agentmem.records import EvalResult
    from agentmem.view.render import Links, model_label, render
    from agentmem.view.training import eval_chart

    def result(level: int, step: int, f1: float) -> EvalResult:
        return EvalResult(run_id=f"{level}{step}" * 8, checkpoint_id=None if step == 0 else "c0ffee" * 5 + "00",
                          model="/cache/models/SmolLM2-135M-Instruct" if step == 0 else f"/ck/run/step-{step:06d}",
                          env="synthetic", step=step, n_episodes=4, f1=f1, em=f1, sub_em=f1,
                          metrics={"base_model": "SmolLM2-135M-Instruct", "env_knobs": {"level": level}},
                          created_at=datetime(2026, 1, 1, tzinfo=timezone.utc))

    results = [result(1, 0, 0.1), result(1, 16, 0.5), result(2, 0, 0.0), result(2, 16, 0.3)]
    chart = eval_chart(results)
    assert re.findall(r'class="legend">([^<]*)<', chart) == ["SmolLM2-135M-Instruct · level 1",
                                                             "SmolLM2-135M-Instruct · level 2"]
    assert chart.count("<polyline") == 2
    html = render("evals.html", links=Links(), title="evals", results=results, charts=[chart])
    assert "<th>knobs</th>" in html and html.count("<td>level 1</td>") == 2 and html.count("<td>level 2</td>") == 2
    assert html.count(">c0ffeec0ff</td>") == 2 and html.count(">default</td>") == 2 and "step-000016<" not in html
    assert model_label("c0ffeec0ffeec0ff") == "c0ffeec0ff"  # the runs page's --model CHECKPOINT_ID


def test_sft_training_page_has_no_panels_of_terms_that_are_off():
    """An sft run reports no kd or RL term and no clip: no KL or clip-fraction panel, no kd/rl loss line; a
    distill run with the RL term keeps both panels. Every term's points come from the steps' metrics."""
    from agentmem.records import TrainStep
    from agentmem.view.training import step_charts, term_series

    def step(k: int, **metrics) -> tuple[int, TrainStep]:
        return k, TrainStep(run_id="r", step=k, loss=1.0, tokens=10, lr=1e-5, seconds=1.0,
                            metrics={"ce_loss": 1.0, "clip_fraction": 0.0, **metrics})

    sft = "".join(step_charts([step(1), step(2)]))
    assert ">loss parts" in sft and ">throughput" in sft and "ce_loss: step 2" in sft
    assert ">KL<" not in sft and ">clip fraction<" not in sft and "kd_loss" not in sft and "rl_loss" not in sft
    distill = "".join(step_charts([step(1, kd_loss=0.5, rl_loss=0.1, rl_groups=4.0),
                                   step(2, kd_loss=0.4, rl_loss=-0.1, rl_groups=4.0)]))
    assert ">KL<" in distill and ">clip fraction<" in distill and "kd_loss: step 2" in distill
    assert term_series([step(1, kd_loss=0.5), step(3, kd_loss=0.25, bonus_loss=-0.125)]) == {
        "bonus": [(3, -0.125)], "ce": [(1, 1.0), (3, 1.0)], "kd": [(1, 0.5), (3, 0.25)]}


def test_an_eval_run_shows_one_interval_everywhere(store, tmp_path):
    """The runs page, /evals and the CLI's eval table show an eval's interval from one function: the stored
    eval_results row's, computed by ``mean_interval`` whatever order the episodes were read in."""
    from agentmem.jobs.eval import summarize
    from agentmem.records import Checkpoint, Episode, EpisodeStatus, Run, RunKind

    rng = np.random.default_rng(7)
    run = Run(kind=RunKind.eval, status="finished", config={"env": "synthetic", "model": "m"})
    f1s = [float(x) for x in rng.choice([0.0, 0.5, 1.0], size=64)]
    episodes = [Episode(run_id=run.id, env="synthetic", task_id=f"t{i:02d}", question="q?", gold_answers=["g"],
                        prediction="p", f1=f, em=f, sub_em=f, status=EpisodeStatus.answered) for i, f in enumerate(f1s)]
    ckpt = Checkpoint(path="/m", base_model="tiny")
    row = summarize(episodes[::-1], run_id=run.id, policy=ckpt, env="synthetic", step=0, metrics={})
    assert row.f1_ci == mean_interval(f1s)
    with store.session() as s:
        repo.insert_run(s, run)
        repo.insert_checkpoint(s, ckpt)
        repo.insert_episodes(s, episodes)
        repo.insert_eval_result(s, row)
        s.commit()
    client = TestClient(create_app(open_read_only(store.url)))
    shown = f"[{row.f1_ci[0]:.3f}, {row.f1_ci[1]:.3f}]"
    assert shown in client.get("/").text and shown in client.get("/evals").text


def test_links_go_to_pages_with_content_and_tables_show_the_gold(client, seeded):
    _, seed, _ = seeded
    runs = client.get("/").text
    row = next(line for line in runs.splitlines() if seed.distill.id[:10] in line and "<tr>" in line)
    assert ">episodes</a>" not in row and f'href="/runs/{seed.distill.id}/training"' in row
    rollout = next(line for line in runs.splitlines() if seed.rollout.id[:10] in line and "<tr>" in line)
    assert ">episodes</a>" in rollout
    table = client.get(f"/runs/{seed.rollout.id}").text
    assert "<th>gold</th><th>prediction</th>" in table
    assert '<td class="pred">Bergen</td><td class="pred">Bergen</td>' in table
