"""Signals at the worst moments (issue 42's two cases that were never re-verified), made
deterministic by tests/fault_campaign/signal_at_call.py: the signal is sent from inside the
process at the K-th call into h5py (during the HDF5 write), right after the output was moved
into place, or from an atexit callback (during the interpreter's shutdown after a success)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests" / "fault_campaign" / "signal_at_call.py"
SWEEP = ROOT / "examples" / "vdp-sweep.yaml"


def _run(k: int, signame: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(DRIVER), str(k), signame, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def _clean(stderr: str) -> None:
    for sign in ("Traceback", "Exception ignored", "internal error"):
        assert sign not in stderr, stderr


@pytest.mark.parametrize("signame", ["SIGINT"])
def test_a_signal_during_shutdown_after_a_success_changes_nothing(tmp_path, signame):
    result = _run(-1, signame, "solve", str(SWEEP), "-o", "run.h5", "-q", cwd=tmp_path)
    _clean(result.stderr)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.h5"]


def test_a_signal_during_shutdown_of_validate_changes_nothing(tmp_path):
    result = _run(-1, "SIGTERM", "validate", str(SWEEP), cwd=tmp_path)
    _clean(result.stderr)
    assert result.returncode == 0 and "valid ode spec" in result.stdout


@pytest.mark.parametrize("k", [1, 300, 1500])
def test_a_signal_inside_the_hdf5_write_stops_cleanly(tmp_path, k):
    result = _run(k, "SIGTERM", "solve", str(SWEEP), "-o", "run.h5", "-q", cwd=tmp_path)
    counted = int(result.stderr.rsplit("h5py calls counted: ", 1)[1].split()[0])
    assert counted >= k, "the signal was not sent: the write makes fewer h5py calls than the test assumes"
    _clean(result.stderr)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert "stopped by SIGTERM; no output was written" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no output, no temporary


def test_a_signal_after_the_output_is_in_place_says_so(tmp_path):
    result = _run(-2, "SIGINT", "solve", str(SWEEP), "-o", "run.h5", "-q", cwd=tmp_path)
    _clean(result.stderr)
    assert result.returncode == 130
    assert "interrupted; run.h5 was written completely before it" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.h5"]


def test_a_signal_to_a_rank_waiting_in_mpi_finalize_changes_nothing(tmp_path):
    # mpi4py's MPI_Finalize runs after Python's finalisation has put back the default action of
    # every handled signal: rank 1, done and waiting there for rank 0, was killed by SIGTERM and
    # the launcher reported the job as killed (code 15, "BAD TERMINATION"; the campaign's finding)
    pytest.importorskip("mpi4py")
    from mpi_helpers import find_mpiexec

    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.fail("mpi4py is installed but no mpiexec was found")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([mpiexec, "-n", "2", sys.executable, str(DRIVER), "-3", "SIGTERM", "train-inverse",
                             str(ROOT / "examples" / "vdp-fit.yaml"), "-o", "fit.h5", "-q", "--iterations", "1"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    _clean(result.stderr)
    assert result.returncode == 0 and "BAD TERMINATION" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit.h5"]


def test_a_signal_while_the_command_line_is_imported_is_one_line(tmp_path):
    # the handlers were installed only after typer and rich were imported: a SIGTERM in that
    # time killed the process by default (under mpirun: the launcher's report and code 15)
    code = (
        "import builtins, os, signal, sys\n"
        "real = builtins.__import__\n"
        "def hooked(name, *args, **kwargs):\n"
        "    if name == 'typer':\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = hooked\n"
        f"sys.argv = ['odecli', 'validate', {str(SWEEP)!r}]\n"
        "from odecli.__main__ import main\n"
        "main()\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    _clean(result.stderr)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert result.stderr == "stopped by SIGTERM; no output was written\n"


def test_a_signal_to_one_rank_while_the_command_line_is_imported_ends_every_rank(tmp_path):
    # rank 1 stopped cleanly (143) before MPI_Init, while rank 0 waited in MPI_Init for it and
    # mpiexec for both: the job hung until killed (found with three orphaned 2-rank fits)
    pytest.importorskip("mpi4py")
    from mpi_helpers import find_mpiexec

    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.fail("mpi4py is installed but no mpiexec was found")
    code = (
        "import builtins, os, signal, sys\n"
        "real = builtins.__import__\n"
        "def hooked(name, *args, **kwargs):\n"
        "    if name == 'typer' and os.environ.get('PMI_RANK') == '1':\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = hooked\n"
        f"sys.argv = ['odecli', 'train-inverse', {str(ROOT / 'examples' / 'vdp-fit.yaml')!r}, '-o', 'fit.h5', '-q']\n"
        "from odecli.__main__ import main\n"
        "main()\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", code], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    _clean(result.stderr)
    assert result.returncode == 128 + signal.SIGTERM, result.stdout + result.stderr
    assert "[rank 1] stopped by SIGTERM; no output was written" in result.stderr
    assert list(tmp_path.iterdir()) == []
