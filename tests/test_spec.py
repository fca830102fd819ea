"""ODE spec loading and validation: the documented contract, defaults, and one-line errors."""

from __future__ import annotations

import copy
import math
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from odecli.errors import InputError, SpecError
from odecli.specs import (
    build_rhs,
    load_ode_spec,
    load_yaml,
    param_tensors,
    parse_ode_spec,
    parse_yaml,
    spec_kind,
    validate_ode_spec_all,
)

CONTRACT = """\
kind: ode                    # required
name: van-der-pol            # optional; default: spec file stem
system:
  states: [x, v]
  params:
    mu: [0.5, 5.0, 25.0]
  equations:
    x: v
    v: mu * (1 - x**2) * v - x
initial:
  x: 2.0
  v: 0.0
batch: 3
time:
  start: 0.0
  end: 10.0
  eval: 101
solver:
  method: dopri5
  rtol: 1.0e-6
  atol: 1.0e-6
  controller: integral
  dt0: null
  max_steps: 100000
  dtype: float64
  device: auto
output: run.h5
"""

MINIMAL = """\
kind: ode
system:
  states: [x]
  equations: {x: -x}
initial: {x: 1.0}
time: {start: 0.0, end: 1.0}
"""


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def minimal() -> dict[str, Any]:
    return parse_yaml(MINIMAL, "spec.yaml")


def test_contract_example_parses_to_documented_values(tmp_path):
    spec = load_ode_spec(write(tmp_path, CONTRACT))
    assert spec.name == "van-der-pol"
    assert spec.states == ("x", "v")
    assert spec.params == {"mu": [0.5, 5.0, 25.0]}
    assert spec.shared_params == ()
    assert spec.equations == {"x": "v", "v": "mu * (1 - x**2) * v - x"}
    assert spec.python is None
    assert spec.initial == [[2.0, 0.0]] * 3
    assert spec.batch == 3
    assert spec.t_start == [0.0] * 3 and spec.t_end == [10.0] * 3
    assert len(spec.t_eval) == 3 and all(len(row) == 101 for row in spec.t_eval)
    assert spec.t_eval[0][0] == 0.0 and spec.t_eval[0][1] == pytest.approx(0.1) and spec.t_eval[0][-1] == 10.0
    assert spec.solver.method == "dopri5" and spec.solver.rtol == 1e-6 and spec.solver.atol == 1e-6
    assert spec.solver.controller == "integral" and spec.solver.dt0 is None
    assert spec.solver.max_steps == 100000 and spec.solver.dtype == "float64" and spec.solver.device == "auto"
    assert spec.output == "run.h5" and spec.default_output == "run.h5"
    assert spec.text == CONTRACT
    assert spec.file == str(tmp_path / "spec.yaml")


def test_defaults(tmp_path):
    spec = load_ode_spec(write(tmp_path, MINIMAL, "decay.yaml"))
    assert spec.name == "decay"
    assert spec.batch == 1
    assert spec.params == {} and spec.shared_params == ()
    assert spec.t_eval == [[0.0, 1.0]]
    assert spec.output is None and spec.default_output == "decay.h5"
    s = spec.solver
    assert (s.method, s.rtol, s.atol, s.controller, s.dt0, s.max_steps, s.dtype, s.device) == (
        "dopri5", 1e-6, 1e-6, "integral", None, 100000, "float64", "auto"
    )
    assert (s.dt_min, s.dt_max, s.safety, s.factor_min, s.factor_max) == (0.0, math.inf, 0.9, 0.2, 10.0)
    assert (s.pcoeff, s.icoeff, s.dcoeff, s.adjoint) == (None, None, None, "direct")


