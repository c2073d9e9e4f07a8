"""Server-rendered SVG charts for the overview page: no script, no build step, no CDN.

Each chart is one `<svg role="img">` with a `<title>` and a `<desc>` (what a screen reader
announces), labelled axes with round-number ticks, and a `<title>` on every bar and point (the
tooltip). Colours come from classes styled in `static/ui.css` (the page's CSP allows no inline
style). Each value is also on its element as a `data-` attribute, and the page puts the same
numbers in a table under each chart. Pure functions: data in, markup out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape

from markupsafe import Markup

WIDTH, HEIGHT = 720, 230
LEFT, RIGHT, TOP, BOTTOM = 72, 14, 14, 46
LIST_WIDTH = 520
LIST_ROW = 24
LIST_LABEL = 240


@dataclass(frozen=True, slots=True)
class Series:
    """One named series of a time chart: a value per bucket (None: not read), drawn with CSS class `css`."""

    name: str
    css: str
    values: Sequence[float | None]


def nice_ticks(top: float, count: int = 4, *, whole: bool = False) -> list[float]:
    """Round tick values from 0 up to at least `top` (about `count` steps of 1, 2 or 5 × 10^n; `whole`: steps of at least 1)."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    if whole:
        step = max(1, step)
    return [i * step for i in range(int(math.ceil(top / step - 1e-9)) + 1)]


def number(value: float) -> str:
    """A tick or value label: whole numbers without decimals, others with up to two."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}".rstrip("0").rstrip(".")


def time_label(at: datetime, step: int) -> str:
    """A bucket's start as the x axis shows it: the time of day for buckets under a day, else the date."""
    return at.strftime("%H:%M") if step < 86_400 else at.strftime("%m-%d")


def _open(ident: str, title: str, desc: str, height: int, css: str, width: int = WIDTH) -> list[str]:
    return [f'<svg class="chart {css}" id="{ident}" role="img" aria-labelledby="{ident}-title {ident}-desc" '
            f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">',
            f'<title id="{ident}-title">{escape(title)}</title>', f'<desc id="{ident}-desc">{escape(desc)}</desc>']


