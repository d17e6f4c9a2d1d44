"""Plots as inline SVG strings, drawn on the server: line charts (with optional error bars) and histograms.

Pure functions of numbers to markup (no I/O, no plotting library); every text is escaped, and each point or
bar carries a ``<title>`` so its value shows on hover.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
# One dash pattern per line (the first solid), so a line drawn over an identical one (``loss`` under
# ``kd_loss`` when the loss is the KD term alone) still shows through its gaps.
DASHES = ("", "6 3", "2 3", "8 3 2 3", "1 3", "10 4", "4 2 1 2", "3 6")
LEGEND_ROW = 14
_PAD = {"left": 56, "right": 16, "top": 28, "bottom": 40}


@dataclass(frozen=True)
class Series:
    """One line: (x, y) points sorted by x, and optionally a (low, high) error bar per point."""

    label: str
    points: Sequence[tuple[float, float]]
    errors: Sequence[tuple[float, float]] | None = None


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:  # one value: a unit range around it (from 0 when it is 0)
        lo, hi = (0.0, 1.0) if lo == 0 else (lo - 0.5, hi + 0.5)
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks, t = [], first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(t, 12))
    return ticks


def integer_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` whole-number ticks covering [lo, hi] (training steps), at least 1 apart; a single value
    gets one neighbour on each side."""
    first, last = math.floor(lo), math.ceil(hi)
    if last <= first:
        first, last = first - 1, last + 1
    raw = (last - first) / max(1, n)
    if raw <= 1:
        step = 1
    else:
        mag = 10 ** math.floor(math.log10(raw))
        step = int(next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw))
    start = math.floor(first / step) * step
    ticks = [float(t) for t in range(start, last + 1, step)]
    if ticks[-1] < last:
        ticks.append(ticks[-1] + step)
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e4 or abs(v) < 1e-3:
        return f"{v:.2g}"
    return f"{v:.4g}"


class _Frame:
    def __init__(self, width: int, height: int, xs: list[float], ys: list[float],
                 y_range: tuple[float, float] | None, integer_x: bool = False):
        self.w, self.h = width, height
        ticks = integer_ticks if integer_x else nice_ticks
        self.xt = ticks(min(xs), max(xs)) if xs else [0.0, 1.0]
        self.yt = nice_ticks(*(y_range or (min(ys), max(ys)))) if ys or y_range else [0.0, 1.0]
        self.x0, self.x1 = self.xt[0], self.xt[-1] if self.xt[-1] > self.xt[0] else self.xt[0] + 1
        self.y0, self.y1 = self.yt[0], self.yt[-1] if self.yt[-1] > self.yt[0] else self.yt[0] + 1

    def x(self, v: float) -> float:
        return _PAD["left"] + (v - self.x0) / (self.x1 - self.x0) * (self.w - _PAD["left"] - _PAD["right"])

    def y(self, v: float) -> float:
        return self.h - _PAD["bottom"] - (v - self.y0) / (self.y1 - self.y0) * (self.h - _PAD["top"] - _PAD["bottom"])

    def axes(self, title: str, x_label: str, y_label: str) -> list[str]:
        left, bottom = _PAD["left"], self.h - _PAD["bottom"]
        out = [f'<text x="{self.w / 2:.1f}" y="16" class="title" text-anchor="middle">{escape(title)}</text>',
               f'<line x1="{left}" y1="{bottom}" x2="{self.w - _PAD["right"]}" y2="{bottom}" class="axis"/>',
               f'<line x1="{left}" y1="{_PAD["top"]}" x2="{left}" y2="{bottom}" class="axis"/>']
        for t in self.xt:
            out.append(f'<text x="{self.x(t):.1f}" y="{bottom + 14}" class="tick" text-anchor="middle">{_fmt(t)}</text>')
        for t in self.yt:
            y = self.y(t)
            out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{self.w - _PAD["right"]}" y2="{y:.1f}" class="grid"/>')
            out.append(f'<text x="{left - 4}" y="{y + 3:.1f}" class="tick" text-anchor="end">{_fmt(t)}</text>')
        out.append(f'<text x="{self.w / 2:.1f}" y="{self.h - 6}" class="label" text-anchor="middle">'
                   f'{escape(x_label)}</text>')
        out.append(f'<text x="12" y="{self.h / 2:.1f}" class="label" text-anchor="middle" '
                   f'transform="rotate(-90 12 {self.h / 2:.1f})">{escape(y_label)}</text>')
        return out


