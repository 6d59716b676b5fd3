"""The cyclic-GC pause around parsing: nested and concurrent pauses, and the prior state kept."""

from __future__ import annotations

import gc
import threading

from tracestore.ingest.service import cyclic_gc_paused


def test_the_collector_resumes_after_the_last_pause_only() -> None:
    assert gc.isenabled()
    with cyclic_gc_paused():
        assert not gc.isenabled()
        with cyclic_gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()


def test_concurrent_pauses_from_threads() -> None:
    inside = threading.Barrier(3)
    leave = threading.Event()

    def pause() -> None:
        with cyclic_gc_paused():
            inside.wait(10)
            leave.wait(10)

    threads = [threading.Thread(target=pause) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait(10)
    assert not gc.isenabled()
    leave.set()
    for t in threads:
        t.join(10)
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    try:
        with cyclic_gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_an_error_inside_still_resumes_the_collector() -> None:
    try:
        with cyclic_gc_paused():
            raise ValueError("boom")
    except ValueError:
        pass
    assert gc.isenabled()
