"""Peak memory while ingesting one large rollout (default 50 MB), as a multiple of its size.

Runs in a fresh subprocess: after one small warm-up rollout (imports, connection, compiled
statements: what a running service already holds), RSS before the document is read, then
the peak RSS after it was parsed, validated, projected and stored.

The peak is /proc's VmHWM, not getrusage's ru_maxrss: on Linux a child's ru_maxrss starts
at its parent's peak (kept across fork and exec), which billed the benchmark process's own
memory to the child.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.corpus import sized

CHILD = """
import json, sys
from pathlib import Path
from tracestore.db.engine import create_engine
from tracestore.ingest.service import ingest_bytes

def status_kb(field):
    for line in Path('/proc/self/status').read_text().splitlines():
        if line.startswith(field + ':'):
            return int(line.split()[1])
    raise RuntimeError('no ' + field)

engine = create_engine(sys.argv[2])
# A running service has imported, connected and compiled its statements already: one small
# rollout first, so those one-time costs are not billed to the large one.
warm = ingest_bytes(engine, Path(sys.argv[3]).read_bytes())
assert warm.status == 'created', warm
before = status_kb('VmRSS')
raw = Path(sys.argv[1]).read_bytes()
result = ingest_bytes(engine, raw)
assert result.status == 'created', result
peak = status_kb('VmHWM')  # this process's own high-water mark
print(json.dumps({'before_kb': before, 'peak_kb': peak, 'bytes': len(raw)}))
"""


def measure(url: str, n_bytes: int = 50_000_000) -> dict[str, Any]:
    """Peak RSS growth while ingesting one rollout of about `n_bytes`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.json"
        path.write_bytes(sized(n_bytes, seed=7))
        warm = Path(tmp) / "warm.json"
        warm.write_bytes(sized(100_000, seed=8))
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(path), url, str(warm)],
            capture_output=True,
            text=True,
            check=True,
        )
    data: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    growth = (data["peak_kb"] - data["before_kb"]) * 1024
    data["peak_growth_bytes"] = growth
    data["multiple_of_size"] = growth / data["bytes"]
    data["self_peak_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return data
