"""Run a Python script under ``mpiexec -n N`` from a test, in a subprocess with a timeout.

Tests stay in a single pytest process; only the scripts they launch run on several ranks,
so a hang or a crash on one rank fails one test instead of the whole session.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def find_mpiexec() -> str | None:
    """The mpiexec next to the running interpreter (the venv's MPICH), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    return shutil.which("mpiexec")


def run_mpi(script: Path, n: int, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``script`` on ``n`` ranks; skips the test only when mpi4py is not importable.

    Ranks may outnumber cores, and the env lets Open MPI oversubscribe and run as root
    (MPICH needs neither); each rank uses one BLAS/torch thread, and the repo root is on
    PYTHONPATH so the scripts import the working tree. On timeout the whole launched process group is killed (so no rank
    lingers) and the test fails with whatever the ranks printed.
    """
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py is not importable; install the 'mpi' extra to run the MPI tests")
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.fail("mpi4py is installed but no mpiexec was found next to Python or on PATH")
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
    )
    cmd = [mpiexec, "-n", str(n), sys.executable, str(script), *args]
    proc = subprocess.Popen(
        cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


SCRIPTS = Path(__file__).parent / "mpi_scripts"


def mpi_script(name: str):
    """The MPI script ``mpi_scripts/<name>.py`` imported as a module, for what the tests use of it
    in this process (its one-rank ``compute(None)``, its constants) beside its mpiexec runs."""
    import importlib

    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(SCRIPTS))


def compute_on_one_thread(script):
    """``script.compute(None)``, the one-rank result, with one torch thread: small tensors, where
    a second thread costs more than it gives on a shared 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return script.compute(None)
    finally:
        torch.set_num_threads(before)
