"""No rank left waiting (issue 42): a failure on one rank ends every rank, with its message and the
exit code the same cause gives on one rank, whatever the rank count.

Each case launches the real command line (``python -m odecli``, the console script's handlers)
under ``mpiexec``, in MPMD form where the ranks must see different files (``-wdir``), with a hard
timeout: before the mechanism of :func:`odecli.parallel.comm.end_together` every case here hung
until killed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpi_helpers import REPO_ROOT, find_mpiexec

pytest.importorskip("mpi4py")
EXAMPLES = REPO_ROOT / "examples"
TIMEOUT_S = 60
PDE_SPEC = """\
kind: pde-inverse
equation: acoustic2d
grid: {shape: [24, 24], spacing: 10.0}
time: {dt: 0.0015, steps: 40}
boundary: {absorbing_width: 4}
sources:
  wavelet: {type: ricker, peak_frequency: 25}
  positions: [[60, 60]]
receivers:
  line: {from: [200, 20], to: [200, 200], count: 4}
observed: {file: obs.h5, dataset: data/observed}
unknown: {type: grid, initial: 2000, bounds: [1500, 2600]}
optimizer: {type: adam, learning_rate: 20, iterations: 2}
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _command(parts: list[tuple[int, Path, list[str]]]) -> list[str]:
    """``mpiexec -n N -wdir DIR python -m odecli ARGS : ...`` for each (N, DIR, ARGS)."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.fail("mpi4py is installed but no mpiexec was found")
    cmd = [mpiexec]
    for k, (n, wdir, args) in enumerate(parts):
        cmd += ([":"] if k else []) + ["-n", str(n), "-wdir", str(wdir), sys.executable, "-m", "odecli", *args]
    return cmd


def _finish(proc: subprocess.Popen, cmd: list[str]) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"hung: {' '.join(cmd)} ran past {TIMEOUT_S} s\nstdout:\n{out}\nstderr:\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _start(parts: list[tuple[int, Path, list[str]]]) -> tuple[subprocess.Popen, list[str]]:
    cmd = _command(parts)
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    return proc, cmd


def _run(parts: list[tuple[int, Path, list[str]]]) -> subprocess.CompletedProcess:
    return _finish(*_start(parts))


def _serial(cwd: Path, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "odecli", *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _rank_pid(launcher: int, rank: int, deadline_s: float = 30) -> int:
    """The process of ``rank`` among the descendants of the launcher ``launcher``."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                if f"PMI_RANK={rank}".encode() not in environ:
                    continue
                ancestor = pid
                while ancestor > 1 and ancestor != launcher:
                    ancestor = _parent(ancestor)
            except (OSError, ValueError):
                continue
            if ancestor == launcher:
                return pid
        time.sleep(0.05)
    pytest.fail(f"rank {rank} did not start")


def _catches_sigterm(pid: int, deadline_s: float = 30) -> None:
    """Wait until ``pid`` handles SIGTERM (odecli installed its handler: start-up has begun)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        status = Path(f"/proc/{pid}/status").read_text()
        caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
        if caught & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.01)
    pytest.fail(f"process {pid} never caught SIGTERM")


def _two_folders(tmp_path: Path, files: dict[str, str | Path], only_in_first: tuple[str, ...]) -> tuple[Path, Path]:
    """Folders a/ and b/ with the same ``files`` (text or a file to copy), less ``only_in_first`` in b/."""
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        folder.mkdir(parents=True)
        for name, content in files.items():
            if folder is b and name in only_in_first:
                continue
            if isinstance(content, Path):
                shutil.copy(content, folder / name)
            else:
                (folder / name).write_text(content)
    return a, b


@pytest.mark.parametrize("command,ranks", [("solve", 2), ("solve", 4), ("train-inverse", 2)])
def test_spec_missing_on_one_rank(tmp_path, command, ranks):
    spec = EXAMPLES / ("vdp-sweep.yaml" if command == "solve" else "vdp-fit.yaml")
    a, b = _two_folders(tmp_path, {"s.yaml": spec}, only_in_first=("s.yaml",))
    args = [command, "s.yaml", "-o", "out.h5", "-q"]
    p = _run([(ranks - 1, a, args), (1, b, args)])
    assert p.returncode == 2, p.stderr
    assert f"[rank {ranks - 1}] error: s.yaml: file not found" in p.stderr
    assert not (a / "out.h5").exists()


def test_pde_spec_and_observed_file_missing_on_one_rank(tmp_path):
    obs = tmp_path / "obs.h5"
    with h5py.File(obs, "w") as f:
        f["data/observed"] = np.random.default_rng(0).normal(size=(1, 4, 40))
    # the spec on rank 1 only; then the observed file on rank 0 only (the rank that prints)
    a, b = _two_folders(tmp_path / "spec", {"s.yaml": PDE_SPEC, "obs.h5": obs}, only_in_first=("s.yaml",))
    args = ["train-inverse", "s.yaml", "-o", "out.h5", "-q"]
    p = _run([(1, b, args), (1, a, args)])
    assert p.returncode == 2, p.stderr
    assert "[rank 0] error: s.yaml: file not found" in p.stderr
    a, b = _two_folders(tmp_path / "obs", {"s.yaml": PDE_SPEC, "obs.h5": obs}, only_in_first=("obs.h5",))
    p = _run([(1, b, args), (1, a, args)])
    assert p.returncode == 2, p.stderr
    assert "[rank 0] error:" in p.stderr and "obs.h5" in p.stderr
    assert _serial(b, args).returncode == 2  # the same cause, the same code on one rank


def test_input_error_on_one_rank_of_an_ode_fit(tmp_path, ranks=2):
    """The last sample's true mu (1e7) does not solve in 2000 steps: only the last rank sees it."""
    text = (EXAMPLES / "vdp-fit.yaml").read_text()
    text = text.replace(", 3.0]", ", 1.0e+7]").replace("adjoint: direct}", "adjoint: direct, max_steps: 2000}")
    (tmp_path / "s.yaml").write_text(text)
    args = ["train-inverse", "s.yaml", "-o", "out.h5", "-q"]
    one = _serial(tmp_path, args)
    assert one.returncode == 2 and "sample 63" in one.stderr, one.stderr
    p = _run([(ranks, tmp_path, args)])
    assert p.returncode == 2, p.stderr
    assert f"[rank {ranks - 1}] error: s.yaml: inverse.data.truth:" in p.stderr and "sample 63" in p.stderr


