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
starts a sweep (in a thread of its own: removing an abandoned spill can take a while)
that removes every root of this user whose lock nobody holds. The kernel drops a dead
process's locks, in whatever pid namespace it ran, so a root in use on this machine is
never taken for abandoned. (The temporary directory must be local: on a network
filesystem a lock may not be seen by another machine.)
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import itertools
import os
import stat
import tempfile
import threading

PREFIX = "tracestore-duckdb-"
OWNER = ".owner"
# A filesystem without flock (some FUSE and network mounts): its roots get no `.owner`,
# so no sweep ever takes them for abandoned (their makers still remove them).
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)

_lock = threading.Lock()
# root -> the descriptor of its `.owner`, held (shared) while this process uses the root.
_held: dict[str, int] = {}
# The root this process's own DuckDBs spill under (spill_directory), made once.
_own_lock = threading.Lock()
_own_root: str | None = None
_count = itertools.count()


def _forget_after_fork() -> None:
    # A forked child shares the parent's lock descriptions: closing its copies leaves the
    # parent's locks in place, and the root stays the parent's to remove. The module's
    # locks are made anew: one held by another thread at the fork stays held in the
    # child for good (only the forking thread goes on there).
    global _own_root, _lock, _own_lock
    _lock = threading.Lock()
    _own_lock = threading.Lock()
    for fd in _held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()
    _own_root = None


os.register_at_fork(after_in_child=_forget_after_fork)


def remove_tree(root: str) -> bool:
    """Remove `root` and everything under it, `.owner` last: a removal that fails part of
    the way (a process still writing there) leaves a root the next sweep finds. Returns
    whether it is gone."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            if dirpath != root or name != OWNER:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(dirpath, name))
        for name in dirnames:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                if os.path.islink(path):
                    os.unlink(path)
                else:
                    os.rmdir(path)
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(root, OWNER))
    with contextlib.suppress(OSError):
        os.rmdir(root)
    return not os.path.lexists(root)


def _open_owner(root: str) -> int | None:
    """A descriptor of `root`'s `.owner` if it is a regular file of this user's (never
    blocking: a FIFO planted under the name would hang an open), else None."""
    try:
        fd = os.open(
            os.path.join(root, OWNER),
            os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK,
        )
    except OSError:
        return None
    try:
        found = os.fstat(fd)
    except OSError:
        found = None
    if found is None or not stat.S_ISREG(found.st_mode) or found.st_uid != os.geteuid():
        os.close(fd)
        return None
    return fd


def sweep_abandoned(directory: str | None = None) -> list[str]:
    """Remove the roots in `directory` (the temporary directory) of this user that no
    living process holds: the ones left by processes killed together. Returns what it
    removed."""
    directory = directory or tempfile.gettempdir()
    removed: list[str] = []
    try:
        entries = [e for e in os.scandir(directory) if e.name.startswith(PREFIX)]
    except OSError:
        return removed
    for entry in entries:
        try:
            found = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
            continue  # not a root of ours: not ours to judge
        # No `.owner`: a root made before locks were kept, or on a filesystem without
        # flock, whose maker removes it; left alone.
        fd = _open_owner(entry.path)
        if fd is None:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # held: in use
            continue
        try:
            if remove_tree(entry.path):
                removed.append(entry.path)
        finally:
            os.close(fd)
    return removed


def _sweep_soon() -> None:
    threading.Thread(target=sweep_abandoned, name="spill-sweep", daemon=True).start()


def new_spill_root() -> str:
    """A new root, held by this process (remove it with `remove_spill_root`); roots
    nobody holds any more are removed in the background."""
    root = tempfile.mkdtemp(prefix=PREFIX)
    # The lock file is made under another name and locked before it becomes `.owner`: a
    # sweep never sees a new root's `.owner` unlocked.
    staged = os.path.join(root, OWNER + ".new")
    fd: int | None = None
    try:
        fd = os.open(staged, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.rename(staged, os.path.join(root, OWNER))
    except OSError as exc:
        if fd is not None:
            os.close(fd)
        if exc.errno not in _NO_FLOCK:
            remove_tree(root)
            raise
        # No flock here: a root without `.owner`, never swept, removed by this process.
        with contextlib.suppress(OSError):
            os.unlink(staged)
    else:
        with _lock:
            _held[root] = fd
    _sweep_soon()
    return root


def remove_spill_root(root: str) -> None:
    """Remove `root` and what was spilled under it, and let go of its lock."""
    remove_tree(root)
    with _lock:
        fd = _held.pop(root, None)
    if fd is not None:
        os.close(fd)


def remove_if_last(root: str) -> None:
    """Remove `root` if no other process holds it (an analytics child whose parent died:
    only the last of its siblings removes the pool's root, which they may still be
    spilling into). This process's lock is let go either way: call it on the way out."""
    with _lock:
        fd = _held.pop(root, None)
    if fd is None:
        return
    try:
        # Converting a shared lock to an exclusive one: granted only when no other
        # process holds the file. A refused conversion drops this process's lock on
        # Linux: a sibling (or, if both were refused, the next sweep) removes the root.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return
    try:
        remove_tree(root)
    finally:
        os.close(fd)


def use_spill_root(root: str) -> None:
    """Spill under `root`, a root another process made and removes (the analytics
    children's, made by their parent), holding it while this process lives."""
    global _own_root
    fd = _open_owner(root)  # None when gone already (the parent died), or no flock there
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError:
            os.close(fd)
        else:
            with _lock:
                _held[root] = fd
    with _own_lock:
        _own_root = root


def _remove_own(root: str, pid: int) -> None:
    if os.getpid() == pid:  # not in a forked child that inherited the handler
        remove_spill_root(root)


def spill_directory() -> str:
    """A directory of its own for one DuckDB's spilled intermediates, under this
    process's root (made at the first call, removed at exit). DuckDB makes the directory
    when it first spills and removes it when closed."""
    global _own_root
    with _own_lock:
        if _own_root is None:
            _own_root = new_spill_root()
            atexit.register(_remove_own, _own_root, os.getpid())
        return os.path.join(_own_root, f"db-{next(_count)}")
