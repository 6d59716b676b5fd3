"""The reward-per-step chart: inline SVG drawn here, so the page loads no chart library.

One bar per step (per bucket of steps on a long run, at most MAX_BARS bars: the bucket's
largest reward), each a link to its step; steps with a finding are marked red under the
axis, and where the trajectory's reward differs from the trace's a dark tick shows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from tracestore.inspect.models import RewardSeries

MAX_BARS = 400
BAR = 4  # user units per bar; the SVG scales to the page's width
HEIGHT = 120
MARK = 8  # height of the drift strip under the axis
MIN_BARS = 60  # a short run's bars keep a bar's width, not the page's


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _biggest(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present, key=abs) if present else None


def reward_svg(series: RewardSeries, run_href: str) -> str:
    """The chart as an SVG element (empty text when the run has no steps); each bar links
    to its step on the run page at `run_href`."""
    trace, trajectory = series.trace, series.trajectory
    n = max(len(trace), len(trajectory))
    if n == 0:
        return ""
    size = -(-n // MAX_BARS)  # steps per bar
    bars = -(-n // size)
    main = trace if trace else trajectory
    drift = set(series.drift_positions)
    values: list[tuple[int, float | None, float | None, bool]] = []
    for b in range(bars):
        start, stop = b * size, min(n, (b + 1) * size)
        values.append(
            (
                start,
                _biggest(main[start:stop]),
                _biggest(trajectory[start:stop]) if trace else None,
                any(p in drift for p in range(start, stop)),
            )
        )
    shown = [v for _, a, b, _ in values for v in (a, b) if v is not None]
    top, bottom = max([0.0, *shown]), min([0.0, *shown])
    if top == bottom:
        top = 1.0
    scale = (HEIGHT - 10) / (top - bottom)
    zero = 5 + top * scale
    width = max(bars, MIN_BARS) * BAR
    parts = [
        f'<svg class="rewards" viewBox="0 0 {width} {HEIGHT + MARK + 2}" '
        f'preserveAspectRatio="none" role="img" aria-label="reward per step">',
        f'<line class="axis" x1="0" y1="{zero:.1f}" x2="{width}" y2="{zero:.1f}"/>',
    ]
    for b, (start, value, other, drifted) in enumerate(values):
        x = b * BAR
        label = f"step {start}" if size == 1 else f"steps {start} to {min(n, start + size) - 1}"
        tip = f"{label}: reward {_fmt(value)}"
        if other is not None and other != value:
            tip += f" (trajectory {_fmt(other)})"
        if drifted:
            tip += " · drift"
        href = f"{run_href}?step={start}#step-{start}"
        parts.append(f'<a href="{escape(href)}"><title>{escape(tip)}</title>')
        parts.append(f'<rect class="hit" x="{x}" y="0" width="{BAR}" height="{HEIGHT + MARK}"/>')
        if value is not None and value != 0:
            y = zero - value * scale
            parts.append(
                f'<rect class="bar" x="{x + 0.5}" y="{min(y, zero):.1f}" width="{BAR - 1}" '
                f'height="{max(abs(zero - y), 0.5):.1f}"/>'
            )
        if other is not None and other != value:
            y = zero - other * scale
            parts.append(f'<rect class="other" x="{x}" y="{y - 1:.1f}" width="{BAR}" height="2"/>')
        if drifted:
            parts.append(
                f'<rect class="drift" x="{x}" y="{HEIGHT + 1}" width="{BAR}" height="{MARK}"/>'
            )
        parts.append("</a>")
    parts.append("</svg>")
    return "".join(parts)
