"""Events in the generated C solver: run ``solve_samples_events`` and gather what it recorded.

The C side (``solver_events.c``, spliced in when a :class:`~odecli.ode.native.rhs.NativeRhs`
brings events) transcribes :mod:`odecli.ode.events` lane by lane: the same sign-change rule,
the same Illinois iteration on the same dense output, the same terminal rule, so the event
times equal the PyTorch loop's to round-off and samples take the same steps. It writes up to
``cap`` occurrences per sample and event into fixed arrays and counts all of them; the samples
that had more than ``cap`` are solved again, alone, with room for the most any had (samples are
independent and the solver deterministic, so the second solve repeats the first exactly).
:data:`FIRST_CAP` makes that rare (a solve of 1024 pendulums with 6 zero crossings a sample on
average, 9 at most, cost 2.0x the solve without events when every sample was solved twice, 1.1x
with room for 16), and bounds the arrays: B x events x cap x (n_states + 1) doubles.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import time
from typing import Callable

import numpy as np

from odecli.ode.methods import METHODS
from odecli.ode.native.engine import _ARGTYPES, Job, _holding_gil, _library, solve_job
from odecli.ode.native.rhs import NativeRhs
from odecli.ode.solution import ArraySolution, EventRecord
from odecli.ode.status import Progress

FIRST_CAP = 16
"""Occurrences per sample and event the first solve keeps room for."""


def solve_job_with_events(rhs: NativeRhs, method: str, job: Job, threads: int | None,
                          progress: Callable[[Progress], None] | None, started: float) -> ArraySolution:
    """:func:`~odecli.ode.native.engine.solve_job` with ``rhs.events`` recorded into ``solution.events``."""
    solvers = _entries(rhs, method)
    solution, ev_t, ev_y, ev_count = _solve(rhs, method, job, FIRST_CAP, solvers, threads, progress, started)
    most = int(ev_count.max()) if ev_count.size else 0
    if most > FIRST_CAP:
        # Only the samples that ran out of room, again: their other results are already right.
        rows = np.flatnonzero((ev_count > FIRST_CAP).any(axis=1))
        _, sub_t, sub_y, _ = _solve(rhs, method, _rows(job, rows), most, solvers, threads, None, started)
        wider_t = np.full(ev_t.shape[:2] + (most,), math.nan)
        wider_y = np.full(ev_y.shape[:2] + (most,) + ev_y.shape[3:], math.nan)
        wider_t[:, :, :FIRST_CAP], wider_y[:, :, :FIRST_CAP] = ev_t, ev_y
        wider_t[rows], wider_y[rows] = sub_t, sub_y
        ev_t, ev_y = wider_t, wider_y
        solution.wall_time_s = time.perf_counter() - started
    solution.events = {
        event.name: EventRecord(t=ev_t[:, e, :int(ev_count[:, e].max(initial=0))].copy(),
                                y=ev_y[:, e, :int(ev_count[:, e].max(initial=0))].copy(), count=ev_count[:, e].copy())
        for e, event in enumerate(rhs.events)
    }
    return solution


def _solve(rhs: NativeRhs, method: str, job: Job, cap: int, solvers: tuple[Callable, Callable], threads: int | None,
           progress: Callable[[Progress], None] | None, started: float):
    """One solve with room for ``cap`` occurrences: (solution, ev_t, ev_y, ev_count)."""
    batch, n_states = job.y0.shape
    n_events = len(rhs.events)
    ev_t = np.full((batch, n_events, cap), math.nan)
    ev_y = np.full((batch, n_events, cap, n_states), math.nan)
    ev_count = np.zeros((batch, n_events), dtype=np.int64)
    extra = [ctypes.c_int64(cap)] + [ctypes.c_void_p(a.ctypes.data) for a in (ev_t, ev_y, ev_count)]
    solution = solve_job(rhs, method, job, threads, progress, started, solvers=solvers, extra_args=extra)
    return solution, ev_t, ev_y, ev_count


def _rows(job: Job, rows: np.ndarray) -> Job:
    """The job of samples ``rows`` only, with outputs of its own."""
    def take(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a[rows])

    part = dataclasses.replace(job, y0=take(job.y0), t0=take(job.t0), t1=take(job.t1), grid=take(job.grid),
                               p=take(job.p), dt=take(job.dt), y_out=take(job.y_out), istat=take(job.istat),
                               fstat=take(job.fstat), y_final=take(job.y_final))
    return part.fresh_outputs()


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
