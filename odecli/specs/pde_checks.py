"""The cross-field checks of a ``kind: pde-inverse`` spec: physical values and the stability limit.

They run after the declared and structural checks of odecli.specs.pde, on its normalised
dict, and raise through its accessor (``V.err(field, message)``: a one-line SpecError).
"""

from __future__ import annotations

import math
import struct
from bisect import bisect_left, bisect_right
from typing import Any

import numpy as np

from odecli.optim.transforms import TRANSFORM_EDGE
from odecli.pde import stability
from odecli.pde.propagator import EQUATIONS


def check_physical(V: Any, spec: dict, raw: dict) -> None:
    """Each parameter's sign rule wherever the spec writes a value down (wave speed > 0,
    conductivity >= 0; the equation module's ``violates_sign``), and, for an equation with
    several parameters, the rules between them (``check_parameters``: elastic2d's vs <= vp).

    A negative speed would otherwise run (the wave equation only sees c^2) and fit nonsense, and a
    negative conductivity makes the heat equation ill-posed. Fields known only once evaluated
    (files) are checked by the run on the evaluated field (``odecli.app.pde_problem``).
    """
    module = EQUATIONS[spec["equation"]]
    what, least = module.QUANTITY, module.LEAST
    names = spec["parameters"]
    if len(names) > 1:
        _check_parameters(V, spec, module)
        return

    def check(v: float, field: str, text: str = "") -> None:
        if module.violates_sign(v):
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

    written_true = raw.get("true_model")
    if isinstance(written_true, dict) and "type" not in written_true:  # {c: MODEL}
        written_true = next(iter(written_true.values()))
    model(spec["true_model"], written_true, "true_model")
    unk, written = spec["unknown"], raw["unknown"]
    model(unk.get("initial"), written.get("initial"), "unknown.initial")
    model(unk.get("model"), written.get("model"), "unknown.model")
    if unk["type"] == "mlp":
        check(unk["base"], "unknown.base")
    if unk["bounds"] is not None and unk["bounds"][0] < 0:
        raise V.err("unknown.bounds[0]", f"a {what} bound must be >= 0, got {unk['bounds'][0]:g}")


def _check_parameters(V: Any, spec: dict, module: Any) -> None:
    """An equation with several parameters: its module's ``check_parameters(low, high)`` on the
    true models and on the unknown's starting models, each parameter's smallest and largest value
    on the grid; where one is known only once evaluated (a file, an MLP) the run checks it."""
    nodes = _nodes(spec)
    unk = spec["unknown"]
    starts = {}
    for name in spec["parameters"]:
        if name in unk["parameters"]:
            one = unk["parameters"][name]
            starts[name] = one.get("initial") if one["type"] == "grid" else one.get("model")
        else:
            starts[name] = unk["fixed"][name]
    for name, one in unk["parameters"].items():  # each parameter's bounds on its own: vs >= 0 ...
        if one["bounds"] is not None:
            lo, hi = one["bounds"]
            problem = module.check_parameters({name: lo}, {name: hi})
            if problem is not None:
                raise V.err(f"unknown.parameters.{name}.bounds", problem)
    for field, models in (("true_model", spec["true_models"]), ("unknown", starts)):
        ranges = {name: r for name, r in ((n, _range(m, nodes)) for n, m in models.items()) if r is not None}
        high = {n: r[1] for n, r in ranges.items()}
        high.update(_largest_differences({n: models[n] for n in ranges}, nodes))
        problem = module.check_parameters({n: r[0] for n, r in ranges.items()}, high)
        if problem is not None:
            raise V.err(field, problem)


