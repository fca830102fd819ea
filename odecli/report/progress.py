"""The progress bar of long solves: a rich bar on a terminal, nothing elsewhere.

One bar, two ways to feed it: :func:`solve_progress` takes the solver's own progress reports
(one process), :func:`samples_progress` counts samples written (a solve over MPI ranks, on
rank 0). Both yield None where there is nothing to show on, so callers pass it straight on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from odecli.ode.status import Progress as SolveProgress


@contextlib.contextmanager
def _bar(console: Console, enabled: bool, *counters: ProgressColumn, **fields: float) -> Iterator[Callable | None]:
    """A transient ``solving`` bar with ``counters`` between the bar and the clocks; yields its
    ``update(**kwargs)`` for the one task, or None off a terminal."""
    if not (enabled and console.is_terminal):
        yield None
        return
    columns = (TextColumn("[bold]solving"), BarColumn(), *counters, TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("solve", total=None, **fields)
        yield lambda **kwargs: bar.update(task, **kwargs)


@contextlib.contextmanager
def solve_progress(console: Console, enabled: bool) -> Iterator[Callable[[SolveProgress], None] | None]:
    """Yield a solver ``progress`` callback, or None when there is nothing to show on."""
    counters = (TextColumn("{task.fields[finished]}/{task.total} samples done"),
                TextColumn("slowest at {task.fields[slowest]:.0%}"), TextColumn("{task.fields[rate]:.0f} steps/s"))
    started = time.perf_counter()
    with _bar(console, enabled, *counters, finished=0, slowest=0.0, rate=0.0) as update_bar:
        if update_bar is None:
            yield None
            return

        def update(p: SolveProgress) -> None:
            # Completion is driven by the slowest sample, the one that decides when the run ends.
            rate = p.loop_iterations / max(time.perf_counter() - started, 1e-9)
            update_bar(total=p.batch, completed=p.finished + (p.batch - p.finished) * p.slowest_fraction,
                       finished=p.finished, slowest=p.slowest_fraction, rate=rate)

        yield update


@contextlib.contextmanager
def samples_progress(console: Console, enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """Yield an ``on_progress(done, total)`` callback for samples written, or None."""
    with _bar(console, enabled, TextColumn("{task.completed}/{task.total} samples")) as update_bar:
        yield None if update_bar is None else (lambda done, total: update_bar(completed=done, total=total))
