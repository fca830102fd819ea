"""Events in the generated C solver: run ``solve_samples_events`` and gather what it recorded.

The C side (``solver_events.c``, spliced in when a :class:`~odecli.ode.native.rhs.NativeRhs`
brings events) transcribes :mod:`odecli.ode.events` lane by lane: the same sign-change rule,
the same Illinois iteration on the same dense output, the same terminal rule, so the event
times equal the PyTorch loop's to round-off and samples take the same steps. It writes up to
``cap`` occurrences per sample and event into fixed arrays and counts all of them; when some
sample had more than ``cap``, the batch is solved again with room for the most any had
(samples are independent and the solver deterministic, so the second solve repeats the first
exactly). :data:`FIRST_CAP` makes that rare for terminal events and few recorded ones, and
keeps the arrays small: B x events x cap x (n_states + 1) doubles.
"""

from __future__ import annotations

import ctypes
import math
from typing import Callable

import numpy as np

from odecli.ode.methods import METHODS
from odecli.ode.native.engine import _ARGTYPES, Job, _holding_gil, _library, solve_job
from odecli.ode.native.rhs import NativeRhs
from odecli.ode.solution import ArraySolution, EventRecord
from odecli.ode.status import Progress

FIRST_CAP = 8
"""Occurrences per sample and event the first solve keeps room for."""


def solve_job_with_events(rhs: NativeRhs, method: str, job: Job, threads: int | None,
                          progress: Callable[[Progress], None] | None, started: float) -> ArraySolution:
    """:func:`~odecli.ode.native.engine.solve_job` with ``rhs.events`` recorded into ``solution.events``."""
    batch, n_events, n_states = job.y0.shape[0], len(rhs.events), job.y0.shape[1]
    solvers = _entries(rhs, method)
    cap = FIRST_CAP
    while True:
        ev_t = np.full((batch, n_events, cap), math.nan)
        ev_y = np.full((batch, n_events, cap, n_states), math.nan)
        ev_count = np.zeros((batch, n_events), dtype=np.int64)
        extra = [ctypes.c_int64(cap)] + [ctypes.c_void_p(a.ctypes.data) for a in (ev_t, ev_y, ev_count)]
        solution = solve_job(rhs, method, job, threads, progress, started, solvers=solvers, extra_args=extra)
        most = int(ev_count.max()) if ev_count.size else 0
        if most <= cap:
            break
        cap, job = most, job.fresh_outputs()
    solution.events = {
        event.name: EventRecord(t=ev_t[:, e, :int(ev_count[:, e].max(initial=0))].copy(),
                                y=ev_y[:, e, :int(ev_count[:, e].max(initial=0))].copy(), count=ev_count[:, e].copy())
        for e, event in enumerate(rhs.events)
    }
    return solution


def _entries(rhs: NativeRhs, method: str) -> tuple[Callable, Callable]:
    """``solve_samples_events`` releasing Python's lock (threads) and holding it (tiny batches)."""
    lib = _library(METHODS[method], rhs)
    entries = []
    for library in (lib, _holding_gil(lib._name)):
        entry = library.solve_samples_events
        entry.restype = ctypes.c_int
        entry.argtypes = _ARGTYPES + [ctypes.c_int64] + [ctypes.c_void_p] * 3
        entries.append(entry)
    return entries[0], entries[1]
