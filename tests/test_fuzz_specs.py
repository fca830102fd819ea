"""Property-based hardening: random and malformed specs end in a clean error or a valid run.

Never a traceback, never a partial output file. Thousands of specs go through ``validate``
(cheap); a few hundred go all the way through ``solve``, with mutations that keep each run small
so the test stays bounded in CI.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from odecli.cli import app

runner = CliRunner()

BASE = {
    "kind": "ode",
    "name": "fuzz",
    "system": {"states": ["x", "v"], "params": {"mu": [0.5, 2.0]}, "equations": {"x": "v", "v": "mu * (1 - x**2) * v - x"}},
    "initial": {"x": 2.0, "v": 0.0},
    "time": {"start": 0.0, "end": 1.0, "eval": 5},
    "solver": {"method": "dopri5", "rtol": 1e-4, "atol": 1e-4, "max_steps": 200},
}

TOKENS = ["x", "v", "mu", "t", "pi", "e", "1", "2.5", "1e308", "+", "-", "*", "/", "**", "(", ")", ",",
          "sin", "exp", "log", "sqrt", "min", "max", "abs", "__class__", ".", "[", "]", "lambda", ":", "'",
          "f'", "{", "}", "import", "os", "9**9**9", "é", "🙂", " ", "if", "else", "<", "and", "not"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**30, 10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from([math.nan, math.inf, -math.inf, -1, 0, 1e-300, 1e300, "", "∞", "dopri5", "rk4", "cuda"]),
)
junk = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
expressions = st.lists(st.sampled_from(TOKENS), min_size=1, max_size=12).map(" ".join)

PATHS = [
    ("kind",), ("name",), ("system",), ("system", "states"), ("system", "params"), ("system", "params", "mu"),
    ("system", "equations"), ("system", "equations", "x"), ("system", "equations", "v"), ("initial",),
    ("initial", "x"), ("batch",), ("time",), ("time", "start"), ("time", "end"), ("time", "eval"),
    ("solver",), ("solver", "method"), ("solver", "rtol"), ("solver", "atol"), ("solver", "controller"),
    ("solver", "dt0"), ("solver", "dtype"), ("solver", "device"), ("solver", "dt_min"), ("solver", "dt_max"),
    ("output",), ("extra_key",), ("solver", "extra_key"),
]


def mutate(spec: dict, path: tuple[str, ...], value, delete: bool) -> dict:
    spec = yaml.safe_load(yaml.safe_dump(spec))
    node = spec
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    if delete:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return spec


def check_clean(args: list[str], out: Path | None = None) -> None:
    result = runner.invoke(app, args, catch_exceptions=True)
    text = result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in text
    assert result.exit_code in (0, 2, 3), (result.exit_code, text)
    if result.exit_code == 2:
        errors = [line for line in text.splitlines() if line.startswith("error: ")]
        assert errors, text
    if out is not None:
        if result.exit_code == 2:
            assert not out.exists()
        assert not list(out.parent.glob("*.tmp"))


FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
SOLVE_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@FUZZ
@given(path=st.sampled_from(PATHS), value=junk | expressions, delete=st.booleans())
def test_validate_survives_mutated_specs(path, value, delete):
    spec = mutate(BASE, path, value, delete)
    with tempfile.TemporaryDirectory() as folder:
        file = Path(folder) / "spec.yaml"
        file.write_text(yaml.safe_dump(spec, allow_unicode=True))
        check_clean(["validate", str(file)])


@FUZZ
@given(text=st.text(max_size=300))
def test_validate_survives_arbitrary_text(text):
    with tempfile.TemporaryDirectory() as folder:
        file = Path(folder) / "spec.yaml"
        file.write_text(text, encoding="utf-8")
        check_clean(["validate", str(file)])


@SOLVE_FUZZ
@given(
    path=st.sampled_from([p for p in PATHS if p[:1] != ("time",) and p != ("batch",) and "max_steps" not in p]),
    value=junk | expressions, delete=st.booleans(), equation=expressions,
)
def test_solve_survives_mutated_specs(path, value, delete, equation):
    spec = mutate(BASE, path, value, delete)
    spec = mutate(spec, ("system", "equations", "v"), equation, False) if isinstance(spec.get("system"), dict) and isinstance(spec["system"].get("equations"), dict) and len(equation) % 3 == 0 else spec
    with tempfile.TemporaryDirectory() as folder:
        file = Path(folder) / "spec.yaml"
        file.write_text(yaml.safe_dump(spec, allow_unicode=True))
        out = Path(folder) / "out.h5"
        check_clean(["solve", str(file), "-o", str(out), "--quiet"], out)


PDE_BASE = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "acoustic-anomaly.yaml").read_text())
PDE_PATHS = [
    ("equation",), ("grid", "shape"), ("grid", "spacing"), ("time", "dt"), ("boundary",), ("boundary", "top"),
    ("sources",), ("sources", "wavelet"), ("sources", "wavelet", "type"), ("sources", "positions"), ("sources", "line"),
    ("sources", "line", "count"), ("sources", "shots"), ("receivers",), ("receivers", "line"), ("true_model",),
    ("true_model", "type"), ("true_model", "sigma"), ("true_model", "of"), ("unknown",), ("unknown", "type"),
    ("unknown", "initial"), ("unknown", "model"), ("unknown", "hidden"), ("unknown", "bounds"), ("extra_key",),
]
models = st.fixed_dictionaries({"type": st.sampled_from(["constant", "layered", "gaussian", "checkerboard", "marmousi",
                                                         "file", "smoothed", "blob"])}, optional={"value": junk,
                                                                                                  "of": junk})


@FUZZ
@given(path=st.sampled_from(PDE_PATHS), value=junk | models, delete=st.booleans())
def test_validate_survives_mutated_pde_specs(path, value, delete):
    """The declared models, unknown and geometry end in one clean error line, never a traceback."""
    spec = mutate(PDE_BASE, path, value, delete)
    with tempfile.TemporaryDirectory() as folder:
        file = Path(folder) / "spec.yaml"
        file.write_text(yaml.safe_dump(spec, allow_unicode=True))
        check_clean(["validate", str(file)])
