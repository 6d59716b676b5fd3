"""`tracestore retention set|show|unset|apply` and `tracestore db vacuum`.

Rules are stored in the database (`set`) or given in TRACESTORE_RETENTION_RULES; `apply`
plans what they select, then deletes it in batches (`--dry-run` only lists it).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tracestore.cli.common import (
    DbOption,
    console,
    err_console,
    fail,
    open_store,
    reported_errors,
    settings_for,
)

app = typer.Typer(help="Retention rules (by age, by count, per env/policy) and their sweep.")


def _print_json(body: Any) -> None:
    import orjson

    typer.echo(orjson.dumps(body).decode())


def _age_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


@app.command(name="set")
def set_rule(
    name: Annotated[str, typer.Argument(help="The rule's name (setting it again replaces it).")],
    max_age: Annotated[
        str | None,
        typer.Option("--max-age", help="Delete runs received longer ago than this: 30d, 12h, 2w."),
    ] = None,
    keep_last: Annotated[
        int | None,
        typer.Option("--keep-last", min=0, help="Keep this many of the newest runs; delete older."),
    ] = None,
    env: Annotated[str | None, typer.Option("--env", help="Only runs of this env_id.")] = None,
    policy: Annotated[
        str | None, typer.Option("--policy", help="Only runs of this policy_id.")
    ] = None,
    db: DbOption = None,
) -> None:
    """Store a retention rule (by age and/or count, optionally for one env or policy).

    Nothing is deleted until `tracestore retention apply` (or the server's schedule) runs.
    """
    from datetime import UTC, datetime

    from tracestore.db.uow import write_session
    from tracestore.durations import parse_age
    from tracestore.store.retention import Rule, set_rule

    with reported_errors():
        age = parse_age(max_age, name="--max-age") if max_age else None
        rule = Rule(name, max_age_s=age, keep_last=keep_last, env_id=env, policy_id=policy)
        engine = open_store(db, create_new_sqlite=False)
        with write_session(engine) as session:
            set_rule(session, rule, datetime.now(UTC))
    console.print(f"rule {name} stored: {_describe(rule.as_dict())}", highlight=False)


def _describe(rule: dict[str, Any]) -> str:
    parts = []
    if rule["max_age_s"] is not None:
        parts.append(f"older than {_age_text(rule['max_age_s'])}")
    if rule["keep_last"] is not None:
        parts.append(f"past the newest {rule['keep_last']}")
    scope = [f"{k}={rule[k]}" for k in ("env_id", "policy_id") if rule[k] is not None]
    return " or ".join(parts) + (f" ({', '.join(scope)})" if scope else " (every run)")


@app.command()
def unset(
    name: Annotated[str, typer.Argument(help="The stored rule to remove.")],
    db: DbOption = None,
) -> None:
    """Remove a stored rule (rules given in TRACESTORE_RETENTION_RULES stay)."""
    from tracestore.db.uow import write_session
    from tracestore.store.retention import drop_rule

    with reported_errors():
        engine = open_store(db, create_new_sqlite=False)
        with write_session(engine) as session:
            drop_rule(session, name)
    console.print(f"rule {name} removed", highlight=False)


@app.command()
def show(
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the rules in force (stored, then from TRACESTORE_RETENTION_RULES), and what
    each selects now (pinned runs counted apart)."""
    from tracestore.retention.sweep import all_rules, plan

    with reported_errors():
        engine = open_store(db, create_new_sqlite=False)
        rules = all_rules(engine, settings_for(db))
        planned = plan(engine, rules)
    if as_json:
        _print_json(planned.as_dict(runs=False))
        return
    if not rules:
        console.print("no retention rules: nothing is ever deleted by a sweep")
        return
    counts = planned.by_rule()
    for rule in rules:
        console.print(
            f"{rule.name} [{rule.source}]: {_describe(rule.as_dict())}: selects "
            f"{counts[rule.name]} runs now, {planned.pinned.get(rule.name, 0)} pinned kept",
            highlight=False,
            markup=False,
        )


@app.command(name="apply")
def apply_rules(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what the rules select; delete nothing.")
    ] = False,
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            min=1,
            help="Runs per transaction (default: TRACESTORE_RETENTION_BATCH_SIZE).",
        ),
    ] = None,
    vacuum: Annotated[
        bool,
        typer.Option(
            "--vacuum/--no-vacuum",
            help="SQLite in incremental auto-vacuum mode: give freed pages back after each batch.",
        ),
    ] = True,
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Delete what the retention rules select, in batches (each its own transaction), with a
    progress bar. Pinned runs are skipped and counted. Safe beside live ingest: a run
    stored after the sweep's start is never deleted by it. Interrupted, run it again."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from tracestore.retention.space import store_size
    from tracestore.retention.sweep import all_rules, apply, plan

    settings = settings_for(db)
    with reported_errors():
        engine = open_store(db, create_new_sqlite=False)
        rules = all_rules(engine, settings)
        if not rules:
            fail("no retention rules: set one with 'tracestore retention set' first")
        planned = plan(engine, rules)
        if dry_run:
            if as_json:
                _print_json({"dry_run": True, **planned.as_dict()})
                return
            for run in planned.runs:
                console.print(
                    f"{run.run_id}\t{run.received_at.isoformat()}\t{run.rule}",
                    highlight=False,
                    markup=False,
                    soft_wrap=True,
                )
            _summary(planned.as_dict(runs=False), dry_run=True)
            return
        before = store_size(engine)
        progress = Progress(
            TextColumn("deleting"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=err_console,
            disable=not err_console.is_terminal,
        )
        with progress:
            task = progress.add_task("deleting", total=len(planned.runs))
            swept = apply(
                engine,
                planned,
                batch_size=batch_size or settings.retention_batch_size,
                progress=lambda n: progress.advance(task, n),
                vacuum=vacuum,
            )
        after = store_size(engine)
    body = {
        **planned.as_dict(runs=False),
        **swept.as_dict(),
        "size_before": before.as_dict(),
        "size_after": after.as_dict(),
    }
    if as_json:
        _print_json(body)
        return
    _summary(body, dry_run=False)


def _summary(body: dict[str, Any], *, dry_run: bool) -> None:
    pinned = sum(body["pinned_skipped"].values())
    verb = "would delete" if dry_run else "deleted"
    n = body["selected"] if dry_run else body["deleted"]
    line = f"{verb} {n} runs ({body['doc_bytes']:,} document bytes)"
    line += f"; {pinned} pinned runs kept (datasets)" if pinned else "; no pinned run in the way"
    console.print(line, highlight=False)
    if not dry_run:
        if body["pinned_meanwhile"] or body["gone"]:
            console.print(
                f"{body['pinned_meanwhile']} pinned during the sweep and kept; "
                f"{body['gone']} already gone",
                highlight=False,
            )
        before, after = body["size_before"], body["size_after"]
        console.print(
            f"store size {before['bytes']:,} -> {after['bytes']:,} bytes "
            f"({after['free_bytes']:,} free inside; auto_vacuum {after['auto_vacuum']})",
            highlight=False,
        )
        if after["auto_vacuum"] == "none" and after["free_bytes"]:
            console.print(
                "the file keeps its free pages for new rows: 'tracestore db vacuum' gives "
                "them back (--incremental makes later sweeps do it as they go)",
                highlight=False,
            )


def vacuum(
    incremental: Annotated[
        bool,
        typer.Option(
            "--incremental",
            help="SQLite: switch the file to incremental auto-vacuum (one full VACUUM now), "
            "so retention sweeps give space back as they delete.",
        ),
    ] = False,
    db: DbOption = None,
) -> None:
    """Give the space of deleted runs back: SQLite VACUUM (or incremental vacuum), or
    PostgreSQL VACUUM (ANALYZE). A full SQLite VACUUM rewrites the file and holds the write
    lock while it runs (ingest waits)."""
    from tracestore.retention.space import store_size
    from tracestore.retention.space import vacuum as run_vacuum

    with reported_errors():
        engine = open_store(db, create_new_sqlite=False)
        before = store_size(engine)
        done = run_vacuum(engine, incremental=incremental)
        after = store_size(engine)
    console.print(
        f"{done}; size {before.bytes:,} -> {after.bytes:,} bytes (auto_vacuum {after.mode})",
        highlight=False,
    )


def register(app_: typer.Typer, db_app: typer.Typer) -> None:
    """Add `retention ...` and `db vacuum` to the console script."""
    app_.add_typer(app, name="retention")
    db_app.command(name="vacuum")(vacuum)
