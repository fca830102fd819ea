"""Validation of ``kind: pde-inverse`` YAML specs into a normalised plain dict.

Every problem raises ``SpecError(file, dotted.field, message)``: one line naming file and field.
The layout is documented in docs/pde-spec.md.
"""

from __future__ import annotations

import math
import re
import struct
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import Any

import yaml

from odecli.errors import SpecError
from odecli.pde import stability
from odecli.optim.transforms import TRANSFORM_EDGE

# The model field types odecli.pde.models builds (kept here so that checking a spec needs no torch).
MODEL_TYPES = ("constant", "layered", "gaussian", "checkerboard", "marmousi", "file", "smoothed")

EQUATIONS = ("acoustic2d", "heat2d")
UNKNOWN_TYPES = ("grid", "mlp", "scalars")
TRANSFORMS = ("clamp", "sigmoid", "softplus", "none")
OPTIMIZERS = ("adam", "lbfgs")
BOUNDARY_TYPES = ("dirichlet", "neumann")
DEVICES = ("cpu", "cuda", "auto")  # plus cuda:N; auto: cuda when available, else cpu (as for ODEs)
SIDES = ("top", "bottom", "left", "right")
# How far inside its bounds the sigmoid and softplus transforms start a value (their inverses
# cannot reach the bound itself); odecli.pde.unknowns.Transform uses it.

_MISSING = object()


class _V:
    """Small typed accessor that knows the file and the field path for error messages."""

    def __init__(self, file: str) -> None:
        self.file = file

    def err(self, field: str, msg: str) -> SpecError:
        return SpecError(self.file, field, msg)

    def mapping(self, d: Any, field: str, allowed: tuple[str, ...]) -> dict:
        if d is None:
            d = {}
        if not isinstance(d, dict):
            raise self.err(field, f"expected a mapping, got {type(d).__name__}")
        for k in d:
            if k not in allowed:
                raise self.err(f"{field}.{k}" if field else str(k),
                               f"unknown key; allowed: {', '.join(allowed)}")
        return d

    def get(self, d: dict, key: str, field: str, default: Any = _MISSING) -> Any:
        if key not in d or d[key] is None:
            if default is _MISSING:
                raise self.err(_join(field, key), "required")
            return default
        return d[key]

    def num(self, d, key, field, default=_MISSING, *, positive=False, nonneg=False,
            integer=False, minimum=None) -> Any:
        f = _join(field, key)
        v = self.get(d, key, field, default)
        if v is default and default is not _MISSING:
            return v
        return self.check_num(v, f, positive=positive, nonneg=nonneg, integer=integer,
                              minimum=minimum)

    def check_num(self, v, f, *, positive=False, nonneg=False, integer=False, minimum=None):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.err(f, f"expected a number, got {v!r}")
        if integer and not (isinstance(v, int) or float(v).is_integer()):
            raise self.err(f, f"expected an integer, got {v!r}")
        if not math.isfinite(float(v)):
            raise self.err(f, f"must be finite, got {v!r}")
        if positive and v <= 0:
            raise self.err(f, f"must be > 0, got {v!r}")
        if nonneg and v < 0:
            raise self.err(f, f"must be >= 0, got {v!r}")
        if minimum is not None and v < minimum:
            raise self.err(f, f"must be >= {minimum}, got {v!r}")
        return int(v) if integer else float(v)

    def choice(self, d, key, field, choices, default=_MISSING) -> str:
        v = self.get(d, key, field, default)
        if v not in choices:
            raise self.err(_join(field, key), f"must be one of {', '.join(choices)}; got {v!r}")
        return v

    def numlist(self, v, f, length=None, **kw) -> list:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = [v]
        if not isinstance(v, list):
            raise self.err(f, f"expected a list of numbers, got {v!r}")
        if length is not None and len(v) != length:
            raise self.err(f, f"expected {length} numbers, got {len(v)}")
        return [self.check_num(x, f"{f}[{i}]", **kw) for i, x in enumerate(v)]

    def pair(self, v, f, **kw) -> list:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return [self.check_num(v, f, **kw)] * 2
        return self.numlist(v, f, length=2, **kw)


