"""Report parameters: the time window (`since`, `until`) and the environment (`env`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tracestore.errors import InvalidRequest

# The time grammar is shared with the API and the command line (tracestore/timewindow.py);
# these names stay importable from here.
from tracestore.timewindow import WHEN_HELP, check_order, parse_when

__all__ = ["WHEN_HELP", "Filters", "parse_when"]


@dataclass(frozen=True, slots=True)
class Filters:
    """Which runs a report covers: received in [since, until), and of environment `env`."""

    since: datetime | None = None
    until: datetime | None = None
    env: str | None = None

    def __post_init__(self) -> None:
        check_order(self.since, self.until)

    @classmethod
    def parse(cls, since: str | None, until: str | None, env: str | None) -> Filters:
        """Filters from option or query-string text."""
        return cls(
            since=parse_when(since, name="since") if since else None,
            until=parse_when(until, name="until") if until else None,
            env=env if env else None,
        )

    def as_dict(self) -> dict[str, str | None]:
        """The filters as text, for echoing in outputs."""
        return {
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "env": self.env,
        }

    def bind(self, parameters: tuple[str, ...], report: str) -> dict[str, Any]:
        """The prepared-statement parameters of a report that uses `parameters`.

        A filter the report does not take is refused rather than silently ignored.
        """
        given: dict[str, Any] = {"since": self.since, "until": self.until, "env": self.env}
        ignored = [k for k, v in given.items() if v is not None and k not in parameters]
        if ignored:
            raise InvalidRequest(
                f"report {report} does not take {', '.join('--' + k for k in ignored)}",
                report=report,
            )
        return {k: given[k] for k in parameters}
