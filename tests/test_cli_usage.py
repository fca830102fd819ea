"""Usage mistakes (a bad flag value, an unknown option or command, a missing argument) get the same
one-line ``error:`` form and exit code 2 as every other input error, and help shows no typer
placeholders (``<bool>`` on flags, ``{spec}`` for arguments)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from odecli.cli import app

runner = CliRunner()
EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "vdp-sweep.yaml")


@pytest.mark.parametrize("args, names", [
    (["solve", EXAMPLE, "--atol", "abc"], "--atol"),
    (["solve", EXAMPLE, "--bogus"], "--bogus"),
    (["solv", EXAMPLE], "solv"),
    (["stats"], "RUN"),
    (["plot", "run.h5", "--shot", "x"], "--shot"),
])
def test_usage_errors_are_one_line_with_exit_code_2(args, names):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and names in lines[0] and "--help" in lines[0]
    assert "╭" not in result.output  # no boxed panel


@pytest.mark.parametrize("command", ["solve", "stats", "train-inverse", "plot", "export", "init", "validate"])
def test_help_shows_no_typer_placeholders(command):
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "<bool>" not in result.output
    assert "{" not in result.output.splitlines()[0]  # the usage line: `odecli solve [OPTIONS] SPEC`


def test_more_ranks_than_cpus_get_a_note(monkeypatch):
    from odecli.app.commands import oversubscription_note
    from odecli.threads import available_cpus

    monkeypatch.setenv("MPI_LOCALNRANKS", str(available_cpus() + 2))
    note = oversubscription_note()
    assert note is not None and f"{available_cpus() + 2} MPI ranks share {available_cpus()} CPUs" in note
    monkeypatch.setenv("MPI_LOCALNRANKS", "1")
    assert oversubscription_note() is None


def test_piped_output_lines_are_not_wrapped(tmp_path, capfd):
    """Issue 43: a PDE fit's lines wrapped at 80 columns when piped ('model error 0.03061 -> ⏎0.005554')."""
    import os
    import subprocess
    import sys

    spec = Path(__file__).resolve().parents[1] / "examples" / "heat-conductivity.yaml"
    env = {**os.environ, "COLUMNS": "40"}  # even a narrow terminal setting must not fold a piped line
    run = subprocess.run([sys.executable, "-m", "odecli", "train-inverse", str(spec), "-o", str(tmp_path / "fit.h5"),
                          "--iterations", "1"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = (run.stdout + run.stderr).splitlines()
    wrote = [line for line in lines if line.startswith("wrote ")]
    assert len(wrote) == 1 and "model error" in wrote[0] and wrote[0].rstrip().endswith(")"), lines
    assert any(len(line) > 40 for line in lines)
