"""Damaged and foreign run files: ``stats``, ``plot`` and ``export`` say in one line what is wrong.

The run files are real ones, written by ``solve`` and ``train-inverse`` from tiny specs; pieces are
then deleted with h5py, as another program or a damaged copy would leave them. Every command must
answer with exit 2 and one ``error:`` line naming the file and the missing piece, never an internal
error, and must leave no output behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from odecli.cli import app
from test_plot import VDP

runner = CliRunner()

# a two-sample decay fit of one shared rate: a real ode-inverse run in about a second
FIT = """\
kind: ode
name: decay-fit
system:
  states: [u]
  params: {k: 0.5}
  equations: {u: "-k * u"}
initial: {u: [1.0, 2.0]}
batch: 2
time: {start: 0.0, end: 1.0, eval: 5}
solver: {rtol: 1.0e-8, atol: 1.0e-8, dtype: float64, device: cpu}
inverse:
  unknowns:
    params:
      k: {per_sample: false, init: 0.5, bounds: [0.0, 3.0]}
  data:
    truth: {params: {k: 1.3}}
  observed: [u]
  optimizer: {type: lbfgs, iterations: 2}
  checkpoint: {every: 1}
"""

# a 12 x 12 plate, one source, three thermometers, two iterations: a real pde-inverse run
HEAT = """\
kind: pde-inverse
name: heat-tiny
equation: heat2d
grid: {shape: [12, 12], spacing: 0.01}
time: {dt: 0.01, steps: 20}
boundary: {type: dirichlet, value: 0.0}
initial_condition: 0.0
sources:
  wavelet: {type: constant, value: 1.0}
  amplitude: 50.0
  positions: [[0.05, 0.05]]
receivers:
  line: [{from: [0.02, 0.02], to: [0.02, 0.09], count: 3}]
true_model: {type: gaussian, background: 0.0002, amplitude: 0.0004, center: [0.05, 0.05], sigma: 0.03}
observed: {noise: 0.0, seed: 1}
unknown:
  type: grid
  initial: {type: constant, value: 0.0002}
  bounds: [0.00005, 0.002]
optimizer: {type: adam, learning_rate: 0.00001, iterations: 2}
"""

KINDS = ("ode", "ode-inverse", "pde-inverse")
COMMANDS = ("stats", "stats --json", "plot", "export")
REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One small real run file of each kind, written by the commands themselves."""
    folder = tmp_path_factory.mktemp("runs")
    made = {}
    for kind, command, text, code in (("ode", "solve", VDP, 3), ("ode-inverse", "train-inverse", FIT, 0),
                                      ("pde-inverse", "train-inverse", HEAT, 0)):
        spec, out = folder / f"{kind}.yaml", folder / f"{kind}.h5"
        spec.write_text(text)
        result = runner.invoke(app, [command, str(spec), "-o", str(out), "--quiet"])
        assert result.exit_code == code, result.output
        with h5py.File(out) as h5:
            assert h5.attrs["kind"] == kind
        made[kind] = out
    return made


def args_for(command: str, run: Path, out: Path) -> list[str]:
    """The command line of ``command`` ('stats', 'stats --json', ...) on ``run``, writing (if at all) under ``out``."""
    if command.startswith("stats"):
        return ["stats", str(run), *command.split()[1:]]
    if command == "plot":
        return ["plot", str(run), "-o", str(out / "fig.png")]
    return ["export", str(run), "--csv", str(out / "csv")]


def damaged(run: Path, folder: Path, *pieces: str) -> Path:
    """A copy of ``run`` without ``pieces``: datasets or groups by path, root attributes as '@name'."""
    copy = folder / "damaged.h5"
    shutil.copy(run, copy)
    with h5py.File(copy, "a") as h5:
        for piece in pieces:
            if piece.startswith("@"):
                del h5.attrs[piece[1:]]
            else:
                del h5[piece]
    return copy


