"""Helpers shared by the commands that load models or write runs."""

from __future__ import annotations

import logging
import os

from rich.logging import RichHandler


def setup_logging(verbose: bool = False) -> None:
    """Quiet third-party libraries; show our warnings. Called once at the start of heavy commands."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s",
                        handlers=[RichHandler(show_path=False)], force=True)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def weights_dtype(dtype, model: str, db: str | None, threads: int | None):
    """The ``DType`` a generating job runs in: ``dtype`` itself, or for ``auto`` the faster one measured with
    ``model`` on this CPU before the run is written, so the run config stores a concrete choice; the choice is
    printed right after the run id (``job_session.after_run_id``)."""
    from agentmem.config import DType
    from cli.job_session import after_run_id

    if str(dtype) != "auto":
        return DType(str(dtype))
    import torch

    from agentmem.model_refs import auto_dtype
    from store.engine import open_store

    if threads is not None:
        torch.set_num_threads(threads)
    setup_logging()  # no weights bar from the measurement's load: the run's own lines come first
    choice = auto_dtype(open_store(db, create=True), model)
    after_run_id(f"--dtype auto: {choice.dtype} ({choice.reason})")
    return DType(choice.dtype)


def measured_dtype(call, config, db: str | None, threads: int | None):
    """``config`` with ``--dtype auto`` (flag or file) measured; called after the cheap checks, so a bad
    flag answers first. ``config`` None (a resumed run) stays None."""
    if config is None or call.given()[0].get("dtype") != "auto":
        return config
    return config.model_copy(update={"dtype": weights_dtype("auto", config.model, db, threads)})


def check_port(host: str, port: int) -> None:
    """A ``ConfigError`` when this process cannot listen on ``host:port`` (another server holds the port, a
    privileged port, an unknown host), checked before anything loads or any address is printed."""
    import errno
    import socket

    from agentmem.errors import ConfigError

    try:
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise ConfigError(f"--host {host}: {exc.strerror}") from None
    with socket.socket(family, kind) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a closing socket is no holder
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"port {port} on {host} is in use (another server?): give another --port") from None
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def runtime(device, threads: int | None, fsdp: bool = False):
    """The process's Runtime (validated: an unusable device or --fsdp off CUDA fails before any model loads;
    under torchrun, in the process group)."""
    from agentmem.runtime import Runtime

    return Runtime.create(device=device, threads=threads, fsdp=fsdp)


def training_store(db: str | None, rt):
    """The store of a training job: read-write on rank 0, read-only on the other ranks of a torchrun job
    (rank 0 alone writes)."""
    from store.engine import open_read_only, open_store

    return open_store(db) if rt.is_main else open_read_only(db)


def _check_data(rollout) -> None:
    """The environment of ``rollout`` built (``envs.check_data``): a data file that does not parse or has a
    record of the wrong shape is the world's (exit 1; its message starts with the file), a knob value out of
    range the command line's (exit 2)."""
    from pathlib import Path

    from agentmem.errors import AgentmemError
    from cli.config_options import CommandLineError
    from envs import check_data

    try:
        check_data(rollout.env, rollout.data, rollout.env_knobs, chunk_tokens=rollout.chunk_tokens, seed=rollout.seed)
    except AgentmemError as exc:
        if rollout.data is not None and str(exc).startswith(str(Path(rollout.data))):
            raise
        raise CommandLineError(str(exc)) from exc


def preflight(db: str | None, *, runs: list[str] | None = None, resume: str | None = None, kind=None,
              models: tuple[str | None, ...] = (), data: str | None = None, create: bool = False,
              kinds: list[str] | None = None, rollout=None) -> None:
    """The cheap checks of a job's database URL, ids, model references, call kinds (the memory policies'
    registry), data file and, for a job that reads an environment (``rollout``: its ``RolloutConfig``), the
    environment's knobs and data requirement, the memory policy and its options, and its data file read and its
    records' shape checked (``envs.check_data``); run before torch is
    imported (``runtime``, ``setup_logging``), so a bad one answers within a second. The job checks them
    again; these are the same functions, so the messages are the same."""
    from store.engine import check_url

    check_url(db)
    if rollout is not None:
        from agentmem.agent.registry import memory_policy_names, policy_options
        from agentmem.errors import AgentmemError
        from cli.command import unknown_choice
        from cli.config_options import CommandLineError
        from envs import check_env

        names = memory_policy_names()
        if rollout.agent.memory_policy not in names:
            raise CommandLineError(unknown_choice("memory policy", rollout.agent.memory_policy, names))
        try:  # an unknown knob, memory policy or option, a data flag the environment needs or refuses: usage
            check_env(rollout.env, rollout.data, rollout.env_knobs)
            policy_options(rollout.agent.memory_policy, rollout.agent.memory_options)
        except AgentmemError as exc:  # these two read no file: what they refuse is the command line's
            raise CommandLineError(str(exc)) from exc
        data = rollout.data if data is None else data
    if kinds is not None:
        from agentmem.agent.registry import check_kinds

        check_kinds(kinds)
    if data is not None:
        from envs.files import require_file

        require_file(data)
    if rollout is not None:
        _check_data(rollout)
    if not (runs or resume or any(m not in (None, "default") for m in models)):
        return
    from agentmem import model_refs
    from agentmem.jobs.runs import check_runs, load_run
    from store.engine import open_store

    store = open_store(db, create=create)
    try:
        if resume is not None:
            load_run(store, resume, kind)
        if runs:
            check_runs(store, runs)
        for ref in models:
            if ref not in (None, "default"):
                model_refs.resolve(store, ref)
    finally:
        store.engine.dispose()
