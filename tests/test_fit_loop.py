"""The one fit loop and its optimisers on small synthetic objectives: convergence, bounds, the
stop reasons, history rows, and a resume from a checkpoint that continues bit for bit."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from odecli.app import checkpoint as ckpt
from odecli.app.fit import FitSettings, Stop, run_fit
from odecli.optim import Box, OptimizerSettings, Space, make_optimizer
from odecli.parallel.comm import get_comm

TARGET = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
SCALE = torch.tensor([1.0, 4.0, 0.5, 2.0], dtype=torch.float64)


class Quadratic:
    """f(x) = sum(scale * (x - target)^2); ``fail_at``: evaluations from this count on fail."""

    def __init__(self, x: torch.Tensor, fail_at: int | None = None) -> None:
        self.x, self.fail_at, self.n_evals = x, fail_at, 0
        self.saved: list[int] = []
        self.save_hook = None

    def evaluate(self, completed: int):
        self.n_evals += 1
        if self.fail_at is not None and self.n_evals >= self.fail_at:
            return math.inf, None
        d = self.x - TARGET
        return float(torch.sum(SCALE * d * d)), [2.0 * SCALE * d]

    def columns(self) -> dict[str, float]:
        return {"n_evals": self.n_evals}

    def save(self, iteration, f, g, history) -> None:
        self.saved.append(iteration)
        if self.save_hook is not None:
            self.save_hook(iteration, f, g, history)


def _fit(kind: str, iterations: int, lr: float, box: Box | None = None, **settings):
    x = torch.zeros(4, dtype=torch.float64)
    space = Space(None, [False])
    opt = make_optimizer(OptimizerSettings(kind, lr, iterations, 0.0), [x], space, bounds=box)
    objective = Quadratic(x)
    outcome = run_fit(objective, opt, space, FitSettings(iterations, settings.pop("tolerance", 0.0), **settings),
                      history_columns=("n_evals",))
    return x, outcome, objective


@pytest.mark.parametrize("kind,lr,iterations", [("adam", 0.1, 400), ("lbfgs", 1.0, 50)])
def test_both_optimisers_minimise_a_quadratic(kind, lr, iterations):
    x, outcome, _ = _fit(kind, iterations, lr, tolerance=1e-14)
    assert torch.allclose(x, TARGET, atol=1e-3 if kind == "adam" else 1e-8), x
    rows = len(outcome.history["loss"])
    assert rows == outcome.iterations + 1 and outcome.history["loss"][-1] < outcome.history["loss"][0]
    assert all(len(v) == rows for v in outcome.history.values())


@pytest.mark.parametrize("kind,lr", [("adam", 0.1), ("lbfgs", 1.0)])
def test_a_box_keeps_every_point_inside_the_bounds(kind, lr):
    lower = torch.full((4,), -1.0, dtype=torch.float64)
    upper = torch.full((4,), 2.0, dtype=torch.float64)
    x, _, _ = _fit(kind, 60, lr, box=Box([lower], [upper]))
    assert bool(((x >= lower) & (x <= upper)).all())
    assert torch.allclose(x, TARGET.clamp(-1.0, 2.0), atol=0.05)


def test_the_last_point_is_neither_recorded_nor_tested_when_the_kind_says_so():
    _, outcome, objective = _fit("adam", 5, 0.1, record_final=False)
    assert outcome.stop is Stop.ITERATIONS and outcome.iterations == 5
    assert len(outcome.history["loss"]) == 5 and objective.n_evals == 5  # no evaluation after the last step


def test_a_point_that_cannot_be_evaluated_ends_the_fit_at_the_one_before():
    x = torch.zeros(4, dtype=torch.float64)
    space = Space(None, [False])
    opt = make_optimizer(OptimizerSettings("adam", 0.1, 10, 0.0), [x], space)
    objective = Quadratic(x, fail_at=4)  # the start and two iterations evaluate, the third fails
    outcome = run_fit(objective, opt, space, FitSettings(10, 0.0), history_columns=("n_evals",), may_fail=True)
    assert outcome.stop is Stop.FAILED and outcome.iterations == 2 and len(outcome.history["loss"]) == 3
    d = x - TARGET
    assert float(torch.sum(SCALE * d * d)) == outcome.history["loss"][-1]  # the parameters of point 2


def test_a_zero_gradient_at_the_start_stops_before_any_step():
    x = TARGET.clone()
    space = Space(None, [False])
    opt = make_optimizer(OptimizerSettings("lbfgs", 1.0, 10, 0.0), [x], space)
    outcome = run_fit(Quadratic(x), opt, space, FitSettings(10, 0.0), history_columns=("n_evals",))
    assert outcome.stop is Stop.GRADIENT and outcome.iterations == 0


@pytest.mark.parametrize("kind,lr", [("adam", 0.1), ("lbfgs", 1.0)])
def test_a_fit_resumed_from_its_checkpoint_ends_bit_for_bit_as_an_uninterrupted_one(tmp_path: Path, kind, lr):
    comm = get_comm()
    settings = OptimizerSettings(kind, lr, 8, 0.0)

    def start():
        x = torch.zeros(4, dtype=torch.float64)
        space = Space(None, [False])
        return x, space, make_optimizer(settings, [x], space)

    x_full, space, opt = start()
    full = run_fit(Quadratic(x_full), opt, space, FitSettings(8, 0.0), history_columns=("n_evals",))

    path = tmp_path / "fit.ckpt.h5"
    layout = ckpt.Layout(comm, [False])
    x, space, opt = start()
    objective = Quadratic(x)

    def save(iteration, f, g, history):
        ckpt.save(path, layout, kind="test-checkpoint", spec_text="spec", iteration=iteration, f=f, g=g, opt=opt,
                  history=history)
        if iteration == 4:
            raise KeyboardInterrupt  # killed right after the checkpoint of iteration 4

    objective.save_hook = save
    with pytest.raises(KeyboardInterrupt):
        run_fit(objective, opt, space, FitSettings(8, 0.0, checkpoint_every=2), history_columns=("n_evals",))

    x, space, opt = start()
    saved = ckpt.load(path, layout, kind="test-checkpoint", spec_text="spec", opt=opt,
                      history_keys=("loss", "grad_norm", "wall_time_s", "n_evals"))
    assert saved.iteration == 4 and len(saved.history["loss"]) == 5
    resumed = run_fit(Quadratic(x), opt, space, FitSettings(8, 0.0), history_columns=("n_evals",), resumed=saved)
    assert torch.equal(x, x_full)
    assert resumed.history["loss"] == full.history["loss"]
    assert resumed.history["grad_norm"] == full.history["grad_norm"]
    assert (resumed.stop, resumed.iterations) == (full.stop, full.iterations)


class Scripted:
    """An objective whose loss and gradient are given by a function of the evaluation count."""

    def __init__(self, x: torch.Tensor, fn) -> None:
        self.x, self.fn, self.n_evals = x, fn, 0

    def evaluate(self, completed: int):
        self.n_evals += 1
        return self.fn(self.n_evals, self.x)

    def columns(self) -> dict[str, float]:
        return {}

    def save(self, iteration, f, g, history) -> None:
        pass


def _scripted_fit(kind: str, lr, fn, iterations: int = 40):
    x = torch.zeros(2, dtype=torch.float64)
    space = Space(None, [False])
    opt = make_optimizer(OptimizerSettings(kind, lr, iterations, 0.0, line_search="strong_wolfe"), [x], space)
    return run_fit(Scripted(x, fn), opt, space, FitSettings(iterations, 0.0), history_columns=())


def test_a_loss_that_keeps_rising_ends_the_fit_with_a_suggestion():
    from odecli.app.fit import RISING_PATIENCE

    # the gradient points away from the minimum: every Adam step raises the loss
    out = _scripted_fit("adam", 0.5, lambda n, x: (float(torch.sum(x * x)) + 1.0, [-2.0 * x - 1.0]))
    assert out.stop is Stop.RISING and out.iterations == RISING_PATIENCE
    assert "rose for 10 iterations" in out.message and "optimizer.learning_rate: 0.05" in out.message
    assert "\n" not in out.message


def test_a_non_finite_gradient_ends_the_fit_with_a_suggestion():
    def fn(n, x):
        g = 2.0 * (x - 1.0)
        return float(torch.sum((x - 1.0) ** 2)), [g if n < 4 else g * math.nan]

    out = _scripted_fit("adam", None, fn)
    assert out.stop is Stop.NON_FINITE and out.iterations == 3
    assert "not finite at iteration 3" in out.message


def test_a_failed_line_search_says_where_and_what_to_try():
    # a gradient of the wrong sign: no point along -g lowers the loss
    out = _scripted_fit("lbfgs", None, lambda n, x: (float(torch.sum((x - 1.0) ** 2)), [2.0 * (1.0 - x) + 0.0]))
    assert out.stop is Stop.LINE_SEARCH and out.iterations == 0
    assert out.message.startswith("line search failed at iteration 1:") and "% of its scale" in out.message


@pytest.mark.parametrize("scale", [1e-4, 1.0, 2000.0])
def test_without_a_learning_rate_lbfgs_finds_its_own_step_at_any_scale(scale):
    """A quadratic whose minimum and curvature scale with the unknown's range: strong-Wolfe L-BFGS
    with the scale-aware first step converges alike, with no learning rate."""
    x = torch.full((4,), 0.5 * scale, dtype=torch.float64)
    target = TARGET * scale

    def fn(n, x):
        d = (x - target) / scale
        return float(torch.sum(SCALE * d * d)), [2.0 * SCALE * d / scale]

    space = Space(None, [False])
    opt = make_optimizer(OptimizerSettings("lbfgs", None, 30, 0.0, line_search="strong_wolfe"), [x], space,
                         scales=[scale])
    out = run_fit(Scripted(x, fn), opt, space, FitSettings(30, 1e-14), history_columns=())
    assert out.stop in (Stop.LOSS_CHANGE, Stop.GRADIENT), out
    assert torch.allclose(x / scale, TARGET, atol=1e-6), x


@pytest.mark.parametrize("scale", [1e-4, 2000.0])
def test_without_a_learning_rate_adam_steps_relative_to_the_scale(scale):
    x = torch.zeros(4, dtype=torch.float64)
    target = TARGET * scale

    def fn(n, x):
        d = (x - target) / scale
        return float(torch.sum(SCALE * d * d)), [2.0 * SCALE * d / scale]

    space = Space(None, [False])
    opt = make_optimizer(OptimizerSettings("adam", None, 300, 0.0, schedule="cosine"), [x], space,
                         scales=[4.0 * scale])  # the range the values span
    run_fit(Scripted(x, fn), opt, space, FitSettings(300, 0.0), history_columns=())
    assert torch.allclose(x / scale, TARGET, atol=2e-2), x / scale


def test_the_schedules_start_at_one_and_decay():
    from odecli.optim.adam import COSINE_FLOOR, schedule_factor

    assert [schedule_factor("none", t, 100) for t in (1, 100)] == [1.0, 1.0]
    assert schedule_factor("cosine", 1, 100) == 1.0 and schedule_factor("cosine", 100, 100) == pytest.approx(COSINE_FLOOR)
    assert [schedule_factor("step", t, 100) for t in (1, 30, 60, 100)] == [1.0, 0.5, 0.25, 0.125]


def test_a_line_search_at_the_loss_floor_is_convergence_not_failure():
    """Once the gradient has fallen to FLOOR_GRADIENT of its first norm, a line search that finds
    no lower loss has met the loss's precision (a quartic known to 1e-9 here): the fit converged."""
    def fn(n, x):
        d = x - torch.tensor([1.0, -2.0], dtype=x.dtype)
        return round(float(torch.sum(d**4 + 0.5 * d * d * d.flip(0) ** 2)) + 1.0, 9), [4 * d**3 + 2 * d * d.flip(0) ** 2]

    out = _scripted_fit("lbfgs", None, fn)
    assert out.stop is Stop.NO_DECREASE and out.message == ""
    assert out.history["grad_norm"][-1] <= 1e-4 * out.history["grad_norm"][0]


def test_a_signal_whose_exception_was_swallowed_stops_the_fit(monkeypatch):
    """A signal recorded but swallowed on the way (raised inside a finaliser, as during an
    import's lock callback): the next iteration raises it, so no rank fits on regardless."""
    from odecli import interrupts

    monkeypatch.setattr(interrupts, "_received", None)
    x = torch.zeros(4, dtype=torch.float64)
    space = Space(None, [False])
    opt = make_optimizer(OptimizerSettings("adam", 0.1, 10, 0.0), [x], space)
    objective = Quadratic(x)
    real = objective.evaluate

    def evaluate_then_signal(completed):
        if completed == 2:  # the handler ran, and its exception was lost
            try:
                interrupts._raise(15, None)
            except interrupts.Interrupted:
                pass
        return real(completed)

    objective.evaluate = evaluate_then_signal
    with pytest.raises(interrupts.Interrupted):
        run_fit(objective, opt, space, FitSettings(10, 0.0), history_columns=("n_evals",))
    assert objective.n_evals == 3  # the starting point, then iterations 1 and 2
