"""Single-rank PDE numerics and spec validation."""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from odecli.errors import SpecError
from odecli.parallel.comm import get_comm
from odecli.pde import models
from odecli.pde.grid import Block, Grid
from odecli.app.pde_problem import Problem
from odecli.pde.sources import ricker
from odecli.specs.pde import _largest, load_spec, validate

sys.path.insert(0, str(Path(__file__).parent / "mpi_scripts"))
from pde_equivalence import BASE, variants  # noqa: E402

sys.path.pop(0)


def _problem(raw: dict) -> Problem:
    spec = validate(copy.deepcopy(raw), "t.yaml")
    spec["text"] = ""
    return Problem(spec, get_comm())


def _directional_check(P: Problem, scale: float, h: float) -> tuple[float, float]:
    loss, grads = P.evaluate(0)
    gen = torch.Generator().manual_seed(1)
    dirs = [torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale for p in P.unknown.params]
    ad = sum(float((g * d).sum()) for g, d in zip(grads, dirs))
    x0 = [p.detach().clone() for p in P.unknown.params]

    def at(s):
        with torch.no_grad():
            for p, x, d in zip(P.unknown.params, x0, dirs):
                p.copy_(x + s * d)
        return P.evaluate(0)[0]

    fd = (at(h) - at(-h)) / (2 * h)
    return ad, fd


@pytest.mark.parametrize("name,scale,h", [("grid", 5.0, 1e-2), ("mlp", 0.1, 1e-3),
                                          ("scalars", 1.0, 1e-2), ("heat", 0.5, 1e-3)])
def test_gradient_matches_central_differences(name, scale, h):
    raw = variants()[name]
    raw["time"]["steps"] = min(raw["time"]["steps"], 60)
    raw["unknown"]["bounds"] = None if name != "scalars" else raw["unknown"]["bounds"]
    if name != "scalars":
        raw["unknown"].pop("bounds")
        raw["unknown"].pop("transform", None)
    ad, fd = _directional_check(_problem(raw), scale, h)
    assert ad == pytest.approx(fd, rel=1e-6), (ad, fd)


def test_time_segment_checkpointing_does_not_change_gradient():
    raw = copy.deepcopy(BASE)
    raw["compute"] = {"time_segments": 1}
    l1, g1 = _problem(raw).evaluate(0)
    raw["compute"] = {"time_segments": 9}
    l2, g2 = _problem(raw).evaluate(0)
    assert l1 == l2
    torch.testing.assert_close(g1[0], g2[0], rtol=1e-13, atol=0)


def test_ricker_peak():
    w = ricker(10.0, 400, 0.001, delay=0.15)
    assert int(np.argmax(w)) == 150 and w.max() == pytest.approx(1.0)
    assert abs(w[0]) < 1e-6


def test_cfl_violation_names_the_limit():
    raw = copy.deepcopy(BASE)
    raw["time"]["dt"] = 0.01
    with pytest.raises(SpecError) as e:
        _problem(raw)
    msg = str(e.value)
    assert "time.dt" in msg and "CFL" in msg and "\n" not in msg


def test_heat_stability_violation():
    raw = variants()["heat"]
    raw["time"]["dt"] = 50.0
    with pytest.raises(SpecError, match="stability limit"):
        _problem(raw)


def test_bounds_above_cfl_limit_rejected():
    raw = copy.deepcopy(BASE)
    raw["unknown"]["bounds"] = [1500, 9000]
    with pytest.raises(SpecError, match="unknown.bounds"):
        _problem(raw)


BAD = [
    ("kind: ode\n", "kind"),
    ("kind: pde-inverse\nequation: elastic\n", "equation"),
    ("kind: pde-inverse\nequation: acoustic2d\n", "grid: required"),
    ("kind: pde-inverse\nequation: acoustic2d\ngrid: {shape: [40, 40], spacng: 10}\n", "grid.spacng"),
    ("kind: pde-inverse\nequation: acoustic2d\ngrid: {shape: [40, 40], spacing: -1}\n", "grid.spacing"),
    ("kind: [\n", "invalid YAML"),
]


