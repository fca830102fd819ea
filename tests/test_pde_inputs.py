"""Bad pde-inverse input through the command line: `compute.device`, physically impossible models
and a `fixed_border` that leaves nothing to invert are one line naming the file and the field,
exit 2, the same line from `odecli validate` (where the spec alone shows it) and `train-inverse`."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from odecli.cli import app

SMALL = {
    "kind": "pde-inverse",
    "equation": "acoustic2d",
    "grid": {"shape": [30, 26], "spacing": 10.0},
    "time": {"dt": 0.0015, "steps": 40},
    "boundary": {"absorbing_width": 5},
    "sources": {"wavelet": {"type": "ricker", "peak_frequency": 25}, "positions": [[60, 60]]},
    "receivers": {"line": {"from": [230, 20], "to": [230, 230], "count": 6}},
    "true_model": {"type": "gaussian", "background": 2000, "amplitude": 200,
                   "center": [150, 125], "sigma": 40},
    "unknown": {"type": "grid", "initial": 2000, "bounds": [1500, 2600]},
    "optimizer": {"type": "adam", "learning_rate": 20, "iterations": 1},
}
HEAT = {
    **copy.deepcopy(SMALL),
    "equation": "heat2d",
    "grid": {"shape": [20, 20], "spacing": 0.01},
    "time": {"dt": 0.01, "steps": 20},
    "boundary": {"type": "dirichlet"},
    "sources": {"wavelet": {"type": "constant"}, "amplitude": 50.0, "positions": [[0.1, 0.1]]},
    "receivers": {"positions": [[0.05, 0.05], [0.15, 0.15]]},
    "true_model": {"type": "constant", "value": 0.0002},
    "unknown": {"type": "grid", "initial": 0.0002, "bounds": [0.00005, 0.002]},
}


def _set(raw: dict, dotted: str, value) -> dict:
    raw = copy.deepcopy(raw)
    *path, last = dotted.split(".")
    node = raw
    for key in path:
        node = node.setdefault(key, {})
    node[last] = value
    return raw


def _errors(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("error: ")]


def _train(spec: Path, tmp_path: Path):
    return CliRunner().invoke(app, ["train-inverse", str(spec), "-o", str(tmp_path / "out.h5"), "-q"])


# Each: a change to SMALL (or HEAT) and the line both commands must print after "error: FILE: ".
SPEC_PROBLEMS = [
    (SMALL, "compute.device", "banana", "compute.device: must be one of cpu, cuda, auto or cuda:N; got 'banana'"),
    (SMALL, "compute.device", 5, "compute.device: must be one of cpu, cuda, auto or cuda:N; got 5"),
    (SMALL, "true_model", {"type": "constant", "value": -2000},
     "true_model.value: wave speed must be > 0, got -2000"),
    (SMALL, "true_model", {"type": "constant", "value": 0}, "true_model.value: wave speed must be > 0, got 0"),
    (SMALL, "true_model", {"type": "layered", "interfaces": [100], "values": [2000, -1]},
     "true_model.values[1]: wave speed must be > 0, got -1"),
    (SMALL, "true_model.amplitude", -2500,
     "true_model.amplitude: wave speed at the centre (background + amplitude) must be > 0, got -500"),
    (SMALL, "unknown.initial", -5, "unknown.initial: wave speed must be > 0, got -5"),
    (SMALL, "unknown.bounds", [-100, 2600], "unknown.bounds[0]: a wave speed bound must be >= 0, got -100"),
    (SMALL, "unknown.fixed_border", 13,
     "unknown.fixed_border: 13 cells leave no free cell to invert in a 30x26 grid; use at most 12"),
    (HEAT, "true_model.value", -0.0001, "true_model.value: conductivity must be >= 0, got -0.0001"),
]


@pytest.mark.parametrize("base,field,value,line", SPEC_PROBLEMS, ids=[c[3].split(":")[0] + f"={c[2]}"
                                                                       for c in SPEC_PROBLEMS])
def test_validate_and_train_inverse_report_the_same_line(tmp_path, base, field, value, line):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_set(base, field, value)))
    for result in (CliRunner().invoke(app, ["validate", str(spec)]), _train(spec, tmp_path)):
        assert result.exit_code == 2, result.output
        assert _errors(result) == [f"error: {spec}: {line}"], result.output
    assert not (tmp_path / "out.h5").exists()


@pytest.mark.parametrize("base,field,value", [
    (SMALL, "unknown.fixed_border", 12),          # the largest that leaves a free cell
    (SMALL, "unknown.bounds", [0, 2600]),         # a bound may touch zero
    (HEAT, "unknown.initial", 0.0),               # an insulator is a conductivity
])
def test_the_limits_themselves_are_valid(tmp_path, base, field, value):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_set(base, field, value)))
    result = CliRunner().invoke(app, ["validate", str(spec)])
    assert result.exit_code == 0 and "valid pde-inverse spec" in result.output, result.output


def test_a_gpu_the_machine_lacks_is_refused_by_validate(tmp_path):
    """Issue 43: a spec certain to fail must not validate (it used to, and failed at run time)."""
    import torch

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_set(SMALL, "compute.device", "cuda:0")))
    result = CliRunner().invoke(app, ["validate", str(spec)])
    if torch.cuda.is_available():
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == 2
        assert _errors(result) == [f"error: {spec}: compute.device: device 'cuda:0' requested but CUDA is not "
                                   f"available; use cpu or auto"], result.output


def test_device_auto_runs_on_what_there_is(tmp_path):
    """As in ODE specs: CUDA when present, else the CPU (it used to be a RuntimeError)."""
    import h5py
    import torch

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_set(SMALL, "compute.device", "auto")))
    result = _train(spec, tmp_path)
    assert result.exit_code == 0, result.output
    with h5py.File(tmp_path / "out.h5") as f:
        assert ("cuda" in f.attrs["engine"]) == torch.cuda.is_available()


def test_cuda_without_a_gpu_is_an_error_not_a_cpu_run(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    for device in ("cuda", "cuda:1"):
        spec = tmp_path / "spec.yaml"
        spec.write_text(yaml.safe_dump(_set(SMALL, "compute.device", device)))
        result = _train(spec, tmp_path)
        assert result.exit_code == 2, result.output
        assert _errors(result) == [f"error: {spec}: compute.device: device {device!r} requested but CUDA "
                                   "is not available; use cpu or auto"], result.output
        assert not (tmp_path / "out.h5").exists()


@pytest.mark.parametrize("field", ["true_model", "unknown.initial"])
def test_a_model_file_with_a_negative_speed_is_named(tmp_path, field):
    """Only the evaluated field shows it: the run checks it before the first simulation."""
    speeds = np.full((30, 26), 2000.0)
    speeds[3, 4] = -7.0
    np.save(tmp_path / "speeds.npy", speeds)
    spec = tmp_path / "spec.yaml"
    raw = _set(SMALL, field, {"type": "file", "path": "speeds.npy"})
    raw["unknown"].pop("bounds")  # clamping to bounds would lift the initial field's -7
    spec.write_text(yaml.safe_dump(raw))
    result = _train(spec, tmp_path)
    assert result.exit_code == 2, result.output
    assert _errors(result) == [f"error: {spec}: {field}: wave speed must be > 0 everywhere, got -7 "
                               "(the field's minimum)"], result.output


# ---------------------------------------------------------------- time step stability
# dt=0.003 on SMALL's 10 m grid allows c <= 2041.24; dt=0.01 on HEAT's 1 cm grid kappa <= 0.0025.
CFL = ("CFL limit c*dt*sqrt(1/dx^2+1/dy^2) <= 0.8660 (leapfrog, 4th-order space), "
       "i.e. c <= 2041.24 at dt=0.003")
EULER = ("stability limit kappa*dt*(1/dx^2+1/dy^2) <= 0.5 (explicit Euler), "
         "i.e. kappa <= 0.0025 at dt=0.01")
FAST = _set(_set(_set(SMALL, "time.dt", 0.003), "unknown.bounds", [1500, 2040]), "true_model", 2000)


def _without_bounds(raw: dict) -> dict:
    raw = copy.deepcopy(raw)
    raw["unknown"].pop("bounds")
    return raw


# Each: a change to FAST (or HEAT), the field the run names and the value it reports.
UNSTABLE = [
    (FAST, "true_model", 2100, "true_model", "2100"),
    (FAST, "true_model", {"type": "layered", "interfaces": [100], "values": [2000, 2100]},
     "true_model", "2100"),
    # the centre (150, 125) lies between nodes: the run sees 2000 + 200*exp(-0.5*(5/40)^2)
    (FAST, "true_model", SMALL["true_model"], "true_model", "2198.44"),
    (FAST, "true_model", {"type": "checkerboard", "background": 2000, "amplitude": -100,
                          "size": 50}, "true_model", "2100"),
    (_without_bounds(FAST), "unknown.initial", 2100, "unknown", "2100"),
    (FAST, "unknown.bounds", [1500, 2050], "unknown.bounds", "2050"),
    # sigmoid and softplus start from the initial field itself (up to rounding)
    (_set(_set(FAST, "unknown.initial", 2100), "unknown.bounds", [1500, 2600]), "unknown.transform",
     "sigmoid", "unknown", "2100"),
    (_set(_set(FAST, "unknown.initial", 2100), "unknown.bounds", [1500, 2600]), "unknown.transform",
     "softplus", "unknown", "2100"),
    # clamped into its bounds, the initial field reaches the upper bound, named before the bound
    (_set(FAST, "unknown.initial", 2100), "unknown.bounds", [1500, 2050], "unknown", "2050"),
    (FAST, "unknown", {"type": "scalars", "bounds": [1500, 2600], "transform": "clamp",
                       "model": {"type": "layered", "interfaces": [100], "values": [2000, 2100]}},
     "unknown", "2100"),
    (HEAT, "true_model.value", 0.003, "true_model", "0.003"),
    (_without_bounds(HEAT), "unknown.initial", {"type": "gaussian", "background": 0.0002, "amplitude": 0.0028,
                               "center": [0.1, 0.1], "sigma": 0.02}, "unknown", "0.003"),
    (HEAT, "unknown.bounds", [0.00005, 0.003], "unknown.bounds", "0.003"),
]


@pytest.mark.parametrize("base,field,value,named,reached", UNSTABLE,
                         ids=[f"{c[1]}={c[2]}" for c in UNSTABLE])
def test_an_unstable_time_step_is_reported_by_validate_as_the_run_reports_it(
        tmp_path, base, field, value, named, reached):
    """validate used to accept these; the run refused them only after loading the spec."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_set(base, field, value)))
    what, limit = ("wave speed", CFL) if base["equation"] == "acoustic2d" else ("conductivity", EULER)
    line = f"error: {spec}: time.dt: unstable: {named} reaches {what} {reached}; {limit}"
    for result in (CliRunner().invoke(app, ["validate", str(spec)]), _train(spec, tmp_path)):
        assert result.exit_code == 2, result.output
        assert _errors(result) == [line], result.output
    assert not (tmp_path / "out.h5").exists()


