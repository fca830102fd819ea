"""The cross-field checks of a ``kind: pde-inverse`` spec: physical values and the stability limit.

They run after the declared and structural checks of odecli.specs.pde, on its normalised
dict, and raise through its accessor (``V.err(field, message)``: a one-line SpecError).
"""

from __future__ import annotations

import math
import struct
from bisect import bisect_left, bisect_right
from typing import Any

from odecli.optim.transforms import TRANSFORM_EDGE
from odecli.pde import stability


def check_physical(V: Any, spec: dict, raw: dict) -> None:
    """Wave speeds must be > 0 and conductivities >= 0 wherever the spec writes one down.

    A negative speed would otherwise run (the wave equation only sees c^2) and fit nonsense, and a
    negative conductivity makes the heat equation ill-posed. Fields known only once evaluated
    (files) are checked by the run on the evaluated field (``odecli.app.pde_problem``).
    """
    acoustic = spec["equation"] == "acoustic2d"
    what = "wave speed" if acoustic else "conductivity"
    least = "> 0" if acoustic else ">= 0"

    def check(v: float, field: str, text: str = "") -> None:
        if (v <= 0) if acoustic else (v < 0):
            raise V.err(field, f"{what}{text} must be {least}, got {v:g}")

    def model(m: dict | None, written: Any, f: str) -> None:
        """``written``: the model as the spec has it (a bare number is its own field)."""
        if m is None:
            return
        kind = m["type"]
        if kind == "constant":
            check(m["value"], f"{f}.value" if isinstance(written, dict) else f)
        elif kind == "layered":
            for i, v in enumerate(m["values"]):
                check(v, f"{f}.values[{i}]")
        elif kind == "gaussian":
            check(m["background"], f"{f}.background")
            check(m["background"] + m["amplitude"], f"{f}.amplitude",
                  " at the centre (background + amplitude)")
        elif kind == "checkerboard":
            check(m["background"] - abs(m["amplitude"]), f"{f}.amplitude",
                  " of a square (background - |amplitude|)")
        elif kind == "smoothed":
            model(m["of"], written["of"], f"{f}.of")  # a Gaussian filter of a valid field stays valid

    model(spec["true_model"], raw.get("true_model"), "true_model")
    unk, written = spec["unknown"], raw["unknown"]
    model(unk.get("initial"), written.get("initial"), "unknown.initial")
    model(unk.get("model"), written.get("model"), "unknown.model")
    if unk["type"] == "mlp":
        check(unk["base"], "unknown.base")
    if unk["bounds"] is not None and unk["bounds"][0] < 0:
        raise V.err("unknown.bounds[0]", f"a {what} bound must be >= 0, got {unk['bounds'][0]:g}")


# The node coordinates ``(y values, x values)`` of the grid, in metres.
Nodes = tuple[list[float], list[float]]


def check_stability(V: Any, spec: dict) -> None:
    """The run's stability check (odecli.app.pde_problem) on the fields the spec pins down.

    Same limit, message and order as the run (true model, the unknown's starting field, the
    unknown's upper bound), each judged by the largest value the run evaluates on a grid node, so
    validate refuses the time steps the run refuses, and no others. Fields known only once evaluated
    (file, smoothed and marmousi models, an MLP) are left to the run: a bound such as a smoothed
    model's unsmoothed peak would refuse specs that run. It comes after every other spec check;
    the run's own checks of files (a wavelet, a model's values) and of the ranks come later.
    Values are taken in float64 and, for a float32 run, rounded to float32 as the run holds them
    (a constant, layer or checkerboard value is then exactly the run's); a Gaussian's exp and a
    sigmoid or softplus unknown's start (taken as the initial value itself) differ from the run's
    field by rounding only, which can matter within rounding of the limit.
    """
    eq, dt = spec["equation"], spec["time"]["dt"]
    dy, dx = spec["grid"]["spacing"]
    most = stability.limit(eq, dt, dy, dx)
    for field, value in _largest_values(spec):
        if value > most:
            raise V.err("time.dt", stability.unstable(eq, field, value, most, dt))


def _largest_values(spec: dict) -> list[tuple[str, float]]:
    """``(field as the run names it, its largest value)`` for each field the spec pins down."""
    (ny, nx), (dy, dx) = spec["grid"]["shape"], spec["grid"]["spacing"]
    single = spec["compute"]["dtype"] == "float32"  # the run holds its fields in float32 (not the bound)
    if single:  # Block.coords: iy.to(float32) * dy, in float32
        nodes: Nodes = ([_float32(float(iy) * _float32(dy)) for iy in range(ny)],
                        [_float32(float(ix) * _float32(dx)) for ix in range(nx)])
    else:
        nodes = ([iy * dy for iy in range(ny)], [ix * dx for ix in range(nx)])  # Block.coords
    unk = spec["unknown"]
    found = []
    if spec["true_model"] is not None:
        found.append(("true_model", _largest(spec["true_model"], nodes, single)))
    found.append(("unknown", _unknown_largest(unk, nodes, single)))
    if single:
        found = [(field, None if v is None else _float32(v)) for field, v in found]
    if unk["transform"] in ("clamp", "sigmoid"):  # Transform.max_value, a Python float in the run too
        found.append(("unknown.bounds", unk["bounds"][1]))
    return [(field, v) for field, v in found if v is not None]