def assert_one_line_error(result, *fragments: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "internal error" not in lines[0] and "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def nothing_written(folder: Path) -> bool:
    """No picture, no CSV folder and no temporary left by a refused command."""
    return not (folder / "fig.png").exists() and not (folder / "csv").exists() and not list(folder.glob(".*"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", COMMANDS)
def test_intact_runs_of_every_kind_work(runs, tmp_path, kind, command):
    """The requirements ask for nothing the writers leave out."""
    result = runner.invoke(app, args_for(command, runs[kind], tmp_path))
    assert result.exit_code == 0, result.output


def test_export_of_a_real_fit_writes_its_fitted_parameters(runs, tmp_path):
    """train-inverse stores the fit in group 'fit'; export looked only for 'params' and wrote no params.csv."""
    result = runner.invoke(app, ["export", str(runs["ode-inverse"]), "--csv", str(tmp_path)])
    assert result.exit_code == 0 and "params.csv" in result.output, result.output
    with h5py.File(runs["ode-inverse"]) as h5:
        k = h5["fit/k"][...]
    lines = (tmp_path / "params.csv").read_text().splitlines()
    assert lines[0] == "name,index,value" and lines[1:] == [f"k,0,{float(k[0])!r}"]
    assert k.shape == (1,) and abs(k[0] - 0.5) > 1e-3  # the fit moved from its initial guess


@pytest.mark.parametrize("kind, missing", [
    ("ode", {"stats": "'status', 'stats'; missing attributes 'method'", "plot": "'t', 'y'", "export": "'t', 'y', 'status'"}),
    ("ode-inverse", {"stats": "'history', 'status', 'fit', 'stats'", "plot": "'history', 't', 'y'",
                     "export": "'history'"}),
    ("pde-inverse", {"stats": "'history'", "plot": "'history'", "export": "'history'"}),
])
@pytest.mark.parametrize("command", ("stats", "plot", "export"))
def test_a_file_with_only_a_kind_is_reported_incomplete(tmp_path, kind, missing, command):
    """The reviewer's case: attrs['kind'] = 'ode' and no datasets gave 'internal error: KeyError'."""
    run = tmp_path / "foreign.h5"
    with h5py.File(run, "w") as h5:
        h5.attrs["kind"] = kind
    result = runner.invoke(app, args_for(command, run, tmp_path))
    assert_one_line_error(result, f"{run}: not a complete odecli run file: missing {missing[command]}",
                          "(written by another program, or damaged)")
    assert nothing_written(tmp_path)


@pytest.mark.parametrize("kind, pieces, command, message", [
    ("ode", ["stats"], "stats", "missing 'stats'"),  # the reviewer's second case
    ("ode", ["stats/n_rejected"], "stats", "missing 'stats/n_rejected'"),
    ("ode", ["@method", "@rtol"], "stats", "missing attributes 'method', 'rtol'"),
    ("ode", ["status"], "stats", "missing 'status'"),
    ("ode", ["status"], "export", "missing 'status'"),
    ("ode", ["y"], "plot", "missing 'y'"),
    ("ode", ["t"], "export", "missing 't'"),
    ("ode-inverse", ["fit"], "stats", "missing 'fit'"),
    ("ode-inverse", ["status", "stats"], "stats", "missing 'status', 'stats'"),
    ("ode-inverse", ["history/grad_norm"], "stats", "missing 'history/grad_norm'"),
    ("ode-inverse", ["history/loss"], "plot", "missing 'history/loss'"),
    ("ode-inverse", ["y"], "plot", "missing 'y'"),
    ("ode-inverse", ["history"], "export", "missing 'history'"),
    ("pde-inverse", ["history/wall_time_s"], "stats", "missing 'history/wall_time_s'"),
    ("pde-inverse", ["timing/comm_s"], "stats", "missing 'timing/comm_s'"),
    ("pde-inverse", ["history/loss"], "plot", "missing 'history/loss'"),
    ("pde-inverse", ["history"], "export", "missing 'history'"),
])
def test_a_missing_piece_is_named(runs, tmp_path, kind, pieces, command, message):
    run = damaged(runs[kind], tmp_path, *pieces)
    result = runner.invoke(app, args_for(command, run, tmp_path))
    assert_one_line_error(result, f"{run}: not a complete odecli run file: {message} (written by")
    assert nothing_written(tmp_path)


def test_pieces_a_command_does_not_need_may_be_missing(runs, tmp_path):
    """plot and export of an ODE run without its counters still work: they are shown when present."""
    run = damaged(runs["ode"], tmp_path, "stats", "@method")
    assert runner.invoke(app, ["plot", str(run), "-o", str(tmp_path / "fig.png")]).exit_code == 0
    assert runner.invoke(app, ["export", str(run), "--csv", str(tmp_path / "csv")]).exit_code == 0
    assert (tmp_path / "csv" / "samples.csv").read_text().startswith("sample,status,status_name,t_final,")


def test_a_dataset_where_a_group_belongs_is_named(runs, tmp_path):
    run = damaged(runs["ode"], tmp_path, "stats")
    with h5py.File(run, "a") as h5:
        h5["stats"] = np.zeros(3)
    result = runner.invoke(app, ["stats", str(run)])
    assert_one_line_error(result, f"{run}: not a complete odecli run file: 'stats' is not a group")


@pytest.mark.parametrize("kind", KINDS)
def test_any_piece_deleted_gives_a_result_or_one_line(runs, tmp_path, kind):
    """Every dataset, group and root attribute deleted in turn: stats and export never crash."""
    with h5py.File(runs[kind]) as h5:
        pieces: list[str] = []
        h5.visit(pieces.append)
        pieces += [f"@{name}" for name in h5.attrs if name != "kind"]
    for piece in pieces:
        run = damaged(runs[kind], tmp_path, piece)
        for command in ("stats", "export"):
            result = runner.invoke(app, args_for(command, run, tmp_path))
            if result.exit_code != 0:
                assert_one_line_error(result, f"{run}: not a complete odecli run file")
            shutil.rmtree(tmp_path / "csv", ignore_errors=True)


# ---------------------------------------------------------------- wrong shapes and dtypes


def replaced(run: Path, folder: Path, path: str, damage: Callable[[np.ndarray], Any]) -> Path:
    """A copy of ``run`` whose dataset ``path`` holds ``damage(its values)``, as another writer might leave it."""
    with h5py.File(run) as h5:
        values = h5[path][...]
    copy = damaged(run, folder, path)
    with h5py.File(copy, "a") as h5:
        h5[path] = damage(values)
    return copy


def text(values: np.ndarray) -> np.ndarray:
    return np.full(values.shape, b"1.5")


def scalar(values: np.ndarray) -> np.ndarray:
    return values.reshape(-1)[0]


def empty(values: np.ndarray) -> np.ndarray:
    return values[:0]


def one_fewer(values: np.ndarray) -> np.ndarray:
    """One entry fewer along the last axis."""
    return values[..., :-1]


def one_more(values: np.ndarray) -> np.ndarray:
    """One entry more along the first axis."""
    return np.concatenate([values, values[:1]])


def first_column(values: np.ndarray) -> np.ndarray:
    """The last axis dropped."""
    return values[..., 0]


def extra_axis(values: np.ndarray) -> np.ndarray:
    return values[..., None]


STATS = ("stats", "stats --json")
NUMBERS = "(strings), expected integers or floats"
TRAJECTORY = "expected (sample, time, state) or (time, state) or (time,) with"
TRACES = "expected (shot, receiver, step) or (shot, step, receiver) with"
# kind, damaged dataset, damage, the commands that read it, the message (up to where it depends on the command)
RESHAPED = [
    # ode: 3 samples, 21 output times, 2 states
    ("ode", "status", text, COMMANDS, f"dataset 'status' has dtype |S3 {NUMBERS}"),
    ("ode", "status", scalar, COMMANDS, "dataset 'status' has shape (), expected (sample,)"),
    ("ode", "stats/n_steps", one_fewer, (*STATS, "export"),
     "dataset 'stats/n_steps' has shape (2,), expected (sample,) with sample = 3 (from 'status')"),
    ("ode", "stats/n_rejected", text, (*STATS, "export"), f"dataset 'stats/n_rejected' has dtype |S3 {NUMBERS}"),
    ("ode", "t", one_fewer, ("plot", "export"),
     f"dataset 'y' has shape (3, 21, 2), {TRAJECTORY} sample = 3 (from 'status'), time = 20 (from 't')"),
    ("ode", "t", text, ("plot", "export"), f"dataset 't' has dtype |S3 {NUMBERS}"),
    ("ode", "y", first_column, ("plot", "export"),
     f"dataset 'y' has shape (3, 21), {TRAJECTORY} sample = 3 (from 'status'), time = 21 (from 't')"),
    ("ode", "y", one_more, ("plot", "export"),
     f"dataset 'y' has shape (4, 21, 2), {TRAJECTORY} sample = 3 (from 'status'), time = 21 (from 't')"),
    ("ode", "y", scalar, ("plot", "export"),
     f"dataset 'y' has shape (), {TRAJECTORY} sample = 3 (from 'status'), time = 21 (from 't')"),
    ("ode", "t_final", one_fewer, ("export",),
     "dataset 't_final' has shape (2,), expected (sample,) with sample = 3 (from 'status')"),
    ("ode", "y_final", first_column, ("export",),
     "dataset 'y_final' has shape (3,), expected (sample, state) with sample = 3 (from 'status'), "
     "state = 2 (from 'y')"),
    ("ode", "params/mu", text, ("plot", "export"), f"dataset 'params/mu' has dtype |S3 {NUMBERS}"),
    ("ode", "params/mu", one_fewer, ("plot", "export"),
     "dataset 'params/mu' has shape (2,), expected (sample,) with sample = 3 (from 'status')"),
    # ode-inverse: 2 samples, 5 output times, 1 state, 3 history entries, one shared unknown k
    ("ode-inverse", "status", text, (*STATS, "plot"), f"dataset 'status' has dtype |S3 {NUMBERS}"),
    ("ode-inverse", "stats/n_steps", one_more, STATS,
     "dataset 'stats/n_steps' has shape (3,), expected (sample,) with sample = 2 (from 'status')"),
    ("ode-inverse", "t", text, ("plot", "export"), f"dataset 't' has dtype |S3 {NUMBERS}"),
    ("ode-inverse", "y", extra_axis, ("plot", "export"),
     f"dataset 'y' has shape (2, 5, 1, 1), {TRAJECTORY} sample = 2"),
    ("ode-inverse", "history/loss", empty, COMMANDS,
     "dataset 'history/loss' has shape (0,), expected (iteration,) with iteration >= 1"),
    ("ode-inverse", "history/loss", extra_axis, COMMANDS,
     "dataset 'history/loss' has shape (3, 1), expected (iteration,) with iteration >= 1"),
    ("ode-inverse", "history/grad_norm", one_fewer, (*STATS, "export"),
     "dataset 'history/grad_norm' has shape (2,), expected (iteration,) with iteration = 3 (from 'history/loss')"),
    ("ode-inverse", "history/n_evals", text, (*STATS, "export"), f"dataset 'history/n_evals' has dtype |S3 {NUMBERS}"),
    ("ode-inverse", "fit/k", empty, (*STATS, "export"),
     "dataset 'fit/k' has shape (0,), expected (unknown k,) with unknown k >= 1"),
    ("ode-inverse", "truth/k", one_more, STATS,
     "dataset 'truth/k' has shape (2,), expected (unknown k,) with unknown k = 1 (from 'fit/k')"),
    # pde-inverse: 2 iterations, 1 rank, a 12 x 12 grid, 1 shot, 3 receivers, 20 time steps
    ("pde-inverse", "history/loss", text, COMMANDS, f"dataset 'history/loss' has dtype |S3 {NUMBERS}"),
    ("pde-inverse", "history/wall_time_s", scalar, (*STATS, "export"),
     "dataset 'history/wall_time_s' has shape (), expected (iteration,) with iteration = 2 (from 'history/loss')"),
    ("pde-inverse", "history/model_error", one_fewer, (*STATS, "export"),
     "dataset 'history/model_error' has shape (1,), expected (iteration,) with iteration = 2 (from 'history/loss')"),
    ("pde-inverse", "timing/comm_s", one_more, STATS,
     "dataset 'timing/comm_s' has shape (2,), expected (rank,) with rank = 1 (from 'timing/total_s')"),
    ("pde-inverse", "fields/true", one_fewer, ("plot", "export"),
     "dataset 'fields/true' has shape (12, 11), expected (y, x) with y = 12, x = 12 (from 'fields/final')"),
    ("pde-inverse", "fields/initial", extra_axis, ("plot", "export"),
     "dataset 'fields/initial' has shape (12, 12, 1), expected (y, x) with y = 12, x = 12 (from 'fields/final')"),
    ("pde-inverse", "data/observed", text, ("plot", "export"), f"dataset 'data/observed' has dtype |S3 {NUMBERS}"),
    ("pde-inverse", "data/predicted", one_fewer, ("plot", "export"),
     f"dataset 'data/predicted' has shape (1, 3, 19), {TRACES} shot = 1, receiver = 3 (from 'data/observed'), "
     "step = 20 (from 'data/time')"),
    ("pde-inverse", "data/time", one_fewer, ("plot", "export"),
     f"dataset 'data/observed' has shape (1, 3, 20), {TRACES} step = 19 (from 'data/time')"),
    ("pde-inverse", "geometry/receivers", extra_axis, ("plot",),
     "dataset 'geometry/receivers' has shape (3, 2, 1), expected (receiver, 2) "
     "with receiver = 3 (from 'data/observed')"),
    ("pde-inverse", "geometry/sources", text, ("plot",), f"dataset 'geometry/sources' has dtype |S3 {NUMBERS}"),
]


@pytest.mark.parametrize("kind, path, damage, command, message", [
    pytest.param(kind, path, damage, command, message, id=f"{kind}-{path}-{damage.__name__}-{command}")
    for kind, path, damage, commands, message in RESHAPED for command in commands
])
def test_a_wrong_shape_or_dtype_is_named_with_what_was_expected(runs, tmp_path, kind, path, damage, command, message):
    """A dataset another writer left with the wrong axes, sizes or type gave 'internal error' from numpy."""
    run = replaced(runs[kind], tmp_path, path, damage)
    result = runner.invoke(app, args_for(command, run, tmp_path))
    assert_one_line_error(result, f"error: {run}: {message}")
    assert nothing_written(tmp_path)


def with_attribute(run: Path, folder: Path, name: str, value: Any) -> Path:
    """A copy of ``run`` whose root attribute ``name`` is ``value``."""
    copy = damaged(run, folder)
    with h5py.File(copy, "a") as h5:
        h5.attrs[name] = value
    return copy


TEXT = "|O (strings), expected integers or floats"
DECOMPOSITION = ("attribute 'decomposition' is not a JSON object as text with a list of rank counts as 'proc_grid', "
                 """expected e.g. '{"proc_grid": [1, 1]}'""")
# kind, attribute, value, the commands that read it as a number, the message
REATTRIBUTED = [
    ("ode", "rtol", "tight", STATS, f"attribute 'rtol' has dtype {TEXT}"),
    ("ode", "wall_time_s", np.ones(2), STATS, "attribute 'wall_time_s' has shape (2,), expected a scalar"),
    ("ode-inverse", "iterations", "two", STATS, f"attribute 'iterations' has dtype {TEXT}"),
    ("ode-inverse", "noise", np.zeros(2), STATS, "attribute 'noise' has shape (2,), expected a scalar"),
    ("pde-inverse", "ranks", "one", STATS, f"attribute 'ranks' has dtype {TEXT}"),
    ("pde-inverse", "model_error_final", np.ones(2), STATS,
     "attribute 'model_error_final' has shape (2,), expected a scalar"),
    ("pde-inverse", "grid_spacing", "1 cm", ("plot",), f"attribute 'grid_spacing' has dtype {TEXT}"),
    ("pde-inverse", "grid_spacing", np.ones(3), ("plot",), "attribute 'grid_spacing' has shape (3,), expected (2,)"),
    ("pde-inverse", "decomposition", "1 x 1", STATS, DECOMPOSITION),
    ("pde-inverse", "decomposition", '{"proc_grid": 2}', STATS, DECOMPOSITION),
    ("pde-inverse", "decomposition", '{"proc_grid": ["a", null]}', STATS, DECOMPOSITION),
]


@pytest.mark.parametrize("kind, name, value, command, message", [
    pytest.param(kind, name, value, command, message, id=f"{kind}-{name}-{type(value).__name__}-{command}")
    for kind, name, value, commands, message in REATTRIBUTED for command in commands
])
def test_a_numeric_attribute_of_the_wrong_type_or_shape_is_named(runs, tmp_path, kind, name, value, command, message):
    """rtol or ranks as text, or an array of them, gave 'internal error' from float() or int()."""
    run = with_attribute(runs[kind], tmp_path, name, value)
    result = runner.invoke(app, args_for(command, run, tmp_path))
    assert_one_line_error(result, f"error: {run}: {message}")
    assert nothing_written(tmp_path)


@pytest.mark.parametrize("command", ("stats", "stats --json", "plot"))
def test_datasets_a_command_does_not_read_may_be_damaged(runs, tmp_path, command):
    """stats reads four of the counters in 'stats' and plot none: another one of any type does not stop them."""
    run = replaced(runs["ode"], tmp_path, "stats/dt0", text)
    assert runner.invoke(app, args_for(command, run, tmp_path)).exit_code == 0


@pytest.mark.parametrize("kind, path, node, command", [
    ("ode", "params", "dataset", "plot"),  # read, when present, for the legend
    ("ode", "params/mu", "group", "export"),
    ("pde-inverse", "fields/final", "group", "stats"),  # stats reports the shapes of these two
    ("pde-inverse", "data/observed", "group", "stats --json"),
])
def test_a_group_and_a_dataset_swapped_are_named(runs, tmp_path, kind, path, node, command):
    """Optional pieces too: a group where stats read a dataset's shape gave 'internal error: AttributeError'."""
    run = damaged(runs[kind], tmp_path, path)
    with h5py.File(run, "a") as h5:
        if node == "dataset":
            h5[path] = np.zeros(3)
        else:
            h5.create_group(path)["x"] = np.zeros(3)
    result = runner.invoke(app, args_for(command, run, tmp_path))
    wanted = "group" if node == "dataset" else "dataset"
    assert_one_line_error(result, f"{run}: not a complete odecli run file: {path!r} is not a {wanted}")
    assert nothing_written(tmp_path)


@pytest.mark.parametrize("kind, unwritten", [
    ("ode", {"ranks/busy_s", "ranks/idle_s", "ranks/samples", "ranks/chunk_start", "ranks/chunk_stop",
             "ranks/chunk_rank"}),  # a distributed solve's
    ("ode-inverse", {"params/"}),  # other programs' name for fit/
    ("pde-inverse", set()),
])
def test_real_runs_match_every_entry_of_their_layout(runs, kind, unwritten):
    """What the writers write is what the readers check for (so neither can drift from the other)."""
    from odecli.io.layout import layout_of, require

    entries = [path.removesuffix("*") for path in layout_of(kind).arrays]
    with h5py.File(runs[kind]) as h5:
        require(h5, optional=entries)
        assert {entry for entry in entries if entry.rstrip("/") not in h5 and entry[1:] not in h5.attrs} == unwritten


@pytest.mark.parametrize("kind", KINDS)
def test_any_dataset_retyped_or_reshaped_gives_a_result_or_one_line(runs, tmp_path, kind):
    """Every dataset in turn as text, a scalar and with an extra axis: stats and export never crash."""
    with h5py.File(runs[kind]) as h5:
        paths: list[str] = []
        h5.visititems(lambda name, node: paths.append(name) if isinstance(node, h5py.Dataset) else None)
    for path in paths:
        for damage in (text, scalar, extra_axis):
            run = replaced(runs[kind], tmp_path, path, damage)
            for command in ("stats", "export"):
                result = runner.invoke(app, args_for(command, run, tmp_path))
                if result.exit_code != 0:
                    assert_one_line_error(result, f"error: {run}: ")
                shutil.rmtree(tmp_path / "csv", ignore_errors=True)


@pytest.mark.parametrize("command", ("stats", "plot", "export"))
def test_an_unknown_kind_is_named_with_the_known_ones(tmp_path, command):
    run = tmp_path / "other.h5"
    with h5py.File(run, "w") as h5:
        h5.attrs["kind"] = "pde-forward"
    result = runner.invoke(app, args_for(command, run, tmp_path))
    assert_one_line_error(result, f"{run}: not an odecli run file: unknown kind 'pde-forward' "
                                  "(expected one of ode, ode-inverse, pde-inverse)")
    assert nothing_written(tmp_path)


def test_a_kind_stored_as_fixed_length_bytes_is_read(runs, tmp_path):
    """Other HDF5 writers (and h5py given np.bytes_) store strings as bytes; the kind is still 'ode'."""
    run = damaged(runs["ode"], tmp_path)
    with h5py.File(run, "a") as h5:
        h5.attrs["kind"] = np.bytes_(b"ode")
    result = runner.invoke(app, ["stats", str(run), "--json"])
    assert result.exit_code == 0 and '"kind": "ode"' in result.output, result.output


@pytest.mark.parametrize("command", ("stats", "plot", "export"))
def test_a_folder_is_named_as_such(tmp_path, monkeypatch, command):
    """``odecli stats .`` said 'file not found'."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs.h5").mkdir()
    for folder in (".", "runs.h5"):
        result = runner.invoke(app, args_for(command, Path(folder), Path("out")))
        assert_one_line_error(result, f"error: {folder}: is a folder, expected an odecli run file")
    assert not Path("out").exists()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Real checkpoints: train-inverse in a fresh process, killed right after its first checkpoint."""
    folder = tmp_path_factory.mktemp("checkpoints")
    made = {}
    for kind, text, variable in (("ode-inverse", FIT, "ODECLI_ODE_EXIT_AFTER_CHECKPOINT"),
                                 ("pde-inverse", HEAT + "checkpoint: {every: 1}\n", "ODECLI_PDE_EXIT_AFTER_CHECKPOINT")):
        spec, out = folder / f"{kind}.yaml", folder / f"{kind}.h5"
        spec.write_text(text)
        env = {**os.environ, variable: "1", "PYTHONPATH": str(REPO_ROOT)}
        proc = subprocess.run([sys.executable, "-m", "odecli", "train-inverse", str(spec), "-o", str(out), "--quiet"],
                              capture_output=True, text=True, timeout=300, env=env, cwd=REPO_ROOT)
        assert proc.returncode == 75 and not out.exists(), proc.stderr  # the simulated kill
        made[kind] = folder / f"{kind}.ckpt.h5"
        with h5py.File(made[kind]) as h5:
            assert h5.attrs["kind"] == f"{kind}-checkpoint"
    return made


@pytest.mark.parametrize("kind", ("ode-inverse", "pde-inverse"))
@pytest.mark.parametrize("command", ("stats", "plot", "export"))
def test_a_checkpoint_says_how_to_resume_it(checkpoints, tmp_path, kind, command):
    """A checkpoint said 'unknown run kind'; it is to be resumed, and the message says how."""
    result = runner.invoke(app, args_for(command, checkpoints[kind], tmp_path))
    output = checkpoints[kind].with_name(f"{kind}.h5")
    assert_one_line_error(result, f"{checkpoints[kind]}: is a checkpoint of an unfinished train-inverse "
                                  f"(kind '{kind}-checkpoint'), not a run file",
                          f"odecli train-inverse SPEC -o {output} --resume")
    assert nothing_written(tmp_path)
