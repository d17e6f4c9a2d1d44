"""Token heat maps: each sampled (action) token coloured by a stored teacher value.

``logprob`` is the teacher's log-prob of the sampled token (0 is best; more negative is redder);
``reverse_kl`` the full-vocabulary KL(student || teacher) at that position (0 is best; larger is redder).
Colours are relative to one scale per page (the 95th percentile of the page's values, so pages compare
like with like); every token element holds its stored value in ``data-value`` (exact: the float32 as a
Python float) and shows it on hover (``title``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from html import escape

import numpy as np

LEVELS = 32
_BASE, _HOT = np.array([255, 255, 255]), np.array([214, 39, 40])
COLOURS = ["#" + "".join(f"{c:02x}" for c in np.rint(_BASE + (_HOT - _BASE) * i / (LEVELS - 1)).astype(int))
           for i in range(LEVELS)]


class Metric(str, enum.Enum):
    logprob = "logprob"
    reverse_kl = "reverse_kl"

    @property
    def label(self) -> str:
        return "teacher log-prob" if self is Metric.logprob else "reverse KL"


def badness(values: np.ndarray, metric: Metric) -> np.ndarray:
    """How bad each value is, >= 0: minus the log-prob, or the KL (round-off below 0 clamped)."""
    values = np.asarray(values, dtype=np.float64)
    return np.maximum(0.0, -values if metric is Metric.logprob else values)


def page_scale(arrays: Sequence[np.ndarray], metric: Metric) -> float:
    """The badness that gets the hottest colour: the 95th percentile over all the arrays (at least 1e-6)."""
    nonempty = [badness(a, metric) for a in arrays if len(a)]
    if not nonempty:
        return 1.0
    return max(1e-6, float(np.percentile(np.concatenate(nonempty), 95)))


def levels(values: np.ndarray, metric: Metric, scale: float) -> np.ndarray:
    return np.minimum(LEVELS - 1, np.rint(badness(values, metric) / scale * (LEVELS - 1))).astype(int)


def token_spans(pieces: Sequence[str], ids: np.ndarray, values: np.ndarray, metric: Metric, scale: float) -> str:
    """One ``<span class="tok">`` per token, coloured, with ``data-value`` and a hover title."""
    out = []
    label = metric.label
    for piece, tid, value, level in zip(pieces, ids.tolist(), values.tolist(), levels(values, metric, scale).tolist(),
                                        strict=True):
        out.append(f'<span class="tok" style="background:{COLOURS[level]}" data-value="{value!r}" '
                   f'title="{label} {value:.4f} · id {tid}">{escape(piece)}</span>')
    return "".join(out)


def legend(metric: Metric, scale: float) -> str:
    """A colour bar from 0 to the page's scale, for the template."""
    cells = "".join(f'<span style="background:{c}"></span>' for c in COLOURS[:: max(1, LEVELS // 16)])
    hot = f"{-scale:.3g}" if metric is Metric.logprob else f"{scale:.3g}"
    return (f'<div class="legend"><span class="legend-label">{escape(metric.label)}: 0</span>'
            f'<span class="legend-bar">{cells}</span><span class="legend-label">{hot} or worse</span></div>')
