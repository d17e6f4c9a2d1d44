"""Assemble a server: config, model, sampler, run and app; the one place ``agentmem serve`` builds from.

Order of work: the config is checked and the model reference resolved before any weights load; the
served checkpoint is registered (it is every call's policy version); the ``serve`` run is opened (a name
used before continues its run); then the backend loads and the app is built.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI

from agentmem import model_refs
from agentmem.backends.types import AsyncEngine, Backend
from agentmem.config import BackendKind, ServeConfig, load_template
from agentmem.runtime import CPU, Runtime
from agentmem.serve.app import create_app
from agentmem.serve.calls import ServeSettings
from agentmem.serve.chat_template import with_template
from agentmem.serve.engine_sampler import EngineSampler
from agentmem.serve.gateway import UpstreamSampler
from agentmem.serve.recorder import Recorder, open_run
from agentmem.serve.sampler import BatchSampler, Sampler
from store.engine import Store


@dataclass
class Server:
    app: FastAPI
    sampler: Sampler
    recorder: Recorder

    @property
    def run_id(self) -> str:
        return self.recorder.run_id

    def close(self, status: str = "interrupted") -> None:
        self.sampler.close()
        self.recorder.finish(status)

    def serve(self, host: str, port: int) -> str:
        """Serve on ``host:port`` until SIGINT (Ctrl-C) or SIGTERM, then close, marking the run
        ``interrupted`` (``failed`` when the server itself fails); the status. uvicorn stops gracefully on
        either signal (calls in flight are answered) and then raises the signal again, after putting back the
        handlers it found: the ones set here only note it, so that the run is closed either way (a SIGTERM's
        default action would end the process before). Call it from the main thread."""
        import signal

        import uvicorn

        signals = (signal.SIGINT, signal.SIGTERM)
        found = {sig: signal.signal(sig, lambda *_: None) for sig in signals}
        status = "failed"
        try:
            uvicorn.run(self.app, host=host, port=port, log_level="warning")
            status = "interrupted"
        finally:
            for sig, handler in found.items():
                signal.signal(sig, handler)
            self.close(status)
        return status


def context_length(backend: Backend) -> int:
    """The longest prompt + output the backend's model takes."""
    model = getattr(backend, "model", None)
    if model is not None:
        return int(model.config.max_position_embeddings)
    llm = getattr(backend, "llm", None)
    if llm is not None:
        return int(llm.llm_engine.model_config.max_model_len)
    return int(backend.tokenizer.model_max_length)


def build_server(store: Store, config: ServeConfig, runtime: Runtime = CPU, *, api_key: str | None = None,
                 backend: Backend | None = None, engine: Callable[[], AsyncEngine] | None = None,
                 policy_version: str | None = None, upstream_api_key: str | None = None) -> Server:
    """A ready server. ``backend`` injects a loaded backend, ``engine`` a factory of an async engine (tests;
    ``policy_version`` then names it). ``upstream_api_key``: the key a gateway sends its upstreams."""
    template = load_template(config.chat_template) if config.chat_template is not None else None
    if config.upstream is not None:
        return _gateway(store, config, api_key, template, upstream_api_key)
    if backend is None and engine is None:
        ref = model_refs.resolve(store, config.model)
        policy_version = model_refs.register(store, ref).id
        if config.backend is BackendKind.vllm:
            engine = functools.partial(_vllm_engine, ref.path, config.dtype.value)
    # the model or engine loads before the run is opened: a backend that cannot load leaves no run behind
    if engine is not None:  # continuous batching: every request goes to the engine as it arrives
        live = EngineSampler(engine)
        settings = ServeSettings(config.name, config.context_length or live.engine.max_model_len, config.max_n,
                                 config.max_tokens, api_key, top_logprobs=True, nucleus=live.engine.nucleus,
                                 shaping=getattr(live.engine, "shaping", False),
                                 constrains=getattr(live.engine, "constrains", False),
                                 max_body_bytes=config.max_body_bytes)
        recorder = Recorder(store, open_run(store, config.model_dump(mode="json"), config.run_name), policy_version)
        return Server(create_app(live, recorder, with_template(live.tokenizer, template), settings), live, recorder)
    if backend is None:
        backend = model_refs.backend(config.backend, ref.path, config.dtype, runtime)
    sampler = BatchSampler(backend, window_s=config.batch_window_ms / 1000, max_batch=config.max_batch,
                      continuous=config.continuous_batching)
    settings = ServeSettings(config.name, config.context_length or context_length(backend), config.max_n,
                             config.max_tokens, api_key,
                             top_logprobs=getattr(backend, "lists_top_logprobs", False),
                             shaping=getattr(backend, "shaping", False),
                             constrains=getattr(backend, "constrains", False), max_body_bytes=config.max_body_bytes)
    recorder = Recorder(store, open_run(store, config.model_dump(mode="json"), config.run_name), policy_version)
    return Server(create_app(sampler, recorder, with_template(backend.tokenizer, template), settings), sampler,
                  recorder)


def _vllm_engine(path: str, dtype: str) -> AsyncEngine:
    from agentmem.backends.vllm_async import AsyncVLLMEngine

    return AsyncVLLMEngine(path, dtype=dtype)


def _gateway(store: Store, config: ServeConfig, api_key: str | None, template: str | None,
             upstream_api_key: str | None) -> Server:
    """Gateway mode: the tokenizer of ``config.model`` renders prompts, the upstreams generate (``gateway.py``)."""
    assert config.upstream is not None
    ref = model_refs.resolve(store, config.model)
    tokenizer = with_template(model_refs.load_tokenizer(ref.path), template)
    sampler = UpstreamSampler(config.upstream, tokenizer, api_key=upstream_api_key, text=config.upstream_text,
                              model=config.name if config.upstream_text else None)
    try:
        sampler.connect(config.upstream_wait)  # before the run opens: no upstream, no run
    except BaseException:
        sampler.close()
        raise
    policy_version = model_refs.register(store, ref).id
    recorder = Recorder(store, open_run(store, config.model_dump(mode="json"), config.run_name), policy_version)
    length = config.context_length or sampler.context_length() or int(tokenizer.model_max_length)
    settings = ServeSettings(config.name, length, config.max_n, config.max_tokens, api_key,
                             top_logprobs=False, shaping=True,  # the options go upstream (vLLM applies them)
                             constrains=False, max_body_bytes=config.max_body_bytes)
    return Server(create_app(sampler, recorder, tokenizer, settings), sampler, recorder)
