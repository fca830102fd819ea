"""The ``odecli`` command line: thin Typer commands over the library.

Commands parse flags, call one library function and turn its result into text and an exit code.
Errors become ``error: <file>: <field>: <what was expected>`` on stderr and a documented exit
code (0 ok, 2 invalid input, 3 completed with failed samples, 1 internal error), never a traceback
(set ODECLI_DEBUG=1 to see one).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Callable, Optional

import typer
import typer.core
from rich.console import Console

from odecli import __version__
from odecli.errors import EXIT_INTERNAL, EXIT_INVALID_INPUT, InputError, OdecliError
from odecli.interrupts import forget_written
from odecli.parallel.launcher import launched_rank, launched_ranks

try:  # typer >= 0.20 carries its own copy of click
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - older typer on the click package
    from click.exceptions import UsageError


class _UsageError(UsageError):
    """A bad flag, value or argument, shown as every other input error is: one line, exit 2."""

    def show(self, file=None) -> None:
        command = self.ctx.command_path if self.ctx is not None else "odecli"
        sys.stderr.write(f"error: {self.format_message()} (see '{command} --help')\n")


class _Signal(Exception):
    """A signal that arrived outside a command's handler, carried past click (which would print
    "Aborted!" and exit 1) to :func:`run`."""

    def __init__(self, interrupted: KeyboardInterrupt) -> None:
        super().__init__(str(interrupted))
        self.interrupted = interrupted


class _Group(typer.core.TyperGroup):
    """The odecli command group: usage errors of every command become :class:`_UsageError`."""

    def make_context(self, *args, **kwargs):
        with _one_line_usage_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with _one_line_usage_errors():
            return super().invoke(ctx)


@contextlib.contextmanager
def _one_line_usage_errors():
    """Parsing and dispatch: a usage error becomes :class:`_UsageError`, a signal :class:`_Signal`."""
    try:
        yield
    except KeyboardInterrupt as exc:
        raise _Signal(exc) from None
    except UsageError as exc:
        if isinstance(exc, _UsageError) or type(exc).__name__ == "NoArgsIsHelpError":  # plain `odecli`: the help
            raise
        raise _UsageError(exc.format_message(), exc.ctx) from None


app = typer.Typer(
    cls=_Group,
    name="odecli",
    help="Batched ODE solving and MPI-parallel PDE inverse problems on CPU or GPU.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    # Plain help (click's): typer's rich panels print flags as `--force <bool>` and arguments as `{spec}`.
    rich_markup_mode=None,
)


class _Command(typer.core.TyperCommand):
    """Usage lines as Unix help writes them (``odecli solve [OPTIONS] SPEC``): typer wraps a
    required argument in braces (``{SPEC}``), which reads like a placeholder syntax."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [re.sub(r"^\{(.*)\}$", r"\1", piece) for piece in super().collect_usage_pieces(ctx)]


stdout = Console(highlight=False, soft_wrap=True)  # lines are never wrapped, also when piped
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def _failure(exc: BaseException) -> tuple[Optional[str], int]:
    """The one line to print for a failure, and its exit code (raises what is not a failure)."""
    if isinstance(exc, typer.Exit):
        raise exc
    if isinstance(exc, SystemExit):  # another rank reports it (odecli.app.solve_ranks)
        code = exc.code if isinstance(exc.code, int) else EXIT_INTERNAL
        if code == 0:
            raise exc
        return None, code
    if isinstance(exc, OdecliError):
        return f"error: {exc}", exc.exit_code
    if isinstance(exc, KeyboardInterrupt):  # Ctrl-C, or SIGTERM/SIGHUP via odecli.interrupts
        signum = getattr(exc, "signum", signal.SIGINT)
        what = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        kept = getattr(exc, "kept", None)  # set by a library that kept something (a checkpoint)
        from odecli.interrupts import written

        done = written()
        if kept is None and done:  # it came after the output was complete and in place
            kept = f"{', '.join(done)} was written completely before it"
        return f"{what}; {kept or 'no output was written'}", 128 + signum
    if _from_h5py(exc) and _READING:  # stats/plot/export: the run file's own bytes are damaged
        return f"error: {_READING[0]}: damaged HDF5 data ({type(exc).__name__}: {' '.join(str(exc).split())})", \
            EXIT_INVALID_INPUT
    if isinstance(exc, RecursionError):  # a spec nested too deep for the loader or the checks
        return "error: the input is nested too deeply to read", EXIT_INVALID_INPUT
    if os.environ.get("ODECLI_DEBUG"):
        raise exc
    return (f"internal error: {type(exc).__name__}: {exc} (set ODECLI_DEBUG=1 for a traceback)",
            EXIT_INTERNAL)


