"""Plots for the review page as inline SVG strings: no JavaScript, no image files.

`line_chart` draws metrics over steps; `reward_strip` draws the rewards of a step's groups
(one column of dots per group). Every label is escaped: names come from users' metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

COLORS = ("#2563eb", "#d97706", "#059669", "#7c3aed", "#dc2626")
LEFT, RIGHT, TOP, BOTTOM = 46, 10, 22, 26


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]  # (x, y), finite values only


class _Axes:
    """Maps data coordinates to pixels inside the margins."""

    def __init__(self, xs: list[float], ys: list[float], width: int, height: int) -> None:
        self.width, self.height = width, height
        self.x0, self.x1 = _span(min(xs), max(xs), pad=0.0)
        self.y0, self.y1 = _span(min(ys), max(ys), pad=0.08)

    def x(self, value: float) -> float:
        inner = self.width - LEFT - RIGHT
        return LEFT + (value - self.x0) / (self.x1 - self.x0) * inner

    def y(self, value: float) -> float:
        inner = self.height - TOP - BOTTOM
        return self.height - BOTTOM - (value - self.y0) / (self.y1 - self.y0) * inner

    def frame(self, title: str, x_label: str, x_ticks: list[float]) -> list[str]:
        parts = [
            f'<text x="{LEFT}" y="14" class="t">{escape(title)}</text>',
            f'<line x1="{LEFT}" y1="{self.height - BOTTOM}" x2="{self.width - RIGHT}" '
            f'y2="{self.height - BOTTOM}" class="ax"/>',
            f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{self.height - BOTTOM}" class="ax"/>',
        ]
        for value in _ticks(self.y0, self.y1, 4):
            y = self.y(value)
            parts.append(
                f'<line x1="{LEFT}" y1="{y:.1f}" x2="{self.width - RIGHT}" y2="{y:.1f}" class="g"/>'
                f'<text x="{LEFT - 4}" y="{y + 3:.1f}" class="yl">{_label(value)}</text>'
            )
        for value in x_ticks:
            x = self.x(value)
            parts.append(
                f'<text x="{x:.1f}" y="{self.height - BOTTOM + 13}" class="xl">{_label(value)}</text>'
            )
        parts.append(
            f'<text x="{self.width - RIGHT}" y="{self.height - 2}" class="xn">{escape(x_label)}</text>'
        )
        return parts


def line_chart(
    series: list[Series], *, title: str, x_label: str = "step", width: int = 340, height: int = 160
) -> str:
    """Lines with a dot per point (hover shows the value); 'no data' when every series is empty."""
    points = [p for s in series for p in s.points if math.isfinite(p[0]) and math.isfinite(p[1])]
    if not points:
        return _svg(width, height, title, [f'<text x="{LEFT}" y="{height / 2}">no data</text>'])
    axes = _Axes([p[0] for p in points], [p[1] for p in points], width, height)
    xs = sorted({p[0] for p in points})
    x_ticks = xs if len(xs) <= 8 else [xs[round(i * (len(xs) - 1) / 6)] for i in range(7)]
    parts = axes.frame(title, x_label, x_ticks)
    for number, one in enumerate(series):
        color = COLORS[number % len(COLORS)]
        finite = [(x, y) for x, y in one.points if math.isfinite(x) and math.isfinite(y)]
        if len(finite) > 1:
            path = " ".join(f"{axes.x(x):.1f},{axes.y(y):.1f}" for x, y in finite)
            parts.append(
                f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>'
            )
        for x, y in finite:
            parts.append(
                f'<circle cx="{axes.x(x):.1f}" cy="{axes.y(y):.1f}" r="2.5" fill="{color}">'
                f"<title>{escape(one.name)} at {x:g}: {y:.4g}</title></circle>"
            )
        if len(series) > 1:
            parts.append(
                f'<text x="{width - RIGHT}" y="{14 + 12 * number}" class="lg" fill="{color}">'
                f"{escape(one.name)}</text>"
            )
    return _svg(width, height, title, parts)


def reward_strip(
    groups: list[tuple[int, list[tuple[float, bool]]]],
    *,
    title: str = "rewards by group",
    width: int = 520,
    height: int = 170,
) -> str:
    """One column per group: a dot per trajectory (hollow red when flagged), a bar at the mean."""
    rewards = [reward for _, members in groups for reward, _ in members]
    if not rewards:
        return _svg(width, height, title, [f'<text x="{LEFT}" y="{height / 2}">no data</text>'])
    slots = [float(slot) for slot in range(len(groups))]
    axes = _Axes([-0.6, len(groups) - 0.4], rewards, width, height)
    parts = axes.frame(title, "group", [])
    for slot, (index, members) in zip(slots, groups, strict=True):
        x = axes.x(slot)
        parts.append(f'<text x="{x:.1f}" y="{height - BOTTOM + 13}" class="xl">{index}</text>')
        if members:
            mean = sum(reward for reward, _ in members) / len(members)
            parts.append(
                f'<line x1="{x - 9:.1f}" y1="{axes.y(mean):.1f}" x2="{x + 9:.1f}" '
                f'y2="{axes.y(mean):.1f}" stroke="#888" stroke-width="2"/>'
            )
        for reward, flagged in members:
            style = (
                'fill="none" stroke="#dc2626" stroke-width="1.5"' if flagged else 'fill="#2563eb"'
            )
            parts.append(
                f'<circle cx="{x:.1f}" cy="{axes.y(reward):.1f}" r="3.5" {style} opacity="0.8">'
                f"<title>group {index}: {reward:.4g}{' (flagged)' if flagged else ''}</title></circle>"
            )
    return _svg(width, height, title, parts)


def _svg(width: int, height: int, title: str, parts: list[str]) -> str:
    return (
        f'<svg class="plot" role="img" aria-label="{escape(title, quote=True)}" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'xmlns="http://www.w3.org/2000/svg">' + "".join(parts) + "</svg>"
    )


def _span(low: float, high: float, *, pad: float) -> tuple[float, float]:
    if high - low < 1e-12:
        delta = abs(low) * 0.1 or 1.0
        return low - delta, high + delta
    margin = (high - low) * pad
    return low - margin, high + margin


def _ticks(low: float, high: float, count: int) -> list[float]:
    """About `count` round values between low and high."""
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    values = []
    value = first
    while value <= high + step * 1e-9:
        values.append(round(value, 12))
        value += step
    return values


def _label(value: float) -> str:
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.3g}"
