"""Validation of ``kind: pde-inverse`` YAML specs into a normalised plain dict.

Every problem raises ``SpecError(file, dotted.field, message)``: one line naming file and field.
Every key is declared once (odecli.specs.pde_sections: the fixed sections and the document;
odecli.specs.pde_inputs: models, the unknown, sources, receivers, heat2d's boundary), and the
JSON Schema comes from the same declarations (odecli.specs.pde_schema). Read here, after the
declarative pass, is what spans keys: points inside the grid, a layered model's value count,
the keys an unknown's type needs; the physical and stability checks are in
odecli.specs.pde_checks. The parsed ``optimizer`` is an
:class:`odecli.optim.settings.OptimizerSettings`, as an ODE fit's is.
The layout is documented in docs/pde-spec.md.

Output names, one rule for every kind: a spec's ``name`` defaults to its file's stem; a fit
writes ``<name>-fit.h5`` unless ``-o`` names the file (see odecli.specs.outputs).
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import msgspec

from odecli.errors import SpecError
from odecli.optim.settings import OptimizerSettings
from odecli.specs import pde_inputs as inputs
from odecli.specs import pde_sections as sections
from odecli.specs.declare import Problems, Section, check_keys, fields, read, read_value
from odecli.specs.loader import load_yaml
from odecli.specs.pde_checks import _largest, check_physical, check_stability

__all__ = ["_largest", "line_points", "load_spec", "validate"]

class _V:
    """Raises a spec problem as a one-line SpecError naming the file (odecli.specs.pde_checks uses it)."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.problems = Problems(file)

    def err(self, field: str, msg: str) -> SpecError:
        return SpecError(self.file, field, msg)

    def section(self, raw: dict, key: str, declared: type[Section], required: bool = False) -> dict:
        """``raw[key]`` read against its declaration (odecli.specs.pde_sections), as a plain dict."""
        if required and raw.get(key) is None:
            raise self.err(key, "required key is missing")
        return sections.plain(read(raw.get(key), declared, key, self.problems))

    def key(self, raw: dict, key: str) -> Any:
        """``raw[key]`` read against its annotation in :class:`PdeDocument` (None where empty)."""
        annotation, needed = DOCUMENT_FIELDS[key]
        if raw.get(key) is None:
            if needed:
                raise self.err(key, "required key is missing")
            return None
        return read_value(raw[key], annotation, key, self.problems)


DOCUMENT_FIELDS = fields(sections.PdeDocument)
TOP_KEYS = tuple(DOCUMENT_FIELDS)
EQUATIONS = typing.get_args(DOCUMENT_FIELDS["equation"][0])  # the equations a spec may name


def load_spec(path: Path) -> dict:
    """Read and validate a spec file; returns the normalised spec (with ``text`` and ``base_dir``)."""
    raw, text = load_yaml(path)
    spec = validate(raw, str(path), Path(path).parent)
    spec["text"] = text
    return spec


def validate(raw: Any, file: str, base_dir: Path | None = None) -> dict:
    """``raw`` (a loaded spec) checked, section by section, and normalised; the first problem raises."""
    V = _V(file)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise V.err("", f"expected a mapping, got {type(raw).__name__}")
    check_keys(raw, sections.PdeDocument, "", V.problems)
    if raw.get("kind") != "pde-inverse":
        raise V.err("kind", f"must be 'pde-inverse', got {raw.get('kind')!r}")
    out: dict = {"file": file, "base_dir": base_dir or Path(".")}
    out["name"] = str(raw.get("name") or Path(file).stem)
    eq = out["equation"] = V.key(raw, "equation")

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
        out["boundary"] = _heat_boundary(read(raw.get("boundary"), inputs.HeatBoundary, "boundary", V.problems))
        initial = V.key(raw, "initial_condition")
        out["initial_condition"] = 0.0 if initial is None else initial

    out["sources"] = _sources(V, V.key(raw, "sources"), depth, width)
    out["receivers"] = _receivers(V, V.key(raw, "receivers"), depth, width)
    out["true_model"] = _model(V, V.key(raw, "true_model"), "true_model")
    out["observed"] = V.section(raw, "observed", sections.Observed)
    if out["observed"]["file"] is None and out["true_model"] is None:
        raise V.err("true_model", "required unless observed.file gives the data")

    out["unknown"] = _unknown(V, V.key(raw, "unknown"))
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


def _heat_boundary(boundary: inputs.HeatBoundary) -> dict:
    """Every side's ``{type, value}``: its own, else the boundary's."""
    sides = {}
    for name in inputs.SIDES:
        side = getattr(boundary, name)
        if isinstance(side, str):
            side = inputs.HeatSide(type=side)
        elif side is None:
            side = inputs.HeatSide()
        sides[name] = {"type": boundary.type if side.type is None else side.type,
                       "value": boundary.value if side.value is None else side.value}
    return sides


