"""The store side of ``agentmem serve``: the ``serve`` run, episodes named by clients, one call at a time.

- The run: a named run (``--run-name``) has a fixed id (``serve_run_id``), so restarting the server with
  the same name continues the same run; without a name each start opens a new run.
- Episodes: a client names an episode by any string (URL path, header or ``metadata``); its row id is
  derived from (run, client id), so the same name always reaches the same row. A call without an episode
  is its own one-call episode, closed (``answered``) with the call. A call with ``n > 1`` is a group: choice
  ``i`` goes to episode ``{episode}.{i}`` (``{call id}.{i}`` without one), all of one task, so GRPO compares
  them. A new episode's task is the client's task, else its episode name; its sample index is the next free
  one among the run's episodes of that task.
- Calls: step = one past the episode's last stored call (arrival order). Each request's invocations, the
  episodes they create and the episodes' latest outputs are written in ONE transaction, before the
  response is sent: a killed server or a dropped client never leaves a call half-written.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass

from agentmem.records import Episode, EpisodeStatus, Invocation, Run, RunKind, ServeCall, new_id, utcnow
from agentmem.serve.protocol import ApiError
from agentmem.serve.sampler import Choice
from store import repository as repo
from store.engine import Store
from store.errors import NotFound
from store.repository import serve as serve_repo

ENV = "serve"


def serve_run_id(name: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, f"agentmem-serve-run:{name}").hex


def episode_row_id(run_id: str, client_id: str) -> str:
    return uuid.uuid5(uuid.UUID(run_id), f"serve-episode\x00{client_id}").hex


def open_run(store: Store, config: dict, name: str | None) -> str:
    """Start the serve run (or, for a name already used, take it over again); its id."""
    with store.session() as s:
        if name is not None:
            rid = serve_run_id(name)
            try:
                run = repo.get_run(s, rid)
            except NotFound:
                run = None
            if run is not None:
                if run.kind is not RunKind.serve:
                    raise ApiError(500, f"run {rid} is a {run.kind.value} run")
                repo.claim_run(s, rid)
                s.commit()
                return rid
            repo.start_run(s, Run(id=rid, kind=RunKind.serve, config=config))
        else:
            run = Run(kind=RunKind.serve, config=config)
            repo.start_run(s, run)
            rid = run.id
        s.commit()
    return rid


@dataclass(frozen=True)
class CallContext:
    """What the client said about a call: its episode, task, kind and parent (all optional)."""

    episode: str | None = None
    task: str | None = None
    kind: str = "chat"
    parent: str | None = None
    reopen: bool = False  # a call may continue an episode already rewarded (it goes back to running)
    record: bool = True  # False: a gateway in front records the call (X-Agentmem-Record: no); nothing is stored
    episode_field: str | None = None  # where the client named the episode and the task (a 400 names it)
    task_field: str | None = None


@dataclass(frozen=True)
class Planned:
    """The ids one request's calls will be stored under, known before generation ends (a stream names its
    invocation in every chunk): per choice, the invocation id, the client's episode name and the row id."""

    call_id: str
    invocation_ids: list[str]
    client_episodes: list[str]
    episode_ids: list[str]
    tasks: list[str]


@dataclass(frozen=True)
class Sent:
    """What the client sent: per prompt, its rendered text and its question (the last user message, or the
    prompt); the chat ``messages`` and ``tools`` (None for completions); the sampling fields as given."""

    prompt_texts: list[str]
    questions: list[str]
    messages: list[dict] | None
    tools: list[dict] | None
    sampling: dict


