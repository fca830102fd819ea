"""Events (issue 44) against independent references: analytic event times, scipy ``solve_ivp``
events at a 1e-12 reference, and scipy at the same rtol as the bar our error must clear.

The bar: at each rtol, our event times' largest error against the reference must be at most
``SLACK`` times scipy's own (RK45, the same Dormand-Prince pair, same rtol/atol), with a floor
at round-off, so a test fails when root finding or dense output is worse than scipy's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.integrate import solve_ivp
from scipy.optimize import brentq

import odecli
from odecli.ode.events import Event, crossings, locate

SLACK = 3.0  # our error <= SLACK * scipy's at the same rtol
FLOOR = 1e-12  # round-off of t ~ 10


def _scipy_events(fun, span, y0, event, rtol, atol, method="RK45"):
    result = solve_ivp(fun, span, y0, events=event, rtol=rtol, atol=atol, method=method)
    return result.t_events[0]


def test_locate_finds_a_root_of_a_polynomial_to_round_off():
    roots = torch.tensor([0.1, 0.5, 0.77, 1 / 3], dtype=torch.float64)

    def G(th):
        return (th - roots) * (1 + th ** 2)

    g0, g1 = G(torch.zeros(4, dtype=torch.float64)), G(torch.ones(4, dtype=torch.float64))
    theta = locate(G, g0, g1, torch.full((4,), 1e-15, dtype=torch.float64), torch.ones(4, dtype=torch.bool))
    assert torch.allclose(theta, roots, rtol=0, atol=4e-15)


def test_crossings_follow_direction_and_need_a_sign_change():
    g_old = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    g_new = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0], [1.0, -1.0, 0.0]])
    direction = torch.tensor([1.0, -1.0, 0.0])
    hit = crossings(g_old, g_new, direction)
    assert hit.tolist() == [[True, False, True], [False, True, True], [False, False, False]]


def _ball(t, y, p):
    return torch.stack([y[:, 1], -9.81 * torch.ones_like(y[:, 0])], dim=1)


def test_bouncing_ball_with_restitution_by_repeated_solves_matches_the_analytic_bounces():
    """Terminal ground event, then restart at h = 0 with v -> -0.8 v, per sample: three bounces."""
    g, e = 9.81, 0.8
    h0 = torch.tensor([10.0, 5.0, 1.0, 20.0, 0.3], dtype=torch.float64)
    v0 = torch.tensor([0.0, 2.0, -1.0, 0.0, 4.0], dtype=torch.float64)
    ground = Event(lambda t, y, p: y[:, 0], "falling", True, "ground")
    t, y = torch.zeros_like(h0), torch.stack([h0, v0], dim=1)
    found = []
    for _ in range(3):
        sol = odecli.solve(_ball, y, t, t + 100.0, events=[ground], rtol=1e-8, atol=1e-10)
        assert (sol.status == 5).all() and sol.success.all()
        found.append(sol.events["ground"].t[:, 0])
        assert torch.equal(sol.t_final, sol.events["ground"].t[:, 0])
        t, y = sol.t_final, torch.stack([torch.zeros_like(h0), -e * sol.y_final[:, 1]], dim=1)
    # analytic: first landing, then each flight lasts 2 * (speed after the bounce) / g
    first = (v0 + torch.sqrt(v0 ** 2 + 2 * g * h0)) / g
    speed = torch.sqrt(v0 ** 2 + 2 * g * h0)
    expected = [first, first + 2 * e * speed / g, first + 2 * e * speed / g + 2 * e * e * speed / g]
    for got, want in zip(found, expected):
        assert torch.allclose(got, want, rtol=1e-13, atol=1e-13)


def test_terminal_event_fills_later_output_times_with_nan_and_keeps_earlier_ones():
    y0 = torch.tensor([[10.0, 0.0]], dtype=torch.float64)
    grid = torch.linspace(0, 3, 7, dtype=torch.float64)
    sol = odecli.solve(_ball, y0, 0.0, 3.0, grid, events=[Event(lambda t, y, p: y[:, 0], -1, True)],
                       rtol=1e-10, atol=1e-10)
    t_hit = math.sqrt(2 * 10 / 9.81)
    before = grid <= t_hit
    assert torch.isnan(sol.y[0, ~before]).all()
    assert torch.allclose(sol.y[0, before, 0], 10 - 0.5 * 9.81 * grid[before] ** 2, atol=1e-9)
    assert abs(float(sol.t_final[0]) - t_hit) < 1e-12


def test_terminal_count_ends_at_the_nth_occurrence_and_records_every_one():
    """x = sin(t): falling zeros at pi, 3 pi, 5 pi; terminal 2 ends at 3 pi."""
    def f(t, y, p):
        return torch.stack([y[:, 1], -y[:, 0]], dim=1)

    y0 = torch.tensor([[0.0, 1.0], [0.0, 2.0]], dtype=torch.float64)
    falling = Event(lambda t, y, p: y[:, 0], "falling", 2, "zero")
    rising = Event(lambda t, y, p: y[:, 0], "rising", False, "up")
    sol = odecli.solve(f, y0, 0.0, 20.0, events=[falling, rising], rtol=1e-10, atol=1e-12)
    assert sol.events["zero"].count.tolist() == [2, 2]
    assert torch.allclose(sol.events["zero"].t, torch.tensor([[math.pi, 3 * math.pi]] * 2, dtype=torch.float64),
                          atol=1e-8)
    # the rising zero at 2 pi comes before the end; the one at 4 pi does not
    assert sol.events["up"].count.tolist() == [1, 1]
    assert torch.allclose(sol.t_final, torch.full((2,), 3 * math.pi, dtype=torch.float64), atol=1e-8)
    assert torch.allclose(sol.events["zero"].y[:, :, 0], torch.zeros(2, 2, dtype=torch.float64), atol=1e-8)


def _pendulum(t, y, p):
    return torch.stack([y[:, 1], -torch.sin(y[:, 0])], dim=1)


def test_pendulum_zero_crossings_over_many_samples_against_scipy_and_without_changing_steps():
    batch = 1000
    rng = np.random.default_rng(0)
    theta0 = rng.uniform(0.1, 2.5, batch)
    y0 = torch.tensor(np.stack([theta0, np.zeros(batch)], 1))
    rtol = atol = 1e-8
    both = Event(lambda t, y, p: y[:, 0], "both", False, "zero")
    sol = odecli.solve(_pendulum, y0, 0.0, 20.0, events=[both], rtol=rtol, atol=atol)
    plain = odecli.solve(_pendulum, y0, 0.0, 20.0, rtol=rtol, atol=atol)
    # events change no sample's steps
    assert torch.equal(sol.stats["n_steps"], plain.stats["n_steps"])
    assert torch.equal(sol.y_final, plain.y_final)
    record = sol.events["zero"]

    def event(t, y):
        return y[0]

    ours, theirs = [], []
    for i in range(0, batch, 50):  # a 1e-12 reference for every 50th sample
        fun = lambda t, y: [y[1], -math.sin(y[0])]  # noqa: E731
        ref = _scipy_events(fun, (0, 20), y0[i].numpy(), event, 1e-12, 1e-12, "DOP853")
        same = _scipy_events(fun, (0, 20), y0[i].numpy(), event, rtol, atol)
        n = int(record.count[i])
        assert n == len(ref) == len(same)
        assert torch.isnan(record.t[i, n:]).all()
        ours.append(np.abs(record.t[i, :n].numpy() - ref).max())
        theirs.append(np.abs(same - ref).max())
    assert max(ours) <= SLACK * max(max(theirs), FLOOR), (max(ours), max(theirs))


def _kepler(t, y, p):
    r3 = (y[:, 0] ** 2 + y[:, 1] ** 2) ** 1.5
    return torch.stack([y[:, 2], y[:, 3], -y[:, 0] / r3, -y[:, 1] / r3], dim=1)


def _periapsis(t, y, p):
    return y[:, 0] * y[:, 2] + y[:, 1] * y[:, 3]  # r . v: - to + at periapsis


@pytest.mark.parametrize("rtol", [1e-6, 1e-9])
def test_kepler_periapsis_times_are_multiples_of_the_period(rtol):
    """Start at apoapsis (r = a (1 + e), speed sqrt((1 - e) / (a (1 + e)))): periapsis at (k + 1/2) T."""
    ecc = np.array([0.1, 0.3, 0.5, 0.7])
    a = 1.0
    r_apo = a * (1 + ecc)
    speed = np.sqrt((1 - ecc) / (a * (1 + ecc)))
    y0 = torch.tensor(np.stack([r_apo, 0 * ecc, 0 * ecc, speed], 1))
    period = 2 * math.pi * a ** 1.5
    span = 3.2 * period
    sol = odecli.solve(_kepler, y0, 0.0, span, events=[Event(_periapsis, "rising", False, "peri")], rtol=rtol, atol=rtol)
    record = sol.events["peri"]
    assert record.count.tolist() == [3] * 4
    exact = (np.arange(3) + 0.5) * period
    ours = np.abs(record.t.numpy() - exact).max()

    def event(t, y):
        return y[0] * y[2] + y[1] * y[3]

    event.direction = 1

    def fun(t, y):
        r3 = (y[0] ** 2 + y[1] ** 2) ** 1.5
        return [y[2], y[3], -y[0] / r3, -y[1] / r3]

    theirs = max(np.abs(_scipy_events(fun, (0, span), y0[i].numpy(), event, rtol, rtol) - exact).max() for i in range(4))
    assert ours <= SLACK * max(theirs, FLOOR), (ours, theirs)


def test_stiff_threshold_under_method_auto_matches_the_analytic_crossing():
    """y' = -k (y - cos t), k = 1e4 (stiff); y = 0.5 falling, then rising: roots of the exact solution."""
    k = torch.tensor([1e3, 1e4], dtype=torch.float64)

    def f(t, y, p):
        return -p["k"][:, None] * (y - torch.cos(t)[:, None])

    def exact(t, kk, y0=2.0):
        steady = (kk * kk * np.cos(t) + kk * np.sin(t)) / (kk * kk + 1)
        c = y0 - kk * kk / (kk * kk + 1)
        return steady + c * np.exp(-kk * t)

    y0 = torch.full((2, 1), 2.0, dtype=torch.float64)
    threshold = Event(lambda t, y, p: y[:, 0] - 0.5, "both", False, "half")
    rtol = 1e-6
    sol = odecli.solve(f, y0, 0.0, 6.0, params={"k": k}, events=[threshold], method="auto", rtol=rtol, atol=1e-9)
    assert (sol.status == 0).all()
    for i, kk in enumerate(k.tolist()):
        roots = [brentq(lambda s: exact(s, kk) - 0.5, lo, hi, xtol=1e-15) for lo, hi in ((0.5, 2.0), (4.0, 5.5))]
        record = sol.events["half"]
        assert int(record.count[i]) == 2
        ours = np.abs(record.t[i].numpy() - roots).max()

        def event(t, y):
            return y[0] - 0.5

        theirs = np.abs(_scipy_events(lambda t, y: [-kk * (y[0] - math.cos(t))], (0, 6), [2.0], event, rtol, 1e-9,
                                      "Radau") - roots).max()
    assert ours <= SLACK * max(theirs, FLOOR), (ours, theirs)


