"""`tracestore delete RUN_ID...`: delete runs, each in its own transaction, with an audit row.

From the database (`--db`, the default) or through a server (`--url`, which needs a key
with the admin role when the server has keys).
"""

from __future__ import annotations

import getpass
from typing import Annotated, Any

import typer

from tracestore.cli.common import DbOption, console, err_console, fail, open_store, reported_errors
from tracestore.cli.remote import ReadKeyOption, server_url

UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="Delete through a running server at this base URL instead of --db (default: "
        "TRACESTORE_URL when neither --db nor TRACESTORE_DATABASE_URL names a store).",
        show_default=False,
    ),
]


def who() -> str:
    """The audit's `deleted_by` for work done from the command line."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no user name in this environment (a bare container)
        return "cli"


def _local(db: str | None, run_ids: list[str], force: bool, reason: str | None) -> list[Any]:
    from datetime import UTC, datetime

    from tracestore.db.uow import write_session
    from tracestore.errors import NotFound, Pinned
    from tracestore.store.deletion import Deletion, delete_run

    how = Deletion(by=who(), via="cli", reason=reason, force=force)
    outcomes: list[Any] = []
    with reported_errors():
        engine = open_store(db, create_new_sqlite=False)
        for run_id in run_ids:
            try:
                with write_session(engine) as session:
                    entry = delete_run(session, run_id, how, datetime.now(UTC))
                outcomes.append((run_id, "deleted", entry.get("pinned_by")))
            except Pinned as exc:
                outcomes.append((run_id, "pinned", exc.details.get("pinned_by")))
            except NotFound:
                outcomes.append((run_id, "not_found", None))
    return outcomes


def _remote(
    url: str, api_key: str | None, run_ids: list[str], force: bool, reason: str | None
) -> list[Any]:
    import httpx

    from tracestore.client import path_segment

    headers = {"X-API-Key": api_key} if api_key else {}
    params: dict[str, str] = {"force": "true"} if force else {}
    if reason:
        params["reason"] = reason
    outcomes: list[Any] = []
    try:
        with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=120) as client:
            for run_id in run_ids:
                if not run_id:
                    # "/v1/rollouts/" is the list's address; no run has an empty run_id.
                    outcomes.append((run_id, "not_found", None))
                    continue
                # A run_id of '.' or '..' escaped, or the URL's normalisation resolves it.
                response = client.delete("/v1/rollouts/" + path_segment(run_id), params=params)
                if response.status_code == 204:
                    outcomes.append((run_id, "deleted", None))
                    continue
                error = _error(response)
                if response.status_code == 404 and error.get("code") == "not_found":
                    outcomes.append((run_id, "not_found", None))
                elif error.get("code") == "pinned":
                    outcomes.append((run_id, "pinned", error.get("pinned_by")))
                else:
                    message = error.get("message") or response.text[:200]
                    fail(f"{message} ({url} answered {response.status_code})")
    except httpx.TransportError as exc:
        fail(f"cannot reach {url}: {exc}")
    return outcomes


def _error(response: Any) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {}


def delete(
    run_ids: Annotated[list[str], typer.Argument(metavar="RUN_ID...", help="Runs to delete.")],
    db: DbOption = None,
    url: UrlOption = None,
    api_key: ReadKeyOption = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Delete runs a dataset pins too (the audit says so)."),
    ] = False,
    reason: Annotated[
        str | None, typer.Option("--reason", help="Why: kept in the audit row.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the outcomes as JSON.")] = False,
) -> None:
    """Delete runs: each one's document, projected rows and drift findings, in one
    transaction per run, with an audit row (who, when, why; never the content).

    A run a dataset pins is left alone unless --force. Exit 0 when every run was deleted,
    2 when one was not found (already deleted: deleting is never done twice) or pinned.
    """
    remote = server_url(db, url)
    if remote is not None:
        outcomes = _remote(remote, api_key, run_ids, force, reason)
    else:
        outcomes = _local(db, run_ids, force, reason)
    if as_json:
        import orjson

        body = [{"run_id": r, "status": s, "pinned_by": p} for r, s, p in outcomes]
        typer.echo(orjson.dumps(body).decode())
    else:
        for run_id, status, pinned_by in outcomes:
            if status == "deleted":
                extra = f" (pinned by {', '.join(pinned_by)}: forced)" if pinned_by else ""
                console.print(f"deleted {run_id}{extra}", highlight=False, markup=False)
            elif status == "pinned":
                err_console.print(
                    f"kept {run_id}: pinned by dataset {', '.join(pinned_by or [])} "
                    "(drop the dataset, or --force)",
                    highlight=False,
                    markup=False,
                )
            else:
                err_console.print(
                    f"not found: {run_id} (never stored, or already deleted)",
                    highlight=False,
                    markup=False,
                )
    if any(status != "deleted" for _, status, _ in outcomes):
        raise typer.Exit(2)