def test_batch_inferred_from_longest_list_and_scalars_broadcast():
    data = minimal()
    data["system"]["params"] = {"k": [1.0, 2.0, 3.0, 4.0], "c": 0.5, "d": [7]}
    data["system"]["equations"] = {"x": "-k * x + c + d"}
    data["time"] = {"start": [0.0, 1.0, 2.0, 3.0], "end": 10}
    spec = parse_ode_spec(data, MINIMAL, "spec.yaml")
    assert spec.batch == 4
    assert spec.params == {"k": [1.0, 2.0, 3.0, 4.0], "c": [0.5] * 4, "d": [7.0] * 4}
    assert spec.shared_params == ("c",)
    assert spec.initial == [[1.0]] * 4
    assert spec.t_start == [0.0, 1.0, 2.0, 3.0] and spec.t_end == [10.0] * 4
    assert spec.t_eval == [[0.0, 10.0], [1.0, 10.0], [2.0, 10.0], [3.0, 10.0]]


def test_explicit_batch_broadcasts_scalars():
    data = minimal()
    data["batch"] = 5
    spec = parse_ode_spec(data, "", "spec.yaml")
    assert spec.batch == 5 and spec.initial == [[1.0]] * 5 and spec.t_end == [1.0] * 5


def test_per_sample_initial_values_and_backward_time():
    data = minimal()
    data["initial"] = {"x": [1.0, -2.0]}
    data["time"] = {"start": 5.0, "end": [0.0, 1.0], "eval": 3}
    spec = parse_ode_spec(data, "", "spec.yaml")
    assert spec.initial == [[1.0], [-2.0]]
    assert spec.t_eval == [[5.0, 2.5, 0.0], [5.0, 3.0, 1.0]]


def test_eval_one_means_end_only():
    data = minimal()
    data["time"]["eval"] = 1
    assert parse_ode_spec(data, "", "spec.yaml").t_eval == [[1.0]]


def test_eval_explicit_list_is_shared_by_all_samples():
    data = minimal()
    data["initial"] = {"x": [1.0, 2.0]}
    data["time"]["eval"] = [0.25, 0.5, 1.0]
    assert parse_ode_spec(data, "", "spec.yaml").t_eval == [[0.25, 0.5, 1.0]] * 2


def test_eval_times_off_the_span_by_round_off_are_the_spans_ends():
    # what numpy.arange(0.1, 0.31, 0.1) and its like give: 0.30000000000000004 for 0.3
    data = minimal()
    data["time"] = {"start": 0.0, "end": 0.3, "eval": [0.0, 0.1, 0.2, 0.1 + 0.2]}
    assert 0.1 + 0.2 > 0.3
    assert parse_ode_spec(data, "", "spec.yaml").t_eval == [[0.0, 0.1, 0.2, 0.3]]
    data["time"]["eval"] = [0.1, 0.3 + 1e-9]  # a real miss, however small, is still an error
    with pytest.raises(SpecError, match=r"time.eval\[1\]: 0.300000001 lies outside"):
        parse_ode_spec(data, "", "spec.yaml")
    data["time"]["eval"] = [0.1, 0.3, 0.1 + 0.2]  # two times that are one to round-off
    with pytest.raises(SpecError, match=r"time.eval\[2\]: .* is 0.3 to round-off"):
        parse_ode_spec(data, "", "spec.yaml")


def test_yaml_exponent_floats_without_dot_are_numbers(tmp_path):
    spec = load_ode_spec(write(tmp_path, MINIMAL + "solver: {rtol: 1e-8, atol: 1E-10}\n"))
    assert spec.solver.rtol == 1e-8 and spec.solver.atol == 1e-10


def test_fixed_step_method_with_dt0():
    data = minimal()
    data["solver"] = {"method": "rk4", "dt0": 0.01}
    assert parse_ode_spec(data, "", "spec.yaml").solver.dt0 == 0.01


def test_compile_is_a_boolean_or_wait(tmp_path):
    for text, mode in (("true", True), ("false", False), ("wait", "wait")):
        spec = load_ode_spec(write(tmp_path, MINIMAL + f"solver: {{compile: {text}}}\n"))
        assert spec.solver.compile == mode


