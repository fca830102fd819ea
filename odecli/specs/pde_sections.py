"""The declared sections of a ``kind: pde-inverse`` spec: keys, types, limits and defaults, once.

odecli.specs.pde reads each of these with :func:`odecli.specs.declare.read` and
odecli.specs.pde_schema describes them with :func:`odecli.specs.declare.schema`, so the
validator and the JSON Schema cannot drift apart. An empty (null) key reads as left out, as
it always has in pde-inverse specs. The geometry (sources, receivers), the models and the
unknown, whose keys depend on their ``type``, are declared in odecli.specs.pde_inputs;
:class:`PdeDocument` gathers every top-level key.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

import msgspec
from msgspec import Meta

from odecli.pde.propagator import EQUATIONS
from odecli.specs import pde_inputs as inputs
from odecli.specs.declare import Section, expected

Positive = Annotated[float, Meta(gt=0)]
NonNegative = Annotated[float, Meta(ge=0)]
Count = Annotated[int, Meta(ge=1)]
AutoOrCount = Annotated[Union[Literal["auto"], Count], expected("auto or a whole number >= 1")]
DEVICE_PATTERN = "^(cpu|cuda|auto|cuda:[0-9]+)$"


class Grid(Section, frozen=True):
    """the grid's nodes: shape [ny, nx] and spacing in metres (one number: the same in both)"""

    shape: Annotated[tuple[Annotated[int, Meta(ge=4)], Annotated[int, Meta(ge=4)]],
                     expected("[ny, nx], two whole numbers >= 4")]
    # a list, not a tuple: msgspec 0.23 crashes (segfault) converting to a union of a number and a tuple of them
    spacing: Annotated[Union[Positive, Annotated[list[Positive], Meta(min_length=2, max_length=2)]],
                       expected("a number > 0 or [dy, dx]")]


class Time(Section, frozen=True):
    """the time step (s), the number of steps, and (heat2d) the scheme; a steady equation has no time"""

    dt: Positive
    steps: Count
    # heat2d: implicit is backward Euler, one linear solve a step (settings: solver), stable for any dt
    scheme: Literal["explicit", "implicit"] = "explicit"


class Solver(Section, frozen=True):
    """the linear solver of a steady equation or an implicit scheme: preconditioned CG to a relative residual"""

    rtol: Annotated[float, Meta(gt=0, lt=1)] = 1e-10  # a relative residual: between 0 and 1
    max_iterations: Count = 500


class AcousticBoundary(Section, frozen=True):
    """acoustic2d and elastic2d: an absorbing layer on the sides (and the top unless free_surface)"""

    absorbing_width: Annotated[int, Meta(ge=0)] = 20
    absorbing_strength: Optional[Positive] = None
    free_surface: bool = False


class Observed(Section, frozen=True):
    """the observed data: synthesised from true_model (with noise), or read from a file"""

    noise: NonNegative = 0.0
    seed: int = 0
    file: Optional[str] = None
    dataset: str = "data/observed"


class Regularization(Section, frozen=True):
    """penalties on the unknown field"""

    tikhonov: NonNegative = 0.0
    tv: NonNegative = 0.0
    tv_epsilon: Positive = 1e-6


class ContinuationStage(Section, frozen=True):
    """one stage of frequency continuation: iterations on data low-passed at max_frequency (Hz)"""

    max_frequency: Positive  # the zero-phase Butterworth's -6 dB point (odecli.pde.filtering)
    iterations: Count


