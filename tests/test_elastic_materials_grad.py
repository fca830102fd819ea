"""The hand-written backward of the staggered parameters on the C kernels' path
(odecli/pde/elastic/materials_grad.py) against autograd through the reference's edge fill and
materials, for random parameters and random adjoints of every output (the gradients in the
full elastic tests barely reach the grid's edges or the free surface's row)."""

from __future__ import annotations

import pytest
import torch

from odecli.pde import native
from odecli.pde.elastic.materials_grad import fill_edges_, materials_with_adjoint
from odecli.pde.elastic.reference import materials

NAMES = ("by", "bx", "lam2mu", "lam", "mu_xy", "surface")

pytestmark = pytest.mark.skipif(native.load("elastic")[0] is None,
                                reason="no C compiler: the fused kernels do not run here")


def _parameters(ny: int, nx: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    vp = 2000 + 500 * torch.rand(ny + 2, nx + 2, generator=g, dtype=torch.float64)
    vs = 800 + 400 * torch.rand(ny + 2, nx + 2, generator=g, dtype=torch.float64)
    rho = 1800 + 600 * torch.rand(ny + 2, nx + 2, generator=g, dtype=torch.float64)
    return torch.stack([vp, vs, rho])


def _gradient(make, exchanged: torch.Tensor, adjoints: dict) -> torch.Tensor:
    p = exchanged.clone().requires_grad_(True)
    m = make(p)
    loss = sum((getattr(m, k) * a).sum() for k, a in adjoints.items())
    loss.backward()
    return p.grad


@pytest.mark.parametrize("sides", [(True, True, True, True), (False, True, True, False),
                                   (True, False, False, True)])
@pytest.mark.parametrize("surface", [True, False])
def test_the_backward_gives_autograds_gradient(sides, surface):
    """Each output's adjoint alone (their gradients differ by orders of magnitude: the
    buoyancy's would hide in the moduli's), then all together."""
    ny, nx = 7, 9
    exchanged = _parameters(ny, nx, 1)
    g = torch.Generator().manual_seed(2)
    adjoints = {k: torch.randn(ny, nx, generator=g, dtype=torch.float64) for k in NAMES[:5]}
    if surface:
        adjoints["surface"] = torch.randn(nx, generator=g, dtype=torch.float64)
    for part in [{k: a} for k, a in adjoints.items()] + [adjoints]:
        reference = _gradient(lambda p: materials(fill_edges_(p.clone(), sides), surface),
                              exchanged, part)
        got = _gradient(lambda p: materials_with_adjoint(p, sides, surface), exchanged, part)
        scale = float(reference.abs().max())
        assert scale > 0
        assert float((got - reference).abs().max()) <= 1e-13 * scale, list(part)
    # the south ring, read by the materials: a neighbour's (its gradient goes back there) or
    # the edge row's copy (its gradient folded onto that row, its own 0)
    assert (float(reference[:, -1].abs().max()) > 0) != sides[1]


def test_the_forward_is_the_references_bit_for_bit():
    exchanged = _parameters(6, 5, 3)
    sides = (True, True, True, True)
    ref = materials(fill_edges_(exchanged.clone(), sides), True)
    got = materials_with_adjoint(exchanged, sides, True)
    for k in NAMES:
        assert torch.equal(getattr(got, k), getattr(ref, k)), k


def test_an_output_without_adjoint_adds_nothing():
    """Outputs nobody used (None adjoints) count as zero, as autograd's do."""
    ny, nx = 5, 6
    exchanged = _parameters(ny, nx, 4)
    sides = (True, True, True, True)
    adjoints = {"lam": torch.ones(ny, nx, dtype=torch.float64)}
    reference = _gradient(lambda p: materials(fill_edges_(p.clone(), sides), False),
                          exchanged, adjoints)
    got = _gradient(lambda p: materials_with_adjoint(p, sides, False), exchanged, adjoints)
    assert float((got - reference).abs().max()) <= 1e-13 * float(reference.abs().max())