@pytest.mark.parametrize("base,field,value", [
    (FAST, "true_model", 2041),                          # just under the limit
    (FAST, "true_model", {**SMALL["true_model"], "center": [150, 1000]}),  # peak off the grid
    (FAST, "true_model", {"type": "layered", "interfaces": [1000], "values": [2000, 9000]}),
    (_set(FAST, "unknown.initial", 2100), "unknown.bounds", [1500, 2040]),  # clamped below
    (HEAT, "true_model.value", 0.0024),
])
def test_a_stable_time_step_still_validates(tmp_path, base, field, value):
    """Only what the run evaluates counts: a peak or layer no grid node reaches is no limit."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_set(base, field, value)))
    result = CliRunner().invoke(app, ["validate", str(spec)])
    assert result.exit_code == 0 and "valid pde-inverse spec" in result.output, result.output


# float32 runs hold the fields in float32: a value is judged as the run rounds it, not as written.
# At dt=0.0026 the limit is 2355.27859883 and 2355.2786 rounds down to 2355.27856 in float32;
# at dt=0.003 the limit is 2041.24145232 and 2041.2414 rounds up to 2041.24146.
F32 = _set(_set(SMALL, "compute.dtype", "float32"), "unknown.bounds", [1500, 2300])


def test_a_float32_field_that_rounds_under_the_limit_validates_and_runs(tmp_path):
    """validate refused it on the float64 value while the float32 run accepted it."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_set(_set(F32, "time.dt", 0.0026), "true_model", 2355.2786)))
    result = CliRunner().invoke(app, ["validate", str(spec)])
    assert result.exit_code == 0 and "valid pde-inverse spec" in result.output, result.output
    result = _train(spec, tmp_path)
    assert result.exit_code == 0, result.output


