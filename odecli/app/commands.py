"""What ``odecli solve`` and ``odecli train-inverse`` do, as functions a script can call.

The CLI parses flags and prints; everything between a spec path and a written file is here. Each
function checks its inputs before importing torch, so a bad spec fails in a fraction of a second
instead of after the seconds ``import torch`` takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from odecli.errors import EXIT_FAILED_SAMPLES, EXIT_OK, InputError
from odecli.specs import feasibility

Logger = Callable[[str], None]


@dataclass(frozen=True)
class Outcome:
    """An exit code, and the summary line to print (None where the run printed its own)."""

    exit_code: int
    summary: str | None = None


def _ranks() -> tuple[int, int]:
    """(ranks in the job, ranks on this machine) from the MPI launcher's environment."""
    import os

    from odecli.app.solve_ranks import launched_ranks

    total = launched_ranks()
    here = next((int(os.environ[v]) for v in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")
                 if os.environ.get(v, "").isdigit()), total)
    return total, here


def oversubscription_note() -> str | None:
    """A note when more MPI ranks run on this machine than it has CPUs: each rank then gets less
    than a core and the run is slower than with fewer ranks (4 ranks on 2 cores ran 4-8x slower
    than 1 rank), which otherwise looks like a fault of odecli."""
    from odecli.threads import available_cpus

    local = _ranks()[1]
    cpus = available_cpus()
    if local <= cpus:
        return None
    return (f"{local} MPI ranks share {cpus} CPUs on this machine: each rank gets less than one core, "
            f"so this runs slower than {cpus} rank{'s' if cpus > 1 else ''} would")


def solve_file(spec_path: Path, output: Path | None, *, overrides: dict[str, Any], force: bool, quiet: bool,
               stdout: Any, stderr: Any, logger: Logger) -> Outcome:
    """Solve a ``kind: ode`` spec into an HDF5 run file (over the ranks when under mpirun)."""
    from odecli.io.atomic import check_space, check_writable
    from odecli.io.ode_run import estimated_size
    from odecli.specs import load_ode_spec

    ode_spec = load_ode_spec(spec_path)
    feasibility.check_ode(ode_spec)
    target = output or Path(ode_spec.default_output)
    check_writable(target, force=force)
    check_space(target, estimated_size(ode_spec))
    from odecli.app.solve import solve_spec_arrays, with_overrides
    from odecli.app.solve_ranks import launched_ranks, solve_cli
    from odecli.io.ode_run import write_ode_run
    from odecli.report.failures import FailureTally
    from odecli.report.progress import solve_progress

    ode_spec = with_overrides(ode_spec, **overrides)
    if launched_ranks() > 1:  # under mpirun: the batch is split over the ranks (imports mpi4py only then)
        return Outcome(solve_cli(ode_spec, target, force=force, quiet=quiet, stdout=stdout, stderr=stderr,
                                 logger=logger))
    logger(f"solve {spec_path} -> {target}: {ode_spec.batch} samples, method {ode_spec.solver.method}")
    with solve_progress(stderr, enabled=not quiet) as progress:
        solution = solve_spec_arrays(ode_spec, progress=progress)
    write_ode_run(target, ode_spec, solution, replace=force)
    status = solution.status
    failures = FailureTally()
    failures.add(0, status, solution.t_final)
    failed = failures.failed
    steps = solution.stats["n_steps"].astype(float)
    line = (f"{ode_spec.name}: {status.size} samples, {status.size - failed} succeeded, {failed} failed"
            f"{failures.clause()}; "
            f"steps mean {steps.mean():.1f} max {int(steps.max())}; {solution.wall_time_s:.3f} s{_engine_note(solution.extra)}; "
            f"wrote {target}")
    logger(line)
    return Outcome(EXIT_FAILED_SAMPLES if failed else EXIT_OK, line)


def _engine_note(extra: dict) -> str:
    """Where the C solver could have run but did not, say so and how to get it: a Python
    right-hand side ran about 70x slower than the same system as equations (1000 damped pendulums:
    4.3 s against 0.06 s)."""
    why = extra.get("why_not_native", "")
    if not why:
        return ""
    if why == "the right-hand side is Python code":
        return (" on the PyTorch loop (a python: right-hand side; the same system written as equations: "
                "runs in the generated C solver, often tens of times faster)")
    return f" on the PyTorch loop ({why})"


def train_inverse_file(spec_path: Path, output: Path | None, *, iterations: int | None, resume: bool,
                       force: bool, quiet: bool, logger: Logger) -> int:
    """Fit a ``kind: pde-inverse`` spec, or a ``kind: ode`` spec with an ``inverse:`` section."""
    from odecli.specs import load_yaml, spec_kind

    data, text = load_yaml(spec_path)
    kind = spec_kind(data, str(spec_path))
    if kind == "pde-inverse":
        from odecli.specs.pde import validate

        spec = validate(data, str(spec_path), spec_path.parent)  # a bad field fails before torch is imported
        feasibility.check_pde(spec, *_ranks())
        from odecli.app.fit_pde import train_inverse as run
    elif kind == "ode":
        from odecli.specs import parse_ode_spec

        feasibility.check_ode(parse_ode_spec({k: v for k, v in data.items() if k != "inverse"}, text, str(spec_path)))
        from odecli.app.fit_ode import train_inverse as run
    else:
        raise InputError(f"{spec_path}: kind: train-inverse needs kind pde-inverse or ode, got {kind!r}")
    logger(f"train-inverse {spec_path} ({kind}) -> {output or 'default output'}{' (resume)' if resume else ''}")
    code = run(spec_path, output, iterations, resume, force, quiet)
    logger(f"train-inverse {spec_path}: finished with exit code {code}")
    return code