def _line(t, y, p):
    return torch.ones_like(y)


def test_events_in_one_step_are_ordered_and_the_earliest_terminal_one_ends_the_sample():
    """x' = 1 from 0: one step covers both thresholds; the earlier terminal one wins, the later is dropped."""
    y0 = torch.zeros(2, 1, dtype=torch.float64)
    events = [Event(lambda t, y, p: y[:, 0] - 0.3, 1, True, "late"), Event(lambda t, y, p: y[:, 0] - 0.2, 1, True, "early"),
              Event(lambda t, y, p: y[:, 0] - 0.1, 1, False, "before")]
    grid = torch.tensor([0.0, 0.1, 0.2, 0.25, 1.0], dtype=torch.float64)
    sol = odecli.solve(_line, y0, 0.0, 1.0, grid, events=events, dt0=1.0)
    assert sol.stats["n_steps"].tolist() == [1, 1]  # one step holds every threshold
    assert sol.events["late"].count.tolist() == [0, 0] and sol.events["early"].count.tolist() == [1, 1]
    assert torch.allclose(sol.events["before"].t[:, 0], torch.full((2,), 0.1, dtype=torch.float64), atol=1e-15)
    assert torch.allclose(sol.t_final, torch.full((2,), 0.2, dtype=torch.float64), atol=1e-15)
    # output times up to the event (0.2 included) are filled, later ones are NaN
    assert torch.allclose(sol.y[:, :3, 0], grid[:3].expand(2, 3), atol=1e-15)
    assert torch.isnan(sol.y[:, 3:]).all() and (sol.status == 5).all()