def _float32(v: float) -> float:
    """``v`` rounded to the nearest float32, as a float32 run's field holds it (inf beyond its range).

    A value within a float32 rounding of the limit is on the side the run sees it on: 2355.2786 is
    2355.27856 in float32, under the limit 2355.27860 at dt=0.0026, and the run accepts it.
    """
    try:
        return struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def _largest(m: dict, nodes: Nodes, single: bool = False) -> float | None:
    """The largest value of model ``m`` (odecli.pde.models.evaluate) on the grid's nodes.

    Not a bound but the value itself: a Gaussian centred between nodes, or a layer below the
    grid, must not count more than the run sees. None where it needs the evaluated field.
    ``single``: the nodes are a float32 run's, whose checkerboard signs are taken in float32.
    """
    ys, xs = nodes
    kind = m["type"]
    if kind == "constant":
        return m["value"]
    if kind == "layered":  # torch.bucketize(right=True) is bisect_right
        return max(m["values"][i] for i in {bisect_right(m["interfaces"], y) for y in ys})
    if kind == "gaussian":
        return max(_gaussian(m, y, x) for y in _extremes(ys, m["center"][0])
                   for x in _extremes(xs, m["center"][1]))
    if kind == "checkerboard":
        sy, sx = m["size"]
        return max(m["background"] + m["amplitude"] * a * b
                   for a in _sin_signs(ys, sy, single) for b in _sin_signs(xs, sx, single))
    return None


def _gaussian(m: dict, y: float, x: float) -> float:
    """The gaussian model at one node, in the order models.evaluate computes it."""
    (cy, cx), (sy, sx) = m["center"], m["sigma"]
    r2 = ((y - cy) / sy) ** 2 + ((x - cx) / sx) ** 2
    return m["background"] + m["amplitude"] * math.exp(-0.5 * r2)


def _extremes(coords: list[float], centre: float) -> list[float]:
    """The coordinates nearest to and farthest from ``centre``: a Gaussian's largest value on a
    grid lies at one of them in each axis (nearest for a peak, farthest for a dip)."""
    k = bisect_left(coords, centre)
    return [coords[0], coords[-1]] + coords[max(k - 1, 0): k + 1]


def _sin_signs(coords: list[float], size: float, single: bool = False) -> set[int]:
    """The signs ``sin(pi * c / size)`` takes over the nodes (one factor of a checkerboard).

    On a node at a multiple of ``size`` the sine is a rounding error whose sign the arithmetic
    decides: ``single`` takes it as a float32 run does (pi, the product and the quotient in
    float32; the sine of that float32 argument has its sign). In float32 pi is above pi, in
    float64 below: the last node of a 230 m grid with 230 m squares is on opposite sides.
    """
    if not single:
        return {(s > 0) - (s < 0) for s in (math.sin(math.pi * c / size) for c in coords)}
    pi, size = _float32(math.pi), _float32(size)
    args = (_float32(_float32(pi * c) / size) for c in coords)
    return {(s > 0) - (s < 0) for s in (math.sin(a) for a in args)}


def _unknown_largest(unk: dict, nodes: Nodes, single: bool = False) -> float | None:
    """The largest value of the unknown's starting field (odecli.pde.unknowns), or None for an
    MLP, whose network is drawn only by the run."""
    if unk["type"] == "grid":
        v = _largest(unk["initial"], nodes, single)
        return None if v is None else _transformed(unk, v)
    if unk["type"] == "scalars":  # the transform acts on each trainable number
        model = dict(unk["model"])
        for k in unk["trainable"]:
            v = model[k]
            model[k] = [_transformed(unk, x) for x in v] if isinstance(v, list) else _transformed(unk, v)
        return _largest(model, nodes, single)
    return None


def _transformed(unk: dict, v: float) -> float:
    """What ``v`` becomes through the unknown's transform and back (Transform.inverse then
    forward), as the run starts from it; equal up to rounding for sigmoid and softplus."""
    kind = unk["transform"]
    if kind == "none":
        return v
    lo, hi = unk["bounds"]
    if kind == "clamp":
        return min(max(v, lo), hi)
    if kind == "sigmoid":
        return lo + (hi - lo) * min(max((v - lo) / (hi - lo), TRANSFORM_EDGE), 1 - TRANSFORM_EDGE)
    return lo + max(v - lo, TRANSFORM_EDGE)
