"""The elastic adjoint in scaled variables (``elastic_adjoint_scaled.c``: u = b lambda_v and
tau = C lambda_s stepped by the forward's rows with -dt, the CPML layers' part as a
correction, the gradients summed scaled and turned back once a backward) against the unscaled
adjoint (``adjoint_pass.SCALED = False``), which tests/test_elastic.py checks against autograd:
float64 to 1e-12 relative per parameter, float32 to 2e-6 (measured: 2e-15 and 8e-7); point
forces ``fy`` and ``fx`` and pressure sources, three shots with two sources each, receivers of
every component, two time segments (the adjoints scaled and unscaled where the segments meet),
one and two kernel threads, the default passes (two steps a thread) and passes of three steps
(the steps pipelined SCALED_LAG rows apart).  Also against autograd through the reference
(1e-12), the dot-product test, and float32 against float64 at a point force.  A fluid (vs = 0)
or a stiffness too ill-conditioned to divide by takes the unscaled adjoint.  The check can
fail: receivers' residuals added unscaled are seen."""

from __future__ import annotations

import pytest
import torch
from elastic_setup import build, dot_product_sides, elastic_setup, record_inits
from test_elastic_adjoint_run import gradient, problem

from odecli.parallel.comm import get_comm
from odecli.pde.elastic import adjoint_pass
from odecli.pde.sources import ricker

TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-6}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def relative(got: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest per-parameter (vp, vs, rho) error relative to that parameter's largest."""
    return max(float((g - r).abs().max() / r.abs().max()) for g, r in zip(got, ref))


def scaled_runs(monkeypatch) -> list[bool]:
    """Record whether each adjoint pass driver ran the scaled kernel."""
    return record_inits(monkeypatch, adjoint_pass.AdjointPass, lambda run: run.scaled)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("source_type", ["fy", "fx", "pressure"])
def test_the_scaled_adjoint_gives_the_unscaled_gradient(monkeypatch, dtype, source_type):
    import odecli.pde.elastic.propagator as elastic_propagator

    monkeypatch.setattr(elastic_propagator, "MIN_POINTS_PER_THREAD", 1)
    prop, model, observed = problem(source_type, dtype)
    assert len(prop.segments) == 2
    seen = scaled_runs(monkeypatch)
    for threads in (1, 2):
        for steps in (None, 3):
            prop.threads = threads
            monkeypatch.setattr(adjoint_pass, "STEPS", steps)
            monkeypatch.setattr(adjoint_pass, "SCALED", False)
            seen.clear()
            reference = gradient(prop, model, observed)
            assert seen == [False, False]
            monkeypatch.setattr(adjoint_pass, "SCALED", True)
            seen.clear()
            got = gradient(prop, model, observed)
            assert seen == [True, True]
            assert torch.isfinite(reference).all()
            assert float((reference != 0).double().mean()) > 0.8
            assert relative(got, reference) < TOLERANCE[dtype], (threads, steps,
                                                                 relative(got, reference))


def test_the_scaled_adjoint_gives_autograds_gradient(monkeypatch):
    """Against autograd through the PyTorch reference steps (``prop.fused = False``), float64,
    point forces, two segments: 1e-12 relative per parameter."""
    prop, model, observed = problem("fx", torch.float64)
    seen = scaled_runs(monkeypatch)
    got = gradient(prop, model, observed)
    assert seen == [True, True]
    prop.fused = False
    reference = gradient(prop, model, observed)
    assert relative(got, reference) < 1e-12, relative(got, reference)


def test_the_scaled_adjoint_passes_the_dot_product_test(monkeypatch):
    """<F x, y> = <x, F^T y> for the map F from a segment's starting velocities and stresses to
    its traces and final fields (no sources: linear), F^T the scaled adjoint (so the adjoints'
    scaling at the segment's end and unscaling at its start are in the test), CPML on every
    side, every receiver component."""
    seen = []
    sides = dot_product_sides(False, lambda: seen.append(scaled_runs(monkeypatch)))
    if sides is None:
        pytest.skip("no C compiler: the fused kernels do not run here")
    assert seen == [[True]]
    forward, backward = sides
    assert abs(forward - backward) <= 1e-12 * abs(forward), (forward, backward)


def test_float32_keeps_the_unscaled_accuracy_at_a_point_force(monkeypatch):
    """float32 against float64, 140^2, 300 steps, a vertical force: the scaled gradient within
    2e-6 of the float64 one per parameter, as the unscaled (5e-7).  Where the force's own term
    of the buoyancy gradient was summed apart from the velocity change's (two large sums of
    opposite sign, added at the end), rho's was 1e-5 off at the source point."""
    n, nt, pml = 140, 300, 20
    y, x = torch.meshgrid(torch.arange(float(n), dtype=torch.float64),
                          torch.arange(float(n), dtype=torch.float64), indexing="ij")
    model = torch.stack([2000 + 4 * y, (2000 + 4 * y) / 1.8 - 150 * torch.exp(
        -((y - 84) ** 2 + (x - 56) ** 2) / 196), 1800 + 3 * y])
    recs = [(40, 20 + 5 * k) for k in range(20)]
    grads = {}
    for dtype in (torch.float64, torch.float32):
        setup = elastic_setup(get_comm(), (n, n), (5.0, 5.0), 0.0005, nt, [[(70, 70, 1.0)]],
                              recs, ricker(15.0, nt, 0.0005), width=pml, segments=4,
                              dtype=dtype, pml_speed=2600.0)
        prop = build(setup)
        if not prop.fused:
            pytest.skip("no C compiler: the fused kernels do not run here")
        m = model.to(dtype).clone().requires_grad_(True)
        ((prop.forward(m).double() * 1e10) ** 2).sum().backward()
        grads[dtype] = m.grad.double()
    assert relative(grads[torch.float32], grads[torch.float64]) < 2e-6


def test_a_fluid_takes_the_unscaled_adjoint(monkeypatch):
    """vs = 0 in a patch: the stiffness cannot be divided by, so the unscaled adjoint runs
    (bit for bit the gradient with the scaled one switched off)."""
    prop, model, observed = problem("pressure", torch.float64)
    model = model.clone()
    model[1, 20:30, 10:20] = 0.0
    seen = scaled_runs(monkeypatch)
    got = gradient(prop, model, observed)
    assert seen == [False, False]
    monkeypatch.setattr(adjoint_pass, "SCALED", False)
    assert torch.equal(got, gradient(prop, model, observed))


def test_scaled_ok_takes_positive_definite_well_conditioned_stiffness():
    rho = torch.full((4, 4), 2000.0, dtype=torch.float64)

    def staggered(vp: float, vs: float):
        mu = rho * vs**2
        return rho * vp**2, rho * (vp**2 - 2 * vs**2), mu

    assert adjoint_pass.scaled_ok(*staggered(2000.0, 1100.0))
    # the condition number (vp^2 - vs^2) / vs^2: 99 passes, 399 does not
    assert adjoint_pass.scaled_ok(*staggered(1000.0, 100.0))
    assert not adjoint_pass.scaled_ok(*staggered(1000.0, 50.0))
    lam2mu, lam, mu = staggered(2000.0, 1100.0)
    mu[1, 2] = 0.0
    assert not adjoint_pass.scaled_ok(lam2mu, lam, mu)
    assert not adjoint_pass.scaled_ok(*staggered(1000.0, 1000.0))  # vs = vp: singular


def test_the_check_can_fail(monkeypatch):
    """The receivers' residuals added to the scaled adjoints without their scale factors."""
    prop, model, observed = problem("fy", torch.float64)
    monkeypatch.setattr(adjoint_pass, "SCALED", False)
    reference = gradient(prop, model, observed)
    monkeypatch.setattr(adjoint_pass, "SCALED", True)
    table = adjoint_pass.AdjointPass._receiver_table

    def unscaled_table(self, plan):
        self.scaled = False
        table(self, plan)
        self.scaled = True

    monkeypatch.setattr(adjoint_pass.AdjointPass, "_receiver_table", unscaled_table)
    assert relative(gradient(prop, model, observed), reference) > 1e-3
