"""The drift report people read: one self-contained HTML page, a terminal view, and JSON.

All three render the `DriftReport` of `tracestore.drift.gates.report_data`. Charts are drawn on
the server with matplotlib and inlined as SVG, so the page needs no network, no script
and no other file to be read.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from datetime import date, datetime
from html import escape
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tracestore.drift.models import (
    DayGroup,
    DriftReport,
    KindCount,
    MigrationStatus,
    Phase2Figures,
    Phase3Figures,
    Reader,
    WorstRun,
)

# Where a run (and one of its steps: its position) is shown, when the report is served beside
# the inspector's pages; None for the self-contained file, which links nowhere.
RunHref = Callable[[str, int | None], str]

VERDICT_TEXT = {"ready": "ready", "not_ready": "not ready", "insufficient_data": "no data"}
_RED, _GREEN, _GREY, _BLUE = "#c0392b", "#1e8449", "#7f8c8d", "#2e86c1"


def percent(value: float | None) -> str:
    """A rate as a percentage with two decimals ('n/a' when undefined)."""
    return "n/a" if value is None else f"{value:.2%}"


def _when(value: object) -> str:
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M UTC")
    if isinstance(value, date):
        return value.isoformat()
    return "-" if value is None else str(value)


def report_json(report: DriftReport) -> bytes:
    """The report as JSON (datetimes in ISO 8601), for machines."""
    return orjson.dumps(report.model_dump(mode="json"), option=orjson.OPT_INDENT_2)


def _budget(status: MigrationStatus) -> float:
    figures = status.phases[1].figures
    assert isinstance(figures, Phase2Figures)  # phase 2 is the drift budget's
    return figures.budget


def _readers(status: MigrationStatus) -> list[Reader]:
    figures = status.phases[2].figures
    assert isinstance(figures, Phase3Figures)  # phase 3 counts the readers
    return figures.readers


# --- charts -------------------------------------------------------------------------------


def _svg(figure: Any) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    # Inline SVG: drop the XML declaration and DOCTYPE that precede the <svg> element.
    return text[text.index("<svg") :]


def _figure(width: float, height: float) -> Any:
    # The object API, not pyplot: no global figure state, safe in a threaded server.
    from matplotlib import rcParams
    from matplotlib.figure import Figure

    # Text stays text (selectable, searchable, small); the browser's sans-serif draws it.
    rcParams["svg.fonttype"] = "none"
    figure = Figure(figsize=(width, height), dpi=96)
    figure.patch.set_alpha(0)
    return figure


def _no_data(ax: Any, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", color=_GREY, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)


def chart_rate_per_day(by_day: Sequence[DayGroup], budget: float) -> str:
    """Drift rate per day (bars, red above the budget) with the budget line, as SVG."""
    figure = _figure(7.5, 2.8)
    ax = figure.add_subplot()
    rated = [(d, d.drift_rate) for d in by_day if d.drift_rate is not None]
    days = [d for d, _ in rated]
    if not days:
        _no_data(ax, "no comparable runs in the window")
        return _svg(figure)
    labels = [d.day.strftime("%m-%d") for d in days]  # MM-DD: the year is in the window line
    rates = [100 * r for _, r in rated]
    colors = [_RED if r > budget else _GREEN for _, r in rated]
    bars = ax.bar(range(len(days)), rates, color=colors, width=0.7)
    if len(days) <= 31:  # room for "with drift / comparable" above each bar
        ax.bar_label(bars, [f"{d.runs_with_drift}/{d.comparable_runs}" for d in days], fontsize=7)
    # A week's width at least, so that one day is not one wall-to-wall bar.
    ax.set_xlim(-0.6, max(len(days), 7) - 0.4)
    ax.axhline(100 * budget, color=_BLUE, linestyle="--", linewidth=1)
    ax.text(
        max(len(days), 7) - 0.4,
        100 * budget,
        f" budget {percent(budget)}",
        color=_BLUE,
        va="bottom",
        ha="right",
        fontsize=8,
    )
    step = max(1, len(days) // 15)
    ax.set_xticks(range(0, len(days), step), labels[::step], fontsize=8)
    ax.set_ylabel("runs with drift (%)", fontsize=9)
    ax.set_ylim(0, max(max(rates), 100 * budget) * 1.15 or 1)
    ax.spines[["top", "right"]].set_visible(False)
    return _svg(figure)


def chart_kinds(by_kind: dict[str, KindCount]) -> str:
    """Runs with each drift kind (horizontal bars), as SVG."""
    figure = _figure(7.5, 2.8)
    ax = figure.add_subplot()
    kinds = list(by_kind)  # the summary lists them in DRIFT_KINDS order
    runs = [by_kind[k].runs for k in kinds]
    if not kinds:
        _no_data(ax, "no drift kinds")
        return _svg(figure)
    ax.barh(range(len(kinds)), runs, color=[_RED if n else _GREY for n in runs], height=0.6)
    ax.set_yticks(range(len(kinds)), kinds, fontsize=8)
    ax.invert_yaxis()
    for i, n in enumerate(runs):
        ax.text(n, i, f" {n}", va="center", fontsize=8)
    ax.set_xlabel("runs", fontsize=9)
    ax.set_xlim(0, max(max(runs), 1) * 1.15)
    ax.spines[["top", "right"]].set_visible(False)
    return _svg(figure)


# --- HTML ---------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem;
       color: #1c2833; background: #fdfefe; max-width: 72rem; }
h1 { margin-bottom: .2rem; } h2 { margin-top: 2.2rem; border-bottom: 1px solid #d5d8dc; }
.sub { color: #566573; margin-top: 0; }
.headline { display: flex; flex-wrap: wrap; gap: 1rem; margin: 1.5rem 0; }
.card { border: 1px solid #d5d8dc; border-radius: .5rem; padding: .8rem 1.2rem;
        min-width: 9rem; background: #fff; }
.card .value { font-size: 1.8rem; font-weight: 600; }
.card .label { color: #566573; font-size: .85rem; }
.bad { color: #c0392b; } .good { color: #1e8449; } .none { color: #7f8c8d; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid #eaeded;
         vertical-align: top; }
th { background: #f4f6f6; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: .85em; word-break: break-all; }
.verdict { font-weight: 600; padding: .1rem .5rem; border-radius: .3rem; white-space: nowrap; }
td.run code { white-space: nowrap; }
.verdict.ready { background: #d5f5e3; color: #1e8449; }
.verdict.not_ready { background: #fadbd8; color: #c0392b; }
.verdict.insufficient_data { background: #eaeded; color: #566573; }
figure { margin: 1rem 0; } figcaption { color: #566573; font-size: .9rem; }
figure svg { max-width: 100%; height: auto; }
.notes { background: #fef9e7; border: 1px solid #f9e79f; padding: .6rem 1rem; }
"""