def test_a_float32_field_that_rounds_over_the_limit_is_refused_by_both(tmp_path):
    """validate accepted it on the float64 value while the float32 run refused it."""
    spec = tmp_path / "spec.yaml"
    raw = _set(_set(_set(F32, "time.dt", 0.003), "true_model", 2041.2414), "unknown.bounds", [1500, 2040])
    spec.write_text(yaml.safe_dump(raw))
    line = f"error: {spec}: time.dt: unstable: true_model reaches wave speed 2041.24; {CFL}"
    for result in (CliRunner().invoke(app, ["validate", str(spec)]), _train(spec, tmp_path)):
        assert result.exit_code == 2, result.output
        assert _errors(result) == [line], result.output


def test_a_float32_checkerboard_is_judged_by_the_signs_float32_gives_its_border_nodes(tmp_path):
    """The last node (y = 290 m) lies on a square's edge: sin(pi*290/290) is +1e-16 in float64 but
    -9e-8 in float32, so the float32 run sees background - amplitude = 2100 there. validate took
    the float64 signs, saw at most 2000 and accepted what the run then refused."""
    board = {"type": "checkerboard", "background": 2000, "amplitude": -100, "size": [290, 1000]}
    raw = _set(_set(_set(F32, "time.dt", 0.003), "true_model", board), "unknown.bounds", [1500, 2040])
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(raw))
    line = f"error: {spec}: time.dt: unstable: true_model reaches wave speed 2100; {CFL}"
    for result in (CliRunner().invoke(app, ["validate", str(spec)]), _train(spec, tmp_path)):
        assert result.exit_code == 2, result.output
        assert _errors(result) == [line], result.output
    spec.write_text(yaml.safe_dump(_set(raw, "compute.dtype", "float64")))  # float64: 2000 at most
    assert CliRunner().invoke(app, ["validate", str(spec)]).exit_code == 0
    assert _train(spec, tmp_path).exit_code == 0


