"""Spill roots left by processes killed together are removed by the next one made.

A `tracestore serve` worker and its analytics children killed at once (SIGKILL to the
process group) left their `tracestore-duckdb-*` directory in the temporary directory,
with whatever was being spilled: four after each run of the suite. A root is abandoned
when no process holds its lock; making a root removes the abandoned ones.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.reliability.harness import child_pids
from tests.reports.conftest import Store
from tracestore.reports.spill import (
    OWNER,
    PREFIX,
    new_spill_root,
    remove_spill_root,
    sweep_abandoned,
)


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary directory of the test's own, for this process and the ones it starts."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def _python(code: str, tmp: Path, *, session: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "TMPDIR": str(tmp)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=session,
    )


# Makes a root, says where, and waits for its stdin to close (holding the root meanwhile).
HOLD = (
    "import sys\n"
    "from tracestore.reports.spill import new_spill_root\n"
    "print(new_spill_root(), flush=True)\n"
    "sys.stdin.read()\n"
)


def _wait_unlocked(lock: Path) -> None:
    """Until no process holds a lock on `lock`. (A killed process's main thread shows as
    a zombie while its other threads, DuckDB's among them, are still closing its files.)"""
    deadline = time.monotonic() + 10
    while held := _holders(lock):
        assert time.monotonic() < deadline, f"still held: {held}"
        time.sleep(0.05)


def _holders(lock: Path) -> list[str]:
    """The kernel's locks on `lock` (its lines of /proc/locks)."""
    inode = f":{lock.stat().st_ino} "
    return [line for line in Path("/proc/locks").read_text().splitlines() if inode in line]


def _wait_gone(path: Path) -> None:
    deadline = time.monotonic() + 10
    while path.exists():
        assert time.monotonic() < deadline, f"{path} is still there"
        time.sleep(0.02)


def _roots(tmp: Path) -> list[Path]:
    return sorted(tmp.glob(PREFIX + "*"))


def test_a_root_whose_process_was_killed_is_removed_when_the_next_is_made(tmp: Path) -> None:
    holder = _python(HOLD, tmp)
    assert holder.stdout is not None
    left = Path(holder.stdout.readline().strip())
    (left / "db-0").mkdir()
    (left / "db-0" / "duckdb_temp_storage-0.tmp").write_bytes(b"x" * 4096)  # spilled
    holder.kill()
    holder.wait(10)
    assert left.is_dir()

    made = new_spill_root()  # sweeps in the background
    try:
        _wait_gone(left)
        assert _roots(tmp) == [Path(made)]
        assert (Path(made) / OWNER).is_file()
    finally:
        remove_spill_root(made)
    assert _roots(tmp) == []


def test_a_root_in_use_is_kept_until_its_process_ends(tmp: Path) -> None:
    holder = _python(HOLD, tmp)
    assert holder.stdin is not None
    assert holder.stdout is not None
    held = Path(holder.stdout.readline().strip())
    try:
        assert sweep_abandoned() == []
        assert held.is_dir()
    finally:
        holder.stdin.close()  # it ends without removing its root (as if killed)
        holder.wait(10)
    assert sweep_abandoned() == [str(held)]
    assert not held.exists()


def test_a_root_this_process_holds_is_kept(tmp: Path) -> None:
    mine = new_spill_root()
    try:
        assert sweep_abandoned() == []
        assert Path(mine).is_dir()
    finally:
        remove_spill_root(mine)


def test_a_process_using_a_root_keeps_it_after_its_maker_died(tmp: Path) -> None:
    # The analytics children spill under their parent's root; a child outliving its
    # parent for a moment (it looks for its parent every second) must keep its files.
    maker = _python(HOLD, tmp)
    assert maker.stdout is not None
    root = maker.stdout.readline().strip()
    user = _python(
        "import sys\n"
        "from tracestore.reports.spill import use_spill_root\n"
        f"use_spill_root({root!r})\n"
        "print('using', flush=True)\n"
        "sys.stdin.read()\n",
        tmp,
    )
    assert user.stdin is not None
    assert user.stdout is not None
    assert user.stdout.readline().strip() == "using"
    maker.kill()
    maker.wait(10)
    try:
        assert sweep_abandoned() == []
        assert Path(root).is_dir()
    finally:
        user.stdin.close()
        user.wait(10)
    assert sweep_abandoned() == [root]


def test_a_directory_without_an_owner_file_is_left_alone(tmp: Path) -> None:
    # Made by a version before the lock, or by another user: not ours to judge.
    other = tmp / (PREFIX + "before-locks")
    other.mkdir()
    assert sweep_abandoned() == []
    assert other.is_dir()


def test_a_server_process_group_killed_at_once_leaves_a_root_the_next_one_made_removes(
    tmp: Path, store: Store
) -> None:
    # As the suite's servers end: the worker and its analytics children SIGKILLed
    # together, so no child is left to find its parent gone and remove the pool's root.
    worker = _python(
        "import os, signal, sys\n"
        "from tracestore.reports import live\n"
        f"live.query({store.url!r}, 'SELECT 42 AS n')\n"
        "(root,) = live._spill_roots.values()\n"
        "print(root, flush=True)\n"
        "sys.stdin.read()\n",
        tmp,
        session=True,
    )
    assert worker.stdout is not None
    root = Path(worker.stdout.readline().strip())
    assert root.is_dir()
    assert root.parent == tmp
    assert child_pids(worker.pid)  # the analytics children, spilling under `root`
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(10)
    _wait_unlocked(root / OWNER)
    assert root.is_dir()  # left behind: nobody was there to remove it

    made = new_spill_root()  # as the next pool (or CLI DuckDB) starts
    try:
        _wait_gone(root)
        assert _roots(tmp) == [Path(made)]
    finally:
        remove_spill_root(made)


def test_a_sweep_never_finds_a_new_root_unlocked(
    tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The lock file is locked under another name, then renamed `.owner`: a sweep at any
    # moment of the making sees no `.owner`, or a locked one. (Locks belong to open file
    # descriptions: a sweep in this process tests them as another process's would.)
    rename = os.rename
    swept: list[list[str]] = []

    def sweeping_rename(src: str, dst: str) -> None:
        swept.append(sweep_abandoned())
        rename(src, dst)
        swept.append(sweep_abandoned())

    monkeypatch.setattr(os, "rename", sweeping_rename)  # the one spill.py calls
    made = new_spill_root()
    monkeypatch.undo()
    try:
        assert swept == [[], []]
        assert (Path(made) / OWNER).is_file()
    finally:
        remove_spill_root(made)


def test_a_planted_fifo_for_a_lock_file_does_not_hang_the_sweep(tmp: Path) -> None:
    # Anyone may make a directory under the prefix in a shared /tmp: opening a FIFO
    # named `.owner` would block forever, with the analytics pool's lock held.
    planted = tmp / (PREFIX + "planted")
    planted.mkdir()
    os.mkfifo(planted / OWNER)
    done = threading.Event()

    def sweep() -> None:
        sweep_abandoned()
        done.set()

    threading.Thread(target=sweep, daemon=True).start()
    assert done.wait(10), "the sweep hung on a FIFO"
    assert planted.is_dir()  # not a root of ours: left alone


def test_only_the_last_process_using_a_root_removes_it(tmp: Path) -> None:
    # An analytics child whose parent died removes the pool's root on its way out, unless
    # its sibling still spills into it: then the sibling does.
    maker = _python(HOLD, tmp)
    assert maker.stdout is not None
    root = maker.stdout.readline().strip()
    child = (
        "import os, sys\n"
        "from tracestore.reports.spill import remove_if_last, use_spill_root\n"
        f"use_spill_root({root!r})\n"
        "print('using', flush=True)\n"
        "sys.stdin.readline()\n"
        f"remove_if_last({root!r})\n"
        f"print(os.path.isdir({root!r}), flush=True)\n"
    )
    first, second = _python(child, tmp), _python(child, tmp)
    for sibling in (first, second):
        assert sibling.stdout is not None
        assert sibling.stdout.readline().strip() == "using"
    maker.kill()
    maker.wait(10)
    answers = []
    for sibling in (first, second):  # as they notice their parent gone, one by one
        assert sibling.stdin is not None
        assert sibling.stdout is not None
        sibling.stdin.write("go\n")
        sibling.stdin.flush()
        answers.append(sibling.stdout.readline().strip())
        assert sibling.wait(10) == 0
    assert answers == ["True", "False"]  # kept for the second, removed by it
    assert not Path(root).exists()


def test_a_forked_child_leaves_its_parent_s_root_alone(tmp: Path) -> None:
    # db/engine.py supports forked processes: one that inherited this process's root
    # (and its exit handler) must not remove it when it exits.
    parent = _python(
        "import os, sys\n"
        "from tracestore.reports.spill import spill_directory\n"
        "root = os.path.dirname(spill_directory())\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    sys.exit(0)  # exit handlers run\n"
        "os.waitpid(pid, 0)\n"
        "print(root, os.path.isdir(root), flush=True)\n",
        tmp,
    )
    assert parent.stdout is not None
    root, present = parent.stdout.readline().split()
    assert present == "True"
    assert parent.wait(10) == 0
    assert not Path(root).exists()  # removed by its maker, at its own exit


def test_a_child_forked_while_another_thread_holds_the_module_s_lock_can_spill(
    tmp: Path,
) -> None:
    # A fork copies a lock held by another thread as held, and that thread does not go on
    # in the child: the child's first spill directory waited for it for good.
    code = (
        "import os, signal, threading\n"
        "from tracestore.reports import spill\n"
        "taken, done = threading.Event(), threading.Event()\n"
        "def hold():\n"
        "    with spill._lock, spill._own_lock:\n"
        "        taken.set()\n"
        "        done.wait()\n"
        "threading.Thread(target=hold).start()\n"
        "taken.wait()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    signal.alarm(10)  # a hang ends the child by SIGALRM\n"
        "    spill.new_spill_root()\n"
        "    spill.spill_directory()\n"
        "    os._exit(0)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "done.set()\n"
        "print(os.waitstatus_to_exitcode(status), flush=True)\n"
    )
    process = _python(code, tmp)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "0"  # -14 (SIGALRM) before
    assert process.wait(30) == 0
