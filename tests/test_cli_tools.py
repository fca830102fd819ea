"""validate, schema and init: every problem listed, schemas that accept the examples, starters that run."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from odecli.cli import app
from odecli.errors import InputError, SpecError
from odecli.specs.pde import TOP_KEYS as PDE_TOP_KEYS
from odecli.specs.ode import TOP_KEYS as ODE_TOP_KEYS
from odecli.specs.inverse import (ADJOINT_MODES, CHECKPOINT_KEYS, DATA_KEYS, INTEGER_MINIMUMS, INVERSE_KEYS,
                                 LOSS_KEYS, LOSS_TYPES, NUMBER_MINIMUMS, OBSERVED_EVENT_KEYS, OPTIMIZER_KEYS,
                                 OPTIMIZERS, UNKNOWN_KEYS, VALUE_GROUPS, parse_ode_inverse_spec)
from odecli.specs.validate import validate_data

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted(
    p for p in list((ROOT / "examples").glob("*.yaml")) + list((ROOT / "problems").rglob("*.yaml"))
    if not p.name.endswith(".reference.yaml")
)
ODE_EXAMPLES = [p for p in SPECS if yaml.safe_load(p.read_text()).get("kind") == "ode"]
PDE_EXAMPLES = [p for p in SPECS if yaml.safe_load(p.read_text()).get("kind") == "pde-inverse"]

BAD = """\
kind: ode
system:
  states: [x]
  equations: {x: foo}