@pytest.mark.parametrize("text,needle", BAD)
def test_bad_spec_one_line_errors(tmp_path, text, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(SpecError) as e:
        load_spec(p)
    msg = str(e.value)
    assert msg.startswith(str(p)) and needle in msg and "\n" not in msg
    assert e.value.exit_code == 2


@pytest.mark.parametrize("mutate,field", [
    (lambda r: r["receivers"].update(positions=[[9999, 10]]), "receivers"),
    (lambda r: r["unknown"].update(bounds=[3000, 1000]), "unknown.bounds"),
    (lambda r: r["optimizer"].update(type="sgd"), "optimizer.type"),
    (lambda r: r["true_model"].update(type="blob"), "true_model.type"),
    (lambda r: r["boundary"].update(absorbing_width=30), "boundary.absorbing_width"),
    (lambda r: r["unknown"].update(type="grid", initial=None), "unknown.initial"),
    (lambda r: r.update(parallel={"exchange_every": "often"}), "parallel.exchange_every"),
    (lambda r: r.update(parallel={"exchange_every": 0}), "parallel.exchange_every"),
])
def test_bad_fields_named(mutate, field):
    raw = copy.deepcopy(BASE)
    mutate(raw)
    with pytest.raises(SpecError) as e:
        validate(raw, "s.yaml")
    assert f"s.yaml: {field}" in str(e.value)


def test_examples_validate():
    from odecli.pde.propagator import EQUATIONS

    root = Path(__file__).resolve().parents[1]
    seen = set()
    for p in list((root / "examples").glob("*.yaml")) + list((root / "problems").glob("*.yaml")):
        text = p.read_text()
        if "pde-inverse" in text:
            spec = load_spec(p)
            assert spec["equation"] in EQUATIONS
            seen.add(spec["equation"])
    assert seen == set(EQUATIONS), "every equation has a bundled example"


def test_sponge_absorbs():
    """With the sponge, energy left in the grid after the wave leaves is small."""
    raw = copy.deepcopy(BASE)
    raw["time"]["steps"] = 400
    raw["boundary"]["absorbing_width"] = 12
    P = _problem(raw)
    with torch.no_grad():
        _, u_abs = P.prop.forward(P.true_local, return_field=True)
    raw["boundary"]["absorbing_width"] = 0
    P0 = _problem(raw)
    with torch.no_grad():
        _, u_rig = P0.prop.forward(P0.true_local, return_field=True)
    assert float(u_abs.abs().max()) < 0.1 * float(u_rig.abs().max())
    assert math.isfinite(float(u_abs.abs().max()))


# Normalised model specs (as odecli.specs.pde writes them) on a 30x26 grid of 10 m nodes.
MODEL_PEAKS = [
    {"type": "constant", "value": 2100.0},
    {"type": "layered", "interfaces": [100.0, 105.0, 400.0], "values": [2000.0, 9000.0, 2100.0, 8000.0]},
    {"type": "gaussian", "background": 2000.0, "amplitude": 200.0, "center": [153.0, 127.0],
     "sigma": [40.0, 25.0]},
    {"type": "gaussian", "background": 2000.0, "amplitude": 200.0, "center": [-80.0, 900.0],
     "sigma": [40.0, 40.0]},
    {"type": "gaussian", "background": 2100.0, "amplitude": -300.0, "center": [150.0, 125.0],
     "sigma": [60.0, 90.0]},
    {"type": "checkerboard", "background": 2000.0, "amplitude": -100.0, "size": [50.0, 70.0]},
    {"type": "checkerboard", "background": 2000.0, "amplitude": 100.0, "size": [1000.0, 30.0]},
    {"type": "checkerboard", "background": 2000.0, "amplitude": -100.0, "size": [1000.0, 1000.0]},
]


@pytest.mark.parametrize("model", MODEL_PEAKS, ids=lambda m: m["type"])
def test_validate_sees_the_largest_value_the_run_evaluates(model):
    """validate judges dt by this value without torch; it must be what the run's field reaches
    (not a bound), or validate would refuse time steps the run accepts."""
    grid = Grid(30, 26, 10.0, 10.0)
    field = models.evaluate(model, grid, Block.whole(grid))
    nodes = ([iy * grid.dy for iy in range(grid.ny)], [ix * grid.dx for ix in range(grid.nx)])
    assert _largest(model, nodes) == pytest.approx(float(field.max()), rel=1e-15, abs=0)


@pytest.mark.parametrize("side, expected", [(40, 2), (200, 7), (256, 8), (300, 8), (479, 8),
                                            (480, 16), (1000, 16), (4000, 16)])
def test_auto_exchange_every_takes_whole_passes_above_one(side, expected):
    """One more step per 32 cells of the smallest block; above one 8-step pass only whole
    passes (9 steps ran slower than 8 at 256^2 per rank), and 16 for blocks of 480 or more
    (3-5 % faster than 8 at 2000^2 on 2 ranks)."""
    from types import SimpleNamespace

    from odecli.pde.acoustic.build import auto_exchange_every

    two_ranks = SimpleNamespace(nranks=2, min_local_shape=(side, 2 * side))
    assert auto_exchange_every(two_ranks) == expected
    assert auto_exchange_every(SimpleNamespace(nranks=1, min_local_shape=(side, side))) == 1
