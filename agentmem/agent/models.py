"""Model references as users give them: a checkpoint id from the store, a local folder, 'default', or a
hub name."""

from __future__ import annotations

from pathlib import Path

from agentmem.policy.models import DEFAULT_MODEL, resolve_model
from store import repository as repo
from store.engine import Store
from store.errors import NotFound


def resolve_model_ref(store: Store | None, ref: str | None) -> tuple[str, str]:
    """(model path, base model name). A registered checkpoint id wins over a same-named hub model."""
    if ref and store is not None and "/" not in ref and not Path(ref).exists():
        with store.session() as s:
            try:
                ckpt = repo.get_checkpoint(s, ref)
                return ckpt.path, ckpt.base_model
            except NotFound:
                pass
    path = resolve_model(ref)
    base = DEFAULT_MODEL if ref in (None, "default", DEFAULT_MODEL) else str(ref)
    return str(path), base