def _card(label: str, value: str, figure: str, tone: str = "") -> str:
    return (
        f'<div class="card"><div class="value {tone}" data-figure="{figure}">{escape(value)}'
        f'</div><div class="label">{escape(label)}</div></div>'
    )


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{cell}</td>'
            if i in numeric
            else (f'<td class="run">{cell}</td>' if i == 0 else f"<td>{cell}</td>")
            for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _phase_rows(status: MigrationStatus) -> list[list[str]]:
    rows = []
    for phase in status.phases:
        verdict = phase.verdict
        rows.append(
            [
                str(phase.phase),
                escape(phase.name),
                f'<span class="verdict {verdict}">{VERDICT_TEXT[verdict]}</span>',
                "<br>".join(escape(r) for r in phase.reasons),
            ]
        )
    return rows


def _where(run_id: str, position: int | None, text: str, run_href: RunHref | None) -> str:
    if run_href is None or position is None:
        return escape(text)
    return f'<a href="{escape(run_href(run_id, position))}">{escape(text)}</a>'


def _worst_rows(worst: Sequence[WorstRun], run_href: RunHref | None = None) -> list[list[str]]:
    rows = []
    for run in worst:
        findings = "<br>".join(
            f"<b>{escape(f.kind)}</b> "
            + (
                _where(
                    run.run_id,
                    f.position,
                    f"traj {f.trajectory_index} step {f.step_index}",
                    run_href,
                )
                + ": "
                if f.step_index is not None
                else ""
            )
            + f"<code>{escape(str(f.expected))}</code> ≠ <code>{escape(str(f.actual))}</code>"
            for f in run.findings
        )
        more = run.n_findings - len(run.findings)
        if more > 0:
            findings += f"<br>… and {more} more"
        name = f"<code>{escape(run.run_id)}</code>"
        if run_href is not None:
            name = f'<a href="{escape(run_href(run.run_id, None))}">{name}</a>'
        rows.append(
            [
                name,
                escape(_when(run.received_at)),
                escape(", ".join(run.env_ids) or "-"),
                str(run.n_findings),
                findings,
            ]
        )
    return rows