initial: {x: [1, 2]}
time: {start: 0, end: 1}
solver: {rtol: -1, method: rk9}
"""


def test_validate_lists_every_problem_with_its_field(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text(BAD)
    result = runner.invoke(app, ["validate", str(spec)])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    fields = {line.split(": ")[2] for line in errors}
    assert {"system.equations.x", "solver.rtol", "solver.method"} <= fields, result.output


def test_validate_accepts_a_good_spec_and_flags_python_code(tmp_path):
    (tmp_path / "rhs.py").write_text("def f(t, y, p):\n    return -y\n")
    spec = tmp_path / "py.yaml"
    spec.write_text("kind: ode\nsystem: {states: [x], python: rhs.py:f}\ninitial: {x: 1.0}\ntime: {start: 0, end: 1}\n")
    result = runner.invoke(app, ["validate", str(spec)])
    assert result.exit_code == 0, result.output
    assert "runs Python code" in result.output and "valid ode spec" in result.output


@pytest.mark.parametrize("change, message", [
    (("type: lbfgs", "type: sgd"), "inverse.optimizer.type: expected one of adam, lbfgs, got string 'sgd'"),
    (("observed: [x, v]", "observed: [x, q]"), "inverse.observed"),
    (("noise: 0.01", "noise: -1"), "inverse.data.noise"),
])
def test_validate_checks_an_ode_specs_inverse_section_as_train_inverse_does(tmp_path, change, message):
    """validate imported a function that does not exist, caught the ImportError and passed every inverse: section."""
    spec = tmp_path / "fit.yaml"
    spec.write_text((ROOT / "examples" / "vdp-fit.yaml").read_text().replace(*change))
    result = runner.invoke(app, ["validate", str(spec)])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {spec}: {message}"), result.output
    fit = runner.invoke(app, ["train-inverse", str(spec), "-o", str(tmp_path / "fit.h5")])
    assert fit.exit_code == 2 and errors[0] in fit.output, fit.output


def test_init_writes_a_starter_that_validates_and_solves(tmp_path):
    target = tmp_path / "starter.yaml"
    assert runner.invoke(app, ["init", "ode", "-o", str(target)]).exit_code == 0
    assert "#" in target.read_text()  # commented
    assert runner.invoke(app, ["init", "ode", "-o", str(target)]).exit_code == 2  # no silent overwrite
    assert runner.invoke(app, ["validate", str(target)]).exit_code == 0
    result = runner.invoke(app, ["solve", str(target), "-o", str(tmp_path / "run.h5"), "--quiet"])
    assert result.exit_code == 0, result.output
    assert runner.invoke(app, ["init", "nonsense"]).exit_code == 2


def _ode_schema() -> dict:
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    document = json.loads(result.output)
    jsonschema.Draft202012Validator.check_schema(document)
    return document


def test_schema_accepts_every_bundled_spec_of_both_kinds():
    document = _ode_schema()
    assert set(document["$defs"]) == {"ode", "pde-inverse"}
    assert ODE_EXAMPLES and PDE_EXAMPLES, "expected bundled specs of both kinds"
    assert any("inverse" in yaml.safe_load(p.read_text()) for p in ODE_EXAMPLES), "expected an ODE fit example"
    for path in ODE_EXAMPLES + PDE_EXAMPLES:
        jsonschema.validate(yaml.safe_load(path.read_text()), document)


@pytest.mark.parametrize("kind", ["ode", "pde-inverse"])
def test_every_starter_spec_validates(tmp_path, kind):
    target = tmp_path / f"{kind}.yaml"
    assert runner.invoke(app, ["init", kind, "-o", str(target)]).exit_code == 0
    result = runner.invoke(app, ["validate", str(target)])
    assert result.exit_code == 0, result.output
    jsonschema.validate(yaml.safe_load(target.read_text()), _ode_schema())


@pytest.mark.parametrize(
    "change",
    [
        {"kind": "odd"},
        {"solver": {"rtol": -1}},
        {"solver": {"method": "rk9"}},
        {"time": {"start": 0}},
        {"system": {"states": ["x"]}},
        {"unknown_key": 1},
    ],
)
def test_schema_rejects_bad_ode_specs(change):
    document = _ode_schema()
    spec = {"kind": "ode", "system": {"states": ["x"], "equations": {"x": "-x"}}, "initial": {"x": 1.0},
            "time": {"start": 0, "end": 1}}
    spec.update(change)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(spec, document)


@pytest.mark.parametrize("change", [{"equation": "maxwell"}, {"grid": {"shape": [2, 2], "spacing": 1}}, {"bogus": 1},
                                    {"unknown": {"type": "spline"}}, {"compute": {"device": "banana"}},
                                    {"compute": {"device": 5}}])
def test_schema_rejects_bad_pde_specs(change):
    document = _ode_schema()
    spec = yaml.safe_load(PDE_EXAMPLES[0].read_text())
    spec.update(change)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(spec, document)


def _key_paths(node, prefix: tuple = ()) -> list[tuple]:
    """Every key path through the mappings of a loaded spec (lists are not entered)."""
    paths = []
    for key, value in node.items():
        paths.append(prefix + (key,))
        if isinstance(value, dict):
            paths += _key_paths(value, prefix + (key,))
    return paths


def _with_null(spec: dict, path: tuple) -> dict:
    spec = copy.deepcopy(spec)
    node = spec
    for step in path[:-1]:
        if not isinstance(node.get(step), dict):
            node[step] = {}
        node = node[step]
    node[path[-1]] = None
    return spec


def _validator_problems(spec: dict, path: Path) -> list[str]:
    """validate's problems with ``spec`` as the field each is reported at."""
    try:
        problems = validate_data(spec, path.read_text(), path).problems
    except (SpecError, InputError) as exc:
        problems = [str(exc)]
    return [problem.split(": ")[1] for problem in problems]


def _related(field: str, keys: tuple) -> bool:
    """Whether a problem at ``field`` is about the value at ``keys`` or a section around or under it."""
    field, nulled = field.split("[")[0], ".".join(map(str, keys))
    return field == nulled or field.startswith(nulled + ".") or nulled.startswith(field + ".")


@pytest.fixture(scope="module")
def schema_validator():
    return jsonschema.Draft202012Validator(_ode_schema())


