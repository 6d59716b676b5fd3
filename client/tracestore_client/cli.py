"""`python -m tracestore_client spool status|replay PATH`: look at a spool, deliver it.

A spool lives where the task app runs, which may have this distribution alone; the
server's `tracestore spool` verbs are the same commands (they call these functions).
Exit status: 0 success; 2 usage or input error (no spool there, a server that cannot be
reached or refuses the key, rollouts refused for good); errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from tracestore_client.client import TracestoreClient
from tracestore_client.errors import TracestoreHTTPError
from tracestore_client.spool import SPOOL_MAGIC, Spool, SpoolStatus, looks_like_a_spool

DEFAULT_URL = "http://127.0.0.1:8000"
SHOW_REJECTED = 10  # reasons printed after a replay; the rest are in the .rejected file
# A replay by hand should fail fast when the server is down (a task app's own client
# waits longer): a few retries ride out a restart.
REPLAY_RETRIES = 3
REPLAY_RETRY_TIME = 60.0


class SpoolCommandError(Exception):
    """A spool command failed; the message is the one line to print."""


def open_spool(path: str | os.PathLike[str]) -> Spool:
    """The spool at `path`; SpoolCommandError when there is none (a mistyped path)."""
    spool = Spool(path)
    if spool.path.is_dir():
        raise SpoolCommandError(f"{path} is a directory; give the spool file's path")
    if not spool.exists():
        raise SpoolCommandError(
            f"no spool at {path}: neither it nor its .replaying, .rejected or .lock file exists"
        )
    if not looks_like_a_spool(spool.path):
        # Replaying renames the file away and removes it once delivered: a file of
        # rollouts given by mistake was taken for one damaged record and gone.
        raise SpoolCommandError(
            f"{path} is not a tracestore spool (a spool's records start with "
            f"{SPOOL_MAGIC.decode()!r}); rollout files go in with `tracestore ingest`"
        )
    return spool


_routed: list[logging.Handler] = []


def route_client_logs(verbose: bool) -> None:
    """Send the client's log records to stderr (verbose), or nowhere: for commands.

    A command's own lines say what happened; without this, Python would print every
    retry warning to stderr beside the one error line (logging's last-resort handler).
    """
    logger = logging.getLogger("tracestore.client")
    while _routed:  # a command run twice in one process replaces its handler
        logger.removeHandler(_routed.pop())
    handler: logging.Handler = (
        logging.StreamHandler(sys.stderr) if verbose else logging.NullHandler()
    )
    handler.setFormatter(logging.Formatter("%(message)s"))
    _routed.append(handler)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    return f"{n / 1024:.1f} KiB" if n < 1024**2 else f"{n / 1024**2:.1f} MiB"


def status_lines(status: SpoolStatus) -> list[str]:
    """The status of a spool as lines a person reads."""
    lines = [
        f"spool {status.path}: {status.pending} rollout{'s' if status.pending != 1 else ''} "
        f"waiting ({_size(status.pending_bytes)})"
    ]
    if status.pending:
        written = status.last_written.isoformat(timespec="seconds") if status.last_written else "-"
        lines.append(
            f"  first: {status.first_run_id}  last: {status.last_run_id}  last written: {written}"
        )
    if status.replaying:
        lines.append(
            f"  {status.path}.replaying exists: a replay is running or was interrupted "
            "(the next replay delivers it first)"
        )
    if status.damaged:
        lines.append(
            f"  damaged records skipped: {status.damaged} (a write torn by a crash, "
            "or one being written right now)"
        )
    rejected = f"  rejected: {status.rejected} in {status.rejected_path}"
    if status.last_rejection:
        rejected += f" (last: {status.last_rejection})"
    lines.append(rejected)
    return lines


@dataclass
class ReplayReport:
    """What `spool replay` prints: lines for stdout, and an error line (exit 2) or None."""

    lines: list[str] = field(default_factory=list)
    error: str | None = None


def replay_spool(spool: Spool, url: str, api_key: str | None) -> ReplayReport:
    """Deliver `spool` to the server at `url` now; what was not delivered stays spooled."""
    with TracestoreClient(
        url,
        api_key=api_key,
        spool=spool,
        max_retries=REPLAY_RETRIES,
        max_retry_time=REPLAY_RETRY_TIME,
        replay_on_contact=False,
    ) as client:
        try:
            result = client.replay()
        except TracestoreHTTPError as exc:
            raise SpoolCommandError(
                f"{url} refused the replay ({exc}); the rollouts stay spooled"
            ) from None
    if result.busy:
        raise SpoolCommandError(f"another replay of {spool.path} is running; try again later")
    report = ReplayReport()
    if not (result.delivered or result.rejected or result.remaining or result.damaged):
        report.lines.append(f"spool {spool.path}: nothing to replay")
        return report
    report.lines.append(
        f"spool {spool.path}: {result.delivered} delivered, {result.rejected} rejected, "
        f"{result.remaining} still spooled"
        + (f", {result.damaged} damaged records skipped" if result.damaged else "")
    )
    for reason in result.errors[:SHOW_REJECTED]:
        report.lines.append(f"  rejected: {reason}")
    if len(result.errors) > SHOW_REJECTED:
        report.lines.append(f"  ... and {len(result.errors) - SHOW_REJECTED} more")
    if result.remaining:
        report.error = (
            f"cannot deliver to {url} ({result.stopped}); "
            f"{result.remaining} rollouts stay spooled in {spool.path}"
        )
    elif result.rejected:
        report.error = (
            f"{result.rejected} rollouts were refused for good; they are kept in "
            f"{spool.rejected_path}"
        )
    return report


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tracestore_client", description="tracestore's client, alone."
    )
    verbs = parser.add_subparsers(dest="group", required=True)
    spool = verbs.add_parser("spool", help="look at and deliver a spool").add_subparsers(
        dest="verb", required=True
    )
    status = spool.add_parser("status", help="what a spool holds (changes nothing)")
    status.add_argument("path", metavar="PATH")
    status.add_argument("--json", action="store_true", help="print JSON")
    replay = spool.add_parser("replay", help="deliver a spool to a server now")
    replay.add_argument("path", metavar="PATH")
    replay.add_argument(
        "--url",
        default=os.environ.get("TRACESTORE_URL", DEFAULT_URL),
        help="the server (default: TRACESTORE_URL, else %(default)s)",
    )
    replay.add_argument(
        "--api-key",
        default=os.environ.get("TRACESTORE_API_KEY"),
        help="API key (default: TRACESTORE_API_KEY)",
    )
    replay.add_argument(
        "-v", "--verbose", action="store_true", help="log each retry and batch to stderr"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        spool = open_spool(args.path)
        if args.verb == "status":
            status = spool.status()
            if args.json:
                print(json.dumps(status.as_dict()))
            else:
                print("\n".join(status_lines(status)))
            return 0
        route_client_logs(args.verbose)
        report = replay_spool(spool, args.url, args.api_key)
    except SpoolCommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if report.lines:
        print("\n".join(report.lines))
    if report.error:
        print(f"error: {report.error}", file=sys.stderr)
        return 2
    return 0
