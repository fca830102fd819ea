"""A disk that fills while odecli writes (issue 42): one line naming the file, exit 2, no
temporary left beside it, and any earlier checkpoint intact -- for a PDE fit's checkpoint and for
a solve's run file.

The full disk is a file-size limit (``RLIMIT_FSIZE``, with SIGXFSZ ignored): HDF5's writes then
fail inside the library with EFBIG exactly where a full disk fails them with ENOSPC, without the
root rights a small tmpfs would need. Before the fix the PDE fit printed dozens of "Exception
ignored" tracebacks and died of SIGSEGV with a ``.ckpt.h5.*.tmp`` left behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

resource = pytest.importorskip("resource")

HEAT = """\
kind: pde-inverse
equation: heat2d
grid: {shape: [90, 90], spacing: 0.01}
time: {dt: 0.01, steps: 400}
boundary: {type: dirichlet, value: 0.0}
sources: {wavelet: {type: constant, value: 1.0}, amplitude: 50.0, positions: [[0.2, 0.2]]}
receivers: {line: {from: [0.22, 0.05], to: [0.22, 0.85], count: 40}}
true_model: {type: constant, value: 0.0002}
unknown: {type: grid, initial: {type: constant, value: 0.00025}, bounds: [0.00005, 0.002]}
optimizer: {type: adam, iterations: 4}
checkpoint: {every: 1}
"""

ODE = """\
kind: ode
system: {states: [x, v], params: {k: 1.0}, equations: {x: v, v: -k * x}}
initial: {x: 1.0, v: 0.0}
batch: 400
time: {start: 0.0, end: 1.0, eval: 50}
solver: {engine: torch}
"""

LIMIT = 350_000  # bytes: over the 90 x 90 fit's checkpoints (~260 kB), under its output (~450 kB: traces)
SMALL = 150_000  # under the checkpoints too, and under the 400 x 50 solve's run file (~480 kB)


# MPI's start-up makes shared-memory files larger than the limit: start it first, then limit.
LIMITED_CLI = """\
import resource, signal, sys
from odecli.parallel.comm import get_comm
get_comm()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
limit = int(sys.argv.pop(1))
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
from odecli.cli import run
run()
"""


def _run(args: list[str], cwd: Path, limit: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-c", LIMITED_CLI, str(limit), *args, "-q"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-3000:])
    return lines[0]


def _temporaries(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_a_pde_fit_whose_output_meets_a_full_disk_keeps_its_checkpoint(tmp_path):
    (tmp_path / "heat.yaml").write_text(HEAT)
    line = _one_line(_run(["train-inverse", "heat.yaml", "-o", "fit.h5"], tmp_path, LIMIT))
    assert line == "error: fit.h5: cannot write output file: File too large"
    assert _temporaries(tmp_path) == [] and not (tmp_path / "fit.h5").exists()
    # the checkpoints written before (each under the limit) are whole: the fit resumes from the last
    resumed = _run(["train-inverse", "heat.yaml", "-o", "fit.h5", "--resume"], tmp_path, 100 * LIMIT)
    assert resumed.returncode == 0 and (tmp_path / "fit.h5").exists(), resumed.stderr[-2000:]


def test_a_pde_checkpoint_that_meets_a_full_disk(tmp_path):
    (tmp_path / "heat.yaml").write_text(HEAT)
    line = _one_line(_run(["train-inverse", "heat.yaml", "-o", "fit.h5"], tmp_path, SMALL))
    assert line == "error: fit.ckpt.h5: cannot write output file: File too large"
    assert _temporaries(tmp_path) == [] and not (tmp_path / "fit.h5").exists()


def test_a_solve_whose_run_file_meets_a_full_disk(tmp_path):
    (tmp_path / "osc.yaml").write_text(ODE)
    line = _one_line(_run(["solve", "osc.yaml", "-o", "run.h5"], tmp_path, SMALL))
    assert "run.h5: cannot write output file: File too large" in line
    assert _temporaries(tmp_path) == [] and not (tmp_path / "run.h5").exists()
    ok = _run(["solve", "osc.yaml", "-o", "run.h5"], tmp_path, 10 * LIMIT)
    assert ok.returncode == 0, ok.stderr[-2000:]


def test_a_solve_is_refused_before_computing_when_its_output_cannot_fit(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from typer.testing import CliRunner

    from odecli.cli import app
    from odecli.io import atomic

    monkeypatch.setattr(atomic.os, "statvfs", lambda folder: SimpleNamespace(f_bavail=10, f_frsize=4096))
    monkeypatch.setattr("odecli.app.solve.solve_spec_arrays",
                        lambda *a, **k: pytest.fail("solved although the output could not be written"))
    (tmp_path / "osc.yaml").write_text(ODE)
    result = CliRunner().invoke(app, ["solve", str(tmp_path / "osc.yaml"), "-o", str(tmp_path / "run.h5"), "-q"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "the output needs about 0.458 MiB, but only 0.0391 MiB are free" in lines[0]
    assert lines[0].endswith("No space left on device")
