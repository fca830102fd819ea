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