@pytest.mark.parametrize("path", ODE_EXAMPLES + PDE_EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_schema_and_validator_agree_on_every_empty_value(path, schema_validator):
    """A section whose keys a user commented out is left empty (null): the schema must accept it
    exactly when validate does, at every key of every bundled spec and every top-level section
    the validator knows (and each key the schema lists in those sections), present or not.
    Where validate only objects elsewhere (equations naming a nulled parameter), the schema,
    which does not follow names, is not asked."""
    spec = yaml.safe_load(path.read_text())
    assert not _validator_problems(spec, path) and schema_validator.is_valid(spec)
    kind = schema_validator.schema["$defs"][spec["kind"]]
    sections = {(key,) for key in (ODE_TOP_KEYS + ("inverse",) if spec["kind"] == "ode" else PDE_TOP_KEYS)}
    for key, section in kind["properties"].items():
        sections |= {(key, sub) for sub in section.get("properties", {})}
    disagree = []
    present = set(_key_paths(spec))
    for keys in sorted(present | sections, key=str):
        probe = _with_null(spec, keys)
        problems = _validator_problems(probe, path)
        if keys in present and problems and not any(_related(field, keys) for field in problems):
            continue  # a cross-reference the schema cannot check (say equations naming a nulled param)
        validator, schema = not problems, schema_validator.is_valid(probe)
        if validator != schema:
            disagree.append(f"{'.'.join(map(str, keys))}: null is {'valid' if validator else 'invalid'} "
                            f"to validate, {'valid' if schema else 'invalid'} to the schema")
    assert not disagree, "\n".join(disagree)


# Each object level of an ODE spec's inverse section and the validator's table of its keys
# ('*': the settings of every name in a mapping).
INVERSE_LEVELS = {"": INVERSE_KEYS, "unknowns": VALUE_GROUPS, "unknowns.params.*": UNKNOWN_KEYS,
                  "unknowns.initial.*": UNKNOWN_KEYS, "data": DATA_KEYS, "data.truth": VALUE_GROUPS,
                  "data.events.*": OBSERVED_EVENT_KEYS,
                  "loss": LOSS_KEYS, "optimizer": OPTIMIZER_KEYS, "checkpoint": CHECKPOINT_KEYS}
INVERSE_FIT = {"kind": "ode", "system": {"states": ["x"], "params": {"k": 1.0}, "equations": {"x": "-k * x"}},
               "initial": {"x": 1.0}, "batch": 2, "time": {"start": 0, "end": 1, "eval": 5},
               "inverse": {"unknowns": {"params": {"k": {"bounds": [0, 5]}}},
                           "data": {"truth": {"params": {"k": 2.0}}}}}


def _inverse_level(document: dict, path: str) -> dict:
    """The schema at a dotted path under the ODE spec's inverse section."""
    node = document["$defs"]["ode"]["properties"]["inverse"]
    for step in filter(None, path.split(".")):
        node = node["additionalProperties"] if step == "*" else node["properties"][step]
    return node


def test_schema_lists_every_inverse_key_the_validator_accepts():
    document = _ode_schema()
    for path, keys in INVERSE_LEVELS.items():
        level = _inverse_level(document, path)
        assert set(level["properties"]) == set(keys), path
        assert level["additionalProperties"] is False, path
    for path, values in {"adjoint": ADJOINT_MODES, "loss.type": LOSS_TYPES, "optimizer.type": OPTIMIZERS}.items():
        assert _inverse_level(document, path)["enum"] == list(values), path


def test_schema_states_the_inverse_validators_lower_limits():
    document = _ode_schema()
    for path, limit in NUMBER_MINIMUMS.items():
        number = _inverse_level(document, path.replace("data.events.", "data.events.*.")
                                + (".*" if path == "loss.weights" else ""))
        assert number["type"] == "number", path
        assert number["exclusiveMinimum" if limit.exclusive else "minimum"] == limit.value, path
    for path, minimum in INTEGER_MINIMUMS.items():
        integer = _inverse_level(document, path.replace("data.events.", "data.events.*."))
        assert (integer["type"], integer["minimum"]) == ("integer", minimum), path


def _fit_with(path: str, value) -> dict:
    spec = copy.deepcopy(INVERSE_FIT)
    *parents, last = path.split(".")
    node = spec["inverse"]
    for step in parents:
        node = node.setdefault(step, {})
    node[last] = value
    return spec


@pytest.mark.parametrize("path,value", [
    ("adjoint", "backsolve"), ("unknowns.params.k", None), ("unknowns.initial", None),
    ("unknowns.initial.x", {"per_sample": False, "init": 0.5}), ("unknowns.params.k.bounds", [0, math.inf]),
    ("data.noise", 0.0), ("data.seed", 0), ("data.relative", True), ("observed", ["x"]), ("loss", None),
    ("loss.weights.x", 0.5), ("optimizer", None), ("optimizer.type", "adam"), ("optimizer.iterations", 1),
    ("optimizer.gtol", 0), ("checkpoint", None), ("checkpoint.every", 0),
    ("observed", None), ("loss.weights", None),  # an empty `observed:` fits every state, as if left out
])
def test_schema_accepts_the_inverse_sections_the_validator_accepts(path, value):
    spec = _fit_with(path, value)
    parse_ode_inverse_spec(copy.deepcopy(spec), "", "fit.yaml")
    jsonschema.validate(spec, _ode_schema())


@pytest.mark.parametrize("path,value", [
    ("bogus", 1), ("adjoint", "reverse"), ("unknowns", {}), ("unknowns.shared", {}), ("unknowns.params.k.guess", 1.0),
    ("unknowns.params.k.per_sample", "no"), ("unknowns.params.k.bounds", [0]), ("data.file", "truth.h5"),
    ("data.truth.extra", {}), ("data.noise", -0.1), ("data.seed", -1), ("data.relative", "yes"),
    ("observed", []), ("loss.type", "mae"), ("loss.weights.x", -1.0), ("optimizer.type", "sgd"),
    ("optimizer.learning_rate", 0), ("optimizer.iterations", 0), ("optimizer.history_size", 0),
    ("optimizer.tolerance", -1.0), ("optimizer.lr", 1.0), ("optimizer.tol", 1e-9), ("optimizer.history", 5),
    ("optimizer.gtol", -1e-3), ("optimizer.step", 1), ("checkpoint.every", -1), ("checkpoint.each", 2),
])
def test_schema_rejects_the_inverse_sections_the_validator_rejects(path, value):
    spec = _fit_with(path, value)
    with pytest.raises(SpecError):
        parse_ode_inverse_spec(copy.deepcopy(spec), "", "fit.yaml")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(spec, _ode_schema())


def test_train_inverse_freezes_the_imported_modules_for_the_collector(tmp_path, monkeypatch):
    """The run's modules live until exit, so train-inverse freezes them before the loop: the
    collector's full passes then skip ~170,000 objects (70 ms a pass)."""
    import gc

    import odecli.app.fit_pde

    frozen = []
    monkeypatch.setattr(odecli.app.fit_pde, "train_inverse", lambda *a: frozen.append(gc.get_freeze_count()) or 0)
    spec = tmp_path / "fit.yaml"
    assert runner.invoke(app, ["init", "pde-inverse", "-o", str(spec)]).exit_code == 0
    gc.unfreeze()
    try:
        result = runner.invoke(app, ["train-inverse", str(spec), "--quiet"])
    finally:
        gc.unfreeze()
    assert result.exit_code == 0, result.output
    assert frozen and frozen[0] > 10_000


def test_train_inverse_logs_and_never_overwrites_without_force(tmp_path):
    spec, out, log = tmp_path / "fit.yaml", tmp_path / "fit.h5", tmp_path / "run.log"
    assert runner.invoke(app, ["init", "pde-inverse", "-o", str(spec)]).exit_code == 0
    args = ["train-inverse", str(spec), "-o", str(out), "--iterations", "1", "--quiet"]
    result = runner.invoke(app, [*args, "--log", str(log)])
    assert result.exit_code == 0, result.output
    assert out.is_file()
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and "finished with exit code 0" in lines[1]
    before = out.stat().st_mtime_ns
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "--force" in result.output
    assert out.stat().st_mtime_ns == before
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0