def _cards(report: DriftReport, budget: float) -> str:
    s, status = report.summary, report.status
    rate = s.drift_rate
    rate_tone = "none" if rate is None else ("bad" if rate > budget else "good")
    return "".join(
        [
            _card("runs in the window", str(s.runs), "runs"),
            _card("comparable runs", str(s.comparable_runs), "comparable_runs"),
            _card(
                "comparable runs with drift",
                str(s.comparable_runs_with_drift),
                "runs_with_drift",
                "bad" if s.comparable_runs_with_drift else "good",
            ),
            _card(f"drift rate (budget {percent(budget)})", percent(rate), "drift_rate", rate_tone),
            _card(
                "migration: safe through phase",
                str(status.safe_through_phase),
                "safe_through_phase",
            ),
        ]
    )


def _env_rows(report: DriftReport) -> list[list[str]]:
    by_env = sorted(report.summary.by_env, key=lambda e: (-e.runs_with_drift, str(e.env_id)))
    return [
        [
            escape(str(e.env_id)),
            str(e.comparable_runs),
            str(e.runs_with_drift),
            percent(e.drift_rate),
        ]
        for e in by_env[:20]
    ]


def _reader_rows(readers: Sequence[Reader]) -> list[list[str]]:
    return [
        [
            escape(r.client),
            escape(r.route),
            str(r.reads),
            escape(_when(r.last_seen)),
            "yes" if r.counted else "no (no key or label: a person looking)",
        ]
        for r in readers
    ]


def _sections(report: DriftReport, budget: float, run_href: RunHref | None) -> list[str]:
    s, status, worst = report.summary, report.status, report.worst_runs
    notes = "".join(f"<p>{escape(n)}</p>" for n in status.notes)
    reasons = [[escape(r), str(n)] for r, n in s.not_comparable.items()]
    env_rows, reader_rows = _env_rows(report), _reader_rows(_readers(status))
    return [
        '<h2 id="migration">Migration gates</h2>',
        _table(["phase", "step", "verdict", "figures"], _phase_rows(status), set()),
        f'<div class="notes">{notes}</div>' if notes else "",
        "<h2>Drift rate per day</h2>",
        '<figure id="chart-rate-per-day">',
        chart_rate_per_day(s.by_day, budget),
        "<figcaption>Share of comparable runs with at least one finding, per UTC day; "
        "bars above the dashed budget are red.</figcaption></figure>",
        "<h2>Drift by kind</h2>",
        '<figure id="chart-kinds">',
        chart_kinds(s.by_kind),
        "<figcaption>Runs with at least one finding of each kind (docs/FORMAT.md §6)."
        "</figcaption></figure>",
        "<h2>Worst runs</h2>",
        _table(
            ["run", "received", "env", "findings", "first findings"],
            _worst_rows(worst, run_href),
            {3},
        )
        if worst
        else "<p>No run has a finding.</p>",
        "<h2>Drift by environment</h2>",
        _table(["env_id", "comparable", "with drift", "rate"], env_rows, {1, 2, 3})
        if env_rows
        else "<p>No comparable run.</p>",
        "<h2>Runs that cannot be compared</h2>",
        _table(["reason", "runs"], reasons, {1}) if reasons else "<p>None.</p>",
        "<h2>Legacy trajectory readers</h2>",
        _table(
            ["client", "route", "reads in window", "last seen", "holds phase 3"], reader_rows, {2}
        )
        if reader_rows
        else "<p>No legacy read recorded.</p>",
    ]