def test_a_smoothed_model_is_judged_by_the_run_on_its_smoothed_field(tmp_path):
    """Smoothing lowers a narrow peak (here 2300 to about 2030, under the limit of 2041): the
    spec cannot tell by how much, so validate leaves it to the run, which accepts it."""
    peak = {"type": "gaussian", "background": 2000, "amplitude": 300, "center": [150, 120],
            "sigma": 10}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_set(FAST, "true_model", {"type": "smoothed", "of": peak,
                                                             "sigma": 3})))
    assert CliRunner().invoke(app, ["validate", str(spec)]).exit_code == 0
    result = _train(spec, tmp_path)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("field", ["compute.time_segments", "compute.device", "boundary.free_surface",
                                   "loss.normalize", "parallel.exchange_every", "optimizer.betas"])
def test_an_emptied_optional_value_is_its_default(tmp_path, field):
    """Commenting out a value (`time_segments:` left empty) gave 'required' or passed None on;
    every key with a default reads an empty value as left out."""
    from odecli.specs.pde import validate

    default = validate(copy.deepcopy(SMALL), "spec.yaml")
    emptied = validate(_set(SMALL, field, None), "spec.yaml")
    section, key = field.split(".")
    value = lambda spec: getattr(spec[section], key) if section == "optimizer" else spec[section][key]  # noqa: E731
    assert value(emptied) == value(default)


def test_an_emptied_marmousi_seed_is_seed_0_in_the_run(tmp_path):
    """validate let `seed:` left empty through and the model then ran int(None): 'internal error'."""
    import torch

    from odecli.pde import models
    from odecli.pde.grid import Block, Grid
    from odecli.specs.pde import validate

    fields = []
    for seed in ({}, {"seed": None}, {"seed": 0}):
        raw = _set(SMALL, "true_model", {"type": "marmousi", "vmin": 1500, "vmax": 2400, **seed})
        spec = validate(raw, "spec.yaml")
        grid = Grid(*spec["grid"]["shape"], *spec["grid"]["spacing"])
        fields.append(models.evaluate(spec["true_model"], grid, Block.whole(grid), torch.float64, torch.device("cpu")))
    assert torch.equal(fields[0], fields[1]) and torch.equal(fields[0], fields[2])
