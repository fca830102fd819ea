"""The gradient from compact stores (:class:`~odecli.pde.elastic.forward_pass.CompactStores`:
each step's velocities and the CPML layers' stress derivatives, from which the adjoint pass
derives the five derivative planes) against the five stored planes (``FusedLoop.compact_stores
= False``): float64 to 1e-12 relative per parameter, float32 to 2e-6 (the velocity sums come
from the velocities' change, ``(v_new - v_old - force) / (dt b)``, their buoyancy terms
summed before one division by b: round-off apart; measured on the benchmark's model at 80^2,
400 steps, only rho's gradient differs, 6e-16 relative in float64 and 5e-7 in float32); point forces ``fy`` and ``fx`` (their
part is taken out of the change) and pressure sources, one and two kernel threads, two time
segments (the last one's stores written by its first pass, the other's recomputed).  The
checks can fail: a wrong ``v_old`` (zeros for a segment's first step) is seen."""

from __future__ import annotations

import pytest
import torch
from elastic_setup import record_inits
from test_elastic_adjoint_run import gradient, problem

from odecli.pde.elastic import adjoint_pass
from odecli.pde.elastic.fused import FusedLoop

TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-6}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def relative(got: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest per-parameter (vp, vs, rho) error relative to that parameter's largest."""
    return max(float((g - r).abs().max() / r.abs().max()) for g, r in zip(got, ref))


def compact_used(monkeypatch) -> list:
    """Record each adjoint pass's store layout (None: the five planes)."""
    return record_inits(monkeypatch, adjoint_pass.AdjointPass, lambda run: run.layout)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("source_type", ["fy", "fx", "pressure"])
def test_compact_stores_give_the_five_planes_gradient(monkeypatch, dtype, source_type):
    import odecli.pde.elastic.propagator as elastic_propagator

    monkeypatch.setattr(elastic_propagator, "MIN_POINTS_PER_THREAD", 1)
    # the unscaled adjoint on both (the scaled one: tests/test_elastic_scaled_adjoint.py)
    monkeypatch.setattr(adjoint_pass, "SCALED", False)
    prop, model, observed = problem(source_type, dtype)
    assert len(prop.segments) == 2
    seen = compact_used(monkeypatch)
    for threads in (1, 2):
        prop.threads = threads
        monkeypatch.setattr(FusedLoop, "compact_stores", False)
        reference = gradient(prop, model, observed)
        assert seen and all(layout is None for layout in seen)
        seen.clear()
        monkeypatch.setattr(FusedLoop, "compact_stores", True)
        got = gradient(prop, model, observed)
        assert len(seen) == 2 and all(layout is not None for layout in seen)
        seen.clear()
        assert torch.isfinite(reference).all()
        assert relative(got, reference) < TOLERANCE[dtype], (threads, relative(got, reference))


def test_the_check_can_fail(monkeypatch):
    """The velocities before a segment's first step taken as zeros: the buoyancy gradient's
    terms of those steps go wrong, far beyond the tolerance."""
    prop, model, observed = problem("fy", torch.float64)
    monkeypatch.setattr(FusedLoop, "compact_stores", False)
    reference = gradient(prop, model, observed)
    monkeypatch.setattr(FusedLoop, "compact_stores", True)
    init = adjoint_pass.AdjointPass.__init__

    def zero_start(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.v0 = torch.zeros_like(self.v0)

    monkeypatch.setattr(adjoint_pass.AdjointPass, "__init__", zero_start)
    assert relative(gradient(prop, model, observed), reference) > 1e-6


@pytest.mark.parametrize("source_type", ["fy", "pressure"])
def test_segments_kept_from_the_first_pass_give_the_recomputed_gradient(monkeypatch,
                                                                        source_type):
    """A store budget that keeps every segment's first-pass stores (none recomputed), one that
    keeps the last two, and one that keeps the last only: the kept compact stores give the
    recomputed ones' gradient bit for bit (the same forward steps wrote them).  Kept segments
    save no start: the first of them a copy of its start velocities, the others the previous
    segment's last store, which the mixed budget tells apart."""
    import odecli.pde.elastic.propagator as elastic_propagator

    prop, model, observed = problem(source_type, torch.float64)
    prop.segments = [(0, 7), (7, 13), (13, 19), (19, 25)]
    runs = []
    run = FusedLoop.run
    monkeypatch.setattr(FusedLoop, "run", lambda self, *a, **k: (runs.append(k.get("stores")
                                                                               is not None),
                                                                  run(self, *a, **k))[1])
    step_bytes = []  # one step's stores, as the forward reckons them
    keep_from = elastic_propagator.keep_from
    monkeypatch.setattr(elastic_propagator, "keep_from",
                        lambda *a: (step_bytes.append(a[1]), keep_from(*a))[1])
    copies = []  # the kept segments' copies of their start velocities
    ringed = elastic_propagator.ringed
    monkeypatch.setattr(elastic_propagator, "ringed",
                        lambda *a, **k: (copies.append(1), ringed(*a, **k))[1])
    grads = {}
    for budget, first_kept in ((0, 19), ("6 steps", 13), (1 << 40, 0)):
        prop.store_budget = 6 * step_bytes[0] if budget == "6 steps" else budget
        runs.clear()
        copies.clear()
        grads[budget] = gradient(prop, model, observed)
        # the first passes that stored (the kept segments), then the recomputations
        assert runs.count(True) == 4, runs
        assert prop._keep_from == first_kept
        assert len(copies) == 1  # the first kept segment's; the others read a store
    assert torch.equal(grads[0], grads[1 << 40])
    assert torch.equal(grads[0], grads["6 steps"])
    assert keep_from(prop.segments, 100, 1200, True) == 7
    assert keep_from(prop.segments, 100, 1199, True) == 13
    assert keep_from(prop.segments, 100, None, False) == 19


def test_a_second_backward_through_kept_segments_says_why_it_cannot():
    """Kept segments save no start, so a second backward (retain_graph) has nothing to
    recompute from once the first freed their stores: a clear error, not a wrong gradient."""
    prop, model, observed = problem("fy", torch.float64)
    prop.store_budget = 1 << 40  # every segment keeps its stores
    m = model.clone().requires_grad_(True)
    loss = ((prop.forward(m) - observed) ** 2).sum()
    loss.backward(retain_graph=True)
    assert float(m.grad.abs().max()) > 0
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()