def _axes(parts: list[str], ticks: list[float], scale: float, y_label: str, x_label: str) -> None:
    """Horizontal grid lines with y tick labels, both axis lines and both axis titles."""
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    for tick in ticks:
        y = bottom - tick * scale
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{number(tick)}</text>')
    parts.append(f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{bottom}"/>')
    parts.append(f'<line class="axis" x1="{LEFT}" x2="{right}" y1="{bottom}" y2="{bottom}"/>')
    parts.append(f'<text class="axis-label" transform="translate(14 {(TOP + bottom) / 2:.0f}) rotate(-90)" '
                 f'text-anchor="middle">{escape(y_label)}</text>')
    parts.append(f'<text class="axis-label" x="{(LEFT + right) / 2:.0f}" y="{HEIGHT - 6}" text-anchor="middle">{escape(x_label)}</text>')


LABEL_SPACINGS = tuple(m * 60 for m in (5, 10, 15, 30, 60, 120, 180, 240, 360, 720, 1440, 2880, 10080))
"""Seconds between x axis labels: the smallest giving at most eight labels, each on a round time."""


def _x_labels(parts: list[str], starts: Sequence[datetime], step: int, slot: float) -> None:
    """Labels under the x axis at round times (every hour, every 3 hours, every day...)."""
    span = len(starts) * step
    spacing = next((s for s in LABEL_SPACINGS if s >= step and span / s <= 8), LABEL_SPACINGS[-1])
    for i, start in enumerate(starts):
        if int(start.timestamp()) % spacing:
            continue
        x = LEFT + i * slot
        parts.append(f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{HEIGHT - BOTTOM}" y2="{HEIGHT - BOTTOM + 4}"/>')
        parts.append(f'<text class="tick" x="{x:.1f}" y="{HEIGHT - BOTTOM + 17}" text-anchor="middle">{time_label(start, spacing)}</text>')


def time_chart(ident: str, title: str, desc: str, starts: Sequence[datetime], step: int, series: Sequence[Series], *,
               y_label: str, lines: bool = False, fmt: str = "{}") -> Markup:
    """Stacked bars (or, `lines`, one polyline with points per series) over time buckets starting at `starts`."""
    slot = (WIDTH - LEFT - RIGHT) / max(1, len(starts))
    if lines:
        top = max((v for s in series for v in s.values if v is not None), default=0)
    else:
        top = max((sum(v or 0 for v in column) for column in zip(*(s.values for s in series), strict=True)), default=0)
    ticks = nice_ticks(top, whole=not lines)
    scale = (HEIGHT - TOP - BOTTOM) / ticks[-1]
    parts = _open(ident, title, desc, HEIGHT, "lines" if lines else "bars")
    _axes(parts, ticks, scale, y_label, f"time (UTC), {number(step / 60)}-minute buckets" if step < 86_400
          else f"date (UTC), {number(step / 86_400)}-day buckets")
    _x_labels(parts, starts, step, slot)
    if lines:
        _lines(parts, starts, series, slot, scale, fmt)
    else:
        _bars(parts, starts, series, slot, scale)
    parts.append(_legend(series))
    parts.append("</svg>")
    return Markup("\n".join(parts))


def _bars(parts: list[str], starts: Sequence[datetime], series: Sequence[Series], slot: float, scale: float) -> None:
    bottom = HEIGHT - BOTTOM
    width = max(1.0, slot * 0.8)
    for i, start in enumerate(starts):
        x, base = LEFT + i * slot + (slot - width) / 2, float(bottom)
        for s in series:
            value = s.values[i]
            if not value:
                continue
            h = value * scale
            base -= h
            tip = f"{start.isoformat().replace('+00:00', 'Z')}: {number(value)} {s.name}"
            parts.append(f'<rect class="bar {s.css}" x="{x:.1f}" y="{base:.1f}" width="{width:.1f}" height="{h:.1f}" '
                         f'data-series="{escape(s.name)}" data-value="{number(value)}"><title>{escape(tip)}</title></rect>')


def _lines(parts: list[str], starts: Sequence[datetime], series: Sequence[Series], slot: float, scale: float, fmt: str) -> None:
    bottom = HEIGHT - BOTTOM
    for s in series:
        points = [(LEFT + (i + 0.5) * slot, bottom - v * scale, starts[i], v) for i, v in enumerate(s.values) if v is not None]
        if len(points) > 1:
            parts.append(f'<polyline class="line {s.css}" points="{" ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in points)}"/>')
        for x, y, start, v in points:
            tip = f"{start.isoformat().replace('+00:00', 'Z')}: {s.name} {fmt.format(number(v))}"
            parts.append(f'<circle class="point {s.css}" cx="{x:.1f}" cy="{y:.1f}" r="3" data-series="{escape(s.name)}" '
                         f'data-value="{number(v)}"><title>{escape(tip)}</title></circle>')


def _legend(series: Sequence[Series]) -> str:
    items, x = [], LEFT + 8
    for s in series:
        items.append(f'<rect class="swatch {s.css}" x="{x}" y="{TOP}" width="10" height="10"/>'
                     f'<text class="legend" x="{x + 14}" y="{TOP + 9}">{escape(s.name)}</text>')
        x += 22 + 7 * len(s.name)
    return '<g class="legend">' + "".join(items) + "</g>"


def bar_list(ident: str, title: str, items: Sequence[tuple[str, int]], css: str, *, empty: str) -> Markup:
    """Horizontal bars, one per (label, count), longest first as given; a sentence when there are none."""
    height = 6 + max(1, len(items)) * LIST_ROW
    desc = "; ".join(f"{label}: {count}" for label, count in items) or empty
    parts = _open(ident, title, desc, height, "list", LIST_WIDTH)
    if not items:
        parts.append(f'<text class="empty" x="0" y="16">{escape(empty)}</text>')
    top = max((count for _, count in items), default=1)
    room = LIST_WIDTH - LIST_LABEL - RIGHT - 40
    for i, (label, count) in enumerate(items):
        y = i * LIST_ROW
        shown = label if len(label) <= 34 else label[:33] + "…"
        w = max(2.0, room * count / top)
        parts.append(f'<g class="row" data-label="{escape(label)}" data-value="{count}"><title>{escape(label)}: {count}</title>'
                     f'<text class="label" x="{LIST_LABEL - 8}" y="{y + 15}" text-anchor="end">{escape(shown)}</text>'
                     f'<rect class="bar {css}" x="{LIST_LABEL}" y="{y + 3}" width="{w:.1f}" height="{LIST_ROW - 8}"/>'
                     f'<text class="count" x="{LIST_LABEL + w + 6:.1f}" y="{y + 15}">{count}</text></g>')
    parts.append("</svg>")
    return Markup("\n".join(parts))
