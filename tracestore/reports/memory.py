"""How much memory each DuckDB may take: TRACESTORE_ANALYTICS_MEMORY_LIMIT, else a share of
the memory available. Light to import and to check (DuckDB reads a configured value in a
child process), so that `tracestore serve` checks the value before any worker starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tracestore.errors import InvalidRequest

# DuckDB's memory for one connection's work (its buffer manager's limit: not all a process
# holds, but what grows with the data): what does not fit spills to disk, what cannot
# spill fails with a clear error. DuckDB's own default is 80% of the memory available.
MEMORY_LIMIT_ENV = "TRACESTORE_ANALYTICS_MEMORY_LIMIT"
# cgroup v2, then v1: a container's limit, which sysconf does not see.
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def available_memory() -> int | None:
    """The machine's RAM, or the container's (cgroup) limit when lower; None if unknown."""
    try:
        found = [os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")]
    except (ValueError, OSError):
        found = []
    for path in CGROUP_LIMITS:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (v2) means none
            found.append(int(text))
    return min(found) if found else None


def configured_limit() -> str:
    """TRACESTORE_ANALYTICS_MEMORY_LIMIT as set, or '' when it is not."""
    return os.environ.get(MEMORY_LIMIT_ENV, "").strip()


def memory_limit() -> str:
    """DuckDB's memory limit here: TRACESTORE_ANALYTICS_MEMORY_LIMIT (DuckDB's syntax,
    e.g. `2GiB`), or an eighth of the memory available (at least 256 MiB)."""
    value = configured_limit()
    if value:
        return value
    available = available_memory()
    if available is None:
        return ""  # DuckDB's own default
    # An eighth: a server process has two analytics children, and a host a few processes.
    return f"{max(available // 8, 256 << 20) >> 20}MiB"


def unreadable_limit(limit: str, reason: str) -> str:
    """What to tell an operator whose TRACESTORE_ANALYTICS_MEMORY_LIMIT DuckDB refused."""
    return (
        f"{MEMORY_LIMIT_ENV}={limit!r} is not a memory size DuckDB reads "
        f"({reason}): give a number and a unit, e.g. 2GiB or 512MB"
    )


# Run in a child: duckdb, once imported, stays in a process for its life (~40 MiB), and
# `tracestore serve`'s supervisor runs no report.
_CHECK = """
import sys
import duckdb
from tracestore.errors import first_line
try:
    duckdb.connect(":memory:", config={"memory_limit": sys.argv[1]}).close()
except duckdb.Error as exc:
    print(first_line(exc))
    sys.exit(1)
"""


def check_memory_limit() -> None:
    """Refuse a configured limit DuckDB cannot read (InvalidRequest), now rather than at
    the first report; nothing to check when none is configured. DuckDB reads it in a
    child process, so that the caller does not keep duckdb imported."""
    limit = configured_limit()
    if not limit:
        return
    checked = subprocess.run(
        [sys.executable, "-c", _CHECK, limit], capture_output=True, text=True, check=False
    )
    if checked.returncode != 0:
        # The child's own failure (duckdb missing, killed) says so on stderr's last line.
        errors = checked.stderr.strip().splitlines()
        reason = checked.stdout.strip() or (errors[-1] if errors else f"exit {checked.returncode}")
        raise InvalidRequest(unreadable_limit(limit, reason))
