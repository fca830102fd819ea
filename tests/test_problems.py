"""Every problem in problems/ solves to its independent reference within a tolerance-proportional bound.

The references (``problems/<stem>.reference.yaml``) come from closed forms, the Hairer / Bari
IVP test sets, or SciPy at rtol = atol = 1e-13 (``problems/make_references.py``), never from
odecli. A problem passes when, for every sample and state,
``|y - y_end| <= check_rtol * max(|y_end|, check_floor)``. The stiff problems in problems/stiff/
are solved by tests/test_stiff.py; here only their sidecars are checked.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from odecli.app.solve import solve_spec
from odecli.specs import load_ode_spec

PROBLEMS = Path(__file__).resolve().parent.parent / "problems"
STIFF = PROBLEMS / "stiff"
# make_references.py sets check_rtol = max(10 rtol, 10 observed) rounded up to 1/2/5e-k (at most 2.5x).
MAX_CHECK_OVER_BASIS = 25.0


def _is_ode_spec(path: Path) -> bool:
    if path.name.endswith(".reference.yaml") or "marmousi" in path.name.lower():
        return False
    return (yaml.safe_load(path.read_text()) or {}).get("kind") == "ode"


def _specs(folder: Path) -> list[Path]:
    return [p for p in sorted(folder.glob("*.yaml")) if _is_ode_spec(p)]


def _sidecar(spec: Path) -> dict:
    return yaml.safe_load(spec.with_name(spec.name[: -len(".yaml")] + ".reference.yaml").read_text())


def relative_errors(y: np.ndarray, ref: dict) -> np.ndarray:
    """|y - y_end| / max(|y_end|, check_floor), elementwise, (batch, n_states)."""
    y_end = np.asarray(ref["y_end"], dtype=float)
    return np.abs(y - y_end) / np.maximum(np.abs(y_end), float(ref["check_floor"]))


NONSTIFF = _specs(PROBLEMS)
STIFF_SPECS = _specs(STIFF)


def test_problem_library_is_populated():
    names = {p.stem for p in NONSTIFF}
    assert {"vanderpol", "lotka-volterra", "lorenz", "brusselator", "pleiades", "arenstorf"} <= names
    assert {"robertson", "hires", "oregonator", "vanderpol-stiff"} <= {p.stem for p in STIFF_SPECS}


@pytest.mark.parametrize("path", NONSTIFF + STIFF_SPECS, ids=lambda p: str(p.relative_to(PROBLEMS)))
def test_sidecar_is_complete_and_proportional(path: Path):
    ref = _sidecar(path)
    data = yaml.safe_load(path.read_text())
    assert ref["source"].strip()
    y_end = np.asarray(ref["y_end"], dtype=float)
    assert y_end.ndim == 2 and y_end.shape[1] == len(data["system"]["states"])
    assert np.all(np.isfinite(y_end))
    solver = data.get("solver") or {}
    basis = ref["check_basis"]
    # The sidecar is stale when the spec's tolerances changed after it was generated.
    assert float(basis["rtol"]) == float(solver.get("rtol", 1e-6))
    assert float(basis["atol"]) == float(solver.get("atol", 1e-6))
    # The bound stays proportional: a few times the larger of rtol and the error SciPy's
    # solver with the same tableau makes at these tolerances, and never looser than 0.1 %.
    check = float(ref["check_rtol"])
    assert 0 < check <= MAX_CHECK_OVER_BASIS * max(float(basis["rtol"]), float(basis["observed_error"]))
    assert check <= 1e-3


def test_comparison_rejects_an_error_just_over_the_bound():
    ref = {"y_end": [[1.0, -2.0, 0.0]], "check_rtol": 1e-6, "check_floor": 1.0}
    inside = np.array([[1.0 + 0.9e-6, -2.0 * (1 + 0.9e-6), 0.9e-6]])
    outside = np.array([[1.0, -2.0 * (1 + 1.1e-6), 0.0]])
    assert relative_errors(inside, ref).max() <= ref["check_rtol"]
    assert relative_errors(outside, ref).max() > ref["check_rtol"]


@pytest.mark.parametrize("path", NONSTIFF, ids=lambda p: p.stem)
def test_problem_matches_reference(path: Path):
    spec = load_ode_spec(path)
    ref = _sidecar(path)
    solution = solve_spec(spec)

    assert solution.status.tolist() == [0] * spec.batch
    t_end = np.broadcast_to(np.asarray(ref["t_end"], dtype=float), (spec.batch,))
    np.testing.assert_allclose(solution.t_final.cpu().numpy(), t_end, rtol=1e-12, atol=0)

    y_final = solution.y_final.detach().cpu().double().numpy()
    assert y_final.shape == np.asarray(ref["y_end"]).shape
    errors = relative_errors(y_final, ref)
    worst = np.unravel_index(np.argmax(errors), errors.shape)
    assert errors.max() <= float(ref["check_rtol"]), (
        f"{path.name}: sample {worst[0]} state {spec.states[worst[1]]}: relative error "
        f"{errors.max():.3e} > check_rtol {ref['check_rtol']}"
    )
    # The dense output's last point is the end state too.
    np.testing.assert_allclose(solution.y[:, -1].detach().cpu().double().numpy(), y_final, rtol=1e-12, atol=1e-14)