def _join(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key


def load_spec(path: Path) -> dict:
    """Read and validate a spec file; returns the normalised spec (with ``text`` and ``base_dir``)."""
    path = Path(path)
    name = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(name, "", "file not found") from None
    except OSError as exc:
        raise SpecError(name, "", f"cannot read: {exc.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "yaml"
        msg = str(getattr(exc, "problem", None) or exc).splitlines()[0]
        raise SpecError(name, where, f"invalid YAML: {msg}") from None
    spec = validate(raw, name, path.parent)
    spec["text"] = text
    return spec


TOP_KEYS = ("kind", "name", "description", "equation", "grid", "time", "boundary", "sources",
            "receivers", "true_model", "observed", "unknown", "regularization", "optimizer",
            "loss", "parallel", "checkpoint", "compute", "initial_condition")


def validate(raw: Any, file: str, base_dir: Path | None = None) -> dict:
    V = _V(file)
    raw = V.mapping(raw, "", TOP_KEYS)
    if raw.get("kind") != "pde-inverse":
        raise V.err("kind", f"must be 'pde-inverse', got {raw.get('kind')!r}")
    out: dict = {"file": file, "base_dir": base_dir or Path(".")}
    out["name"] = str(raw.get("name") or Path(file).stem)
    eq = out["equation"] = V.choice(raw, "equation", "", EQUATIONS)

    g = V.mapping(V.get(raw, "grid", ""), "grid", ("shape", "spacing"))
    shape = V.numlist(V.get(g, "shape", "grid"), "grid.shape", length=2, integer=True, minimum=4)
    spacing = V.pair(V.get(g, "spacing", "grid"), "grid.spacing", positive=True)
    out["grid"] = {"shape": shape, "spacing": spacing}
    ny, nx = shape
    depth, width = (ny - 1) * spacing[0], (nx - 1) * spacing[1]

    t = V.mapping(V.get(raw, "time", ""), "time", ("dt", "steps"))
    out["time"] = {"dt": V.num(t, "dt", "time", positive=True),
                   "steps": V.num(t, "steps", "time", integer=True, minimum=1)}

    if eq == "acoustic2d":
        b = V.mapping(raw.get("boundary"), "boundary",
                      ("absorbing_width", "absorbing_strength", "free_surface"))
        aw = V.num(b, "absorbing_width", "boundary", 20, integer=True, nonneg=True)
        if 2 * aw >= min(ny, nx):
            raise V.err("boundary.absorbing_width", f"{aw} cells leaves no interior in a {ny}x{nx} grid")
        fs = V.get(b, "free_surface", "boundary", False)
        if not isinstance(fs, bool):
            raise V.err("boundary.free_surface", f"expected true/false, got {fs!r}")
        out["boundary"] = {"absorbing_width": aw,
                           "absorbing_strength": V.num(b, "absorbing_strength", "boundary", None,
                                                       positive=True),
                           "free_surface": fs}
        if "initial_condition" in raw:
            raise V.err("initial_condition", "only used by heat2d")
    else:
        b = V.mapping(raw.get("boundary"), "boundary", ("type", "value") + SIDES)
        dtype_ = V.choice(b, "type", "boundary", BOUNDARY_TYPES, "dirichlet")
        dval = V.num(b, "value", "boundary", 0.0)
        sides = {}
        for s in SIDES:
            sd = b.get(s)
            if sd is None:
                sides[s] = {"type": dtype_, "value": dval}
                continue
            f = f"boundary.{s}"
            if isinstance(sd, str):
                sd = {"type": sd}
            sd = V.mapping(sd, f, ("type", "value"))
            sides[s] = {"type": V.choice(sd, "type", f, BOUNDARY_TYPES, dtype_),
                        "value": V.num(sd, "value", f, dval)}
        out["boundary"] = sides
        out["initial_condition"] = V.num(raw, "initial_condition", "", 0.0)

    out["sources"] = _sources(V, V.get(raw, "sources", ""), depth, width)
    out["receivers"] = _receivers(V, V.get(raw, "receivers", ""), depth, width)

    out["true_model"] = (_model(V, raw["true_model"], "true_model")
                         if raw.get("true_model") is not None else None)
    obs = V.mapping(raw.get("observed"), "observed", ("noise", "seed", "file", "dataset"))
    out["observed"] = {"noise": V.num(obs, "noise", "observed", 0.0, nonneg=True),
                       "seed": V.num(obs, "seed", "observed", 0, integer=True),
                       "file": obs.get("file"), "dataset": V.get(obs, "dataset", "observed", "data/observed")}
    if out["observed"]["file"] is None and out["true_model"] is None:
        raise V.err("true_model", "required unless observed.file gives the data")

    out["unknown"] = _unknown(V, V.get(raw, "unknown", ""))
    r = V.mapping(raw.get("regularization"), "regularization", ("tikhonov", "tv", "tv_epsilon"))
    out["regularization"] = {"tikhonov": V.num(r, "tikhonov", "regularization", 0.0, nonneg=True),
                             "tv": V.num(r, "tv", "regularization", 0.0, nonneg=True),
                             "tv_epsilon": V.num(r, "tv_epsilon", "regularization", 1e-6,
                                                 positive=True)}
    o = V.mapping(V.get(raw, "optimizer", ""), "optimizer",
                  ("type", "learning_rate", "iterations", "tolerance", "betas", "history_size",
                   "max_line_search"))
    out["optimizer"] = {
        "type": V.choice(o, "type", "optimizer", OPTIMIZERS, "adam"),
        "learning_rate": V.num(o, "learning_rate", "optimizer", 1.0, positive=True),
        "iterations": V.num(o, "iterations", "optimizer", integer=True, minimum=1),
        "tolerance": V.num(o, "tolerance", "optimizer", 0.0, nonneg=True),
        "betas": V.numlist(V.get(o, "betas", "optimizer", [0.9, 0.999]), "optimizer.betas", length=2, nonneg=True),
        "history_size": V.num(o, "history_size", "optimizer", 10, integer=True, minimum=1),
        "max_line_search": V.num(o, "max_line_search", "optimizer", 12, integer=True, minimum=1),
    }
    lo = V.mapping(raw.get("loss"), "loss", ("normalize",))
    norm = V.get(lo, "normalize", "loss", True)
    if not isinstance(norm, bool):
        raise V.err("loss.normalize", f"expected true/false, got {norm!r}")
    out["loss"] = {"normalize": norm}
    p = V.mapping(raw.get("parallel"), "parallel", ("proc_grid", "exchange_every"))
    every = V.get(p, "exchange_every", "parallel", "auto")
    if isinstance(every, str) and every != "auto":
        raise V.err("parallel.exchange_every", f"expected auto or a whole number >= 1, got {every!r}")
    if every != "auto":
        every = V.num(p, "exchange_every", "parallel", integer=True, minimum=1)
    out["parallel"] = {"proc_grid": (V.numlist(p["proc_grid"], "parallel.proc_grid", length=2,
                                               integer=True, minimum=1)
                                     if p.get("proc_grid") is not None else None),
                       "exchange_every": every}
    c = V.mapping(raw.get("checkpoint"), "checkpoint", ("every",))
    out["checkpoint"] = {"every": V.num(c, "every", "checkpoint", 0, integer=True, nonneg=True)}
    cp = V.mapping(raw.get("compute"), "compute", ("dtype", "device", "time_segments", "threads"))
    segs = V.get(cp, "time_segments", "compute", "auto")
    if segs != "auto":
        segs = V.num(cp, "time_segments", "compute", integer=True, minimum=1)
    device = V.get(cp, "device", "compute", "cpu")
    if device not in DEVICES and not (isinstance(device, str) and re.fullmatch(r"cuda:\d+", device)):
        raise V.err("compute.device", f"must be one of cpu, cuda, auto or cuda:N; got {device!r}")
    out["compute"] = {"dtype": V.choice(cp, "dtype", "compute", ("float64", "float32"), "float64"),
                      "device": device,
                      "time_segments": segs,
                      "threads": V.num(cp, "threads", "compute", 0, integer=True, nonneg=True)}
    _check_physical(V, out, raw)
    most = min((ny - 1) // 2, (nx - 1) // 2)
    if out["unknown"]["fixed_border"] > most:
        raise V.err("unknown.fixed_border",
                    f"{out['unknown']['fixed_border']} cells leave no free cell to invert in a "
                    f"{ny}x{nx} grid; use at most {most}")
    _check_stability(V, out)
    return out


def _check_physical(V: _V, spec: dict, raw: dict) -> None:
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


def _check_stability(V: _V, spec: dict) -> None:
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


def line_points(start, end, count: int) -> list[tuple[float, float]]:
    """``count`` evenly spaced points from ``start`` to ``end`` (both included)."""
    if count == 1:
        return [(float(start[0]), float(start[1]))]
    return [
        (
            float(start[0]) + (float(end[0]) - float(start[0])) * k / (count - 1),
            float(start[1]) + (float(end[1]) - float(start[1])) * k / (count - 1),
        )
        for k in range(count)
    ]


def _points(V: _V, d: Any, f: str, depth: float, width: float) -> list[list[float]]:
    """``positions: [[y, x], ...]`` and/or ``line(s): {from, to, count}`` -> list of points."""
    pts: list = []
    if d.get("positions") is not None:
        if not isinstance(d["positions"], list) or not d["positions"]:
            raise V.err(f"{f}.positions", "expected a non-empty list of [y, x] pairs")
        for i, p in enumerate(d["positions"]):
            pts.append(V.numlist(p, f"{f}.positions[{i}]", length=2))
    lines = d.get("line")
    if lines is not None:
        lines = lines if isinstance(lines, list) else [lines]
        for i, ln in enumerate(lines):
            lf = f"{f}.line" if len(lines) == 1 else f"{f}.line[{i}]"
            ln = V.mapping(ln, lf, ("from", "to", "count"))
            a = V.numlist(V.get(ln, "from", lf), f"{lf}.from", length=2)
            b = V.numlist(V.get(ln, "to", lf), f"{lf}.to", length=2)
            n = V.num(ln, "count", lf, integer=True, minimum=1)
            pts.extend([list(p) for p in line_points(a, b, n)])
    for i, p in enumerate(pts):
        if not (-1e-9 <= p[0] <= depth + 1e-9 and -1e-9 <= p[1] <= width + 1e-9):
            raise V.err(f, f"point {i} at (y={p[0]:g}, x={p[1]:g}) m is outside the grid "
                           f"(0..{depth:g}, 0..{width:g})")
    return pts


def _wavelet(V: _V, w: Any, f: str) -> dict:
    w = V.mapping(w, f, ("type", "peak_frequency", "delay", "values", "path", "value"))
    kind = V.choice(w, "type", f, ("ricker", "array", "file", "constant"), "ricker")
    out = {"type": kind}
    if kind == "ricker":
        out["peak_frequency"] = V.num(w, "peak_frequency", f, positive=True)
        out["delay"] = V.num(w, "delay", f, None, nonneg=True)
    elif kind == "array":
        out["values"] = V.numlist(V.get(w, "values", f), f"{f}.values")
    elif kind == "file":
        out["path"] = str(V.get(w, "path", f))
    else:
        out["value"] = V.num(w, "value", f, 1.0)
    return out


def _sources(V: _V, d: Any, depth, width) -> dict:
    f = "sources"
    d = V.mapping(d, f, ("wavelet", "amplitude", "positions", "line", "shots"))
    shots = [[p] for p in _points(V, d, f, depth, width)]
    if d.get("shots") is not None:
        if not isinstance(d["shots"], list):
            raise V.err(f"{f}.shots", "expected a list of shots, each a list of [y, x] positions")
        for i, s in enumerate(d["shots"]):
            sf = f"{f}.shots[{i}]"
            if not isinstance(s, list) or not s:
                raise V.err(sf, "expected a non-empty list of [y, x] positions")
            sub = _points(V, {"positions": s}, sf, depth, width)
            shots.append(sub)
    if not shots:
        raise V.err(f, "no sources: give positions, line or shots")
    return {"wavelet": _wavelet(V, V.get(d, "wavelet", f), f"{f}.wavelet"),
            "amplitude": V.num(d, "amplitude", f, 1.0), "shots": shots}


def _receivers(V: _V, d: Any, depth, width) -> dict:
    d = V.mapping(d, "receivers", ("positions", "line"))
    pts = _points(V, d, "receivers", depth, width)
    if not pts:
        raise V.err("receivers", "no receivers: give positions or line")
    return {"points": pts}


MODEL_KEYS = {
    "constant": ("value",),
    "layered": ("interfaces", "values"),
    "gaussian": ("background", "amplitude", "center", "sigma"),
    "checkerboard": ("background", "amplitude", "size"),
    "marmousi": ("seed", "vmin", "vmax", "layers", "water_depth"),
    "file": ("path", "dataset"),
    "smoothed": ("of", "sigma"),
}
MODEL_REQUIRED = {
    "constant": ("value",), "layered": ("interfaces", "values"),
    "gaussian": ("background", "amplitude", "center", "sigma"),
    "checkerboard": ("background", "amplitude", "size"), "marmousi": (), "file": ("path",),
    "smoothed": ("of", "sigma"),
}


def _model(V: _V, d: Any, f: str) -> dict:
    if isinstance(d, (int, float)) and not isinstance(d, bool):
        d = {"type": "constant", "value": d}
    if not isinstance(d, dict):
        raise V.err(f, f"expected a model mapping, got {d!r}")
    kind = V.choice(d, "type", f, MODEL_TYPES)
    d = V.mapping(d, f, ("type",) + MODEL_KEYS[kind])
    for k in MODEL_REQUIRED[kind]:
        V.get(d, k, f)
    m = {k: v for k, v in d.items() if v is not None}  # an empty optional key is left out: its default
    if kind == "layered":
        m["interfaces"] = V.numlist(d["interfaces"], f"{f}.interfaces")
        m["values"] = V.numlist(d["values"], f"{f}.values")
        if len(m["values"]) != len(m["interfaces"]) + 1:
            raise V.err(f"{f}.values", "need one more value than interfaces")
        if m["interfaces"] != sorted(m["interfaces"]):
            raise V.err(f"{f}.interfaces", "must be increasing depths")
    elif kind == "gaussian":
        for k in ("background", "amplitude"):
            m[k] = V.num(d, k, f)
        m["center"] = V.numlist(d["center"], f"{f}.center", length=2)
        m["sigma"] = V.pair(d["sigma"], f"{f}.sigma", positive=True)
    elif kind == "checkerboard":
        for k in ("background", "amplitude"):
            m[k] = V.num(d, k, f)
        m["size"] = V.pair(d["size"], f"{f}.size", positive=True)
    elif kind == "constant":
        m["value"] = V.num(d, "value", f)
    elif kind == "smoothed":
        m["of"] = _model(V, d["of"], f"{f}.of")
        m["sigma"] = V.num(d, "sigma", f, nonneg=True)
    elif kind == "file":
        m["path"] = str(d["path"])
    elif kind == "marmousi":
        for k in ("vmin", "vmax", "water_depth"):
            if k in m:
                m[k] = V.num(d, k, f, positive=True)
        if "layers" in m:
            m["layers"] = V.num(d, "layers", f, integer=True, minimum=2)
    return m


def _unknown(V: _V, d: Any) -> dict:
    f = "unknown"
    d = V.mapping(d, f, ("type", "initial", "bounds", "transform", "hidden", "activation", "base",
                         "scale", "seed", "model", "trainable", "fixed_border"))
    kind = V.choice(d, "type", f, UNKNOWN_TYPES)
    out: dict = {"type": kind}
    b = d.get("bounds")
    out["bounds"] = V.numlist(b, f"{f}.bounds", length=2) if b is not None else None
    if out["bounds"] is not None and out["bounds"][0] >= out["bounds"][1]:
        raise V.err(f"{f}.bounds", "lower bound must be below the upper bound")
    out["transform"] = V.choice(d, "transform", f, TRANSFORMS, "clamp" if b is not None else "none")
    if out["transform"] in ("sigmoid", "clamp") and out["bounds"] is None:
        raise V.err(f"{f}.transform", f"{out['transform']} needs bounds: [low, high]")
    if out["transform"] == "softplus" and out["bounds"] is None:
        raise V.err(f"{f}.transform", "softplus needs bounds: [low, high] (only low is used)")
    out["fixed_border"] = V.num(d, "fixed_border", f, 0, integer=True, nonneg=True)
    if kind == "grid":
        out["initial"] = _model(V, V.get(d, "initial", f), f"{f}.initial")
    elif kind == "mlp":
        hidden = V.get(d, "hidden", f, [20, 20])
        out["hidden"] = [int(x) for x in V.numlist(hidden, f"{f}.hidden", integer=True, minimum=1)]
        out["activation"] = V.choice(d, "activation", f, ("tanh", "relu", "sin", "softplus"), "tanh")
        out["base"] = V.num(d, "base", f)
        out["scale"] = V.num(d, "scale", f, 1.0, positive=True)
        out["seed"] = V.num(d, "seed", f, 0, integer=True)
    else:
        out["model"] = _model(V, V.get(d, "model", f), f"{f}.model")
        tr = d.get("trainable")
        mk = out["model"]["type"]
        numeric = {"constant": ["value"], "layered": ["values"],
                   "gaussian": ["background", "amplitude"],
                   "checkerboard": ["background", "amplitude"]}.get(mk)
        if numeric is None:
            raise V.err(f"{f}.model.type", f"scalars unknowns need a constant, layered, gaussian "
                                          f"or checkerboard model, got {mk}")
        tr = numeric if tr is None else ([tr] if isinstance(tr, str) else tr)
        for k in tr:
            if k not in numeric:
                raise V.err(f"{f}.trainable", f"{k!r} is not a numeric parameter of a {mk} model "
                                             f"(choose from {', '.join(numeric)})")
        out["trainable"] = list(tr)
    return out