def test_python_function_is_resolved_relative_to_spec_folder(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "rhs.py").write_text("import torch\n\ndef f(t, y, p):\n    return -p['k'][:, None] * y\n")
    data = minimal()
    data["system"] = {"states": ["x"], "params": {"k": [1.0, 2.0]}, "python": "model/rhs.py:f"}
    spec = parse_ode_spec(data, "", str(tmp_path / "spec.yaml"))
    assert spec.python == f"{tmp_path / 'model' / 'rhs.py'}:f"
    assert spec.equations is None
    f = build_rhs(spec)
    y = torch.ones(2, 1, dtype=torch.float64)
    assert f(torch.zeros(2), y, param_tensors(spec, torch.float64, "cpu")).tolist() == [[-1.0], [-2.0]]


def test_python_file_is_not_executed_during_validation(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "rhs.py").write_text(f"open({str(marker)!r}, 'w').close()\n\ndef f(t, y, p):\n    return y\n")
    data = minimal()
    data["system"] = {"states": ["x"], "python": "rhs.py:f"}
    parse_ode_spec(data, "", str(tmp_path / "spec.yaml"))
    assert not marker.exists()


def test_python_module_that_raises_on_import_is_an_input_error(tmp_path):
    (tmp_path / "rhs.py").write_text("raise RuntimeError('boom\\nsecond line')\n\ndef f(t, y, p):\n    return y\n")
    data = minimal()
    data["system"] = {"states": ["x"], "python": "rhs.py:f"}
    spec = parse_ode_spec(data, "", str(tmp_path / "spec.yaml"))
    with pytest.raises(InputError, match="RuntimeError: boom second line"):
        build_rhs(spec)


def test_build_rhs_broadcasts_constants_and_follows_dtype():
    data = minimal()
    data["system"] = {"states": ["x", "v"], "params": {"k": [1.0, 3.0]}, "equations": {"x": 1, "v": "-k * x + t"}}
    data["initial"] = {"x": 0.0, "v": 0.0}
    spec = parse_ode_spec(data, "", "spec.yaml")
    f = build_rhs(spec)
    y = torch.tensor([[1.0, 0.0], [2.0, 0.0]], dtype=torch.float32)
    out = f(torch.tensor([0.5, 0.5], dtype=torch.float32), y, param_tensors(spec, "float32", "cpu"))
    assert out.dtype == torch.float32 and out.shape == (2, 2)
    assert out.tolist() == [[1.0, -0.5], [1.0, -5.5]]