class Optimizer(Section, frozen=True, kw_only=True):
    """the optimiser; the same keys as an ODE fit's (odecli.optim.settings.OptimizerSettings), and
    a pde-inverse fit's frequency_continuation"""

    # L-BFGS by default, as in ODE fits: with its strong-Wolfe line search it beat Adam on the
    # bundled MLP unknowns (heat2d 0.24x vs 0.48x, acoustic 0.060x vs 0.083x) and on most of the
    # defaults sweep's problems (benchmarks/RESULTS.md)
    type: Literal["adam", "lbfgs"] = "lbfgs"
    # left out: scale-aware (Adam: 2 % of each unknown's range per step; L-BFGS: a first step of 5 %)
    learning_rate: Optional[Positive] = None
    iterations: Count
    tolerance: NonNegative = 0.0
    gtol: NonNegative = 0.0
    betas: Annotated[tuple[NonNegative, NonNegative], expected("[beta1, beta2], two numbers >= 0")] = (0.9, 0.999)
    history_size: Count = 10
    max_line_search: Count = 12
    line_search: Literal["strong_wolfe", "armijo"] = "strong_wolfe"
    schedule: Literal["none", "cosine", "step"] = "none"
    # L-BFGS on a grid unknown: its first inverse-Hessian guess smooths over this many cells (0: none)
    smoothing: Annotated[Union[Literal["auto"], NonNegative], expected("auto or a number of cells >= 0")] = "auto"
    # stages on low-passed data (rising max_frequency), each its own iterations, before
    # ``iterations`` on the full band; the optimiser restarts at each stage (a new misfit)
    frequency_continuation: Optional[list[ContinuationStage]] = None


class Loss(Section, frozen=True):
    """the misfit"""

    normalize: bool = True


class Parallel(Section, frozen=True):
    """ranks and halo exchanges"""

    proc_grid: Optional[Annotated[tuple[Count, Count], expected("[ranks in y, ranks in x]")]] = None
    exchange_every: AutoOrCount = "auto"


class Checkpoint(Section, frozen=True):
    """iterations between checkpoints (0: none)"""

    every: Annotated[int, Meta(ge=0)] = 0


class Compute(Section, frozen=True):
    """where and how the run computes"""

    dtype: Literal["float64", "float32"] = "float64"
    device: Annotated[str, expected("one of cpu, cuda, auto or cuda:N", pattern=DEVICE_PATTERN, extra={
        "message": "must be one of cpu, cuda, auto or cuda:N; got {value!r}"})] = "cpu"
    time_segments: AutoOrCount = "auto"
    threads: Annotated[int, Meta(ge=0)] = 0


def plain(section: Section) -> dict:
    """A read section as the plain dict (lists, not tuples) the run has always been given."""
    return msgspec.to_builtins(section)


class PdeDocument(Section, frozen=True, kw_only=True):
    """odecli PDE inverse spec (kind: pde-inverse)"""

    kind: Literal["pde-inverse"]
    name: Optional[str] = None
    description: Optional[str] = None
    equation: Literal[tuple(EQUATIONS)]  # type: ignore[valid-type]  # the registry's equations
    grid: Grid
    time: Optional[Time] = None  # required by every equation but the steady ones (which refuse it)
    solver: Optional[Solver] = None  # steady equations and implicit schemes only
    # AcousticBoundary or HeatBoundary, by equation (odecli.specs.pde reads the one, the schema states which)
    boundary: Optional[dict[str, Any]] = None
    sources: inputs.Sources
    receivers: inputs.Receivers
    # a model, or one per parameter ({vp: MODEL, vs: MODEL, rho: MODEL}; odecli.specs.pde_params)
    # (the schema adds that mapping form; msgspec declares no union of a model and a mapping of them)
    true_model: Optional[inputs.Model] = None
    observed: Observed = msgspec.field(default_factory=Observed)
    unknown: inputs.Unknown
    regularization: Regularization = msgspec.field(default_factory=Regularization)
    optimizer: Optimizer
    loss: Loss = msgspec.field(default_factory=Loss)
    parallel: Parallel = msgspec.field(default_factory=Parallel)
    checkpoint: Checkpoint = msgspec.field(default_factory=Checkpoint)
    compute: Compute = msgspec.field(default_factory=Compute)
    initial_condition: Optional[float] = None  # heat2d only; default 0
