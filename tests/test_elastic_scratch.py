"""The elastic backward's scratch helpers (odecli/pde/elastic/scratch.py): the ring cleared
through one strided view, a checkpoint's memory variables packed by runs of rows and columns,
and a saved tensor lent as read-only scratch only where its ring is 0."""

from __future__ import annotations

import types

import pytest
import torch

from odecli.pde.elastic.reference import RING, Profiles
from odecli.pde.elastic.scratch import PackedPsi, ringed_for_reading, zero_ring_


def _cleared(t: torch.Tensor) -> torch.Tensor:
    out = t.clone()
    out[..., :RING, :] = 0
    out[..., -RING:, :] = 0
    out[..., :, :RING] = 0
    out[..., :, -RING:] = 0
    return out


@pytest.mark.parametrize("contiguous", [True, False])
def test_zero_ring_clears_the_ring_and_nothing_else(contiguous):
    t = torch.randn(2, 3, 9, 11, dtype=torch.float64) + 5.0
    if not contiguous:
        t = t.transpose(-1, -2).contiguous().transpose(-1, -2)
    want = _cleared(t)
    assert torch.equal(zero_ring_(t), want)


def test_packed_memory_variables_come_back_where_they_were():
    ny, nx = 12, 10
    col = lambda v: torch.tensor(v, dtype=torch.float64)[:, None]
    row = lambda v: torch.tensor(v, dtype=torch.float64)[None, :]
    ay = [1.0, 1.0, 0, 0, 0, 0, 0, 0, 0, 1.0, 1.0, 1.0]  # two runs of rows
    ax = [1.0, 0, 0, 0, 0, 0, 0, 0, 1.0, 1.0]
    zero_y, zero_x = [0.0] * ny, [0.0] * nx
    p = Profiles(col(ay), col(zero_y), col(zero_y), col(zero_y),
                 row(ax), row(zero_x), row(zero_x), row(zero_x))
    psi = torch.zeros(1, 8, ny, nx, dtype=torch.float64)
    layers = torch.zeros(ny, nx, dtype=torch.bool)
    layers[torch.tensor(ay) != 0] = True
    layers[:, torch.tensor(ax) != 0] = True
    psi[:, :, layers] = torch.randn(1, 8, int(layers.sum()), dtype=torch.float64)
    packed = PackedPsi(psi, p)
    psi_copy = psi.clone()
    psi.zero_()  # the forward goes on updating psi in place: the pack must hold copies
    assert torch.equal(packed.into(torch.zeros_like(psi)), psi_copy)


def test_a_saved_tensor_is_read_in_place_only_with_a_zero_ring():
    prop = types.SimpleNamespace()
    base = torch.zeros(1, 2, 8, 9, dtype=torch.float64)
    base[..., RING:-RING, RING:-RING] = torch.randn(1, 2, 4, 5, dtype=torch.float64)
    inside = base[..., RING:-RING, RING:-RING]
    assert ringed_for_reading(prop, "v0", inside).data_ptr() == base.data_ptr()  # no copy
    other = base.clone()
    other[0, 0, 0, 0] = 1.0  # a ring that is not 0: copied, ring cleared, the tensor untouched
    inner = other[..., RING:-RING, RING:-RING]
    got = ringed_for_reading(prop, "v0", inner)
    assert got.data_ptr() not in (base.data_ptr(), other.data_ptr())
    assert torch.equal(got, _cleared(other)) and float(other[0, 0, 0, 0]) == 1.0
    # the scratch it copied into is its own: reading the first tensor again takes it in place
    assert ringed_for_reading(prop, "v0", inside).data_ptr() == base.data_ptr()
