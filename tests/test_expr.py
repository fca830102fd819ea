"""The equation compiler: right values on tensors, and every escape from the sandbox refused fast."""

from __future__ import annotations

import math
import time

import pytest
import torch

from odecli.errors import SpecError
from odecli.specs.expr import compile_expression

NAMES = {"x", "v", "mu", "t"}


def env(dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    return {
        "x": torch.tensor([0.5, -1.0, 2.0], dtype=dtype),
        "v": torch.tensor([1.5, 0.25, -3.0], dtype=dtype),
        "mu": torch.tensor([0.5, 5.0, 25.0], dtype=dtype),
        "t": torch.tensor([0.0, 1.0, 2.0], dtype=dtype),
    }


def run(text: str, values: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    return compile_expression(text, NAMES, "spec.yaml", "system.equations.v")(values or env())


@pytest.mark.parametrize(
    "text, expected",
    [
        ("mu * (1 - x**2) * v - x", lambda x, v, mu, t: mu * (1 - x**2) * v - x),
        ("x + v * 2", lambda x, v, mu, t: x + v * 2),  # precedence: * before +
        ("(x + v) * 2", lambda x, v, mu, t: (x + v) * 2),
        ("-x**2", lambda x, v, mu, t: -(x**2)),  # ** binds tighter than unary minus
        ("2**3**2 + 0*x", lambda x, v, mu, t: torch.full_like(x, 512.0)),  # ** is right-associative
        ("x / v - +t", lambda x, v, mu, t: x / v - t),
        ("sin(x) + cos(v) * tan(t)", lambda x, v, mu, t: torch.sin(x) + torch.cos(v) * torch.tan(t)),
        ("exp(-t) * log(mu) + sqrt(mu)", lambda x, v, mu, t: torch.exp(-t) * torch.log(mu) + torch.sqrt(mu)),
        ("tanh(v) - abs(x)", lambda x, v, mu, t: torch.tanh(v) - torch.abs(x)),
        ("min(x, v) + max(x, 1)", lambda x, v, mu, t: torch.minimum(x, v) + torch.clamp(x, min=1.0)),
        ("pi * e * x", lambda x, v, mu, t: math.pi * math.e * x),
        ("2.5e-1 * x", lambda x, v, mu, t: 0.25 * x),
    ],
)
def test_values_match_hand_computed_torch(text, expected):
    values = env()
    assert torch.allclose(run(text, values), expected(**values), rtol=1e-12, atol=0)


def test_result_follows_state_dtype():
    assert run("2 * x + 1", env(torch.float32)).dtype == torch.float32


def test_constant_expression_is_a_tensor():
    result = run("1.0 + 2 * pi")
    assert isinstance(result, torch.Tensor)
    assert result.item() == pytest.approx(1.0 + 2 * math.pi)


def test_division_by_constant_zero_is_inf_not_an_exception():
    assert math.isinf(run("1 / 0").item())


@pytest.mark.parametrize(
    "text, token",
    [
        ("__import__('os')", "'__import__'"),
        ("().__class__", "attribute"),
        ("x.real", "'.' attribute access"),
        ("lambda: 1", "'lambda'"),
        ("[x for x in y]", "comprehension"),
        ("f'{x}'", "f-string"),
        ("y[0]", "indexing"),
        ("x[0]", "indexing"),
        ("open('f')", "'open'"),
        ("eval('1')", "'eval'"),
        ("x if x else v", "'if ... else'"),
        ("x < v", "'<'"),
        ("x and v", "'and'"),
        ("foo + x", "unknown name 'foo'"),
        ("__builtins__", "'__builtins__'"),
        ("sin(x, y=1)", "'y='"),
        ("sin(*[x])", "'*'"),
        ("min(x)", "min() takes exactly 2"),
        ("x(1)", "'x' is not a function"),
        ("sin + x", "'sin' is a function"),
        ("x // 2", "'//'"),
        ("x ^ 2", "'^'"),
        ("~x", "'~'"),
        ("'abc'", "'abc'"),
        ("True * x", "'True'"),
        ("1j * x", "'1j'"),
        ("(x, v)", "tuple"),
        ("x +* v", "invalid expression"),
        ("", "empty expression"),
        ("x" * 10_001, "limit is 10000"),
        ("(" * 500 + "x" + ")" * 500, "nested deeper than 100"),
        ("-" * 9_000 + "x", "nested deeper than 100"),
        ("x+" * 4_000 + "x", "nested deeper than 100"),
        ("sin(" * 150 + "x" + ")" * 150, "nested deeper than 100"),
    ],
)
def test_escapes_are_refused_quickly_with_a_one_line_message(text, token):
    began = time.perf_counter()
    with pytest.raises(SpecError) as caught:
        compile_expression(text, NAMES, "spec.yaml", "system.equations.v")
    assert time.perf_counter() - began < 1.0
    message = str(caught.value)
    assert message.startswith("spec.yaml: system.equations.v: ")
    assert token in message
    assert "\n" not in message


def test_huge_constant_power_evaluates_to_inf_quickly():
    began = time.perf_counter()
    result = run("9**9**9")
    assert time.perf_counter() - began < 1.0
    assert math.isinf(result.item())


def test_huge_integer_literal_becomes_inf():
    assert math.isinf(run("1" + "0" * 400).item())


def test_multiline_text_is_one_expression():
    values = env()
    assert torch.allclose(run("x +\n  v", values), values["x"] + values["v"])


def test_names_outside_the_allowed_set_are_refused_even_if_in_env():
    with pytest.raises(SpecError, match="unknown name 'z'"):
        compile_expression("z", {"x"}, "f.yaml", "system.equations.x")
