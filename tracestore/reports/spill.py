"""Where DuckDB spills what does not fit its memory limit, and who removes it.

Each process that runs DuckDB (an analytics child, a CLI reading a snapshot) spills under
a *root*, a `tracestore-duckdb-*` directory in the system's temporary directory; each
DuckDB gets a directory of its own under it (two DuckDBs sharing one delete each other's
files: DuckDB names them alike). A root is removed by whoever made it: the process, at
exit, or the parent of the analytics children, with its pool.

A process killed with everything that used its root (SIGKILL to a server's process
group, a machine's OOM killer taking a worker and its children) leaves the root behind,
with whatever was being spilled. So every root holds a lock file, `.owner`, on which each
process using the root keeps a shared `flock` for as long as it lives; making a new root
first removes every root whose lock nobody holds. The kernel drops a dead process's
locks, in whatever pid namespace it ran, so a root in use is never taken for abandoned.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import itertools
import os
import shutil
import tempfile
import threading

PREFIX = "tracestore-duckdb-"
OWNER = ".owner"

_lock = threading.Lock()
# root -> the descriptor of its `.owner`, held (shared) while this process uses the root.
_held: dict[str, int] = {}
_own_root: str | None = None
_count = itertools.count()


def _hold(root: str) -> None:
    """Take a shared lock on `root`'s `.owner` (it must exist) and keep it."""
    fd = os.open(os.path.join(root, OWNER), os.O_RDONLY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_SH)
    with _lock:
        _held[root] = fd


def sweep_abandoned(directory: str | None = None) -> list[str]:
    """Remove the roots in `directory` (the temporary directory) that no living process
    holds: the ones left by processes killed together. Returns what it removed."""
    directory = directory or tempfile.gettempdir()
    removed: list[str] = []
    try:
        entries = [e for e in os.scandir(directory) if e.name.startswith(PREFIX)]
    except OSError:
        return removed
    for entry in entries:
        try:
            # No `.owner` (a root made before locks were kept, or another user's, which
            # this process cannot read): not ours to judge.
            fd = os.open(os.path.join(entry.path, OWNER), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # held: in use
            continue
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
        finally:
            os.close(fd)
    return removed


def new_spill_root() -> str:
    """A new root, held by this process (remove it with `remove_spill_root`); roots
    nobody holds any more are removed first."""
    sweep_abandoned()
    root = tempfile.mkdtemp(prefix=PREFIX)
    # The lock file is made under another name and locked before it becomes `.owner`: a
    # sweep never sees a new root's `.owner` unlocked.
    staged = os.path.join(root, OWNER + ".new")
    fd = os.open(staged, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.rename(staged, os.path.join(root, OWNER))
    with _lock:
        _held[root] = fd
    return root


def remove_spill_root(root: str) -> None:
    """Remove `root` and what was spilled under it, and let go of its lock."""
    shutil.rmtree(root, ignore_errors=True)
    with _lock:
        fd = _held.pop(root, None)
    if fd is not None:
        os.close(fd)


def use_spill_root(root: str) -> None:
    """Spill under `root`, a root another process made and removes (the analytics
    children's, made by their parent), holding it while this process lives."""
    global _own_root
    # Gone already (the parent died): this process is about to end too.
    with contextlib.suppress(OSError):
        _hold(root)
    with _lock:
        _own_root = root


def spill_directory() -> str:
    """A directory of its own for one DuckDB's spilled intermediates, under this
    process's root (made at the first call, removed at exit). DuckDB makes the directory
    when it first spills and removes it when closed."""
    global _own_root
    with _lock:
        root = _own_root
    if root is None:
        made = new_spill_root()
        with _lock:
            if _own_root is None:
                _own_root = made
                atexit.register(remove_spill_root, made)
                made = ""
            root = _own_root
        if made:  # another thread made one first
            remove_spill_root(made)
    return os.path.join(root, f"db-{next(_count)}")
