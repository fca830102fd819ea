"""Explicit Runge–Kutta methods: Butcher tableaux, embedded error weights and dense output.

A method is data (:class:`ExplicitRK`); the batched loop in :mod:`odecli.ode.solver` runs any of
them. Conventions follow scipy's ``rk.py``: ``K`` holds the ``s`` stage derivatives followed by
``f(t1, y1)``, which every method computes because it is the next step's first stage (FSAL).
Error weights ``e`` and interpolation matrices ``P`` therefore have ``s + 1`` rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from odecli.ode import _dop853_coefficients as dop853

InterpolantKind = Literal["hermite", "polynomial", "dop853"]


@dataclass(frozen=True)
class ExplicitRK:
    """An explicit RK method.

    ``order`` is the order of the propagated solution. ``error_order`` is the order of the
    embedded solution (None for fixed-step methods); the controller's exponent is
    ``1 / (error_order + 1)``. Dense output: ``polynomial`` evaluates
    ``y0 + h * sum_i K_i * sum_j P[i, j] * theta**(j + 1)``; ``hermite`` is the cubic Hermite
    interpolant through (y0, f0) and (y1, f1); ``dop853`` is DOP853's own 7th-order interpolant.
    """

    name: str
    order: int
    c: tuple[float, ...]
    a: tuple[tuple[float, ...], ...]
    b: tuple[float, ...]
    error_order: int | None = None
    e: tuple[float, ...] | None = None
    interpolant: InterpolantKind = "hermite"
    p: tuple[tuple[float, ...], ...] | None = None
    description: str = ""

    @property
    def adaptive(self) -> bool:
        return self.e is not None

    @property
    def n_stages(self) -> int:
        return len(self.c)


def _tuple2(rows) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(x) for x in row) for row in rows)


def _tsit5_interpolation_matrix() -> tuple[tuple[float, ...], ...]:
    """Tsitouras' (2011) continuous-extension weights b_i(theta), expanded to power form.

    The paper gives each b_i as a product of factors; expanding them once at import keeps the
    published form visible here and lets the solver use the generic polynomial evaluator.
    """
    P = np.poly1d
    th = P([1.0, 0.0])
    polys = [
        -1.0530884977290216 * th * (th - 1.3299890189751412) * (th**2 - 1.4364028541716351 * th + 0.7139816917074209),
        0.1017 * th**2 * (th**2 - 2.1966568338249754 * th + 1.2949852507374631),
        2.490627285651252793 * th**2 * (th**2 - 2.38535645472061657 * th + 1.57803468208092486),
        -16.54810288924490272 * (th - 1.21712927295533244) * (th - 0.61620406037800089) * th**2,
        47.37952196281928122 * (th - 1.203071208372362603) * (th - 0.658047292653547382) * th**2,
        -34.87065786149660974 * (th - 1.2) * (th - 0.666666666666666667) * th**2,
        2.5 * (th - 1) * (th - 0.6) * th**2,
    ]
    rows = []
    for poly in polys:
        coeffs = poly.coeffs[::-1]  # ascending powers; constant term is zero
        coeffs = np.pad(coeffs, (0, 5 - len(coeffs)))
        rows.append(tuple(float(x) for x in coeffs[1:5]))
    return tuple(rows)


EULER = ExplicitRK("euler", 1, c=(0.0,), a=((),), b=(1.0,), description="forward Euler, order 1")
MIDPOINT = ExplicitRK("midpoint", 2, c=(0.0, 0.5), a=((), (0.5,)), b=(0.0, 1.0), description="explicit midpoint, order 2")
HEUN = ExplicitRK("heun", 2, c=(0.0, 1.0), a=((), (1.0,)), b=(0.5, 0.5), description="Heun (explicit trapezoid), order 2")
RK4 = ExplicitRK(
    "rk4", 4, c=(0.0, 0.5, 0.5, 1.0), a=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)),
    b=(1 / 6, 1 / 3, 1 / 3, 1 / 6), description="classic Runge–Kutta, order 4",
)

BOSH3 = ExplicitRK(
    "bosh3", 3, c=(0.0, 0.5, 0.75), a=((), (0.5,), (0.0, 0.75)), b=(2 / 9, 1 / 3, 4 / 9),
    error_order=2, e=(5 / 72, -1 / 12, -1 / 9, 1 / 8), interpolant="hermite",
    description="Bogacki–Shampine 3(2), FSAL, cubic Hermite dense output",
)

DOPRI5 = ExplicitRK(
    "dopri5", 5,
    c=(0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0),
    a=(
        (),
        (1 / 5,),
        (3 / 40, 9 / 40),
        (44 / 45, -56 / 15, 32 / 9),
        (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
        (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
    ),
    b=(35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84),
    error_order=4,
    e=(-71 / 57600, 0.0, 71 / 16695, -71 / 1920, 17253 / 339200, -22 / 525, 1 / 40),
    interpolant="polynomial",
    p=_tuple2([
        [1.0, -8048581381 / 2820520608, 8663915743 / 2820520608, -12715105075 / 11282082432],
        [0.0, 0.0, 0.0, 0.0],
        [0.0, 131558114200 / 32700410799, -68118460800 / 10900136933, 87487479700 / 32700410799],
        [0.0, -1754552775 / 470086768, 14199869525 / 1410260304, -10690763975 / 1880347072],
        [0.0, 127303824393 / 49829197408, -318862633887 / 49829197408, 701980252875 / 199316789632],
        [0.0, -282668133 / 205662961, 2019193451 / 616988883, -1453857185 / 822651844],
        [0.0, 40617522 / 29380423, -110615467 / 29380423, 69997945 / 29380423],
    ]),
    description="Dormand–Prince 5(4), FSAL, 4th-order dense output (Shampine)",
)

_TSIT5_B = (
    0.09646076681806522951816731316512876333711995238157997181903319145764851595234062815396,
    0.01,
    0.4798896504144995747752495322905965199130404621990332488332634944254542060153074523509,
    1.379008574103741893192274821856872770756462643091360525934940067397245698027561293331,
    -3.290069515436080679901047585711363850115683290894936158531296799594813811049925401677,
    2.324710524099773982415355918398765796109060233222962411944060046314465391054716027841,
)
_TSIT5_B_HAT = (
    0.09468075576583945807478876255758922856117527357724631226139574065785592789071067303271,
    0.009183565540343253096776363936645313759813746240984095238905939532922955247253608687270,
    0.4877705284247615707855642599631228241516691959761363774365216240304071651579571959813,
    1.234297566930478985655109673884237654035539930748192848315425833500484878378061439761,
    -2.707712349983525454881109975059321670689605166938197378763992255714444407154902012702,
    1.866628418170587035753719399566211498666255505244122593996591602841258328965767580089,
    1 / 66,
)
TSIT5 = ExplicitRK(
    "tsit5", 5,
    c=(0.0, 0.161, 0.327, 0.9, 0.9800255409045096857298102862870245954942137979563024768854764293221195950761080302604, 1.0),
    a=(
        (),
        (0.161,),
        (-0.008480655492356988544426874250230774675121177393430391537369234245294192976164141156943,
         0.3354806554923569885444268742502307746751211773934303915373692342452941929761641411569),
        (2.897153057105493432130432594192938764924887287701866490314866693455023795137503079289,
         -6.359448489975074843148159912383825625952700647415626703305928850207288721235210244366,
         4.362295432869581411017727318190886861027813359713760212991062156752264926097707165077),
        (5.325864828439256604428877920840511317836476253097040101202360397727981648835607691791,
         -11.74888356406282787774717033978577296188744178259862899288666928009020615663593781589,
         7.495539342889836208304604784564358155658679161518186721010132816213648793440552049753,
         -0.09249506636175524925650207933207191611349983406029535244034750452930469056411389539635),
        (5.861455442946420028659251486982647890394337666164814434818157239052507339770711679748,
         -12.92096931784710929170611868178335939541780751955743459166312250439928519268343184452,
         8.159367898576158643180400794539253485181918321135053305748355423955009222648673734986,
         -0.07158497328140099722453054252582973869127213147363544882721139659546372402303777878835,
         -0.02826905039406838290900305721271224146717633626879770007617876201276764571291579142206),
    ),
    b=_TSIT5_B,
    error_order=4,
    e=tuple(bi - bh for bi, bh in zip(_TSIT5_B + (0.0,), _TSIT5_B_HAT)),
    interpolant="polynomial",
    p=_tsit5_interpolation_matrix(),
    description="Tsitouras 5(4), FSAL, 4th-order dense output",
)

DOP853 = ExplicitRK(
    "dop853", 8,
    c=tuple(dop853.C),
    a=tuple(tuple(row[:i]) for i, row in enumerate(dop853.A)),
    b=tuple(dop853.B),
    error_order=7,
    e=tuple(dop853.E5),
    interpolant="dop853",
    description="Dormand–Prince 8(5,3), 7th-order dense output (3 extra stages when needed)",
)

METHODS: dict[str, ExplicitRK] = {m.name: m for m in (EULER, MIDPOINT, HEUN, RK4, BOSH3, DOPRI5, TSIT5, DOP853)}


def get_method(name: str) -> ExplicitRK:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; expected one of {', '.join(METHODS)}") from None
