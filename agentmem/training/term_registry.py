"""Loss terms from other packages: the entry-point group ``agentmem.loss_terms``.

A package adds a term to the objective without editing agentmem: it writes one class (or function) that
takes the ``DistillConfig`` and returns a ``LossTerm`` (``agentmem.training.terms``: a ``name``,
``needs_teacher``, ``needs_reference`` and ``__call__(MicroBatch) -> TermValue``), and names it in its
pyproject.toml::

    [project.entry-points."agentmem.loss_terms"]
    entropy = "my_package.entropy:EntropyTerm"

A run weighs it with ``DistillConfig.loss.terms`` (``{"entropy": 0.01}``); its value goes where every
term's does, the step's metrics as ``{term.name}_loss``, and the progress line and the viewer show it there. Entry points are listed on first use and loaded only when
the objective is built; this module imports no torch, so a job checks the names before any weights load.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from importlib.metadata import entry_points
from typing import Any

from agentmem.errors import ConfigError

GROUP = "agentmem.loss_terms"


@functools.cache
def _plugins() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def loss_term_names() -> list[str]:
    return sorted(_plugins())


def check_loss_terms(names: Iterable[str]) -> None:
    """A ``ConfigError`` for a name no installed package registers."""
    unknown = sorted(set(names) - set(_plugins()))
    if unknown:
        raise ConfigError(f"unknown loss term(s) {unknown} in loss_terms; installed: "
                          f"{', '.join(loss_term_names()) or f'none (entry-point group {GROUP})'}")


def loss_term_factory(name: str) -> Any:
    """The factory registered as ``name``: ``factory(config: DistillConfig) -> LossTerm``."""
    check_loss_terms([name])
    return _plugins()[name].load()
