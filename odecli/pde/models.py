"""Model (coefficient field) generators: constant, layered, gaussian, checkerboard, marmousi-like,
file (an array the application layer read), smoothed.

Analytic generators are pointwise functions of the node coordinates, evaluated on any block, so a
rank's block is bit-identical to the same block of the global field.  Numbers in a model spec may be
replaced by tensors (``params``) so that a model with a few unknown scalars is differentiable.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from odecli.pde.grid import Block, Grid


def _val(spec: dict, key: str, params: dict | None, dtype, device):
    if params is not None and key in params:
        return params[key]
    return torch.as_tensor(spec[key], dtype=dtype, device=device)


def evaluate(spec: dict, grid: Grid, block: Block, dtype=torch.float64, device=None,
             params: dict | None = None, base_dir: Path | None = None) -> torch.Tensor:
    """The model on ``block`` as a tensor of shape ``block.shape`` (physical units)."""
    kind = spec["type"]
    Y, X = block.coords(grid, dtype, device)
    v = lambda k: _val(spec, k, params, dtype, device)  # noqa: E731
    if kind == "constant":
        return v("value") + torch.zeros_like(Y)
    if kind == "layered":
        interfaces = torch.as_tensor(spec["interfaces"], dtype=dtype, device=device)
        values = v("values")
        idx = torch.bucketize(Y, interfaces, right=True)
        return values[idx]
    if kind == "gaussian":
        cy, cx = spec["center"]
        sig = spec["sigma"]
        sy, sx = (sig, sig) if np.isscalar(sig) else sig
        r2 = ((Y - cy) / sy) ** 2 + ((X - cx) / sx) ** 2
        return v("background") + v("amplitude") * torch.exp(-0.5 * r2)
    if kind == "checkerboard":
        size = spec["size"]
        sy, sx = (size, size) if np.isscalar(size) else size
        s = torch.sin(math.pi * Y / sy) * torch.sin(math.pi * X / sx)
        return v("background") + v("amplitude") * torch.sign(s)
    if kind == "marmousi":
        return _marmousi(spec, grid, Y, X)
    if kind in ("file", "smoothed"):
        full = global_array(spec, grid, base_dir)
        return torch.as_tensor(full[block.y0 : block.y1, block.x0 : block.x1].copy(),
                               dtype=dtype, device=device)
    raise ValueError(f"unknown model type {kind!r}")


def global_array(spec: dict, grid: Grid, base_dir: Path | None = None) -> np.ndarray:
    """The whole model as a float64 numpy array (used for file and smoothed models)."""
    kind = spec["type"]
    if kind == "file":
        # read by the application layer (odecli.io.model_files) into "array"
        arr = np.asarray(spec["array"], dtype=np.float64)
        if arr.shape != grid.shape:
            raise ValueError(f"model array {spec['path']} has shape {arr.shape}, grid is {grid.shape}")
        return arr
    if kind == "smoothed":
        from scipy.ndimage import gaussian_filter

        base = global_array(spec["of"], grid, base_dir)
        return gaussian_filter(base, sigma=float(spec["sigma"]), mode="nearest")
    t = evaluate(spec, grid, Block.whole(grid), torch.float64, None, None, base_dir)
    return t.numpy()


def _marmousi(spec: dict, grid: Grid, Y: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """Procedural layered model with undulating interfaces, a normal fault and two lenses.

    Pointwise in (Y, X); all random parameters come from ``seed``.
    """
    rng = np.random.default_rng(int(spec.get("seed", 0)))
    vmin, vmax = float(spec.get("vmin", 1500.0)), float(spec.get("vmax", 4500.0))
    nlayers = int(spec.get("layers", 10))
    depth, width = grid.extent
    water = float(spec.get("water_depth", 0.08 * depth))
    base = np.sort(rng.uniform(water, depth, nlayers - 1))
    speeds = np.linspace(vmin + 0.15 * (vmax - vmin), vmax, nlayers - 1)
    speeds = speeds + rng.normal(0, 0.06 * (vmax - vmin), nlayers - 1)
    speeds = np.clip(speeds, vmin, vmax)
    fault_x = rng.uniform(0.35, 0.65) * width
    throw = rng.uniform(0.03, 0.08) * depth
    field = torch.full_like(Y, vmin)  # water
    for k in range(nlayers - 1):
        amp = rng.uniform(0.01, 0.05) * depth
        wl = rng.uniform(0.3, 1.0) * width
        ph = rng.uniform(0, 2 * math.pi)
        tilt = rng.uniform(-0.08, 0.08)
        surf = base[k] + amp * torch.sin(2 * math.pi * X / wl + ph) + tilt * (X - 0.5 * width)
        surf = surf + torch.where(X > fault_x, torch.full_like(X, throw), torch.zeros_like(X))
        if k == 0:
            surf = torch.clamp(surf, min=water)
        field = torch.where(Y >= surf, torch.full_like(Y, float(speeds[k])), field)
    for _ in range(2):
        cy, cx = rng.uniform(0.4, 0.85) * depth, rng.uniform(0.15, 0.85) * width
        ry, rx = rng.uniform(0.03, 0.06) * depth, rng.uniform(0.06, 0.12) * width
        dv = rng.uniform(-0.15, 0.15) * (vmax - vmin)
        inside = ((Y - cy) / ry) ** 2 + ((X - cx) / rx) ** 2 <= 1.0
        field = torch.where(inside, torch.clamp(field + dv, vmin, vmax), field)
    return field
