"""Issue 42: a signal during a generated-C solve must not free the job's arrays while worker threads
are still inside the C loop. run_blocks cancels the blocks not started and waits for the running
ones before the exception leaves it."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from odecli.ode.native import engine


def test_an_interrupt_waits_for_the_running_blocks_and_cancels_the_rest():
    batch = 64
    job = SimpleNamespace(y0=np.zeros((batch, 1)), istat=np.zeros((batch, 4), dtype=np.int64))
    lock = threading.Lock()
    state = {"running": 0, "started": 0, "finished": 0}

    def entry(lo, hi, *args):  # stands in for the C solver: slow enough that others are mid-block
        with lock:
            state["running"] += 1
            state["started"] += 1
        time.sleep(0.05)
        with lock:
            state["running"] -= 1
            state["finished"] += 1
        return 0

    def progress(snapshot):  # the signal arrives while the main thread collects results
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        engine.run_blocks(entry, [], job, threads=2, progress=progress)
    assert state["running"] == 0  # nothing still writing into the job's arrays
    assert state["finished"] == state["started"]
    assert state["started"] < len(engine.block_ranges(batch, 2, progress))  # the rest were cancelled
