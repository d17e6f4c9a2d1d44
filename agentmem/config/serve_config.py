"""An OpenAI-compatible server's config (``agentmem serve``): ``ServeConfig``, and the chat templates shipped
for it (a file or a shipped name: ``chat_template``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from agentmem.config.base import Frozen
from agentmem.config.choices import BackendKind, DType

# the Jinja chat templates shipped with agentmem (``--chat-template chatml_tools``)
TEMPLATES = Path(__file__).parent.parent / "serve" / "templates"


def shipped_templates() -> list[str]:
    """The names of the templates shipped with agentmem."""
    return sorted(p.stem for p in TEMPLATES.glob("*.jinja"))


def load_template(value: str) -> str:
    """The Jinja text of ``value``: a file, or the name of a shipped template."""
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text()
    if (TEMPLATES / f"{value}.jinja").is_file():
        return (TEMPLATES / f"{value}.jinja").read_text()
    raise FileNotFoundError(f"{value}: no such file, nor the name of a shipped template "
                            f"({', '.join(shipped_templates())})")


class ServeConfig(Frozen):
    """One server's configuration, stored in its run (the API keys, the address and the process options are
    flags of their own)."""

    model: str | None = None
    """Model to serve: a checkpoint id, a model folder or 'default'."""
    served_model_name: str | None = None
    """The `model` name clients send (default: the --model value, or 'default')."""
    backend: BackendKind = BackendKind.transformers
    """Generation backend (vllm: its async engine, in this process)."""
    # fp32, as rollouts: on CPU it is as fast for long prompts, and the stored log-probs then match the fp32
    # recompute of training
    dtype: DType = DType.float32
    """Model dtype (float32, as rollouts: the stored log-probs then match training's float32 recompute)."""
    run_name: str | None = None
    """Name of the serve run: restarting with the same name continues the same run (default: a new run)."""
    max_n: int = Field(16, ge=1)
    """Largest `n` (samples per call) a request may ask."""
    max_tokens: int = Field(256, ge=1)
    """Output tokens of a request that sets none."""
    batch_window_ms: float = Field(5.0, ge=0)
    """transformers, when no batch runs: a request waits until none has arrived for this long (at most 10 times
    it) for others to start a batch with."""
    max_batch: int = Field(64, ge=1)
    """Calls per backend batch."""
    continuous_batching: bool = True
    """transformers: requests of plain sampling join the running batch between decoding steps; off: each batch
    is fixed when it starts, later requests wait for it to end."""
    context_length: int | None = Field(None, ge=2)
    """Longest prompt plus output, in tokens (default: the model's)."""
    upstream: tuple[str, ...] | None = None
    """Gateway mode: forward generation to this vLLM or agentmem OpenAI server (e.g. http://127.0.0.1:8002/v1)
    instead of loading the model; --model then gives only the tokenizer and chat template. Several upstreams:
    an episode's calls stay on one."""
    upstream_text: bool = False
    """The upstreams return no token ids (a hosted API): the chat goes to their /chat/completions under the
    served name, the reply text is tokenized locally and stored not replayable (sft, not distill)."""
    upstream_wait: float = Field(60.0, ge=0)
    """Seconds start-up waits, retrying with backoff, for a first upstream to answer."""
    chat_template: str | None = None
    """A Jinja chat template FILE replacing the model's own (or `chatml_tools`, shipped: ChatML with Hermes tool
    calls, for the default model): a request with tools its template cannot render is refused."""
    max_body_mb: float = Field(4.0, gt=0)
    """Largest request body, in MB: a longer one is refused (413) before it is read."""

    @field_validator("backend")
    @classmethod
    def _local(cls, value: BackendKind) -> BackendKind:
        if value is BackendKind.openai:
            raise ValueError("a server generates with transformers or vllm; to forward to another server use --upstream")
        return value

    @field_validator("upstream", mode="before")
    @classmethod
    def _upstreams(cls, value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...] | None:
        found = (value,) if isinstance(value, str) else tuple(value or ())
        return found or None

    @field_validator("chat_template")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                load_template(value)
            except FileNotFoundError as exc:
                raise ValueError(str(exc)) from None
        return value

    @property
    def name(self) -> str:
        return self.served_model_name or self.model or "default"

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)
