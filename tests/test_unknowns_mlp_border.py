"""An MLP unknown's border (issue 40): by default an acoustic2d/elastic2d MLP's sponge continues
the field at the nearest free node, rather than being inverted (the data barely see it: a free
network filled it with error) or held at its start (a layered model's sponge would keep most of
the error)."""

from __future__ import annotations

import torch

from odecli.pde.grid import Block, Grid
from odecli.pde.unknowns import make_unknown


def _mlp(border: int):
    grid = Grid(20, 26, 10.0, 10.0)
    spec = {"type": "mlp", "transform": "sigmoid", "bounds": [1500.0, 2600.0], "fixed_border": border, "seed": 1,
            "hidden": [12], "activation": "tanh", "base": 2000.0, "scale": 300.0, "features": "plain",
            "frequency": 1.0, "fourier_features": 8}
    return make_unknown(spec, grid, Block(0, 20, 0, 26), torch.float64, torch.device("cpu"), None)


def test_an_mlp_border_continues_its_nearest_free_node_and_the_interior_is_the_free_network():
    free, bordered = _mlp(0), _mlp(4)
    with torch.no_grad():
        f, b = free.field(), bordered.field()
    assert float((f - 2000.0).abs().max()) > 1.0  # plain features: the field is not flat
    assert torch.equal(b[4:16, 4:22], f[4:16, 4:22])  # same seed: the free nodes are the network's
    assert torch.equal(b[:4, 4:22], f[4:5, 4:22].expand(4, -1))  # top rows copy the first free row
    assert torch.equal(b[:, 22:], b[:, 21:22].expand(-1, 4))  # right columns copy the last free column
    assert torch.equal(b[16:, :4], f[15:16, 4:5].expand(4, 4))  # corner: the nearest free corner node


def test_an_mlp_unknown_defaults_to_a_border_of_the_sponge_and_a_grid_unknown_to_none(tmp_path):
    from odecli.specs.pde import load_spec

    text = """\
kind: pde-inverse
equation: acoustic2d
grid: {shape: [32, 32], spacing: 10.0}
time: {dt: 0.0015, steps: 20}
boundary: {absorbing_width: 6}
sources: {wavelet: {type: ricker, peak_frequency: 20}, positions: [[60, 60]]}
receivers: {positions: [[250, 250]]}
true_model: 2000
optimizer: {iterations: 1}
"""
    for unknown, border in (("{type: mlp, base: 2000, scale: 300, bounds: [1500, 2600]}", 6),
                            ("{type: grid, initial: 2000}", 0), ("{type: mlp, base: 2000, fixed_border: 2}", 2)):
        path = tmp_path / "s.yaml"
        path.write_text(text + f"unknown: {unknown}\n")
        assert load_spec(path)["unknown"]["fixed_border"] == border
