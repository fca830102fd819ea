"""Issue 42: a finished solve must not be lost to HDF5's 64 KiB object-header limit on attributes.

A spec of 4,200 states solved completely and then failed to write (``object header message is
too large``): its ``states`` attribute (4,200 variable-length strings) and its spec text outgrow
an object header. Files are now written in the 1.8 file format, which keeps such attributes in
dense storage (:data:`odecli.io.atomic.LIBVER`).
"""

from __future__ import annotations

import h5py
from typer.testing import CliRunner

from odecli.cli import app

N_STATES = 4200


def test_a_spec_of_thousands_of_states_writes_its_solve(tmp_path):
    (tmp_path / "rhs.py").write_text("def F(t, y, p):\n    return -y\n")
    names = [f"x{i}" for i in range(N_STATES)]
    (tmp_path / "big.yaml").write_text(
        "kind: ode\nsystem:\n  states: [" + ", ".join(names) + "]\n  python: rhs.py:F\n"
        "initial: {" + ", ".join(f"{n}: 1.0" for n in names) + "}\ntime: {start: 0, end: 1, eval: 3}\n")
    out = tmp_path / "big.h5"
    result = CliRunner().invoke(app, ["solve", str(tmp_path / "big.yaml"), "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    with h5py.File(out) as h5:
        assert list(h5.attrs["states"]) == names
        assert h5.attrs.get_id("states").get_storage_size() > 64 * 1024  # beyond an object header's limit
        assert h5["y"].shape == (1, 3, N_STATES)
    stats = CliRunner().invoke(app, ["stats", str(out)])
    assert stats.exit_code == 0, stats.output
