"""Several elastic adjoint steps in one pass over the rows (``elastic_adjoint_run``, driven by
:mod:`odecli.pde.elastic.adjoint_pass`): the gradient bit for bit that of one
``elastic_adjoint_step`` per step (``adjoint_pass.STEPS = 0``, the path before the passes), for
pass lengths 1, 3 and 5 (segments of 13 and 12 steps: passes that do not divide them), on one
and two kernel threads (the pass's steps pipelined over the threads), in float64 and float32,
with point forces (their buoyancy gradient is summed inside the pass) and pressure sources,
several shots with two sources each and receivers of every component (their residuals are
added inside the pass), some on the rows next to where the threads' steps meet; with the five
derivative planes stored (``FusedLoop.compact_stores = False``: the compact stores' gradient
differs by round-off, tests/test_elastic_stores.py)."""

from __future__ import annotations

import pytest
import torch
from elastic_setup import build, elastic_setup

from odecli.parallel.comm import get_comm
from odecli.pde.elastic import adjoint_pass
from odecli.pde.elastic.fused import FusedLoop
from odecli.pde.sources import ricker

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def problem(source_type: str, dtype):
    ny, nx, nt = 40, 30, 25
    y, x = torch.meshgrid(torch.arange(float(ny), dtype=dtype),
                          torch.arange(float(nx), dtype=dtype), indexing="ij")
    model = torch.stack([2200 + 10 * y, 1100 + 5 * y + 3 * x, 1900 + 4 * x])
    shots = [[(19, 10, 1.0), (21, 20, -0.5)], [(12, 15, 1.0), (12, 15, 0.7)],
             [(13, 5, 1.0), (33, 25, 0.3)]]
    recs = [(14, 4), (19, 17), (21, 29), (25, 8), (2, 27), (37, 3)]
    setup = elastic_setup(get_comm(), (ny, nx), (10.0, 10.0), 0.001, nt, shots, recs,
                          ricker(25.0, nt, 0.001), source_type=source_type,
                          components=["vy", "vx", "pressure", "vy", "pressure", "vx"], width=6,
                          segments=2, dtype=dtype)
    prop = build(setup)
    if not prop.fused:
        pytest.skip("no C compiler: the fused kernels do not run here")
    # the first segment recomputed, the last one's stores kept (the default budget would keep
    # both here; test_elastic_stores compares the two)
    prop.store_budget = 0
    # observed traces of another model, so that every receiver has a residual
    with torch.no_grad():
        scale = torch.tensor([1.02, 0.97, 1.01], dtype=dtype)[:, None, None]
        observed = prop.forward(model * scale)
    return prop, model, observed


def gradient(prop, model, observed):
    """The gradient of the squared residuals, scaled so that float32's stays clear of 0."""
    m = model.clone().requires_grad_(True)
    (((prop.forward(m) - observed) * 1e15) ** 2).sum().backward()
    return m.grad


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("source_type", ["fy", "fx", "pressure"])
def test_the_pass_gives_the_per_step_adjoints_gradient_bit_for_bit(monkeypatch, dtype,
                                                                   source_type):
    import odecli.pde.elastic.propagator as elastic_propagator

    monkeypatch.setattr(elastic_propagator, "MIN_POINTS_PER_THREAD", 1)
    # the five derivative planes (compact stores: tests/test_elastic_stores.py)
    monkeypatch.setattr(FusedLoop, "compact_stores", False)
    prop, model, observed = problem(source_type, dtype)
    assert [b - a for a, b in prop.segments] == [13, 12]
    monkeypatch.setattr(adjoint_pass, "STEPS", 0)
    prop.threads = 1
    reference = gradient(prop, model, observed)
    assert torch.isfinite(reference).all() and float((reference != 0).double().mean()) > 0.9
    lengths = []
    steps = adjoint_pass.AdjointPass.steps
    monkeypatch.setattr(adjoint_pass.AdjointPass, "steps",
                        lambda self, hi, n, *rest: (lengths.append(n),
                                                    steps(self, hi, n, *rest)))
    for per_pass in (1, 3, 5):
        monkeypatch.setattr(adjoint_pass, "STEPS", per_pass)
        for threads in (1, 2):
            prop.threads = threads
            lengths.clear()
            got = gradient(prop, model, observed)
            # the passes ran (not the per-step path), shorter ones at the segments' starts
            expect = [per_pass] * (13 // per_pass) + [13 % per_pass] * (13 % per_pass > 0)
            expect += [per_pass] * (12 // per_pass) + [12 % per_pass] * (12 % per_pass > 0)
            assert sorted(lengths) == sorted(expect), (per_pass, lengths)
            assert torch.equal(got, reference), (per_pass, threads,
                                                 float((got - reference).abs().max()))


def test_the_check_can_fail(monkeypatch):
    """Receivers' residuals added one step late (the pass's step j + 1 given step j's) change
    the gradient: the bit-for-bit comparison above would see it."""
    monkeypatch.setattr(FusedLoop, "compact_stores", False)
    prop, model, observed = problem("fy", torch.float64)
    monkeypatch.setattr(adjoint_pass, "STEPS", 0)
    reference = gradient(prop, model, observed)
    monkeypatch.setattr(adjoint_pass, "STEPS", 3)
    steps = adjoint_pass.AdjointPass.steps

    def late(self, hi, n, t0, gtr, *rest):
        shifted = None if gtr is None else torch.roll(gtr, 1, dims=-1)
        return steps(self, hi, n, t0, shifted, *rest)

    monkeypatch.setattr(adjoint_pass.AdjointPass, "steps", late)
    assert not torch.equal(gradient(prop, model, observed), reference)
