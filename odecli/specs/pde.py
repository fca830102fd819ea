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
from odecli.pde.propagator import EQUATIONS as EQUATION_MODULES
from odecli.specs import feasibility
from odecli.specs import pde_inputs as inputs
from odecli.specs import pde_params as params
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
    out["steady"] = steady = params.steady(eq)
    out["parameters"] = list(params.parameters(eq))
    if steady:
        if raw.get("time") is not None:
            raise V.err("time", f"{eq} is steady: it has no time axis (remove time)")
        out["time"] = {"dt": 1.0, "steps": 1, "scheme": "steady"}  # one 'step': the solve
    else:
        out["time"] = V.section(raw, "time", sections.Time, required=True)
        schemes = getattr(EQUATION_MODULES[eq], "SCHEMES", ("explicit",))  # heat2d: explicit, implicit
        if out["time"]["scheme"] not in schemes:
            having = [name for name, m in EQUATION_MODULES.items() if "implicit" in getattr(m, "SCHEMES", ())]
            raise V.err("time.scheme", f"only {', '.join(having)} has an implicit scheme; {eq} steps explicitly")
    solves = steady or out["time"]["scheme"] == "implicit"
    if raw.get("solver") is not None and not solves:
        raise V.err("solver", "only used by steady equations and time.scheme: implicit")
    out["solver"] = V.section(raw, "solver", sections.Solver) if solves else None

    if eq in ("acoustic2d", "elastic2d"):
        out["boundary"] = V.section(raw, "boundary", sections.AcousticBoundary)
        aw = out["boundary"]["absorbing_width"]
        if 2 * aw >= min(ny, nx):
            raise V.err("boundary.absorbing_width", f"{aw} cells leaves no interior in a {ny}x{nx} grid")
        if "initial_condition" in raw:
            raise V.err("initial_condition", "only used by heat2d")
    else:
        out["boundary"] = _heat_boundary(read(raw.get("boundary"), inputs.HeatBoundary, "boundary", V.problems))
        rule = getattr(EQUATION_MODULES[eq], "check_boundary", None)  # e.g. poisson2d's all-Neumann
        problem = rule(out["boundary"]) if rule is not None else None
        if problem is not None:
            raise V.err("boundary", problem)
        if steady:
            if "initial_condition" in raw:
                raise V.err("initial_condition", f"{eq} is steady: it has no initial condition")
        else:
            initial = V.key(raw, "initial_condition")
            out["initial_condition"] = 0.0 if initial is None else initial

    out["sources"] = _sources(V, V.key(raw, "sources"), depth, width, eq, steady)
    out["receivers"] = _receivers(V, V.key(raw, "receivers"), depth, width, eq)
    out["true_models"] = params.true_models(V, raw.get("true_model"), eq)
    given = [m for m in out["true_models"].values() if m is not None]
    # one-parameter equations: the model itself, as always; several: the mapping
    out["true_model"] = (out["true_models"][out["parameters"][0]] if len(out["parameters"]) == 1
                         else out["true_models"] if given else None)
    out["observed"] = V.section(raw, "observed", sections.Observed)
    if out["observed"]["file"] is None:
        for name, m in out["true_models"].items():
            if m is None:
                field = "true_model" if len(out["parameters"]) == 1 or not given else f"true_model.{name}"
                raise V.err(field, "required unless observed.file gives the data")

    if raw.get("unknown") is None:
        raise V.err("unknown", "required key is missing")
    out["unknown"] = params.unknown(V, raw["unknown"], eq, out["true_models"])
    out["regularization"] = V.section(raw, "regularization", sections.Regularization)
    optimizer = V.section(raw, "optimizer", sections.Optimizer, required=True)
    out["continuation"] = _continuation(V, optimizer.pop("frequency_continuation"), out["time"]["dt"], steady)
    out["optimizer"] = OptimizerSettings(**{**optimizer, "betas": tuple(optimizer["betas"])})
    smoothing = optimizer["smoothing"]
    if smoothing != "auto" and smoothing > max(ny, nx):  # 4 sigma^2 stencil passes: 1e9 never ends
        raise V.err("optimizer.smoothing", f"at most the grid's larger side ({max(ny, nx)} cells), got {smoothing:g}")
    for key, section in (("loss", sections.Loss), ("parallel", sections.Parallel),
                         ("checkpoint", sections.Checkpoint), ("compute", sections.Compute)):
        out[key] = V.section(raw, key, section)
    sponge = out["boundary"]["absorbing_width"] if eq in ("acoustic2d", "elastic2d") else 0
    for unknown in (out["unknown"], *out["unknown"]["parameters"].values()):
        if unknown["fixed_border"] is None:  # an MLP continues the interior into the sponge (unknowns.py)
            unknown["fixed_border"] = sponge if unknown["type"] == "mlp" else 0
    feasibility.check_pde_memory(out)  # first: the checks below visit every node of each side
    check_physical(V, out, raw)
    most = min((ny - 1) // 2, (nx - 1) // 2)
    if out["unknown"]["fixed_border"] > most:
        raise V.err("unknown.fixed_border",
                    f"{out['unknown']['fixed_border']} cells leave no free cell to invert in a "
                    f"{ny}x{nx} grid; use at most {most}")
    check_stability(V, out)
    return out


def _continuation(V: _V, stages: list[dict] | None, dt: float, steady: bool) -> list[dict]:
    """``optimizer.frequency_continuation``: stages of rising cutoffs below the Nyquist frequency."""
    f = "optimizer.frequency_continuation"
    if not stages:
        return []
    if steady:
        raise V.err(f, "a steady equation's data have no time axis to low-pass")
    nyquist = 0.5 / dt
    for i, stage in enumerate(stages):
        cutoff = stage["max_frequency"]
        if cutoff >= nyquist:
            raise V.err(f"{f}[{i}].max_frequency", f"{cutoff:g} Hz is not below the Nyquist frequency "
                                                   f"{nyquist:g} Hz of time.dt")
        if i and cutoff <= stages[i - 1]["max_frequency"]:
            raise V.err(f"{f}[{i}].max_frequency", f"the stages' cutoffs must rise: {cutoff:g} Hz "
                                                   f"follows {stages[i - 1]['max_frequency']:g} Hz")
    return [dict(stage) for stage in stages]


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


def _sources(V: _V, d: inputs.Sources, depth, width, equation: str, steady: bool) -> dict:
    f = "sources"
    shots = [[p] for p in _points(V, d, f, depth, width)]
    for i, s in enumerate(d.shots or []):
        sub = [list(p) for p in s]
        _inside(V, sub, f"{f}.shots[{i}]", depth, width)
        shots.append(sub)
    if not shots:
        raise V.err(f, "no sources: give positions, line or shots")
    if d.type is not None and equation != "elastic2d":
        raise V.err(f"{f}.type", f"only elastic2d has source types; {equation}'s sources are its field's")
    if steady:  # a steady source is its amplitude: a wavelet of one 'step' of 1
        if d.wavelet is not None:
            raise V.err(f"{f}.wavelet", f"{equation} is steady: a source is its amplitude (remove wavelet)")
        wavelet: dict = {"type": "constant", "value": 1.0}
    elif d.wavelet is None:
        raise V.err(f"{f}.wavelet", "required key is missing")
    else:
        wavelet = _wavelet(V, d.wavelet, f"{f}.wavelet")
    return {"wavelet": wavelet, "amplitude": d.amplitude, "shots": shots,
            "type": d.type or "pressure"}


def _receivers(V: _V, d: inputs.Receivers, depth, width, equation: str) -> dict:
    """Receiver points; elastic2d's each with its component (positions take the receivers', lines
    their own or the receivers', vy by default)."""
    f = "receivers"
    pts: list = [list(p) for p in d.positions or []]
    default = d.component or "vy"
    components = [default] * len(pts)
    lines = d.line
    written = [] if lines is None else lines if isinstance(lines, list) else [lines]
    for i, ln in enumerate(written):
        here = line_points(getattr(ln, "from"), ln.to, ln.count)
        pts.extend([list(p) for p in here])
        components.extend([ln.component or default] * len(here))
        if ln.component is not None and equation != "elastic2d":
            raise V.err(f"{f}.line{'' if not isinstance(lines, list) else f'[{i}]'}.component",
                        f"only elastic2d receivers record a component; {equation}'s record its field")
    _inside(V, pts, f, depth, width)
    if not pts:
        raise V.err(f, "no receivers: give positions or line")
    if d.component is not None and equation != "elastic2d":
        raise V.err(f"{f}.component", f"only elastic2d receivers record a component; {equation}'s record its field")
    out: dict = {"points": pts}
    if equation == "elastic2d":
        out["components"] = components
    return out
