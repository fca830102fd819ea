"""Validation of ``kind: pde-inverse`` YAML specs into a normalised plain dict.

Every problem raises ``SpecError(file, dotted.field, message)``: one line naming file and field.
The sections with fixed keys are declared in odecli.specs.pde_sections (which the JSON Schema
comes from too); the geometry, the models and the unknown, whose keys depend on their type,
are read here; the physical and stability checks are in odecli.specs.pde_checks. The parsed
``optimizer`` is an :class:`odecli.optim.settings.OptimizerSettings`, as an ODE fit's is.
The layout is documented in docs/pde-spec.md.

Output names, one rule for every kind: a spec's ``name`` defaults to its file's stem; a fit
writes ``<name>-fit.h5`` unless ``-o`` names the file (see odecli.specs.outputs).
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any

from odecli.errors import SpecError
from odecli.optim.settings import OptimizerSettings
from odecli.specs import pde_sections as sections
from odecli.specs.declare import Problems, Section, read
from odecli.specs.loader import load_yaml
from odecli.specs.pde_checks import _largest, check_physical, check_stability

__all__ = ["_largest", "line_points", "load_spec", "validate"]

# The model field types odecli.pde.models builds (kept here so that checking a spec needs no torch).
MODEL_TYPES = ("constant", "layered", "gaussian", "checkerboard", "marmousi", "file", "smoothed")

EQUATIONS = ("acoustic2d", "heat2d")
UNKNOWN_TYPES = ("grid", "mlp", "scalars")
TRANSFORMS = ("clamp", "sigmoid", "softplus", "none")
BOUNDARY_TYPES = ("dirichlet", "neumann")
SIDES = ("top", "bottom", "left", "right")
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
                close = difflib.get_close_matches(str(k), allowed, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"expected one of: {', '.join(allowed)}"
                raise self.err(f"{field}.{k}" if field else str(k), f"unknown key ({hint})")
        return d

    def section(self, raw: dict, key: str, declared: type[Section], required: bool = False) -> dict:
        """``raw[key]`` read against its declaration (odecli.specs.pde_sections), as a plain dict."""
        if required and raw.get(key) is None:
            raise self.err(key, "required key is missing")
        return sections.plain(read(raw.get(key), declared, key, Problems(self.file)))

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
    raw, text = load_yaml(path)
    spec = validate(raw, str(path), Path(path).parent)
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

    grid = V.section(raw, "grid", sections.Grid, required=True)
    spacing = grid["spacing"] if isinstance(grid["spacing"], list) else [grid["spacing"]] * 2
    out["grid"] = {"shape": grid["shape"], "spacing": spacing}
    ny, nx = grid["shape"]
    depth, width = (ny - 1) * spacing[0], (nx - 1) * spacing[1]
    out["time"] = V.section(raw, "time", sections.Time, required=True)

    if eq == "acoustic2d":
        out["boundary"] = V.section(raw, "boundary", sections.AcousticBoundary)
        aw = out["boundary"]["absorbing_width"]
        if 2 * aw >= min(ny, nx):
            raise V.err("boundary.absorbing_width", f"{aw} cells leaves no interior in a {ny}x{nx} grid")
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
    out["observed"] = V.section(raw, "observed", sections.Observed)
    if out["observed"]["file"] is None and out["true_model"] is None:
        raise V.err("true_model", "required unless observed.file gives the data")

    out["unknown"] = _unknown(V, V.get(raw, "unknown", ""))
    out["regularization"] = V.section(raw, "regularization", sections.Regularization)
    optimizer = V.section(raw, "optimizer", sections.Optimizer, required=True)
    out["optimizer"] = OptimizerSettings(**{**optimizer, "betas": tuple(optimizer["betas"])})
    for key, section in (("loss", sections.Loss), ("parallel", sections.Parallel),
                         ("checkpoint", sections.Checkpoint), ("compute", sections.Compute)):
        out[key] = V.section(raw, key, section)
    check_physical(V, out, raw)
    most = min((ny - 1) // 2, (nx - 1) // 2)
    if out["unknown"]["fixed_border"] > most:
        raise V.err("unknown.fixed_border",
                    f"{out['unknown']['fixed_border']} cells leave no free cell to invert in a "
                    f"{ny}x{nx} grid; use at most {most}")
    check_stability(V, out)
    return out


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
