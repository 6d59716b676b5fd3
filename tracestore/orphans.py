"""Processes that end with their parent: a watch for being reparented.

A process killed outright (SIGKILL, the OOM killer) does not stop its children; each is
reparented (to init or a subreaper) and runs on, holding its memory and its sockets.
`tracestore serve`'s workers and the analytics children each watch for that.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

# Seconds between two looks at the parent: a second is soon enough for a process whose
# parent is gone, and a getppid() a second costs nothing.
CHECK_S = 1.0


def when_orphaned(parent: int, then: Callable[[], None], *, name: str) -> None:
    """Call `then` in a daemon thread once this process is no longer `parent`'s child.

    `parent` is the pid the parent gave before this process started: it may be gone
    already, in which case `then` runs at the first look."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(CHECK_S)
        then()

    threading.Thread(target=watch, name=name, daemon=True).start()


__all__ = ["CHECK_S", "when_orphaned"]
