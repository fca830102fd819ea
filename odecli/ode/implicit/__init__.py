"""Stiff (implicit) methods; importing this package registers them with the solver.

Method names:

* ``rodas5``, ``rodas5p``, ``rodas4`` – Rosenbrock (linearly implicit), see :mod:`.rosenbrock`;
* ``kvaerno5``, ``kvaerno3`` – ESDIRK with simplified Newton, see :mod:`.esdirk`;
* ``auto`` – starts with tsit5 and switches a sample to rodas5 once stiffness is detected,
  see :mod:`.auto`.

All report the extra per-sample statistics ``n_jac_evals``, ``n_lu_decomps`` and
``n_newton_iters``.
"""

from __future__ import annotations

from odecli.ode.implicit.auto import STEPPER as _AUTO
from odecli.ode.implicit.esdirk import STEPPERS as _ESDIRK
from odecli.ode.implicit.rosenbrock import STEPPERS as _ROSENBROCK
from odecli.ode.stepper import register

for _stepper in (*_ROSENBROCK.values(), *_ESDIRK.values(), _AUTO):
    register(_stepper)
