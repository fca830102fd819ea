"""ESDIRK (kvaerno5 / kvaerno3): the tableaus' structure, dense output between steps, evaluation counts."""

from __future__ import annotations

import dataclasses

import pytest

from odecli.ode.implicit.esdirk import TABLEAUS


def test_tableaus_are_stiffly_accurate_with_the_last_stage_at_t_plus_h():
    """f1 = K_s needs y1 = z_s with c_s = 1 (the error estimate y1 - z_{s-1} needs c_{s-1} = 1)."""
    for tab in TABLEAUS.values():
        assert tab.c[0] == 0.0 and tab.c[-2] == 1.0 and tab.c[-1] == 1.0, tab.name
        for i, (row, c) in enumerate(zip(tab.a, tab.c)):
            assert abs(sum(row) - c) < 1e-14, (tab.name, i)
            assert i == 0 or row[-1] == tab.gamma, (tab.name, i)
    k3 = TABLEAUS["kvaerno3"]
    with pytest.raises(ValueError, match="stiffly accurate"):
        dataclasses.replace(k3, c=k3.c[:-1] + (0.9,))
    with pytest.raises(ValueError, match="row sum"):
        dataclasses.replace(k3, a=k3.a[:-1] + ((0.5,) + k3.a[-1][1:],))