_READING: list[Path] = []  # the run file a reading command (stats, plot, export) works on


def _from_h5py(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside h5py (reading a file whose bytes are damaged)."""
    tb = exc.__traceback__
    while tb is not None:
        if f"h5py{os.sep}" in tb.tb_frame.f_code.co_filename:  # h5py's Python and Cython modules
            return True
        tb = tb.tb_next
    return False


def _clean_errors(command: Callable, ranks: bool = False) -> Callable:
    """Run a command; report errors as one line with the right exit code.

    ``ranks``: the command runs over MPI ranks when launched by mpirun (solve, train-inverse).
    There a failure goes through :func:`odecli.parallel.comm.end_together`: printed once with the
    same exit code when every rank failed alike, else printed by the failing rank, which aborts
    every rank with its exit code, so no rank is left waiting for it."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        under_mpi = ranks and launched_ranks() > 1  # no import before the try: a signal may come any time
        try:
            forget_written()  # a signal's line names this command's outputs only
            if under_mpi:
                _watch_ranks()
            return command(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - the last line of defence against tracebacks
            line, code = _failure(exc)
        if under_mpi:
            from odecli.parallel.comm import end_together

            line, code = end_together(line, code)
        if line is not None:
            stderr.print(line, markup=False, soft_wrap=True)
        raise typer.Exit(code)

    return wrapper


def _ranked(command: Callable) -> Callable:
    """:func:`_clean_errors` for a command that runs over MPI ranks."""
    return _clean_errors(command, ranks=True)


_RANKED = {"solve", "train-inverse"}  # the commands that run over MPI ranks under mpirun


def _watch_ranks() -> None:
    """Under mpirun: failures end every rank together, and a termination signal whose handler
    cannot run (the main thread waits inside a blocking MPI call) aborts the job from a watchdog."""
    from odecli.interrupts import watch_stuck
    from odecli.parallel.comm import abort_now, end_failures_together

    end_failures_together()
    watch_stuck(lambda signum: abort_now(f"stopped by {signal.Signals(signum).name}; no output was written",
                                         128 + signum))


def _file_logger(path: Optional[Path]) -> Callable[[str], None]:
    """A one-line-per-event log appender for --log (nothing when no file is given). The file is
    opened at the first event, so a spec that fails validation leaves no log behind."""
    if path is None:
        return lambda message: None
    if _is_hdf5(path):
        raise InputError(f"--log: {path} is an HDF5 file (a run or a checkpoint); give a text file for the log")
    handle = None

    def write(message: str) -> None:
        import datetime

        nonlocal handle
        if handle is None:
            try:
                handle = open(path, "a", encoding="utf-8")
            except OSError as exc:
                raise InputError(f"--log: cannot open {path}: {exc.strerror}") from None
        handle.write(f"{datetime.datetime.now().isoformat(timespec='seconds')} {message}\n")
        handle.flush()

    return write


def _is_hdf5(path: Path) -> bool:
    """Whether ``path`` is (or, by its name, would be) an HDF5 file: appending text would damage it."""
    if path.suffix.lower() in (".h5", ".hdf5", ".he5"):
        return True
    try:
        with open(path, "rb") as handle:
            return handle.read(8) == b"\x89HDF\r\n\x1a\n"
    except OSError:
        return False


def _note_oversubscription(note: Optional[str], quiet: bool) -> None:
    if note and not quiet and launched_rank() == 0:
        stderr.print(f"note: {note}", markup=False, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        stdout.print(f"odecli {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Batched ODE solving and MPI-parallel PDE inverse problems."""


@app.command(cls=_Command)
@_ranked
def solve(
    spec: Path = typer.Argument(..., metavar="SPEC", help="YAML spec with kind: ode."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Output HDF5 file (default: spec's output or <name>.h5)."),
    method: Optional[str] = typer.Option(None, "--method", help="Override solver.method."),
    rtol: Optional[float] = typer.Option(None, "--rtol", help="Override solver.rtol."),
    atol: Optional[float] = typer.Option(None, "--atol", help="Override solver.atol."),
    device: Optional[str] = typer.Option(None, "--device", help="Override solver.device (cpu, cuda, auto)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no summary line."),
    log: Optional[Path] = typer.Option(None, "--log", help="Append a log of the run to this file."),
) -> None:
    """Solve every sample of an ODE batch and write trajectories and statistics to HDF5.

    Example: odecli solve examples/vdp-sweep.yaml -o vdp.h5
    """
    from odecli.app.commands import oversubscription_note, solve_file

    _note_oversubscription(oversubscription_note(), quiet)
    overrides = {"method": method, "rtol": rtol, "atol": atol, "device": device}
    outcome = solve_file(spec, output, overrides=overrides, force=force, quiet=quiet, stdout=stdout,
                         stderr=stderr, logger=_file_logger(log))
    if outcome.summary is not None and not quiet:
        stdout.print(outcome.summary, markup=False, soft_wrap=True)
    raise typer.Exit(outcome.exit_code)


@app.command(cls=_Command)
@_clean_errors
def stats(
    run: Path = typer.Argument(..., metavar="RUN", help="A run file written by odecli."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    per_sample: bool = typer.Option(False, "--per-sample", help="List every sample (ODE runs)."),
) -> None:
    """Report what happened in a run: status counts, steps, f-evals, timings, loss histories.

    Example: odecli stats vdp.h5 --json
    """
    from odecli.report.stats import render, summarize

    _READING.append(run)
    summary = summarize(run, per_sample=per_sample)
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    else:
        render(summary, stdout)


@app.command(cls=_Command)
@_clean_errors
def validate(spec: Path = typer.Argument(..., metavar="SPEC", help="A YAML spec of any kind.")) -> None:
    """Check a spec without running it; list every problem with its field path.

    Example: odecli validate examples/vdp-sweep.yaml
    """
    from odecli.specs.validate import validate_file

    report = validate_file(spec)
    for note in report.notes:
        stdout.print(f"note: {note}", markup=False, soft_wrap=True)
    for problem in report.problems:
        stderr.print(f"error: {problem}", markup=False, soft_wrap=True)
    if report.problems:
        raise typer.Exit(EXIT_INVALID_INPUT)
    stdout.print(f"{spec}: valid {report.kind} spec", markup=False, soft_wrap=True)


@app.command(cls=_Command)
@_clean_errors
def schema() -> None:
    """Print the JSON Schema of every spec kind (for editors and the YAML language server).

    Example: odecli schema > odecli.schema.json
    """
    from odecli.specs.schema import all_schemas

    sys.stdout.write(json.dumps(all_schemas(), indent=2) + "\n")


@app.command(cls=_Command)
@_clean_errors
def init(
    kind: str = typer.Argument(..., metavar="KIND", help="ode or pde-inverse"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Where to write the spec (default <kind>.yaml)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Write a commented starter spec.

    Example: odecli init ode -o my-system.yaml
    """
    from odecli.io.atomic import atomic_path, check_writable
    from odecli.specs.validate import starter_spec

    text = starter_spec(kind)
    target = output or Path(f"{kind}.yaml")
    check_writable(target, force=force)
    with atomic_path(target, replace=force) as tmp:
        tmp.write_text(text, encoding="utf-8")
    stdout.print(f"wrote {target}", markup=False)


@app.command("train-inverse", cls=_Command)
@_ranked
def train_inverse(
    spec: Path = typer.Argument(..., metavar="SPEC", help="YAML spec with kind: pde-inverse (or kind: ode with an inverse: section)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Output HDF5 file (default: <name>-fit.h5; name defaults to the spec file's stem)."),
    iterations: Optional[int] = typer.Option(None, "--iterations", help="Override the number of iterations."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the checkpoint beside the output (OUT.ckpt.h5)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file; start over on an earlier run's checkpoint."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
    log: Optional[Path] = typer.Option(None, "--log", help="Append the run's start and outcome to this file (rank 0)."),
) -> None:
    """Fit unknown fields or parameters to data; run under mpirun for domain decomposition.

    Example: mpirun -n 2 odecli train-inverse examples/acoustic-anomaly.yaml -o fwi.h5
    """
    from odecli.app.commands import oversubscription_note, train_inverse_file

    _note_oversubscription(oversubscription_note(), quiet)

    # The ~170,000 objects of the modules imported so far live until exit: frozen (after one
    # collection, so no garbage is frozen with them), the collector's full passes stop walking
    # them (a full pass took 70 ms, about every 60 evaluations at 256^2: 4 % of the run).
    # Here, not in the library, because the freeze is process-wide.
    gc.collect()
    gc.freeze()
    code = train_inverse_file(spec, output, iterations=iterations, resume=resume, force=force, quiet=quiet,
                              logger=_file_logger(log if launched_rank() == 0 else None))
    raise typer.Exit(code)


@app.command(cls=_Command)
@_clean_errors
def plot(
    run: Path = typer.Argument(..., metavar="RUN", help="A run file written by odecli (ode, pde-inverse or ode-inverse)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Picture file, .png or .pdf (default: <run stem>.png)."),
    samples: Optional[str] = typer.Option(None, "--samples", help="Samples to draw, e.g. 0,3,5 or 2-6 (default: all, at most 20)."),
    states: Optional[str] = typer.Option(None, "--states", help="States to draw, e.g. x,v (default: all)."),
    phase: Optional[str] = typer.Option(None, "--phase", help="Phase portrait of two states, e.g. x,v."),
    shot: int = typer.Option(0, "--shot", help="pde-inverse: the shot whose receiver traces are drawn."),
    logx: bool = typer.Option(False, "--logx", help="Log scale for t (or the first --phase state)."),
    logy: bool = typer.Option(False, "--logy", help="Log scale for the states (or the second --phase state)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing picture."),
) -> None:
    """Draw a run: ODE trajectories or a phase portrait; inverse runs' fields, loss and traces.

    Example: odecli plot vdp.h5 --samples 0,8,15 --phase x,v -o vdp-phase.pdf
    """
    from odecli.report.plot import PlotRequest, plot_run

    request = PlotRequest(samples=samples, states=states, phase=phase, shot=shot, logx=logx, logy=logy)
    _READING.append(run)
    target = plot_run(run, output, request, force=force)
    for note in request.notes:
        stdout.print(f"note: {note}", markup=False, soft_wrap=True)
    stdout.print(f"wrote {target}", markup=False, soft_wrap=True)


@app.command(cls=_Command)
@_clean_errors
def export(
    run: Path = typer.Argument(..., metavar="RUN", help="A run file written by odecli."),
    csv: Optional[Path] = typer.Option(None, "--csv", help="Folder for the CSV files (created if missing)."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing CSV files in the folder."),
) -> None:
    """Write a run as CSV files: ODE trajectories and per-sample table; inverse runs' history and data.

    Example: odecli export vdp.h5 --csv vdp-csv/
    """
    from odecli.io.export import export_csv

    if csv is None:
        raise InputError("--csv: give the folder to write CSV files into, e.g. --csv out/")
    _READING.append(run)
    for path in export_csv(run, csv, force=force):
        stdout.print(f"wrote {path}", markup=False, soft_wrap=True)


class _ClosedReaderTolerantStdout:
    """stdout that, once its reader has gone (``odecli ... | head``), sends the rest to
    /dev/null: the command still finishes its work and writes its files, as it would with its
    output on a terminal, instead of dying of BrokenPipeError half-way through a fit."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._discard_from_now_on()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._discard_from_now_on()

    def _discard_from_now_on(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def run() -> None:
    """The ``odecli`` console script: the app, with SIGTERM and SIGHUP unwinding like Ctrl-C
    (so no temporary output is left behind) and a reader that closes stdout early tolerated."""
    from odecli.interrupts import finish, install

    install()
    sys.stdout = _ClosedReaderTolerantStdout(sys.stdout)
    try:
        app(prog_name="odecli")
    except (KeyboardInterrupt, _Signal) as exc:  # a signal outside a command's own handler
        line, code = _failure(exc.interrupted if isinstance(exc, _Signal) else exc)
        if launched_ranks() > 1 and _RANKED.intersection(sys.argv[1:]):
            from odecli.parallel.comm import end_together

            line, code = end_together(line, code)
        if line is not None:
            stderr.print(line, markup=False, soft_wrap=True)
        sys.exit(code)
    finally:  # a signal during the interpreter's shutdown: no traceback from an atexit callback
        finish()