def _points(V: _V, read_: inputs.Sources | inputs.Receivers, f: str, depth: float, width: float) -> list[list[float]]:
    """``positions: [[y, x], ...]`` and/or ``line(s): {from, to, count}`` -> list of points inside the grid."""
    pts: list = [list(p) for p in read_.positions or []]
    lines = read_.line
    for ln in [] if lines is None else lines if isinstance(lines, list) else [lines]:
        pts.extend([list(p) for p in line_points(getattr(ln, "from"), ln.to, ln.count)])
    _inside(V, pts, f, depth, width)
    return pts


def _inside(V: _V, pts: list[list[float]], f: str, depth: float, width: float) -> None:
    for i, p in enumerate(pts):
        if not (-1e-9 <= p[0] <= depth + 1e-9 and -1e-9 <= p[1] <= width + 1e-9):
            raise V.err(f, f"point {i} at (y={p[0]:g}, x={p[1]:g}) m is outside the grid "
                           f"(0..{depth:g}, 0..{width:g})")


def _wavelet(V: _V, w: inputs.Wavelet, f: str) -> dict:
    out: dict = {"type": w.type}
    for key in inputs.Wavelet.needs.get(w.type, ()):
        if getattr(w, key) is msgspec.UNSET:
            raise V.err(f"{f}.{key}", "required key is missing")
    if w.type == "ricker":
        out["peak_frequency"] = w.peak_frequency
        out["delay"] = w.delay
    elif w.type == "array":
        out["values"] = list(w.values) if isinstance(w.values, list) else [w.values]
    elif w.type == "file":
        out["path"] = w.path
    else:
        out["value"] = w.value
    return out


def _sources(V: _V, d: inputs.Sources, depth, width) -> dict:
    f = "sources"
    shots = [[p] for p in _points(V, d, f, depth, width)]
    for i, s in enumerate(d.shots or []):
        sub = [list(p) for p in s]
        _inside(V, sub, f"{f}.shots[{i}]", depth, width)
        shots.append(sub)
    if not shots:
        raise V.err(f, "no sources: give positions, line or shots")
    return {"wavelet": _wavelet(V, d.wavelet, f"{f}.wavelet"), "amplitude": d.amplitude, "shots": shots}


def _receivers(V: _V, d: inputs.Receivers, depth, width) -> dict:
    pts = _points(V, d, "receivers", depth, width)
    if not pts:
        raise V.err("receivers", "no receivers: give positions or line")
    return {"points": pts}


def _check_model(V: _V, m: dict | None, f: str) -> None:
    """What a model's declaration cannot state: a layered model's value count and order."""
    if m is None:
        return
    if m["type"] == "layered":
        for key in ("interfaces", "values"):
            m[key] = m[key] if isinstance(m[key], list) else [m[key]]
        if len(m["values"]) != len(m["interfaces"]) + 1:
            raise V.err(f"{f}.values", "need one more value than interfaces")
        if m["interfaces"] != sorted(m["interfaces"]):
            raise V.err(f"{f}.interfaces", "must be increasing depths")
    elif m["type"] in ("gaussian", "checkerboard"):
        key = "sigma" if m["type"] == "gaussian" else "size"
        if not isinstance(m[key], list):
            m[key] = [m[key]] * 2
    elif m["type"] == "smoothed":
        _check_model(V, m["of"], f"{f}.of")


def _model(V: _V, value: Any, f: str) -> dict | None:
    m = inputs.model(value)
    _check_model(V, m, f)
    return m


def _unknown(V: _V, d: inputs.Unknown) -> dict:
    f = "unknown"
    kind = d.type
    out: dict = {"type": kind}
    out["bounds"] = None if d.bounds is None else list(d.bounds)
    if out["bounds"] is not None and out["bounds"][0] >= out["bounds"][1]:
        raise V.err(f"{f}.bounds", "lower bound must be below the upper bound")
    # an MLP's output is mapped into its bounds smoothly (clamp would stop the gradient at them)
    out["transform"] = d.transform or (("sigmoid" if kind == "mlp" else "clamp") if d.bounds is not None
                                       else "none")
    if out["transform"] in ("sigmoid", "clamp") and out["bounds"] is None:
        raise V.err(f"{f}.transform", f"{out['transform']} needs bounds: [low, high]")
    if out["transform"] == "softplus" and out["bounds"] is None:
        raise V.err(f"{f}.transform", "softplus needs bounds: [low, high] (only low is used)")
    out["fixed_border"] = d.fixed_border
    for key in inputs.Unknown.needs[kind]:
        if getattr(d, key) is None:
            raise V.err(f"{f}.{key}", "required key is missing")
    if kind == "grid":
        out["initial"] = _model(V, d.initial, f"{f}.initial")
    elif kind == "mlp":
        hidden = [20, 20] if d.hidden is None else d.hidden
        out["hidden"] = list(hidden) if isinstance(hidden, list) else [hidden]
        out["activation"] = d.activation
        out["base"] = d.base
        out["scale"] = d.scale
        out["seed"] = d.seed
        out["features"] = d.features
        out["frequency"] = d.frequency
        out["fourier_features"] = d.fourier_features
        out["initial"] = _model(V, d.initial, f"{f}.initial") if d.initial is not None else None
    else:
        out["model"] = _model(V, d.model, f"{f}.model")
        tr = d.trainable
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