def test_load_yaml_errors_are_one_line(tmp_path):
    with pytest.raises(SpecError, match=r"^.*missing\.yaml: file not found$"):
        load_yaml(tmp_path / "missing.yaml")
    with pytest.raises(SpecError, match="invalid YAML at line 2, column 8: mapping values") as caught:
        load_yaml(write(tmp_path, "kind: ode\nname: a: b\n"))
    assert "\n" not in str(caught.value)
    with pytest.raises(SpecError, match="top level must be a mapping"):
        load_yaml(write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(SpecError, match="duplicate key 'x'"):
        load_yaml(write(tmp_path, "initial:\n  x: 1\n  x: 2\n"))


def test_spec_kind():
    assert spec_kind({"kind": "ode"}, "s.yaml") == "ode"
    with pytest.raises(SpecError, match="^s.yaml: kind: required"):
        spec_kind({}, "s.yaml")


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation that sets a dotted path in the minimal spec (creating mappings on the way)."""

    def mutate(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for key in parents:
            data = data.setdefault(key, {})
        data[last] = value

    return mutate


def _delete(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for key in parents:
            data = data[key]
        del data[last]

    return mutate


BAD_SPECS = [
    ("unknown top key", _set("sovler", {}), "sovler", "did you mean 'solver'"),
    ("missing kind", _delete("kind"), "kind", "required"),
    ("wrong kind", _set("kind", "pde"), "kind", "expected 'ode'"),
    ("missing system", _delete("system"), "system", "missing"),
    ("empty states", _set("system.states", []), "system.states", "non-empty list"),
    ("duplicate state", _set("system.states", ["x", "x"]), "system.states[1]", "already used"),
    ("reserved state", _set("system.states", ["t"]), "system.states[0]", "reserved"),
    ("function-name state", _set("system.states", ["x", "sin"]), "system.states[1]", "reserved"),
    ("param shadows state", _set("system.params", {"x": 1.0}), "system.params.x", "already used as a state"),
    ("param bool", _set("system.params", {"k": True}), "system.params.k", "got boolean true"),
    ("param nan", _set("system.params", {"k": [1.0, float("nan")]}), "system.params.k[1]", "finite"),
    ("extra equation", _set("system.equations.z", "1"), "system.equations.z", "not a state"),
    ("bad expression", _set("system.equations.x", "x.real"), "system.equations.x", "attribute"),
    ("unknown name", _set("system.equations.x", "-k * x"), "system.equations.x", "unknown name 'k'"),
    ("equations and python", _set("system.python", "f.py:f"), "system", "exactly one"),
    ("python file missing", lambda d: d["system"].update(equations=None, python="nope.py:f"), "system.python",
     "file not found"),
    ("missing initial state", _set("initial", {"y": 1.0}), "initial.y", "not a state"),
    ("initial list length", _set("initial.x", [1, 2, 3, 4]), "initial.x", "list has 4 entries, expected 1 or batch=3"),
    ("inferred batch mismatch",
     lambda d: (d.pop("batch"), d["system"]["params"].update(mu=[1, 2, 3, 4]), d["initial"].update(x=[1, 2, 3])),
     "initial.x", "list has 3 entries, expected 1 or batch=4"),
    ("initial string", _set("initial.x", [1.0, 2.0, "a"]), "initial.x[2]", "got string 'a'"),
    ("bad batch", _set("batch", 0), "batch", "between 1"),
    ("batch bool", _set("batch", True), "batch", "whole number"),
    ("missing end", _delete("time.end"), "time.end", "required"),
    ("end equals start", _set("time.end", 0.0), "time.end", "must differ"),
    ("end inf", _set("time.end", float("inf")), "time.end", "finite"),
    ("eval zero", _set("time.eval", 0), "time.eval", ">= 1"),
    ("eval outside span", _set("time.eval", [0.5, 2.0]), "time.eval[1]", "outside the time span"),
    ("eval not monotone", _set("time.eval", [0.5, 0.25]), "time.eval[1]", "strictly increase"),
    ("unknown time key", _set("time.stop", 1.0), "time.stop", "unknown key"),
    ("negative rtol", _set("solver.rtol", -1), "solver.rtol", "must be > 0, got -1"),
    ("unknown method", _set("solver.method", "dopri"), "solver.method", "did you mean 'dopri5'"),
    ("fixed step no dt0", _set("solver.method", "rk4"), "solver.dt0", "required for fixed-step method 'rk4'"),
    ("unknown solver key", _set("solver.rtoll", 1e-3), "solver.rtoll", "did you mean 'rtol'"),
    ("bad controller", _set("solver.controller", "p"), "solver.controller", "integral, pi, pid"),
    ("max_steps float", _set("solver.max_steps", 2.5), "solver.max_steps", "whole number"),
    ("bad dtype", _set("solver.dtype", "float16"), "solver.dtype", "float32, float64"),
    ("bad device", _set("solver.device", "tpu"), "solver.device", "cpu, cuda, auto"),
    ("safety above 1", _set("solver.safety", 1.5), "solver.safety", "<= 1"),
    ("dt_min above dt_max", _set("solver", {"dt_min": 1.0, "dt_max": 0.5}), "solver.dt_min", "<= solver.dt_max"),
    ("bad adjoint", _set("solver.adjoint", "forward"), "solver.adjoint", "direct, backsolve"),
    ("bad compile", _set("solver.compile", "yes"), "solver.compile", "expected true, false or wait, got"),
    ("output not string", _set("output", 3), "output", "file name"),
]


@pytest.mark.parametrize("mutate, field, fragment", [b[1:] for b in BAD_SPECS], ids=[b[0] for b in BAD_SPECS])
def test_bad_spec_gives_one_line_error_with_field_path(mutate, field, fragment):
    data = minimal()
    data["system"]["params"] = {"mu": [1.0, 2.0, 3.0]}
    data["batch"] = 3
    mutate(data)
    with pytest.raises(SpecError) as caught:
        parse_ode_spec(data, "", "spec.yaml")
    message = str(caught.value)
    assert caught.value.field == field
    assert message.startswith(f"spec.yaml: {field}: ")
    assert fragment in message
    assert "\n" not in message
    assert caught.value.exit_code == 2


def test_validate_all_reports_every_problem():
    data = minimal()
    data["sovler"] = {}
    data["system"]["equations"]["x"] = "foo(x)"
    data["initial"]["x"] = "one"
    data["time"]["end"] = math.nan
    data["solver"] = {"rtol": 0, "method": "rk4", "dtype": "half"}
    problems = validate_ode_spec_all(data, "", "spec.yaml")
    fields = [p.split(": ")[1] for p in problems]
    assert fields == [
        "sovler", "system.equations.x", "initial.x", "time.end", "solver.rtol", "solver.dtype", "solver.dt0"
    ]
    assert all(p.startswith("spec.yaml: ") and "\n" not in p for p in problems)


def test_validate_all_is_empty_for_a_valid_spec():
    assert validate_ode_spec_all(minimal(), "", "spec.yaml") == []


def test_validate_all_accepts_a_non_mapping():
    problems = validate_ode_spec_all([1, 2], "", "spec.yaml")
    assert problems == ["spec.yaml: top level must be a mapping of keys, got a list"]


def test_spec_is_frozen():
    spec = parse_ode_spec(minimal(), "", "spec.yaml")
    with pytest.raises(AttributeError):
        spec.batch = 2  # type: ignore[misc]


def test_parse_does_not_modify_input():
    data = minimal()
    before = copy.deepcopy(data)
    parse_ode_spec(data, "", "spec.yaml")
    assert data == before


def test_the_built_in_method_table_equals_the_solver_registry():
    # Specs are checked against a torch-free copy of the registry (fast errors); keep them equal.
    from odecli.ode.stepper import available_methods
    from odecli.specs.ode import BUILTIN_METHODS

    assert BUILTIN_METHODS == {name: bool(m.adaptive) for name, m in available_methods().items()}


def test_libyaml_and_pure_python_loaders_read_every_bundled_spec_alike():
    import yaml

    from odecli.specs import loader

    if not hasattr(yaml, "CSafeLoader"):
        pytest.skip("PyYAML was built without LibYAML: only the pure-Python loader exists")
    root = Path(__file__).resolve().parents[1]
    files = sorted([*root.glob("examples/*.yaml"), *root.glob("problems/**/*.yaml")])
    assert len(files) > 10
    tricky = "a: on\nb: 1e-6\nc: True\nd: 0x10\ne: 1_000\nf: .5\ng: ~\nh: [1, -2.5e+3, NO, null]\n"
    for text in [tricky, *(f.read_text() for f in files)]:
        fast = yaml.load(text, Loader=loader._FAST_LOADER)  # noqa: S506
        assert fast == yaml.load(text, Loader=loader._LOADER)  # noqa: S506
    assert loader._FAST_LOADER.__mro__[1] is yaml.CSafeLoader


def test_a_yaml_error_is_worded_by_the_pure_python_parser():
    # LibYAML would say "found character that cannot start any token", without the character.
    with pytest.raises(SpecError, match=r"line 2, column 1: found character '\\t' that cannot start"):
        parse_yaml("kind: ode\n\tx: 1\n", "tab.yaml")
    with pytest.raises(SpecError, match="duplicate key 'kind'"):
        parse_yaml("kind: ode\nkind: ode\n", "twice.yaml")


# ---------------------------------------------------------------- one vocabulary, declared once

FIT = """\
kind: ode
system: {states: [x], params: {k: 1.0}, equations: {x: -k * x}}
initial: {x: 1.0}
time: {start: 0, end: 1, eval: 5}
inverse:
  unknowns: {params: {k: {bounds: [0, 5]}}}
  data: {truth: {params: {k: 2.0}}}
  optimizer: %s
"""


@pytest.mark.parametrize("old,new", [("lr", "learning_rate"), ("tol", "tolerance"), ("history", "history_size")])
def test_the_former_ode_optimizer_keys_are_refused_naming_the_shared_ones(old, new):
    from odecli.specs.inverse import parse_ode_inverse_spec

    with pytest.raises(SpecError) as info:
        parse_ode_inverse_spec(parse_yaml(FIT % f"{{{old}: 1}}", "fit.yaml"), "", "fit.yaml")
    assert str(info.value) == f"fit.yaml: inverse.optimizer.{old}: unknown key (renamed: did you mean '{new}'?)"


def test_both_kinds_parse_their_optimizer_into_the_same_settings_with_their_own_defaults():
    from odecli.optim.settings import OptimizerSettings
    from odecli.specs.inverse import parse_ode_inverse_spec
    from odecli.specs.pde import validate

    text = FIT % "{type: adam, learning_rate: 0.1, tolerance: 1.0e-8, history_size: 4}"
    _, inverse = parse_ode_inverse_spec(parse_yaml(text, "fit.yaml"), text, "fit.yaml")
    # an ODE fit's line search has always tried up to 30 steps, a PDE fit's 12
    assert inverse.optimizer == OptimizerSettings("adam", 0.1, 200, 1e-8, 0.0, 4, (0.9, 0.999), 30)
    _, inverse = parse_ode_inverse_spec(parse_yaml(FIT % "{}", "fit.yaml"), "", "fit.yaml")
    assert inverse.optimizer == OptimizerSettings("lbfgs", 1.0, 50, 1e-10, 0.0, 10, (0.9, 0.999), 30)
    root = Path(__file__).resolve().parents[1]
    pde = validate(load_yaml(root / "examples" / "heat-conductivity.yaml")[0], "heat.yaml")
    o = pde["optimizer"]  # the example leaves the step to the scale-aware default
    assert isinstance(o, OptimizerSettings) and o.learning_rate is None
    assert (o.tolerance, o.gtol, o.history_size, o.betas, o.max_line_search) == (0.0, 0.0, 10, (0.9, 0.999), 12)
    assert (o.line_search, o.schedule) == ("strong_wolfe", "none")


@pytest.mark.parametrize("path,typo,field,hint", [
    ("ode", ("time:", "solver: {rtoll: 1}\ntime:"), "solver.rtoll", "did you mean 'rtol'?"),
    ("inverse", ("data: {", "data: {noize: 0.1, "), "inverse.data.noize", "did you mean 'noise'?"),
    ("pde", ("optimizer: {", "optimizer: {learning_rat: 1, "), "optimizer.learning_rat", "did you mean 'learning_rate'?"),
    ("pde", ("true_model: {", "true_model: {backround: 1, "), "true_model.backround", "did you mean 'background'?"),
    ("pde", ("unknown:\n", "unknown:\n  fixed_bordr: 1\n"), "unknown.fixed_bordr", "did you mean 'fixed_border'?"),
    ("pde", ("sources:\n", "sources:\n  amplitud: 1\n"), "sources.amplitud", "did you mean 'amplitude'?"),
    ("pde", ("receivers:\n", "receivers:\n  positons: [[0, 0]]\n"), "receivers.positons", "did you mean 'positions'?"),
])
def test_unknown_keys_of_every_kind_get_a_did_you_mean(path, typo, field, hint, tmp_path):
    from odecli.specs.validate import validate_file

    root = Path(__file__).resolve().parents[1]
    source = {"ode": FIT % "{}", "inverse": FIT % "{}",
              "pde": (root / "examples" / "acoustic-anomaly.yaml").read_text()}[path]
    if path == "ode":
        source = source.split("inverse:")[0]
    spec = tmp_path / "spec.yaml"
    spec.write_text(source.replace(*typo, 1))
    problems = validate_file(spec).problems
    assert f"{spec}: {field}: unknown key ({hint})" in problems, problems


def test_one_default_output_rule_for_every_kind(tmp_path):
    from odecli.specs.outputs import fit_output_of

    spec = parse_ode_spec(parse_yaml(FIT.split("inverse:")[0], "decay.yaml"), "", "decay.yaml")
    assert (spec.default_output, spec.fit_output) == ("decay.h5", "decay-fit.h5")
    named = tmp_path / "spec.yaml"
    named.write_text("kind: pde-inverse\nname: survey\n")
    assert fit_output_of(named) == "survey-fit.h5"
    named.write_text("kind: pde-inverse\n")
    assert fit_output_of(named) == "spec-fit.h5"
    assert fit_output_of(tmp_path / "missing.yaml") == "missing-fit.h5"


def test_the_schema_lists_exactly_the_declared_keys_of_each_section():
    from odecli.specs import pde_sections
    from odecli.specs.ode import SolverSpec
    from odecli.specs.schema import all_schemas

    document = all_schemas()["$defs"]
    assert list(document["ode"]["properties"]["solver"]["properties"]) == list(SolverSpec.__dataclass_fields__)
    for key, section in (("optimizer", pde_sections.Optimizer), ("compute", pde_sections.Compute),
                         ("parallel", pde_sections.Parallel), ("time", pde_sections.Time)):
        assert list(document["pde-inverse"]["properties"][key]["properties"]) == list(section.__struct_fields__)


def test_the_pde_schema_describes_models_unknown_and_geometry_from_their_declarations():
    import jsonschema
    from msgspec.structs import fields

    from odecli.specs import pde_inputs
    from odecli.specs.pde import validate
    from odecli.specs.pde_schema import pde_inverse_schema
    from odecli.specs.pde_sections import AcousticBoundary, PdeDocument

    document = pde_inverse_schema()
    properties = document["properties"]
    assert list(properties) == [f.name for f in fields(PdeDocument)]
    for key, section in (("unknown", pde_inputs.Unknown), ("sources", pde_inputs.Sources),
                         ("receivers", pde_inputs.Receivers)):
        assert list(properties[key]["properties"]) == [f.name for f in fields(section)], key
    assert set(properties["boundary"]["properties"]) == ({f.name for f in fields(AcousticBoundary)}
                                                         | {f.name for f in fields(pde_inputs.HeatBoundary)})
    kinds = [branch["properties"]["type"]["enum"][0] for branch in properties["true_model"]["oneOf"]
             if branch.get("type") == "object"]
    assert kinds == list(pde_inputs.MODEL_TYPES)

    root = Path(__file__).resolve().parents[1]
    base = load_yaml(root / "examples" / "acoustic-anomaly.yaml")[0]
    models = [2000, {"type": "layered", "interfaces": [100], "values": [1900, 2100]},
              {"type": "checkerboard", "background": 2000, "amplitude": 100, "size": 50},
              {"type": "marmousi", "seed": 3, "vmin": 1500, "vmax": 2500},
              {"type": "smoothed", "of": {"type": "constant", "value": 2000}, "sigma": 2},
              {"type": "gaussian", "background": 2000, "amplitude": 100, "center": [1, 2], "sigma": 0},
              {"type": "constant"}, {"type": "blob", "value": 1}, {"type": "file", "path": "v.npy", "extra": 1}]
    for model in models:
        spec = {**base, "true_model": model}
        try:
            validate(spec, "s.yaml")
            valid = True
        except SpecError:
            valid = False
        assert jsonschema.Draft202012Validator(document).is_valid(spec) == valid, model