def _largest_differences(models: dict[str, dict], nodes: Nodes) -> dict[str, float]:
    """``{"x - y": the largest of x - y over the nodes}`` for each pair of analytic models
    (what a rule such as ``vs <= vp`` needs pointwise); the run passes the same of its fields."""
    names = list(models)
    ys, xs = nodes
    grid_x = np.asarray(xs, dtype=np.float64)[None, :]
    largest = {f"{a} - {b}": -math.inf for a in names for b in names if a != b}
    rows = max(1, 2**20 // max(len(xs), 1))
    for first in range(0, len(ys), rows):  # numpy over blocks of rows: node by node, 4000^2 took minutes (issue 42)
        block = {n: _block(models[n], ys[first:first + rows], grid_x) for n in names}
        for a in names:
            for b in names:
                if a != b:
                    largest[f"{a} - {b}"] = max(largest[f"{a} - {b}"], float(np.max(block[a] - block[b])))
    return largest


def _block(m: dict, ys: list[float], xs: np.ndarray) -> np.ndarray:
    """:func:`_value` on rows ``ys`` of nodes ``xs`` (1, nx), broadcastable to (len(ys), nx);
    numpy's exp and sin may differ from math's in the last bit."""
    kind = m["type"]
    y = np.asarray(ys, dtype=np.float64)[:, None]
    if kind in ("constant", "layered"):
        return np.array([_value(m, v, 0.0) for v in ys], dtype=np.float64)[:, None]
    if kind == "gaussian":
        (cy, cx), (sy, sx) = m["center"], m["sigma"]
        with np.errstate(over="ignore"):  # a centre far away: inf, whose exp(-inf) is the background
            return m["background"] + m["amplitude"] * np.exp(-0.5 * (((y - cy) / sy) ** 2 + ((xs - cx) / sx) ** 2))
    sy, sx = m["size"]
    return m["background"] + m["amplitude"] * np.sign(np.sin(np.pi * y / sy) * np.sin(np.pi * xs / sx))


def _value(m: dict, y: float, x: float) -> float:
    """An analytic model (constant, layered, gaussian, checkerboard) at one node."""
    kind = m["type"]
    if kind == "constant":
        return m["value"]
    if kind == "layered":
        return m["values"][bisect_right(m["interfaces"], y)]
    if kind == "gaussian":
        return _gaussian(m, y, x)
    sy, sx = m["size"]
    s = math.sin(math.pi * y / sy) * math.sin(math.pi * x / sx)
    return m["background"] + m["amplitude"] * ((s > 0) - (s < 0))


def _range(m: dict | None, nodes: Nodes) -> tuple[float, float] | None:
    """A model's smallest and largest value on the grid's nodes (None where the run must evaluate it)."""
    if m is None:
        return None
    high = _largest(m, nodes)
    low = _largest(_negated(m), nodes) if m["type"] in _NEGATED else None
    return None if high is None or low is None else (-low, high)


_NEGATED = {"constant": ("value",), "layered": ("values",), "gaussian": ("background", "amplitude"),
            "checkerboard": ("background", "amplitude")}


def _negated(m: dict) -> dict:
    """The model of the negated field (its largest value is minus the smallest)."""
    out = dict(m)
    for key in _NEGATED[m["type"]]:
        v = m[key]
        out[key] = [-x for x in v] if isinstance(v, list) else -v
    return out


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
    The limit bounds the equation's first parameter (elastic2d: vp). A steady equation and an
    implicit scheme have none.
    """
    if spec["time"]["scheme"] in ("steady", "implicit"):
        return
    eq, dt = spec["equation"], spec["time"]["dt"]
    dy, dx = spec["grid"]["spacing"]
    most = stability.limit(eq, dt, dy, dx)
    for field, value in _largest_values(spec):
        if value > most:
            raise V.err("time.dt", stability.unstable(eq, field, value, most, dt))


def limited(spec: dict) -> tuple[str, str, str]:
    """The names the stability messages give the limited parameter's true model, unknown and
    bounds (one-parameter equations: true_model, unknown, unknown.bounds, as always)."""
    name = spec["parameters"][0]
    if len(spec["parameters"]) == 1:
        return "true_model", "unknown", "unknown.bounds"
    if name in spec["unknown"]["parameters"]:
        return f"true_model.{name}", f"unknown.parameters.{name}", f"unknown.parameters.{name}.bounds"
    return f"true_model.{name}", f"unknown.fixed.{name}", ""


def _nodes(spec: dict) -> Nodes:
    (ny, nx), (dy, dx) = spec["grid"]["shape"], spec["grid"]["spacing"]
    if spec["compute"]["dtype"] == "float32":  # Block.coords: iy.to(float32) * dy, in float32
        return ([_float32(float(iy) * _float32(dy)) for iy in range(ny)],
                [_float32(float(ix) * _float32(dx)) for ix in range(nx)])
    return [iy * dy for iy in range(ny)], [ix * dx for ix in range(nx)]  # Block.coords


def _largest_values(spec: dict) -> list[tuple[str, float]]:
    """``(field as the run names it, its largest value)`` for each field of the limited parameter
    the spec pins down."""
    single = spec["compute"]["dtype"] == "float32"  # the run holds its fields in float32 (not the bound)
    nodes = _nodes(spec)
    name = spec["parameters"][0]
    true_field, unknown_field, bounds_field = limited(spec)
    unk = spec["unknown"]["parameters"].get(name)
    found = []
    if spec["true_models"][name] is not None:
        found.append((true_field, _largest(spec["true_models"][name], nodes, single)))
    if unk is None:
        found.append((unknown_field, _largest(spec["unknown"]["fixed"][name], nodes, single)))
    else:
        found.append((unknown_field, _unknown_largest(unk, nodes, single)))
    if single:
        found = [(field, None if v is None else _float32(v)) for field, v in found]
    if unk is not None and unk["transform"] in ("clamp", "sigmoid"):  # Transform.max_value, a Python float in the run too
        found.append((bounds_field, unk["bounds"][1]))
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
    dy, dx = (y - cy) / sy, (x - cx) / sx
    r2 = dy * dy + dx * dx  # what ** 2 rounds to, but inf far away where ** 2 raised OverflowError (issue 42)
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
            if k != "amplitude":  # an offset is bounded by the field's range, the field by the bounds
                model[k] = [_transformed(unk, x) for x in v] if isinstance(v, list) else _transformed(unk, v)
        v = _largest(model, nodes, single)
        return v if v is None or unk["transform"] not in ("clamp", "sigmoid") else min(v, unk["bounds"][1])
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
