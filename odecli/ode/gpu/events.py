"""Events on the GPU: the kernel's ``solve_samples_events_cuda`` and what it recorded, as on the CPU.

The kernel runs ``solver_events.c`` (the transcription of :mod:`odecli.ode.events` the CPU
solver runs) in each thread, so event times and states are the CPU solver's to round-off. As
:mod:`odecli.ode.native.events` does, the first solve keeps room for
:data:`~odecli.ode.native.events.FIRST_CAP` occurrences per sample and event and counts all of
them; the samples that had more are solved again, alone, with room for the most any had.
"""

from __future__ import annotations

import ctypes
import math
from typing import TYPE_CHECKING, Callable

from odecli.ode.native.events import FIRST_CAP
from odecli.ode.solution import EventRecord
from odecli.ode.status import Progress

if TYPE_CHECKING:
    from torch import Tensor

    from odecli.ode.gpu.solve import _Layout
    from odecli.ode.native.rhs import NativeRhs

Run = Callable[["_Layout", list, "Callable[[Progress], None] | None"], None]
"""Launches the events kernel over a layout, with the event arrays' arguments after the Job's."""


def solve_with_events(rhs: "NativeRhs", layout: "_Layout", run: Run,
                      progress: Callable[[Progress], None] | None) -> dict[str, EventRecord]:
    """Solve ``layout`` (its outputs filled in place) and return each event's occurrences."""
    import torch

    ev_t, ev_y, ev_count = _solve(rhs, layout, FIRST_CAP, run, progress)
    most = int(ev_count.max()) if ev_count.numel() else 0
    if most > FIRST_CAP:
        rows = torch.nonzero((ev_count > FIRST_CAP).any(dim=1)).flatten()
        sub_t, sub_y, _ = _solve(rhs, _rows(layout, rows), most, run, None)
        wider_t = torch.full(ev_t.shape[:2] + (most,), math.nan, dtype=ev_t.dtype, device=ev_t.device)
        wider_y = torch.full(ev_y.shape[:2] + (most,) + ev_y.shape[3:], math.nan, dtype=ev_y.dtype,
                             device=ev_y.device)
        wider_t[:, :, :FIRST_CAP], wider_y[:, :, :FIRST_CAP] = ev_t, ev_y
        wider_t[rows], wider_y[rows] = sub_t, sub_y
        ev_t, ev_y = wider_t, wider_y
    dtype = layout.y0_dtype
    records = {}
    for e, event in enumerate(rhs.events):
        kept = int(ev_count[:, e].max()) if ev_count.numel() else 0
        records[event.name] = EventRecord(t=ev_t[:, e, :kept].to(dtype), y=ev_y[:, e, :kept].to(dtype),
                                          count=ev_count[:, e].clone())
    return records


def _solve(rhs: "NativeRhs", layout: "_Layout", cap: int, run: Run,
           progress: Callable[[Progress], None] | None) -> tuple["Tensor", "Tensor", "Tensor"]:
    """One solve with room for ``cap`` occurrences: (ev_t, ev_y, ev_count)."""
    import torch

    batch, n_states = layout.y0.shape
    real, device = layout.y0.dtype, layout.y0.device
    ev_t = torch.full((batch, len(rhs.events), cap), math.nan, dtype=real, device=device)
    ev_y = torch.full((batch, len(rhs.events), cap, n_states), math.nan, dtype=real, device=device)
    ev_count = torch.zeros((batch, len(rhs.events)), dtype=torch.int64, device=device)
    run(layout, [ctypes.c_int64(cap), *(ctypes.c_void_p(t.data_ptr()) for t in (ev_t, ev_y, ev_count))], progress)
    return ev_t, ev_y, ev_count


def _rows(layout: "_Layout", rows: "Tensor") -> "_Layout":
    """The layout of samples ``rows`` only, with outputs of its own (the first solve's stay as they are)."""
    from odecli.ode.gpu.solve import _Layout

    fields = dict(layout.__dict__)
    for name in ("y0", "t0", "t1", "grid", "p", "dt", "y_out", "istat", "fstat", "y_final"):
        fields[name] = fields[name][rows].contiguous()
    return _Layout(**fields)
