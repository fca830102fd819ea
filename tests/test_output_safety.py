"""What happens to output files around the edges of a run: a file that appears while the run
writes, permissions, special files, SIGTERM, a swallowed interrupt, a reader that goes away."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import pytest

from odecli.errors import InputError
from odecli.io.atomic import atomic_path, check_writable

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_an_output_that_appears_during_the_run_is_kept_and_so_is_the_result(tmp_path):
    out = tmp_path / "run.h5"
    with pytest.raises(InputError, match=r"appeared while this run was writing.*run-1\.h5"):
        with atomic_path(out, replace=False) as tmp:
            tmp.write_text("result")
            out.write_text("someone else's")
    assert out.read_text() == "someone else's"
    assert (tmp_path / "run-1.h5").read_text() == "result"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-1.h5", "run.h5"]  # no temporary left


def test_replace_overwrites_and_keeps_the_replaced_files_permissions(tmp_path):
    out = tmp_path / "run.h5"
    out.write_text("old")
    out.chmod(0o640)
    with atomic_path(out, replace=True) as tmp:
        tmp.write_text("new")
    assert out.read_text() == "new"
    assert stat.S_IMODE(out.stat().st_mode) == 0o640


def test_a_new_output_gets_the_umasks_permissions_not_mkstemps_0600(tmp_path):
    previous = os.umask(0o022)
    try:
        with atomic_path(tmp_path / "new.h5") as tmp:
            tmp.write_text("x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "new.h5").stat().st_mode) == 0o644


def test_a_symbolic_link_is_written_through(tmp_path):
    target = tmp_path / "real.h5"
    target.write_text("old")
    link = tmp_path / "link.h5"
    link.symlink_to(target)
    with atomic_path(link) as tmp:
        tmp.write_text("new")
    assert link.is_symlink() and target.read_text() == "new"


def test_force_does_not_replace_a_special_file(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        check_writable(fifo, force=True)


def _odecli(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "odecli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def test_sigterm_during_a_solve_leaves_no_file_and_exits_143(tmp_path):
    # the right-hand side marks that the solve has begun, then takes its time
    (tmp_path / "slow.py").write_text(textwrap.dedent(f"""
        import pathlib, time
        def f(t, y, p):
            pathlib.Path({str(tmp_path / 'started')!r}).touch()
            time.sleep(0.01)
            return -y
    """))
    (tmp_path / "spec.yaml").write_text(textwrap.dedent("""
        kind: ode
        system: {states: [x], python: slow.py:f}
        initial: {x: 1.0}
        time: {start: 0, end: 1000, eval: 5}
        solver: {method: rk4, dt0: 0.001}
    """))
    process = _odecli("solve", str(tmp_path / "spec.yaml"), "-o", str(tmp_path / "run.h5"))
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM
    assert "stopped by SIGTERM; no output was written" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slow.py", "spec.yaml", "started"]


def test_an_interrupt_swallowed_by_a_finaliser_still_stops_the_write(tmp_path):
    # A signal's exception raised inside __del__ is printed and dropped by Python; the write
    # that follows must not put the output in place.
    code = textwrap.dedent(f"""
        import os, signal, sys
        from odecli import interrupts
        from odecli.io.atomic import atomic_path
        interrupts.install()
        class Finaliser:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGTERM)
        Finaliser()
        try:
            with atomic_path({str(tmp_path / 'out.txt')!r}) as tmp:
                tmp.write_text("written after the user asked to stop")
        except interrupts.Interrupted as exc:
            sys.exit(exc.exit_code)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "Exception ignored" in result.stderr  # the exception was indeed swallowed
    assert result.returncode == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []


def test_sighup_still_stops_a_run_once_mpi_is_initialised():
    # train-inverse initialises MPI even on one rank (get_comm); MPICH over UCX then makes SIGHUP
    # UCX's debug signal, which only raised UCX's log level: the fit ran on and wrote its output
    # (exit 0) where the README promises exit 129 and no output.
    pytest.importorskip("mpi4py")
    code = textwrap.dedent("""
        import os, signal, sys, time
        from odecli import interrupts
        from odecli.parallel.comm import get_comm
        interrupts.install()
        get_comm()
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(1.0)
        except interrupts.Interrupted as exc:
            sys.exit(exc.exit_code)
        sys.exit("SIGHUP was lost")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 128 + signal.SIGHUP, result.stderr[-2000:]


def test_a_fit_whose_reader_goes_away_still_finishes_and_writes(tmp_path):
    out = tmp_path / "fit.h5"
    process = _odecli("train-inverse", str(EXAMPLES / "vdp-fit.yaml"), "-o", str(out),
                      "--iterations", "6")
    first = process.stdout.readline()
    process.stdout.close()  # like `| head -1`
    _, err = process.communicate(timeout=120)
    assert first.startswith("start ")  # the progress line of the initial guess
    assert process.returncode == 0, err
    assert "BrokenPipe" not in err and out.exists()


FIT = """\
kind: ode
name: decay-fit
system: {states: [x], params: {k: [1, 2]}, python: rhs.py:f}
initial: {x: 1}
time: {start: 0, end: 1, eval: 3}
solver: {device: cpu}
inverse:
  unknowns: {params: {k: {per_sample: true, init: 1.5, bounds: [0.1, 5.0]}}}
  data: {truth: {params: {k: [1.0, 2.0]}}}
  observed: [x]
  optimizer: {type: lbfgs, iterations: 2}
"""


@pytest.mark.parametrize("command", ["solve", "train-inverse"])
def test_a_file_created_at_the_output_during_the_run_is_not_overwritten(tmp_path, command):
    # the right-hand side, called once the output was checked, plays another process
    out = tmp_path / "out.h5"
    (tmp_path / "rhs.py").write_text(textwrap.dedent(f"""
        import pathlib
        def f(t, y, p):
            out = pathlib.Path({str(out)!r})
            if not out.exists():
                out.write_text("another process's file")
            return -p["k"][:, None] * y
    """))
    (tmp_path / "spec.yaml").write_text(FIT if command == "train-inverse" else FIT.split("inverse:")[0])
    process = _odecli(command, str(tmp_path / "spec.yaml"), "-o", str(out), "-q")
    _, err = process.communicate(timeout=120)
    assert process.returncode == 2, err
    assert f"error: {out}: a file of that name appeared while this run was writing" in err
    assert out.read_text() == "another process's file"
    with h5py.File(tmp_path / "out-1.h5", "r") as h5:  # the result, kept
        assert h5.attrs["kind"] == ("ode" if command == "solve" else "ode-inverse")