class Recorder:
    """Writes a served run's calls. One instance per server process; ``record`` calls are serialised."""

    def __init__(self, store: Store, run_id: str, policy_version: str | None):
        self.store, self.run_id, self.policy_version = store, run_id, policy_version
        self._lock = threading.Lock()

    def check_call(self, ctx: CallContext, planned: Planned) -> None:
        """Before generating: the parent call exists, and no episode of the call was rewarded (unless
        ``ctx.reopen``). ``record`` checks the second again, in its transaction."""
        with self.store.session() as s:
            if ctx.parent is not None and not serve_repo.invocation_exists(s, ctx.parent):
                raise ApiError(400, f"X-Agentmem-Parent: no stored invocation with id {ctx.parent!r}",
                               param="X-Agentmem-Parent", code="parent_not_found")
            for client, ep_id in zip(planned.client_episodes, planned.episode_ids, strict=True):
                self._check_open(s, ctx, client, ep_id)

    def _check_open(self, s, ctx: CallContext, client: str, ep_id: str) -> Episode | None:
        """The episode ``ep_id`` when it exists; 409 when it was rewarded and ``ctx`` does not reopen it."""
        if ctx.episode is None or not serve_repo.episode_in_run(s, self.run_id, ep_id):
            return None
        ep = repo.get_episode(s, ep_id)
        if ep.stop_reason == "reward" and not ctx.reopen:
            raise ApiError(409, f"episode {client!r} was rewarded: a call after its reward needs "
                                "X-Agentmem-Reopen: true (the episode then goes back to running, without its reward)",
                           type="conflict", param="episode", code="episode_rewarded")
        return ep

    def previous(self, invocation_id: str) -> tuple[ServeCall, Invocation] | None:
        """A chat call of this run (its ``serve_calls`` row and its invocation), or None when there is none
        (``previous_response_id`` of the Responses API)."""
        with self.store.session() as s:
            try:
                call = serve_repo.get_serve_call(s, invocation_id)
            except NotFound:
                return None
            episode = (call.client or {}).get("episode")
            if call.messages is None or episode is None:
                return None
            ep_id = episode_row_id(self.run_id, str(episode))
            if not serve_repo.episode_in_run(s, self.run_id, ep_id):
                return None
            inv = next((i for i in repo.episode_invocations(s, ep_id) if i.id == invocation_id), None)
        return None if inv is None else (call, inv)

    def plan(self, ctx: CallContext, prompts: int, n: int) -> Planned:
        call_id, total = new_id(), prompts * n
        inv_ids = [new_id() for _ in range(total)]
        if total == 1:
            clients = [ctx.episode or inv_ids[0]]
            tasks = [ctx.task or clients[0]]
        else:
            base = ctx.episode or call_id
            clients = [f"{base}.{i}" for i in range(total)]
            tasks = [ctx.task or (base if prompts == 1 else f"{base}:{i // n}") for i in range(total)]
        return Planned(call_id, inv_ids, clients, [episode_row_id(self.run_id, c) for c in clients], tasks)

    def record(self, ctx: CallContext, planned: Planned, choices: list[Choice], sent: Sent, temperature: float,
               n: int) -> None:
        """Store one request in one transaction: ``choices`` in request order, ``n`` per prompt, each an
        invocation with its ``serve_calls`` row."""
        standalone = ctx.episode is None  # episodes the client did not name are closed with their call
        with self._lock, self.store.session() as s:
            for i, choice in enumerate(choices):
                prompt, ep_id = i // n, planned.episode_ids[i]
                rewarded = self._check_open(s, ctx, planned.client_episodes[i], ep_id)
                if rewarded is not None and rewarded.stop_reason == "reward":  # reopened: running, no reward
                    repo.update_episode(s, rewarded.model_copy(update={
                        "reward": None, "f1": None, "em": None, "sub_em": None, "status": EpisodeStatus.running,
                        "stop_reason": None, "finished_at": None}))
                if not serve_repo.episode_in_run(s, self.run_id, ep_id):
                    task = planned.tasks[i]
                    repo.insert_episodes(s, [Episode(
                        id=ep_id, run_id=self.run_id, env=ENV, task_id=task,
                        sample_index=serve_repo.next_sample_index(s, self.run_id, task),
                        question=sent.questions[prompt])])
                repo.insert_invocations(s, [Invocation(
                    id=planned.invocation_ids[i], episode_id=ep_id, step=serve_repo.next_step(s, ep_id),
                    kind=ctx.kind, memory_policy=ENV, policy_version=self.policy_version,
                    prompt_ids=choice.prompt_ids, output_ids=choice.output_ids, output_logprobs=choice.logprobs,
                    prompt_text=sent.prompt_texts[prompt], output_text=choice.text, finish_reason=choice.finish_reason,
                    temperature=temperature, latency_s=choice.latency_s, parent_invocation_id=ctx.parent)])
                if not serve_repo.invocation_exists(s, planned.invocation_ids[i]):  # its step was taken meanwhile
                    raise ApiError(409, f"episode {planned.client_episodes[i]!r}: another process stored a call at "
                                        "the same step; serve one run from one server process", type="conflict")
                serve_repo.insert_serve_calls(s, [ServeCall(
                    invocation_id=planned.invocation_ids[i], messages=sent.messages, tools=sent.tools,
                    sampling=sent.sampling, prompt_logprobs=choice.prompt_logprobs, replayable=choice.replayable,
                    client={"episode": planned.client_episodes[i], "task": planned.tasks[i], "kind": ctx.kind})])
                if standalone:
                    ep = repo.get_episode(s, ep_id)
                    repo.update_episode(s, ep.model_copy(update={
                        "prediction": choice.text, "status": EpisodeStatus.answered, "stop_reason": "call",
                        "finished_at": utcnow()}))
                else:
                    serve_repo.set_prediction(s, ep_id, choice.text)
            repo.heartbeat(s, self.run_id)
            s.commit()

    def _episode(self, s, client_id: str) -> Episode:
        ep_id = episode_row_id(self.run_id, client_id)
        if not serve_repo.episode_in_run(s, self.run_id, ep_id):
            # a row id given directly (as the response's X-Agentmem-Episode header names it) works too
            if serve_repo.episode_in_run(s, self.run_id, client_id):
                ep_id = client_id
            else:
                raise ApiError(404, f"no episode {client_id!r} in this server's run", param="episode_id",
                               code="episode_not_found", type="not_found_error")
        return repo.get_episode(s, ep_id)

    def reward(self, client_id: str, reward: float, metrics: dict[str, float], prediction: str | None, *,
               replace: bool = False) -> Episode:
        """Close an episode with its outcome: ``reward``, F1 (``metrics['f1']``, else the reward when it lies in
        [0, 1]), EM and substring EM when given. An episode already rewarded gets 409 unless ``replace``."""
        with self._lock, self.store.session() as s:
            ep = self._episode(s, client_id)
            if ep.stop_reason == "reward" and not replace:
                raise ApiError(409, f"episode {client_id!r} already has a reward ({ep.reward}): send "
                                    '"replace": true to replace it', type="conflict", param="replace",
                               code="episode_rewarded")
            # F1 is the reward when the client gives none and the reward is one (in [0, 1]); else unknown
            f1 = metrics.get("f1", reward if 0.0 <= reward <= 1.0 else None)
            closed = ep.model_copy(update={
                "reward": reward, "f1": f1, "em": metrics.get("em"),
                "sub_em": metrics.get("sub_em"), "status": EpisodeStatus.answered, "stop_reason": "reward",
                "prediction": prediction if prediction is not None else ep.prediction, "finished_at": utcnow()})
            repo.update_episode(s, closed)
            s.commit()
        return closed

    def privileged(self, client_id: str, text: str, answers: list[str], task: str | None = None) -> Episode:
        """Give an episode its privileged context (answers and evidence text), creating the episode when
        its first call has not come yet (a harness knows the gold answer before the agent starts)."""
        with self._lock, self.store.session() as s:
            ep_id = episode_row_id(self.run_id, client_id)
            if not serve_repo.episode_in_run(s, self.run_id, ep_id) and not serve_repo.episode_in_run(
                    s, self.run_id, client_id):
                task = task or client_id
                repo.insert_episodes(s, [Episode(id=ep_id, run_id=self.run_id, env=ENV, task_id=task, question="",
                                                 sample_index=serve_repo.next_sample_index(s, self.run_id, task))])
            ep = self._episode(s, client_id)
            serve_repo.set_privileged(s, ep.id, answers, [text] if text else [])
            s.commit()
            return repo.get_episode(s, ep.id)

    def trace(self, client_id: str) -> dict:
        """One episode of this run as JSON: its outcome, and per call (in step order) what the client sent
        (messages, tools, options), the ids the model read and sampled, the log-probs, and the reply."""
        with self.store.session() as s:
            ep = self._episode(s, client_id)
            calls = repo.episode_invocations(s, ep.id)
            sent = {}
            for inv in calls:
                try:
                    sent[inv.id] = serve_repo.get_serve_call(s, inv.id)
                except NotFound:  # a call stored by another job (an agentmem rollout run read here)
                    pass
        out = _episode_json(ep)
        out["calls"] = [{
            "invocation_id": inv.id, "step": inv.step, "kind": inv.kind, "parent_invocation_id": inv.parent_invocation_id,
            "policy_version": inv.policy_version, "created_at": inv.created_at.isoformat(),
            "messages": sent[inv.id].messages if inv.id in sent else None,
            "tools": sent[inv.id].tools if inv.id in sent else None,
            "options": sent[inv.id].sampling if inv.id in sent else None,
            "client": sent[inv.id].client if inv.id in sent else None,
            "prompt_text": inv.prompt_text, "prompt_ids": inv.prompt_ids.tolist(), "output_text": inv.output_text,
            "output_ids": inv.output_ids.tolist(),
            "output_logprobs": None if inv.output_logprobs is None else inv.output_logprobs.tolist(),
            "finish_reason": inv.finish_reason.value, "temperature": inv.temperature, "latency_s": inv.latency_s,
        } for inv in calls]
        return out

    def episodes(self, run_id: str) -> dict:
        """The episodes of run ``run_id`` (any run of the store, an abbreviated id too) as JSON, newest last."""
        with self.store.session() as s:
            run = repo.get_run(s, run_id)
            eps = repo.list_episodes(s, run.id)
        return {"run_id": run.id, "kind": run.kind.value, "status": run.status,
                "episodes": [_episode_json(e) for e in eps]}

    def finish(self, status: str = "finished") -> None:
        with self.store.session() as s:
            repo.finish_run(s, self.run_id, status=status)
            s.commit()


def _episode_json(ep: Episode) -> dict:
    return {"episode_id": ep.id, "run_id": ep.run_id, "task_id": ep.task_id, "sample_index": ep.sample_index,
            "status": ep.status.value, "stop_reason": ep.stop_reason, "question": ep.question,
            "prediction": ep.prediction, "reward": ep.reward, "f1": ep.f1, "em": ep.em, "sub_em": ep.sub_em,
            "gold_answers": ep.gold_answers, "evidence": ep.evidence, "created_at": ep.created_at.isoformat(),
            "finished_at": ep.finished_at.isoformat() if ep.finished_at else None}
