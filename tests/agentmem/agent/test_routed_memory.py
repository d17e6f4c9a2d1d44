"""The routed memory policy (Router-Mem): BM25 retrieval, P(yes) from the router's log-prob, the threshold,
labels from evidence, exact prompts and stored rows, the oracle, resume, and replay/scoring like overwrite."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import (
    SYNTH,
    KilledBackend,
    LogprobBackend,
    canonical_calls,
    register_policy,
    stored_calls,
    tiny_env,
)
from model_helpers import direct_logprobs

from agentmem.agent.loop import AgentLoop, ListSink
from agentmem.agent.prompts import answer_prompt, render, update_prompt
from agentmem.agent.registry import memory_policy
from agentmem.agent.retrieval import bm25_scores, top_k
from agentmem.agent.routed_memory import ROUTE, RoutedPolicy, p_yes, router_label
from agentmem.config import AgentConfig, PolicySource, RolloutConfig, ScoreConfig
from agentmem.errors import AgentError
from agentmem.jobs.rollout import run_rollout
from agentmem.jobs.score import run_score
from agentmem.records import Episode, EpisodeStatus, Task, TeacherContext
from agentmem.replay import rebuild
from agentmem.testing.tiny_models import tiny_llama, tiny_tokenizer
from agentmem.training.scoring import LoadedModel
from store import repository as repo


def agent(**options) -> AgentConfig:
    return AgentConfig(memory_policy="routed", memory_options=options, memory_tokens=16, answer_max_new_tokens=16,
                       max_batch=4, seed=1, prompt_layout="memory-first")


def reply(route_word):
    def respond(prompt_text):
        if "Reply yes or no." in prompt_text:
            return route_word(prompt_text)
        if "Answer the question from these passages" in prompt_text:
            return "from passages"
        if "Answer the question from your memory" in prompt_text:
            return "from memory"
        return "kept facts"
    return respond


def backend(tok, route_word, route_logprob=lambda text: 0.0):
    return LogprobBackend(tok, lambda p: reply(route_word)(tok.decode(p)), route_logprob)


# ---- pure parts -------------------------------------------------------------------------------------


def test_top_k_is_exact_with_ties_to_the_lower_index():
    docs = ["Bob lives in Oslo.", "The capital of France is Paris.", "Bob and Alice met in Oslo.", "Nothing."]
    scores = bm25_scores("where does Bob live in Oslo?", docs)
    assert scores.dtype == np.float32 and scores[1] == 0 and scores[3] == 0 and scores[0] > scores[2] > 0
    assert top_k("where does Bob live in Oslo?", docs, 3) == [0, 2, 1]  # 1 and 3 tie at 0: the lower first
    assert top_k("zebra", docs, 2) == [0, 1]  # no word matches: reading order
    assert top_k("the of", docs, 9) == [0, 1, 2, 3]  # stop words only
    assert top_k("Bob", [], 3) == []
    with pytest.raises(ValueError, match="k must be >= 1"):
        top_k("Bob", docs, 0)


def task(evidence_chunks, chunks=4) -> Task:
    return Task(task_id="t", env="synthetic", question="Where does Bob live?", chunks=[f"c{i}" for i in range(chunks)],
                answers=["Oslo"], evidence_chunks=evidence_chunks)


def test_router_labels_on_known_evidence():
    assert router_label(task([1]), (0, 1)) is True
    assert router_label(task([1, 3]), (1, 3)) is True
    assert router_label(task([1, 3]), (0, 1, 2)) is False  # evidence chunk 3 not retrieved
    assert router_label(task([2]), ()) is False
    assert router_label(task([]), (0, 1)) is False  # no evidence annotation: the safe answer is the full pass


def test_p_yes_from_the_sampled_tokens_logprob():
    assert p_yes("yes", math.log(0.8)) == pytest.approx(0.8, abs=1e-6)
    assert p_yes(" Yes", math.log(0.8)) == pytest.approx(0.8, abs=1e-6)
    assert p_yes("y", math.log(0.6)) == pytest.approx(0.6, abs=1e-6)  # a tokenizer's first piece of "yes"
    assert p_yes("No", math.log(0.7)) == pytest.approx(0.3, abs=1e-6)
    assert p_yes("n", 0.0) == 0.0
    assert p_yes("maybe", -0.1) == 0.0 and p_yes("", -0.1) == 0.0  # not a yes/no token: the full pass
    assert p_yes("yes", None) == 1.0 and p_yes("no", None) == 0.0  # oracle-written: no log-prob
    assert p_yes("yes", -0.6931471805599453) == math.exp(float(np.float32(-0.6931471805599453)))


def test_options_are_checked():
    tok = tiny_tokenizer()
    policy = memory_policy(tok, agent(threshold=0.25, k=2))
    assert isinstance(policy, RoutedPolicy) and policy.threshold == 0.25 and policy.k == 2
    with pytest.raises(AgentError, match=r"memory policy 'routed': bad --memory-option \(thresh: unknown option\); known: threshold, k"):
        memory_policy(tok, agent(thresh=0.5))
    with pytest.raises(AgentError, match=r"k: Input should be greater than or equal to 1"):
        memory_policy(tok, agent(k=0))


# ---- episodes through the loop ----------------------------------------------------------------------


ROUTE_0 = ("Question: Which company does Vode work for?\n\nRetrieved passages:\n"
           "[0] An old market drew visitors at dusk.\n[1] Vode works for Katidyne.\n\n"
           "Do these passages contain everything needed to answer the question? Reply yes or no.")
ANSWER_0 = ("Question: Which company does Vode work for?\n\nRetrieved passages:\n"
            "[0] An old market drew visitors at dusk.\n[1] Vode works for Katidyne.\n\n"
            "Answer the question from these passages. Reply with the short answer only.")


def run_loop(tok, config, be, n=1):
    env = tiny_env(tok)
    tasks = env.tasks(n)
    loop = AgentLoop(be, config, env.score)
    sink = ListSink()
    episodes = [Episode(run_id="r", env="synthetic", task_id=t.task_id, question=t.question, gold_answers=t.answers)
                for t in tasks]
    loop.run([loop.start(e, t) for e, t in zip(episodes, tasks, strict=True)], sink)
    return tasks, sorted(sink.all_invocations, key=lambda i: (i.episode_id, i.step)), sink.finished


def test_yes_above_threshold_answers_from_the_retrieved_chunks_exactly():
    tok = tiny_tokenizer()
    be = backend(tok, lambda text: "yes", lambda text: math.log(0.75))
    (t,), invs, (ep,) = run_loop(tok, agent(threshold=0.7, k=2), be)
    assert [i.kind for i in invs] == [ROUTE, "answer"]
    route, answer = invs
    assert route.prompt_ids.tolist() == render(tok, ROUTE_0).ids and route.prompt_text == render(tok, ROUTE_0).text
    assert answer.prompt_ids.tolist() == render(tok, ANSWER_0).ids
    assert be.seen_prompts == [route.prompt_ids.tolist(), answer.prompt_ids.tolist()]
    assert route.output_ids.tolist() == tok.encode("yes", add_special_tokens=False)[:1]  # max_new_tokens 1
    assert route.output_logprobs.tolist() == pytest.approx([math.log(0.75)])
    assert route.memory_before == "" and route.memory_after == "route: P(yes)=0.7500 -> answer from chunks [0, 1]"
    assert answer.memory_before == answer.memory_after == route.memory_after
    assert {i.memory_policy for i in invs} == {"routed"} and route.chunk_index is None
    assert ep.prediction == "from passages" and ep.status is EpisodeStatus.answered
    assert len(t.chunks) == 4


def test_below_threshold_runs_overwrites_full_pass_with_its_prompts():
    tok = tiny_tokenizer()
    be = backend(tok, lambda text: "yes", lambda text: math.log(0.75))
    (t,), invs, (ep,) = run_loop(tok, agent(threshold=0.8, k=2), be)
    n = len(t.chunks)
    assert [i.kind for i in invs] == [ROUTE] + ["memory_update"] * n + ["answer"]
    memory = ""
    for i, inv in enumerate(invs[1:-1]):
        assert inv.chunk_index == i
        assert inv.prompt_ids.tolist() == update_prompt(tok, t.question, memory, t.chunks[i], "memory-first").ids
        memory = "kept facts"
        assert inv.memory_after == "route: P(yes)=0.7500 -> full pass\n\nkept facts"
    assert invs[-1].prompt_ids.tolist() == answer_prompt(tok, t.question, "kept facts").ids
    assert invs[0].memory_after == "route: P(yes)=0.7500 -> full pass"
    assert ep.prediction == "from memory"


@pytest.mark.parametrize(("word", "prob", "threshold", "answer_now"), [
    ("yes", 0.75, math.exp(float(np.float32(math.log(0.75)))), True),  # P(yes) == threshold answers now
    ("yes", 0.75, 0.76, False),
    ("no", 0.9, 0.05, True),     # P(yes) = 1 - 0.9 = 0.1 >= 0.05
    ("no", 0.9, 0.2, False),
    ("maybe", 0.99, 0.01, False),  # an unreadable router: P(yes) = 0
    ("maybe", 0.99, 0.0, True),    # threshold 0 always answers from the retrieved chunks
    ("yes", 1.0, 1.01, False),     # a threshold above 1 always runs the full pass
])
def test_thresholds_route_as_expected(word, prob, threshold, answer_now):
    tok = tiny_tokenizer()
    be = backend(tok, lambda text: word, lambda text: math.log(prob))
    _, invs, _ = run_loop(tok, agent(threshold=threshold, k=2), be)
    assert (len(invs) == 2) is answer_now


# ---- rollouts through the store ---------------------------------------------------------------------


def rollout_config(**options) -> RolloutConfig:
    return RolloutConfig(model="tiny", episodes=3, group_size=2, chunk_tokens=48, env_knobs=SYNTH,
                         agent=agent(**({"threshold": 0.5, "k": 2} | options)))


def by_question(text):
    return "yes" if "Vode" in text or "Roso" in text else "no"  # tasks 0 and 2 answer now, task 1 reads all


def canonical(store, run_id):
    return canonical_calls(*stored_calls(store, run_id), "prompt_ids", "output_ids", "memory_after")


@pytest.mark.parametrize("calls_before_kill", [3, 6])
def test_killed_routed_rollout_resumes_to_the_same_rows(sqlite_store, calls_before_kill):
    tok = tiny_tokenizer()
    policy = register_policy(sqlite_store, "/models/tiny", "tiny")
    whole = run_rollout(sqlite_store, rollout_config(), backend=backend(tok, by_question), policy=policy)
    want = canonical(sqlite_store, whole.run_id)
    kinds = [k for _, _, k, *_ in want]
    assert kinds.count(ROUTE) == 6 and kinds.count("answer") == 6 and kinds.count("memory_update") == 2 * 5

    killed = KilledBackend(tok, lambda p: reply(by_question)(tok.decode(p)))
    killed.left = calls_before_kill
    with pytest.raises(KeyboardInterrupt):
        run_rollout(sqlite_store, rollout_config(), backend=killed, policy=policy)
    with sqlite_store.session() as s:
        run_id = next(r.run.id for r in repo.list_runs(s) if r.run.id != whole.run_id)
    result = run_rollout(sqlite_store, rollout_config(), backend=backend(tok, by_question), policy=policy,
                         resume=run_id)
    assert result.resumed_episodes > 0
    assert canonical(sqlite_store, run_id) == want


@pytest.mark.parametrize(("hops", "k", "label"), [(1, 1, "yes"), (2, 1, "no")])
def test_oracle_writes_the_evidence_label_and_the_gold_answer(sqlite_store, tokenizer_folder, hops, k, label):
    tok = tiny_tokenizer()
    config = rollout_config(k=k).model_copy(update={
        "model": tokenizer_folder, "policy": PolicySource.oracle, "group_size": 1,
        "env_knobs": SYNTH | {"hops": hops}})
    result = run_rollout(sqlite_store, config)
    tasks = {t.task_id: t for t in tiny_env(tok, hops=hops).tasks(3)}
    with sqlite_store.session() as s:
        routes = list(repo.stream_invocations(s, run_ids=[result.run_id], kinds=[ROUTE]))
    assert len(routes) == 3 and {r.role for r in routes} == {"oracle"}
    assert {r.output_text for r in routes} == {tok.decode(tok.encode(label, add_special_tokens=False)[:1])}
    policy = memory_policy(tok, agent(k=k))
    for ep in result.episodes:
        assert router_label(tasks[ep.task_id], policy.retrieve(tasks[ep.task_id])) is (label == "yes")
        assert ep.f1 == 1.0 and ep.status is EpisodeStatus.answered


def test_routed_episodes_replay_and_score_like_overwrites(sqlite_store):
    tok = tiny_tokenizer()
    policy = register_policy(sqlite_store, "/models/tiny", "tiny")
    result = run_rollout(sqlite_store, rollout_config(), backend=backend(tok, by_question, lambda t: -0.25),
                         policy=policy)
    with sqlite_store.session() as s:
        invs = list(repo.stream_invocations(s, run_ids=[result.run_id]))
    # replay: each call rebuilds to exactly its stored ids, with its stored log-probs at the action positions
    for inv, seq in zip(invs, rebuild(invs, TeacherContext.aligned), strict=True):
        assert seq.invocation_id == inv.id
        assert seq.input_ids.tolist() == inv.prompt_ids.tolist() + inv.output_ids.tolist()
        assert seq.action_ids.tolist() == inv.output_ids.tolist()
        assert seq.sampler_logprobs.tolist() == inv.output_logprobs.tolist()
    # resume from the stored calls reaches each episode's final state (P(yes) from the stored log-prob)
    routed = memory_policy(tok, agent(threshold=0.5, k=2))
    tasks = {t.task_id: t for t in tiny_env(tok).tasks(3)}
    for ep in result.episodes:
        calls = [i for i in invs if i.episode_id == ep.id]
        state = routed.resume(tasks[ep.task_id], calls)
        assert routed.memory_text(state) == calls[-1].memory_after
    # scoring: the teacher's stored per-token log-probs equal a direct forward pass, as for overwrite
    model = tiny_llama(seed=1)
    run_score(sqlite_store, ScoreConfig(run_ids=[result.run_id], context=TeacherContext.aligned, row_tokens=4096),
              teacher=LoadedModel(model, tok, "t"))
    with sqlite_store.session() as s:
        got = repo.get_teacher_scores(s, [i.id for i in invs], "t", TeacherContext.aligned)
    assert len(got) == len(invs)
    for inv in invs:
        want = direct_logprobs(model, inv.prompt_ids, inv.output_ids)
        np.testing.assert_allclose(got[inv.id].token_logprobs, want, atol=2e-5)


# ---- router training --------------------------------------------------------------------------------


def route_nll(model, invocations) -> float:
    import torch

    total = 0.0
    with torch.no_grad():
        for inv in invocations:
            ids = torch.tensor(np.concatenate([inv.prompt_ids, inv.output_ids]), dtype=torch.long)[None]
            logp = torch.log_softmax(model(ids).logits[0].double(), -1)
            total -= float(logp[inv.prompt_tokens - 1, int(inv.output_ids[0])])
    return total / len(invocations)


def test_sft_on_oracle_labelled_route_calls_trains_the_router(sqlite_store, tokenizer_folder, tmp_path):
    """`agentmem sft --run ORACLE_ROUTED_RUN --kinds route`: exactly the route calls are selected (one label
    token each) and training lowers their loss."""
    from transformers import AutoModelForCausalLM

    from agentmem.config import SftConfig
    from agentmem.jobs.sft import run_sft
    from agentmem.testing.tiny_models import save_tiny
    from agentmem.training.selection import select

    runs = []
    for hops in (1, 2):  # labels yes (hops 1, k 1) and no (hops 2)
        config = rollout_config(k=1).model_copy(update={
            "model": tokenizer_folder, "policy": PolicySource.oracle, "group_size": 1,
            "env_knobs": SYNTH | {"hops": hops}})
        runs.append(run_rollout(sqlite_store, config).run_id)
    picked = select(sqlite_store, runs, kinds=["route"])
    assert len(picked.invocations) == 6 and {i.kind for i in picked.invocations} == {ROUTE}
    assert all(i.output_tokens == 1 for i in picked.invocations)
    assert len(select(sqlite_store, runs).invocations) > 6  # without --kinds: every call, route included
    assert SftConfig(run_ids=["r"], kinds="route, update").kinds == ["route", "memory_update"]
    folder = save_tiny(tmp_path / "tiny")
    before = route_nll(AutoModelForCausalLM.from_pretrained(folder), picked.invocations)
    result = run_sft(sqlite_store, SftConfig(run_ids=runs, student=folder, kinds="route", out=str(tmp_path / "ckpt"), optim=dict(steps=3, lr=1e-2), batch=dict(invocations_per_step=64)))
    assert result.history[0].metrics["actions"] == 6
    assert result.history[0].loss == pytest.approx(before, abs=1e-4)
    after = route_nll(AutoModelForCausalLM.from_pretrained(result.last_checkpoint.path), picked.invocations)
    assert np.isfinite(after) and after < before


def test_privileged_distill_accepts_a_routed_run(sqlite_store, tmp_path):
    """`agentmem distill --run ROUTED_RUN --context privileged`: the teacher reads the gold answer and the
    evidence before each route call the student sampled (here restricted to the route calls)."""
    from agentmem.backends.transformers_backend import TransformersBackend
    from agentmem.config import DistillConfig, RLKind
    from agentmem.jobs.distill import run_distill
    from agentmem.training.trainer import Models

    tok = tiny_tokenizer()
    policy = register_policy(sqlite_store, "/models/tiny", "tiny")
    config = rollout_config(threshold=2.0).model_copy(update={"episodes": 2, "group_size": 1})
    run = run_rollout(sqlite_store, config, backend=TransformersBackend.from_model(tiny_llama(seed=3), tok),
                      policy=policy)
    student = tiny_llama(seed=0).train()
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    models = Models(student, tok, policy, tiny_llama(seed=1).requires_grad_(False), tok)
    result = run_distill(sqlite_store, DistillConfig(
        run_ids=[run.run_id], out=str(tmp_path), kinds=["route"], teacher=dict(context=TeacherContext.privileged), rl=dict(kind=RLKind.none), optim=dict(steps=1, lr=1e-3), batch=dict(invocations_per_step=8)), models=models)
    assert result.history[0].metrics["actions"] == 2 and np.isfinite(result.history[0].loss)
    assert any(not torch_equal(before[n], p) for n, p in student.named_parameters())


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_distill_and_sft_take_the_policies_call_kinds():
    from agentmem.agent.registry import check_kinds
    from agentmem.config import DistillConfig, ScoreConfig, SftConfig
    from agentmem.errors import ConfigError

    assert DistillConfig(run_ids=["r"], kinds="route").kinds == ["route"]
    assert DistillConfig(run_ids=["r"], kinds="update,answer").kinds == ["memory_update", "answer"]
    assert SftConfig(run_ids=["r"], kinds="log_search,event_view").kinds == ["log_search", "event_view"]
    assert ScoreConfig(run_ids=["r"], kinds="route").kinds == ["route"]  # score --kinds route
    check_kinds(["route", "memory_update", "answer", "event_view", "log_note", "chat"])
    with pytest.raises(ConfigError, match=r"unknown call kind\(s\) \['routing'\]: give comma-separated "
                                          r"memory_update, answer, event_record"):
        check_kinds(DistillConfig(run_ids=["r"], kinds="routing").kinds)
