"""`tracestore dataset create|list|show|drop`: named, immutable sets of runs that pin them.

A trainer records the runs it trains on (`create NAME` with the list filters of `tracestore
runs`); deletion and retention then leave those runs alone until `drop NAME`. Exports and
reports take `--dataset NAME` to cover exactly those runs.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tracestore.cli.common import (
    CidOption,
    DbOption,
    EnvOption,
    HasDriftOption,
    HasTrajectoriesOption,
    PolicyOption,
    SinceOption,
    TraceKindOption,
    UntilOption,
    console,
    open_store,
    reported_errors,
)

app = typer.Typer(help="Datasets: named, immutable sets of runs, pinned against deletion.")


def _print_json(body: Any) -> None:
    import orjson

    typer.echo(orjson.dumps(body).decode())


def _manifest_lines(m: dict[str, Any]) -> None:
    console.print(f"dataset {m['name']}", highlight=False, markup=False)
    rows = [
        (
            "runs",
            f"{m['n_runs']} ({m['present']} present, {m['missing']} deleted since, "
            f"{m['changed']} stored again with other content)",
        ),
        ("created", f"{m['created_at'].isoformat()} by {m['created_by'] or '-'}"),
        ("filter", ", ".join(f"{k}={v}" for k, v in m["filter"].items()) or "(every run)"),
        ("manifest sha256", m["manifest_hash"]),
    ]
    if m.get("note"):
        rows.append(("note", m["note"]))
    for key, value in rows:
        console.print(f"  {key:<16} {value}", highlight=False, markup=False, soft_wrap=True)


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="The dataset's name (letters, digits, . _ -).")],
    env: EnvOption = None,
    policy: PolicyOption = None,
    correlation_id: CidOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    trace_kind: TraceKindOption = None,
    has_trajectories: HasTrajectoriesOption = None,
    has_drift: HasDriftOption = None,
    note: Annotated[str | None, typer.Option(help="A line saying what it is for.")] = None,
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the manifest as JSON.")] = False,
) -> None:
    """Record the runs the filters select now as dataset NAME, and pin them.

    The set never changes afterwards; its manifest keeps the count, the filter, when and
    by whom, and a sha256 over every run's id and content hash.
    """
    from datetime import UTC, datetime

    from tracestore.cli.delete import who
    from tracestore.cli.drift import parse_when
    from tracestore.db.uow import write_session
    from tracestore.store.datasets import create_dataset
    from tracestore.store.runs import RunFilter

    start, end = parse_when(since, "--since"), parse_when(until, "--until")
    f = RunFilter(
        correlation_id=correlation_id,
        env_id=env,
        policy_id=policy,
        since=start,
        until=end,
        trace_kind=trace_kind,
        has_trajectories=has_trajectories,
        has_drift=has_drift,
    )
    with reported_errors():
        engine = open_store(db, create_new_sqlite=False)
        with write_session(engine) as session:
            manifest = create_dataset(
                session, name, f, created_by=who(), now=datetime.now(UTC), note=note
            )
    if as_json:
        _print_json(manifest)
    else:
        _manifest_lines(manifest)


@app.command(name="list")
def list_(
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the datasets, oldest first."""
    from tracestore.db.uow import read_session
    from tracestore.store.datasets import list_datasets

    with reported_errors():
        engine = open_store(db, create_new_sqlite=False)
        with read_session(engine) as session:
            found = list_datasets(session)
    if as_json:
        _print_json({"items": found})
        return
    if not found:
        console.print("no datasets")
    for d in found:
        console.print(
            f"{d['name']}\t{d['n_runs']} runs\t{d['created_at'].isoformat()}",
            highlight=False,
            markup=False,
        )


@app.command()
def show(
    name: Annotated[str, typer.Argument(help="The dataset.")],
    runs: Annotated[bool, typer.Option("--runs", help="List its runs and their state.")] = False,
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """A dataset's manifest (and with --runs, each run: present, missing or changed)."""
    from tracestore.db.uow import read_session
    from tracestore.store.datasets import dataset_manifest, dataset_runs

    with reported_errors():
        engine = open_store(db, create_new_sqlite=False)
        with read_session(engine) as session:
            manifest = dataset_manifest(session, name)
            members = dataset_runs(session, name) if runs else None
    if as_json:
        _print_json({**manifest, **({"runs": members} if members is not None else {})})
        return
    _manifest_lines(manifest)
    for m in members or []:
        console.print(
            f"{m['run_id']}\t{m['state']}\t{m['content_hash']}", highlight=False, markup=False
        )


@app.command()
def drop(
    name: Annotated[str, typer.Argument(help="The dataset to drop (its runs stay).")],
    db: DbOption = None,
) -> None:
    """Drop a dataset: its runs are unpinned (and stay in the store)."""
    from tracestore.db.uow import write_session
    from tracestore.store.datasets import drop_dataset

    with reported_errors():
        engine = open_store(db, create_new_sqlite=False)
        with write_session(engine) as session:
            manifest = drop_dataset(session, name)
    console.print(f"dataset {name} dropped: {manifest['n_runs']} runs unpinned", highlight=False)


def register(app_: typer.Typer) -> None:
    """Add `dataset ...` to the console script."""
    app_.add_typer(app, name="dataset")
