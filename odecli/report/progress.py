"""Progress display for long solves: a rich bar on a terminal, nothing elsewhere."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from odecli.ode.status import Progress as SolveProgress


@contextlib.contextmanager
def solve_progress(console: Console, enabled: bool) -> Iterator[Callable[[SolveProgress], None] | None]:
    """Yield a solver ``progress`` callback, or None when there is nothing to show on."""
    if not (enabled and console.is_terminal):
        yield None
        return
    columns = (
        TextColumn("[bold]solving"), BarColumn(),
        TextColumn("{task.fields[finished]}/{task.total} samples done"),
        TextColumn("slowest at {task.fields[slowest]:.0%}"),
        TextColumn("{task.fields[rate]:.0f} steps/s"), TimeElapsedColumn(), TimeRemainingColumn(),
    )
    started = time.perf_counter()
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("solve", total=None, finished=0, slowest=0.0, rate=0.0)

        def update(p: SolveProgress) -> None:
            # Completion is driven by the slowest sample, the one that decides when the run ends.
            rate = p.loop_iterations / max(time.perf_counter() - started, 1e-9)
            bar.update(task, total=p.batch, completed=p.finished + (p.batch - p.finished) * p.slowest_fraction,
                       finished=p.finished, slowest=p.slowest_fraction, rate=rate)

        yield update
