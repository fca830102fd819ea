"""``odecli validate`` and ``odecli init``: check any spec kind without running it; starter specs."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from odecli.errors import InputError, SpecError
from odecli.specs.loader import load_yaml, spec_kind
from odecli.specs import feasibility
from odecli.specs.ode import parse_ode_spec, validate_ode_spec_all

KINDS = ("ode", "pde-inverse")


@dataclass
class ValidationReport:
    kind: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def validate_file(path: Path) -> ValidationReport:
    """Every problem in a spec file (one-line messages with field paths) plus notes for the user."""
    data, text = load_yaml(path)
    return validate_data(data, text, path)


def validate_data(data: dict, text: str, path: Path) -> ValidationReport:
    """``validate_file`` on a spec already loaded from ``path`` (relative paths are read from its folder)."""
    kind = spec_kind(data, str(path))
    report = ValidationReport(kind)
    if kind == "ode":
        body = {k: v for k, v in data.items() if k != "inverse"}
        report.problems = validate_ode_spec_all(body, text, str(path))
        python = (data.get("system") or {}).get("python") if isinstance(data.get("system"), dict) else None
        if python:
            report.notes.append(f"this spec loads and runs Python code: {python}")
        if "inverse" in data and not report.problems:  # the section is read against a valid ODE spec
            report.problems += _inverse_problems(data, text, path)
        if not report.problems:
            report.problems += _certain_failures(lambda: feasibility.check_ode(parse_ode_spec(body, text, str(path))))
    elif kind == "pde-inverse":
        from odecli.specs.pde import validate as validate_pde

        try:
            spec = validate_pde(data, str(path), Path(path).parent)
        except SpecError as exc:
            report.problems.append(str(exc))
        else:
            report.problems += _certain_failures(lambda: feasibility.check_pde(spec))
    else:
        raise InputError(f"{path}: kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    return report


def _certain_failures(check) -> list[str]:
    """The problem a valid spec would certainly meet when run (odecli.specs.feasibility)."""
    try:
        check()
    except SpecError as exc:
        return [str(exc)]
    return []


def _inverse_problems(data: dict, text: str, path: Path) -> list[str]:
    """The first problem in an ODE spec's ``inverse:`` section, as train-inverse would report it."""
    from odecli.specs.inverse import parse_ode_inverse_spec

    try:
        parse_ode_inverse_spec(data, text, str(path))
    except SpecError as exc:
        return [str(exc)]
    return []


def starter_spec(kind: str) -> str:
    """The commented template for ``kind``."""
    if kind not in KINDS:
        raise InputError(f"init: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return resources.files("odecli.specs").joinpath("templates", f"{kind}.yaml").read_text(encoding="utf-8")