def test_a_start_on_g_zero_is_no_event_and_direction_follows_the_integration():
    y0 = torch.zeros(1, 1, dtype=torch.float64)
    at_start = Event(lambda t, y, p: y[:, 0], 0, True, "start")  # g = 0 at t0, then > 0 going forward
    rising_in_t = Event(lambda t, y, p: t - 0.5, "rising", False, "half")
    sol = odecli.solve(_line, y0, 0.0, 1.0, events=[at_start, rising_in_t])
    assert sol.events["start"].count.tolist() == [0] and (sol.status == 0).all()
    assert sol.events["half"].count.tolist() == [1]
    back = odecli.solve(_line, y0, 1.0, 0.0, events=[rising_in_t])  # t - 0.5 falls when t runs backwards
    assert back.events["half"].count.tolist() == [0]


def test_event_time_gradients_follow_the_implicit_function_theorem():
    """Landing time t* = (v0 + sqrt(v0^2 + 2 g h0)) / g: its derivatives in g, h0 and v0, by autograd."""
    g = torch.tensor([9.81, 3.7, 1.6], dtype=torch.float64, requires_grad=True)
    h0 = torch.tensor([10.0, 5.0, 2.0], dtype=torch.float64, requires_grad=True)
    v0 = torch.tensor([0.0, 2.0, -1.0], dtype=torch.float64, requires_grad=True)

    def f(t, y, p):
        return torch.stack([y[:, 1], -p["g"] * torch.ones_like(y[:, 0])], dim=1)

    y0 = torch.stack([h0, v0], dim=1)
    grid = torch.tensor([0.0, 0.5, 10.0], dtype=torch.float64)
    sol = odecli.solve(f, y0, 0.0, 10.0, grid, params={"g": g},
                       events=[Event(lambda t, y, p: y[:, 0], -1, True, "ground")], rtol=1e-10, atol=1e-10)
    # output times share the step's interpolant with the events: their derivatives stay those at fixed t
    (dh,) = torch.autograd.grad(sol.y[:, 1, 0].sum(), (g,), retain_graph=True)
    assert torch.allclose(dh, torch.full((3,), -0.125, dtype=torch.float64), rtol=1e-9)
    t_hit = sol.events["ground"].t[:, 0]
    grads = torch.autograd.grad(t_hit.sum(), (g, h0, v0), retain_graph=True)
    with torch.no_grad():
        root = torch.sqrt(v0 ** 2 + 2 * g * h0)
        want = (-(v0 + root) / g ** 2 + h0 / (g * root), 1 / root, (1 + v0 / root) / g)
    for got, expected in zip(grads, want):
        assert torch.allclose(got, expected, rtol=1e-9, atol=1e-12), (got, expected)
    # the state at the event moves with it: the landing speed is -sqrt(v0^2 + 2 g h0)
    (dv,) = torch.autograd.grad(sol.y_final[:, 1].sum(), (h0,))
    assert torch.allclose(dv, -g.detach() / root, rtol=1e-9)


def test_zero_crossing_time_gradient_matches_finite_differences():
    k = torch.tensor([0.7, 1.3], dtype=torch.float64, requires_grad=True)
    y0 = torch.tensor([[1.0, 0.0], [2.0, 0.3]], dtype=torch.float64)

    def f(t, y, p):
        return torch.stack([y[:, 1], -p["k"] * torch.sin(y[:, 0])], dim=1)

    zero = [Event(lambda t, y, p: y[:, 0], 0, 2, "zero")]
    sol = odecli.solve(f, y0, 0.0, 30.0, params={"k": k}, events=zero, rtol=1e-11, atol=1e-11)
    (grad,) = torch.autograd.grad(sol.events["zero"].t[:, 1].sum(), (k,))
    step = 1e-5
    with torch.no_grad():
        up = odecli.solve(f, y0, 0.0, 30.0, params={"k": k + step}, events=zero, rtol=1e-12, atol=1e-12)
        down = odecli.solve(f, y0, 0.0, 30.0, params={"k": k - step}, events=zero, rtol=1e-12, atol=1e-12)
    fd = (up.events["zero"].t[:, 1] - down.events["zero"].t[:, 1]) / (2 * step)
    assert torch.allclose(grad, fd, rtol=1e-5), (grad, fd)