def _legend(series: Sequence[Series], top: float) -> list[str]:
    """One row per line under the plot, with the line's colour and dash and its full label."""
    out = []
    for i, s in enumerate(series):
        y = top + LEGEND_ROW * i
        dash = f' stroke-dasharray="{DASHES[i % len(DASHES)]}"' if DASHES[i % len(DASHES)] else ""
        out.append(f'<line x1="{_PAD["left"]}" y1="{y:.1f}" x2="{_PAD["left"] + 24}" y2="{y:.1f}" '
                   f'stroke="{PALETTE[i % len(PALETTE)]}" stroke-width="2"{dash}/>'
                   f'<text x="{_PAD["left"] + 30}" y="{y + 4:.1f}" class="legend">{escape(s.label)}</text>')
    return out


def _svg(width: int, height: int, body: list[str], label: str) -> str:
    return (f'<svg class="chart" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}">' + "".join(body) + "</svg>")


def line_chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str, width: int = 560,
               height: int = 240, y_range: tuple[float, float] | None = None, integer_x: bool = False) -> str:
    """Lines with markers (and error bars where given), each line with its own dash pattern, and a legend of
    full labels under the plot when there is more than one line. ``integer_x``: whole-number x ticks
    (training steps)."""
    pts = [(x, y) for s in series for x, y in s.points if math.isfinite(y)]
    ys = [y for _, y in pts] + [v for s in series for e in (s.errors or []) for v in e if math.isfinite(v)]
    frame = _Frame(width, height, [x for x, _ in pts], ys, y_range, integer_x)
    body = frame.axes(title, x_label, y_label)
    if not pts:
        body.append(f'<text x="{width / 2:.1f}" y="{height / 2:.1f}" class="empty" text-anchor="middle">no data</text>')
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        finite = [(x, y) for x, y in s.points if math.isfinite(y)]
        if len(finite) > 1:
            path = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in finite)
            dash = f' stroke-dasharray="{DASHES[i % len(DASHES)]}"' if DASHES[i % len(DASHES)] else ""
            body.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"{dash}/>')
        for j, (x, y) in enumerate(s.points):
            if not math.isfinite(y):
                continue
            tip = f"{s.label}: step {_fmt(x)}, {_fmt(y)}"
            if s.errors:
                lo, hi = s.errors[j]
                tip += f" [{_fmt(lo)}, {_fmt(hi)}]"
                body.append(f'<line x1="{frame.x(x):.1f}" y1="{frame.y(lo):.1f}" x2="{frame.x(x):.1f}" '
                            f'y2="{frame.y(hi):.1f}" stroke="{colour}"/>')
            r = 2.5 if len(s.points) < 200 else 1.2
            body.append(f'<circle cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="{r}" fill="{colour}">'
                        f'<title>{escape(tip)}</title></circle>')
    if len(series) > 1:
        body += _legend(series, height + LEGEND_ROW / 2)
        height += LEGEND_ROW * len(series)
    return _svg(width, height, body, title)


def histogram(values: Sequence[float], *, title: str, x_label: str, bins: int = 10, lo: float = 0.0,
              hi: float = 1.0, width: int = 560, height: int = 200) -> str:
    """Counts of ``values`` in ``bins`` equal bins over [lo, hi] (the last bin includes ``hi``)."""
    counts = [0] * bins
    for v in values:
        if lo <= v <= hi:
            counts[min(bins - 1, int((v - lo) / (hi - lo) * bins))] += 1
    frame = _Frame(width, height, [lo, hi], [0.0, float(max(counts, default=0) or 1)], None)
    body = frame.axes(title, x_label, "episodes")
    step = (hi - lo) / bins
    for i, n in enumerate(counts):
        x0, x1 = frame.x(lo + i * step), frame.x(lo + (i + 1) * step)
        y = frame.y(n)
        body.append(f'<rect x="{x0 + 1:.1f}" y="{y:.1f}" width="{max(0.0, x1 - x0 - 2):.1f}" '
                    f'height="{frame.y(0) - y:.1f}" class="bar"><title>{_fmt(lo + i * step)}-'
                    f'{_fmt(lo + (i + 1) * step)}: {n}</title></rect>')
    return _svg(width, height, body, title)
