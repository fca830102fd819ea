"""Spec files: safe YAML loading; validation and JSON Schema from one set of declarations per kind
(odecli.specs.declare); safe equation compilation."""

from odecli.specs.expr import compile_expression
from odecli.specs.loader import load_yaml, parse_yaml, spec_kind
from odecli.specs.ode import OdeSpec, SolverSpec, load_ode_spec, parse_ode_spec, validate_ode_spec_all
from odecli.specs.rhs import build_c_equations, build_rhs, param_tensors

__all__ = [
    "OdeSpec",
    "SolverSpec",
    "build_c_equations",
    "build_rhs",
    "compile_expression",
    "load_ode_spec",
    "load_yaml",
    "param_tensors",
    "parse_ode_spec",
    "parse_yaml",
    "spec_kind",
    "validate_ode_spec_all",
]
