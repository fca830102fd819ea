"""Default output names, one rule for every spec kind.

A spec's ``name`` defaults to its file's stem. A solve writes ``output`` (a ``kind: ode``
spec's key) or else ``<name>.h5``; a fit (``odecli train-inverse``, either kind) writes
``<name>-fit.h5``, so that fitting an ODE spec never overwrites its own solve. ``-o`` on the
command line overrides both.
"""

from __future__ import annotations

from pathlib import Path

from odecli.errors import OdecliError
from odecli.specs.loader import load_yaml


def default_output(name: str, *, fit: bool, output: str | None = None) -> str:
    """The output file of a run of the spec called ``name`` (``output``: the spec's own key, solves only)."""
    if fit:
        return f"{name}-fit.h5"
    return output if output is not None else f"{name}.h5"


def spec_name(path: str | Path, name: object = None) -> str:
    """The spec's ``name`` if it gives one, else its file's stem (as odecli.specs.pde reads it)."""
    return str(name) if name else Path(path).stem


def fit_output_of(path: str | Path) -> str:
    """``<name>-fit.h5`` for the spec file at ``path``, read before the run loads it; a file that
    does not load yet is named by its stem (the run then reports the problem)."""
    try:
        data, _ = load_yaml(path)
    except OdecliError:
        data = {}
    return default_output(spec_name(path, data.get("name")), fit=True)
