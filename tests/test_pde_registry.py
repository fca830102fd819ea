"""The equation registry: every equation the spec accepts is registered, builds a propagator
that has the Propagator interface and its module's stability limit, and the registry (which
``odecli validate`` reads) imports no torch."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from odecli.app.pde_problem import Problem
from odecli.parallel.comm import get_comm
from odecli.pde.propagator import EQUATIONS
from odecli.specs import pde as pde_spec

sys.path.insert(0, str(Path(__file__).parent / "mpi_scripts"))
from pde_equivalence import variants  # noqa: E402

sys.path.pop(0)


def test_the_registry_holds_every_equation_the_spec_accepts():
    assert set(EQUATIONS) == set(pde_spec.EQUATIONS)


@pytest.mark.parametrize("variant", ["grid", "heat"])
def test_each_equation_builds_a_propagator_with_its_modules_limit(variant):
    raw = copy.deepcopy(variants()[variant])
    spec = pde_spec.validate(raw, "t.yaml")
    spec["text"] = ""
    P = Problem(spec, get_comm())
    module = EQUATIONS[spec["equation"]]
    prop = P.prop
    assert isinstance(prop.halo, int) and prop.halo >= 1
    assert prop.segments[0][0] == 0 and prop.segments[-1][1] == spec["time"]["steps"]
    assert prop.stability_limit() == P.limit == module.stability_limit(
        spec["time"]["dt"], *spec["grid"]["spacing"])  # (dy, dx)
    assert P.engine() == prop.engine() and isinstance(prop.engine(), str)
    assert module.violates_sign(-1.0) and not module.violates_sign(1.0)


def test_the_registry_and_stability_import_no_torch():
    code = ("import sys, odecli.pde.stability, odecli.pde.propagator; "
            "sys.exit(3 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