def test_output_appearing_during_a_two_rank_ode_fit(tmp_path):
    """The user's right-hand side creates the output file while the fit runs: rank 0 keeps the
    result beside it and reports that; rank 1 must not wait for it in a barrier."""
    (tmp_path / "rhs_decay.py").write_text(
        "import os\n\ndef decay(t, y, p):\n"
        "    if not os.path.exists('out.h5'):\n        open('out.h5', 'w').close()\n"
        "    return -p['k'][:, None] * y\n")
    (tmp_path / "s.yaml").write_text("""\
kind: ode
system: {states: [x], params: {k: 1.0}, python: rhs_decay.py:decay}
initial: {x: 1.0}
batch: 4
time: {start: 0.0, end: 1.0, eval: 5}
solver: {method: dopri5, rtol: 1.0e-6, atol: 1.0e-8, dtype: float64, adjoint: direct}
inverse:
  unknowns: {params: {k: {per_sample: true, init: 1.5, bounds: [0.1, 5.0]}}}
  data: {truth: {params: {k: [0.5, 1.0, 1.5, 2.0]}}}
  observed: [x]
  optimizer: {type: adam, iterations: 2}
""")
    p = _run([(2, tmp_path, ["train-inverse", "s.yaml", "-o", "out.h5", "-q"])])
    assert p.returncode == 2, p.stderr
    assert "appeared while this run was writing" in p.stderr
    assert (tmp_path / "out-1.h5").exists()


def test_sigterm_to_one_rank_during_start_up(tmp_path):
    shutil.copy(EXAMPLES / "vdp-fit.yaml", tmp_path / "s.yaml")
    proc, cmd = _start([(2, tmp_path, ["train-inverse", "s.yaml", "-o", "out.h5", "-q"])])
    pid = _rank_pid(proc.pid, 1)
    _catches_sigterm(pid)
    os.kill(pid, signal.SIGTERM)
    p = _finish(proc, cmd)
    assert p.returncode == 143, p.stderr
    assert "stopped by SIGTERM" in p.stderr
    assert not (tmp_path / "out.h5").exists()


def test_sigterm_to_a_rank_waiting_inside_mpi(tmp_path):
    """Rank 1 starts MPI, then dawdles: rank 0 waits inside a blocking MPI call, where Python's
    signal handler cannot run; the watchdog aborts the job with 143."""
    shutil.copy(EXAMPLES / "vdp-sweep.yaml", tmp_path / "s.yaml")
    args = ["solve", "s.yaml", "-o", "out.h5", "-q"]
    slow = ("import sys, time; from mpi4py import MPI; time.sleep(30); sys.argv[0] = 'odecli'; "
            "from odecli.cli import run; run()")
    cmd = _command([(1, tmp_path, args)]) + [":", "-n", "1", "-wdir", str(tmp_path), sys.executable, "-c", slow,
                                             *args]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    pid = _rank_pid(proc.pid, 0)
    time.sleep(4)  # rank 0 is past its imports, waiting for rank 1
    began = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    p = _finish(proc, cmd)
    assert p.returncode == 143, p.stderr
    assert "[rank 0] stopped by SIGTERM" in p.stderr
    assert time.monotonic() - began < 20  # not when rank 1 wakes up
