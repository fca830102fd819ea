"""Input that used to end in an internal error (issue 42) is one line and exit 2: deep or badly
tagged YAML, integers no float holds, pipes and devices where a file belongs, bad data files,
output names too long, dangling output links, a log pointed at an HDF5 file, damaged run files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from odecli.cli import app

runner = CliRunner()
REPO_ROOT = Path(__file__).resolve().parents[1]
PDE = """\
kind: pde-inverse
equation: acoustic2d
grid: {shape: [24, 24], spacing: 10.0}
time: {dt: 0.0015, steps: 40}
boundary: {absorbing_width: 4}
sources:
  wavelet: WAVELET
  positions: [[60, 60]]
receivers:
  line: {from: [200, 20], to: [200, 200], count: 4}
OBSERVED
unknown: {type: grid, initial: 2000, bounds: [1500, 2600]}
optimizer: {type: adam, learning_rate: 20, iterations: 1}
"""


def pde_spec(folder: Path, wavelet: str = "{type: ricker, peak_frequency: 25}",
             observed: str = "true_model: {type: constant, value: 2000}") -> Path:
    spec = folder / "pde.yaml"
    spec.write_text(PDE.replace("WAVELET", wavelet).replace("OBSERVED", observed))
    return spec


def one_line(result, *fragments: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.mark.parametrize("text,fragment", [
    ("kind: ode\nx: " + "[" * 1000 + "]" * 1000, "nested too deeply"),
    ("kind: ode\nx: " + "{a: " * 200 + "1" + "}" * 200, "nested more than 64 levels"),
    ("kind: ode\nbatch: !!int 1.5\n", "tagged value"),
    ("kind: ode\nbatch: !!float abc\n", "tagged value"),
    ("kind: ode\nbatch: !!timestamp 2001-99-99\n", "tagged value"),
    ("kind: ode\nbatch: 1" + "0" * 400 + "\n", "batch: integer of 401 digits is too large"),
])
def test_strange_yaml_is_one_line(tmp_path, text, fragment):
    spec = tmp_path / "s.yaml"
    spec.write_text(text)
    one_line(runner.invoke(app, ["validate", str(spec)]), "s.yaml", fragment)


def test_an_integer_beyond_floats_in_a_pde_list_is_named(tmp_path):
    spec = pde_spec(tmp_path)
    spec.write_text(spec.read_text().replace("[[60, 60]]", "[[60, 1" + "0" * 400 + "]]"))
    one_line(runner.invoke(app, ["validate", str(spec)]), "sources.positions[0][1]", "too large")


def test_a_fifo_as_the_spec_is_refused_not_read(tmp_path):
    fifo = tmp_path / "s.yaml"
    os.mkfifo(fifo)
    one_line(runner.invoke(app, ["validate", str(fifo)]), "not a regular file")


@pytest.mark.parametrize("make,fragment", [
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: os.symlink("/dev/zero", p), "not a regular file"),
    (lambda p: np.save(p, np.ones((3, 4))), "one row of samples"),
    (lambda p: np.save(p, np.zeros(0)), "no samples"),
    (lambda p: np.save(p, np.array(["a", "b"])), "expected real numbers"),
    (lambda p: np.save(p, np.array([1.0, np.nan])), "NaN"),
])
def test_bad_wavelet_files_are_refused(tmp_path, make, fragment):
    make(tmp_path / "w.npy")
    spec = pde_spec(tmp_path, wavelet="{type: file, path: w.npy}")
    one_line(runner.invoke(app, ["train-inverse", str(spec), "-o", str(tmp_path / "o.h5"), "-q"]),
             "sources.wavelet.path", fragment)
    assert not (tmp_path / "o.h5").exists()


@pytest.mark.parametrize("store,fragment", [
    (lambda f: f.create_dataset("data/observed", data=np.array([b"a", b"b"])), "expected real numbers"),
    (lambda f: f.create_group("data/observed"), "is a group"),
    (lambda f: f.__setitem__("data/observed", h5py.SoftLink("/nowhere")), "which does not exist"),
    (lambda f: f.__setitem__("data/observed", h5py.ExternalLink("x.h5", "/y")), "link into another file"),
])
def test_bad_observed_files_are_refused(tmp_path, store, fragment):
    with h5py.File(tmp_path / "obs.h5", "w") as f:
        store(f)
    spec = pde_spec(tmp_path, observed="observed: {file: obs.h5, dataset: data/observed}")
    one_line(runner.invoke(app, ["train-inverse", str(spec), "-o", str(tmp_path / "o.h5"), "-q"]),
             "observed.file", fragment)


def test_a_fifo_as_a_model_file_is_refused(tmp_path):
    os.mkfifo(tmp_path / "m.npy")
    spec = pde_spec(tmp_path, observed="true_model: {type: file, path: m.npy}")
    one_line(runner.invoke(app, ["train-inverse", str(spec), "-o", str(tmp_path / "o.h5"), "-q"]),
             "true_model.path", "not a regular file")


@pytest.fixture
def sweep(tmp_path) -> Path:
    spec = tmp_path / "s.yaml"
    shutil.copy(REPO_ROOT / "examples" / "vdp-sweep.yaml", spec)
    return spec


def test_an_output_name_too_long_is_refused_before_solving(sweep, tmp_path):
    for command in ("solve", "train-inverse"):
        spec = sweep if command == "solve" else pde_spec(tmp_path)
        one_line(runner.invoke(app, [command, str(spec), "-o", str(tmp_path / ("a" * 300 + ".h5"))]),
                 "output file name is 303 bytes long")


def test_a_dangling_output_link_is_refused_even_with_force(sweep, tmp_path):
    link = tmp_path / "out.h5"
    link.symlink_to(tmp_path / "missing" / "target.h5")
    for force in ([], ["--force"]):
        one_line(runner.invoke(app, ["solve", str(sweep), "-o", str(link), *force]), "symbolic link", "does not exist")
    assert not (tmp_path / "missing").exists()


def test_log_on_an_hdf5_file_is_refused(sweep, tmp_path):
    run = tmp_path / "run.h5"
    with h5py.File(run, "w") as f:
        f.attrs["kind"] = "ode"
    before = run.read_bytes()
    one_line(runner.invoke(app, ["solve", str(sweep), "-o", str(tmp_path / "o.h5"), "--log", str(run)]), "--log")
    assert run.read_bytes() == before


# ---------------------------------------------------------------- damaged run files

from test_damaged_runs import runs  # noqa: E402,F401 - the module's real runs of every kind


def _copy(runs, kind: str, folder: Path, damage) -> Path:
    copy = folder / "damaged.h5"
    shutil.copy(runs[kind], copy)
    with h5py.File(copy, "a") as h5:
        damage(h5)
    return copy


def _relink(path: str, link):
    def damage(h5):
        del h5[path]
        h5[path] = link
    return damage


@pytest.mark.parametrize("kind,damage,fragment", [
    ("ode", _relink("t", h5py.SoftLink("/nowhere")), "t: is a soft link"),
    ("pde-inverse", _relink("fields/final", h5py.ExternalLink("x.h5", "/y")), "fields/final: is a link into another file"),
    ("ode-inverse", lambda h5: h5.attrs.__setitem__("kind", "pde-inverse"), ""),
    ("pde-inverse", lambda h5: h5.attrs.__setitem__("model_error_final", np.nan), None),
    ("ode", lambda h5: h5.attrs.__setitem__("states", np.array([b"\xff\xfe", b"\xc3"], dtype=h5py.string_dtype("ascii"))),
     "not UTF-8"),
])
@pytest.mark.parametrize("command", ["stats", "plot", "export"])
def test_damaged_runs_give_a_result_or_one_line(runs, tmp_path, kind, damage, fragment, command):  # noqa: F811
    run = _copy(runs, kind, tmp_path, damage)
    args = {"stats": ["stats", str(run), "--json"], "plot": ["plot", str(run), "-o", str(tmp_path / "f.png")],
            "export": ["export", str(run), "--csv", str(tmp_path / "csv")]}[command]
    result = runner.invoke(app, args)
    assert "internal error" not in result.output and "Traceback" not in result.output, result.output
    if fragment and "link" in fragment:  # refused when the file is opened, whatever the command
        one_line(result, fragment)
    elif result.exit_code != 0:
        one_line(result, fragment or "")


def test_more_threads_than_cores_is_refused_by_validate(tmp_path):
    spec = pde_spec(tmp_path)
    spec.write_text(spec.read_text() + f"compute: {{threads: {(os.cpu_count() or 1) * 1000}}}\n")
    one_line(runner.invoke(app, ["validate", str(spec)]), "compute.threads", "CPU cores")
    spec.write_text(spec.read_text().replace("compute:", "#") + f"compute: {{threads: {os.cpu_count() or 1}}}\n")
    assert runner.invoke(app, ["validate", str(spec)]).exit_code == 0


@pytest.mark.parametrize("after,code", [(0, "sys.exit(0)"), (3, "sys.exit(0)"), (3, "raise SystemExit(4)")])
def test_system_exit_in_a_python_rhs_is_a_user_error(tmp_path, after, code):
    shutil.copy(REPO_ROOT / "examples" / "python-rhs.yaml", tmp_path / "s.yaml")
    (tmp_path / "rhs_pendulum.py").write_text(
        "import sys\nimport torch\ncalls = 0\n\ndef damped_pendulum(t, y, p):\n    global calls\n    calls += 1\n"
        f"    if calls > {after}:\n        {code}\n"
        "    return torch.stack([y[:, 1], -p['damping'] * y[:, 1] - p['g_over_l'] * torch.sin(y[:, 0])], dim=1)\n")
    result = runner.invoke(app, ["solve", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "o.h5")])
    one_line(result, "system.python", "damped_pendulum raised SystemExit")
    assert not (tmp_path / "o.h5").exists()