def render_html(
    report: DriftReport, run_href: RunHref | None = None, home_href: str | None = None
) -> str:
    """The report as one self-contained HTML page (inline CSS and SVG; no script).

    With `run_href` (served beside the inspector's pages), run ids and finding steps link
    to the run pages, and `home_href` to the inspector's home; without, it links nowhere.
    """
    budget = _budget(report.status)
    window = report.status.window
    filters = {k: v for k, v in report.summary.filters.items() if k not in ("since", "until")}
    filter_text = ", ".join(f"{k}={v}" for k, v in filters.items())
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            "<title>tracestore drift report</title>",
            f"<style>{_CSS}</style></head><body>",
            (
                f'<p class="sub"><a href="{escape(home_href)}">tracestore</a>: drift report'
                f' · <a href="#migration">migration status</a></p>'
                if home_href is not None
                else ""
            ),
            "<h1>Drift report</h1>",
            f'<p class="sub">Runs received {escape(_when(window.since))} to '
            f"{escape(_when(window.until))}"
            + (f"; filters: {escape(filter_text)}" if filter_text else "")
            + f". Generated {escape(_when(report.generated_at))}, comparator version "
            f"{report.comparator_version}.</p>",
            f'<div class="headline" id="headline">{_cards(report, budget)}</div>',
            *_sections(report, budget, run_href),
            "</body></html>",
        ]
    )


# --- terminal -----------------------------------------------------------------------------


def render_table(report: DriftReport, console: Console) -> None:
    """Print the report's figures as tables on a terminal (or plain text when piped)."""
    s, status = report.summary, report.status
    budget = _budget(status)
    window = status.window
    console.print(
        f"[bold]Drift report[/] runs received {_when(window.since)} to {_when(window.until)}",
        highlight=False,
    )
    head = Table(show_header=False, box=None)
    head.add_row("runs", str(s.runs))
    head.add_row("comparable runs", str(s.comparable_runs))
    head.add_row("comparable runs with drift", str(s.comparable_runs_with_drift))
    head.add_row("drift rate", f"{percent(s.drift_rate)} (budget {percent(budget)})")
    head.add_row("safe through phase", str(status.safe_through_phase))
    console.print(head)

    phases = Table(title="migration gates")
    for column in ("phase", "verdict", "figures"):
        phases.add_column(column)
    for phase in status.phases:
        phases.add_row(
            f"{phase.phase}: {phase.name}",
            VERDICT_TEXT[phase.verdict],
            Text("\n".join(phase.reasons)),
        )
    console.print(phases)

    kinds = Table(title="drift by kind")
    kinds.add_column("kind")
    kinds.add_column("runs", justify="right")
    kinds.add_column("findings", justify="right")
    for kind, counts in s.by_kind.items():
        kinds.add_row(kind, str(counts.runs), str(counts.findings))
    console.print(kinds)

    if s.by_day:
        days = Table(title="drift rate per day")
        for column in ("day", "comparable", "with drift", "rate"):
            days.add_column(column, justify="left" if column == "day" else "right")
        for d in s.by_day:
            days.add_row(
                d.day.isoformat(),
                str(d.comparable_runs),
                str(d.runs_with_drift),
                percent(d.drift_rate),
            )
        console.print(days)

    if report.worst_runs:
        worst = Table(title="worst runs")
        for column in ("run", "findings", "first findings"):
            worst.add_column(column)
        for run in report.worst_runs:
            # Text, not markup: finding values may hold square brackets.
            worst.add_row(
                Text(run.run_id),
                str(run.n_findings),
                Text(
                    "\n".join(
                        f"{f.kind}"
                        + (
                            f" t{f.trajectory_index}/s{f.step_index}"
                            if f.step_index is not None
                            else ""
                        )
                        + f": {f.expected} != {f.actual}"
                        for f in run.findings
                    )
                ),
            )
        console.print(worst)
    for note in status.notes:
        console.print(f"note: {note}", highlight=False)
