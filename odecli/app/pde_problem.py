"""Assemble a validated spec into a distributed forward problem + objective on one rank.

The physics comes from the spec's equation through :data:`odecli.pde.propagator.EQUATIONS`:
its module builds the propagator and words the stability limit and the coefficient's sign rule.
An equation with several parameters (elastic2d) gets them stacked ``(P, ny, nx)`` in its
``PARAMETERS`` order (:meth:`Problem.coefficient`: the inverted ones from the unknown, the others
fixed); a steady one's data ``(experiments, sensors)`` are held with a time axis of one, so the
misfit, the all-reduces and the files treat every equation alike.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from odecli.errors import InputError, SpecError
from odecli.io.model_files import read_array, read_wavelet, with_model_arrays
from odecli.parallel.decomposition import decompose
from odecli.parallel.ops import allreduce_sum, broadcast, halo_exchange
from odecli.pde import models, stability
from odecli.pde.filtering import lowpass
from odecli.pde.grid import Block, Grid
from odecli.pde.propagator import EQUATIONS, Setup, SetupError
from odecli.pde.sources import Geometry, ricker
from odecli.pde.timing import CommTimer
from odecli.pde.unknowns import StackedUnknown, make_unknown
from odecli.app.solve import resolve_device
from odecli.specs.pde_checks import limited
from odecli.app.pde_settings import equation_settings, not_converged


def collective(exc: Exception) -> Exception:
    """Mark an error that every rank raises at the same point (no abort needed)."""
    exc.collective = True  # type: ignore[attr-defined]
    return exc


def _dtype(name: str):
    return torch.float64 if name == "float64" else torch.float32


def _device(name: str, rank: int, file: str) -> torch.device:
    """``compute.device`` as a torch device: ``auto`` is CUDA when present, else the CPU (as in
    ODE specs), and a plain ``cuda`` spreads the ranks over the GPUs: ``rank`` is the rank's
    index among the ranks on its node (as ``odecli solve`` uses it), since a node sees only its
    own GPUs. Asking for a GPU that is not
    there is the user's error, reported as the ODE path words it, not a silent run on the CPU."""
    try:
        device = resolve_device(name)
    except InputError as exc:
        raise SpecError(file, "compute.device", str(exc)) from None
    if device.type != "cuda":
        return device
    count = torch.cuda.device_count()
    if device.index is None:
        return torch.device(f"cuda:{rank % count}")
    if device.index >= count:
        raise SpecError(file, "compute.device", f"{name} requested but only {count} CUDA "
                                                f"device(s) are visible")
    return device


def build_wavelet(spec: dict, nt: int, dt: float, base_dir: Path, file: str) -> np.ndarray:
    w = spec["sources"]["wavelet"]
    if w["type"] == "ricker":
        return ricker(w["peak_frequency"], nt, dt, w["delay"])
    if w["type"] == "constant":
        return np.full(nt, w["value"], dtype=np.float64)
    if w["type"] == "array":
        vals = np.asarray(w["values"], dtype=np.float64)
    else:
        path = Path(w["path"])
        path = path if path.is_absolute() else base_dir / path
        vals = read_wavelet(path, file=file)
    out = np.zeros(nt)
    out[: min(nt, vals.size)] = vals[:nt]
    return out


def kernel_threads(requested: int, ranks: int) -> int:
    """Threads per rank for the fused kernels: ``compute.threads``, else torch's thread count
    shared by the ranks (``mpirun -n 2`` on 2 cores: one each)."""
    return requested if requested > 0 else max(1, torch.get_num_threads() // ranks)


# The spec field that gives the unknown's starting field, for error messages.
_UNKNOWN_FIELD = {"grid": "unknown.initial", "mlp": "unknown", "scalars": "unknown.model"}


class Problem:
    def __init__(self, spec: dict, comm, timer: CommTimer | None = None) -> None:
        self.spec, self.comm = spec, comm
        self.timer = timer if timer is not None else CommTimer()
        file = spec["file"]
        self.dtype = _dtype(spec["compute"]["dtype"])
        self.device = self._agreed_device(spec["compute"]["device"], file)
        ny, nx = spec["grid"]["shape"]
        dy, dx = spec["grid"]["spacing"]
        self.grid = grid = Grid(ny, nx, dy, dx)
        pg = spec["parallel"]["proc_grid"]
        if pg is not None and pg[0] * pg[1] != comm.size:
            raise collective(SpecError(file, "parallel.proc_grid",
                                       f"{pg[0]}x{pg[1]} does not match {comm.size} MPI ranks"))
        try:
            self.decomp = decompose((ny, nx), comm.size, comm.rank,
                                    proc_grid=tuple(pg) if pg is not None else None)
        except ValueError as exc:
            raise collective(SpecError(file, "parallel.proc_grid", str(exc))) from None
        self.block = block = Block.of(self.decomp)
        if min(block.shape) < 2:
            raise collective(SpecError(file, "grid.shape",
                                       f"too small for {comm.size} ranks (a block has "
                                       f"{block.shape[0]}x{block.shape[1]} nodes; need >= 2x2)"))
        dt, nt = spec["time"]["dt"], spec["time"]["steps"]
        self.dt, self.nt = dt, nt
        self.parameters = list(spec["parameters"])
        self.multi = len(self.parameters) > 1  # coefficient (P, ny, nx) in the equation's order
        self.steady = spec["steady"]  # traces (shots, receivers): held here with a time axis of 1
        base = spec["base_dir"]
        wavelet = build_wavelet(spec, nt, dt, base, file)
        amp = spec["sources"]["amplitude"]
        shots = [[(*grid.snap(p), amp) for p in shot] for shot in spec["sources"]["shots"]]
        recs = [grid.snap(p) for p in spec["receivers"]["points"]]
        self.geometry = Geometry(shots, recs, wavelet)
        self.lgeom = self.geometry.local(block, self.device, self.dtype)
        self.equation = EQUATIONS[spec["equation"]]
        try:
            settings = equation_settings(spec)
        except SpecError as exc:  # the same on every rank
            raise collective(exc) from None
        setup = Setup(grid=grid, block=block, decomp=self.decomp, comm=comm, dt=dt, nt=nt,
                      geometry=self.geometry, local=self.lgeom, boundary=spec["boundary"],
                      initial_condition=spec.get("initial_condition"),
                      time_segments=spec["compute"]["time_segments"],
                      threads=kernel_threads(spec["compute"]["threads"], comm.size),
                      exchange_every=spec["parallel"]["exchange_every"], timer=self.timer,
                      dtype=self.dtype, device=self.device, **settings)
        try:
            self.prop = self.equation.build(setup)
        except SetupError as exc:  # every rank raises it at the same point
            raise collective(SpecError(file, exc.field, str(exc))) from None
        # Whether the time loop runs on compiled kernels: the same on every rank.
        self.fused = bool(self.prop.fused)
        # a steady equation and an implicit scheme are stable for any step
        solves = spec["time"]["scheme"] in ("steady", "implicit")
        if spec["time"]["scheme"] == "implicit" and math.isfinite(self.prop.stability_limit()):
            raise collective(SpecError(file, "time.scheme", f"this build's {spec['equation']} propagator "
                                                            f"steps explicitly only"))
        self.limit = math.inf if solves else self.prop.stability_limit()
        if self.multi:
            self._build_parameters(spec, base, file)
        else:
            unknown = dict(spec["unknown"])
            for key in ("initial", "model"):
                if key in unknown:
                    unknown[key] = with_model_arrays(unknown[key], base, file=file, field=f"unknown.{key}")
            self.unknown = make_unknown(unknown, grid, block, self.dtype, self.device, base)
            self.true_local = None
            if spec["true_model"] is not None:
                self.true_local = self._evaluate(spec["true_model"], "true_model")
        self._check_stability()
        self.observed = self._observed()  # (shots, nrec, nt), identical on every rank
        obs_local = self.observed[:, self.lgeom.rec_ids, :]
        self.obs_local = obs_local
        self.max_frequency: float | None = None  # a frequency-continuation stage's low-pass (Hz)
        self.norm = self._norm()
        self.last: dict = {}
        self.iterations: list[int] = []  # the linear solves' iterations in the last evaluation

    def _evaluate(self, model: dict, field: str) -> torch.Tensor:
        """A model on this rank's block (a file's array read first); a bad file is the spec's error."""
        base, file = self.spec["base_dir"], self.spec["file"]
        try:
            return models.evaluate(with_model_arrays(model, base, file=file, field=field), self.grid, self.block,
                                   self.dtype, self.device, base_dir=base)
        except (OSError, ValueError, KeyError) as exc:
            raise collective(SpecError(file, field, str(exc))) from None

    def _build_parameters(self, spec: dict, base: Path, file: str) -> None:
        """Several parameters: the inverted ones one :class:`StackedUnknown`, the others fixed
        fields, the true models stacked ``(P, ny, nx)`` where every one is known."""
        per = {}
        for name, one in spec["unknown"]["parameters"].items():
            one = dict(one)
            for key in ("initial", "model"):
                if one.get(key) is not None:
                    one[key] = with_model_arrays(one[key], base, file=file, field=f"unknown.parameters.{name}.{key}")
            per[name] = one
        self.inverted = list(per)
        self.unknown = StackedUnknown(per, self.grid, self.block, self.dtype, self.device, base)
        self.fixed_local = {name: self._evaluate(m, f"unknown.fixed.{name}")
                            for name, m in spec["unknown"]["fixed"].items()}
        truths = spec["true_models"]
        self.true_fields = {name: None if m is None else self._evaluate(m, f"true_model.{name}")
                            for name, m in truths.items()}
        known = all(v is not None for v in self.true_fields.values())
        self.true_local = torch.stack([self.true_fields[n] for n in self.parameters]) if known else None

    def coefficient(self, field: torch.Tensor) -> torch.Tensor:
        """What the propagator takes: the unknown's field, or (several parameters) every
        parameter stacked ``(P, ny, nx)`` in the equation's order, the fixed ones as they are."""
        if not self.multi:
            return field
        inverted = dict(zip(self.inverted, field.unbind(0)))
        return torch.stack([inverted[n] if n in inverted else self.fixed_local[n] for n in self.parameters])

    def forward(self, coefficient: torch.Tensor) -> torch.Tensor:
        """The propagator's traces with a time axis (a steady equation's: one 'step')."""
        traces = self.prop.forward(coefficient)
        return traces.unsqueeze(-1) if self.steady else traces

    def _agreed_device(self, name: str, file: str) -> torch.device:
        """The rank's device; if any rank lacks it, every rank raises (none waits for another)."""
        error = None
        try:
            device = _device(name, self.comm.node_rank_and_size()[0], file)
        except SpecError as exc:
            error = exc
        if not self._everywhere(error is None):
            raise collective(error or SpecError(file, "compute.device",
                                                f"{name!r} is not available on every rank"))
        return device

    def engine(self) -> str:
        """What runs the time loop, for result files and ``odecli stats``."""
        return self.prop.engine()

    def _everywhere(self, flag: bool) -> bool:
        if self.comm.size == 1:
            return flag
        return self.comm.allreduce_scalar(1.0 if flag else 0.0, op="min") > 0

    # ------------------------------------------------------------------ checks
    def _what(self) -> str:
        return self.equation.QUANTITY

    def _limit_text(self) -> str:
        return self.equation.limit_text(self.limit, self.dt)

    def global_max(self, local: torch.Tensor) -> float:
        v = float(local.detach().max())
        return self.comm.allreduce_scalar(v, op="max") if self.comm.size > 1 else v

    def _check_stability(self) -> None:
        file = self.spec["file"]
        if self.multi:
            self._check_parameters()
        with torch.no_grad():
            start = self.coefficient(self.unknown.field())
            if not self.multi:
                fields = [("true_model", self.true_local), (_UNKNOWN_FIELD[self.spec["unknown"]["type"]], start)]
                self._check_sign([(name, f) for name, f in fields if f is not None])
        true_field, unknown_field, bounds_field = limited(self.spec)
        checks = []
        first = self.parameters[0]
        truth = self.true_local if not self.multi else self.true_fields[first]
        if truth is not None:
            checks.append((true_field, self.global_max(truth)))
        checks.append((unknown_field, self.global_max(start[0] if self.multi else start)))
        hi = self.unknown.transform.max_value if not self.multi or first in self.inverted else None
        if hi is not None:
            checks.append((bounds_field, float(hi)))
        for field, v in checks:
            if v > self.limit:
                raise collective(SpecError(file, "time.dt", stability.unstable(
                    self.spec["equation"], field, v, self.limit, self.dt)))

    def _check_parameters(self) -> None:
        """Several parameters: the equation's rules between them (``check_parameters`` of each
        parameter's global smallest and largest value) on the true and the starting fields, which
        the spec's check cannot see inside files or an MLP; a NaN anywhere is refused too."""
        with torch.no_grad():
            start = self.coefficient(self.unknown.field())
        sets = [("unknown", start)]
        if self.true_local is not None:
            sets.insert(0, ("true_model", self.true_local))
        for field, stacked in sets:
            low = {n: self._global(float(f.min()), "min") for n, f in zip(self.parameters, stacked)}
            high = {n: self._global(float(f.max()), "max") for n, f in zip(self.parameters, stacked)}
            for (a, fa) in zip(self.parameters, stacked):  # the pointwise differences rules need
                for (b, fb) in zip(self.parameters, stacked):
                    if a != b:
                        high[f"{a} - {b}"] = self._global(float((fa - fb).max()), "max")
            bad = [n for n in self.parameters if not (math.isfinite(low[n]) and math.isfinite(high[n]))]
            bad = self._global(float(bool(bad)), "max") > 0
            problem = ("a parameter field is not finite everywhere" if bad
                       else self.equation.check_parameters(low, high))
            if problem is not None:
                raise collective(SpecError(self.spec["file"], field, problem))

    def _global(self, v: float, op: str) -> float:
        return self.comm.allreduce_scalar(v, op=op) if self.comm.size > 1 else v

    def _check_sign(self, fields: list[tuple[str, torch.Tensor]]) -> None:
        """The equation's sign rule (wave speed > 0, conductivity >= 0) over the evaluated
        fields: the spec's check (odecli.specs.pde) cannot see inside files, and a negative
        speed would run silently."""
        least = self.equation.LEAST
        for name, field in fields:
            low = float(field.detach().min())  # NaN if any node is NaN
            bad = not math.isfinite(low) or self.equation.violates_sign(low)
            if self.comm.size > 1:  # a flag, since MPI's min of a NaN is undefined
                bad = self.comm.allreduce_scalar(float(bad), op="max") > 0
                low = self.comm.allreduce_scalar(low, op="min")
            if bad:
                raise collective(SpecError(self.spec["file"], name,
                                           f"{self._what()} must be {least} everywhere, "
                                           f"got {low:g} (the field's minimum)"))

    def _observed(self) -> torch.Tensor:
        spec = self.spec
        o = spec["observed"]
        g = self.geometry
        shape = (g.nshots, g.nrec) if self.steady else (g.nshots, g.nrec, self.nt)
        if o["file"] is not None:
            path = Path(o["file"])
            path = path if path.is_absolute() else spec["base_dir"] / path
            arr = read_array(path, o["dataset"], file=spec["file"], field="observed.file")
            if arr.shape != shape:
                axes = "(experiments, sensors)" if self.steady else "(shots, receivers, steps)"
                raise collective(SpecError(spec["file"], "observed.dataset",
                                           f"shape {arr.shape} does not match {axes} = {shape}"))
            arr = arr[..., None] if self.steady else arr
            return torch.as_tensor(arr, dtype=self.dtype, device=self.device)
        with torch.no_grad(), self.solves():
            full = self.full_traces(self.forward(self.true_local))
        if o["noise"] > 0:
            arr = full.cpu().numpy().astype(np.float64)
            rms = float(np.sqrt(np.mean(arr**2)))
            rng = np.random.default_rng(o["seed"])
            arr = arr + o["noise"] * rms * rng.standard_normal(arr.shape)
            full = torch.as_tensor(arr, dtype=self.dtype, device=self.device)
        return full

    def set_band(self, max_frequency: float | None) -> None:
        """Fit data low-passed at ``max_frequency`` Hz from now on (None: the full band). The
        misfit is then normalised by the low-passed observed data's energy, so that it starts
        near the full band's size and the regularisation keeps its weight against it."""
        self.max_frequency = max_frequency
        self.norm = self._norm()

    def _band(self, traces: torch.Tensor) -> torch.Tensor:
        """``traces`` low-passed to the current stage's band (as they are on the full band)."""
        if self.max_frequency is None:
            return traces
        return lowpass(traces, self.dt, self.max_frequency)

    def _norm(self) -> float:
        if not self.spec["loss"]["normalize"]:
            return 1.0
        observed = self._band(self.observed)
        norm = float((observed * observed).sum())
        return norm if norm > 0 else 1.0

    # ------------------------------------------------------------------ pieces
    def full_traces(self, local_traces: torch.Tensor) -> torch.Tensor:
        """All receivers' traces on every rank (zero-padded all-reduce: exact)."""
        full = self.lgeom.scatter_traces(local_traces.detach())
        if self.comm.size > 1:
            full = allreduce_sum(full, self.comm)
        return full

    def full_misfit(self, local_mis: torch.Tensor) -> torch.Tensor:
        b = local_mis.shape[0]
        full = local_mis.new_zeros((b, self.lgeom.nrec))
        full[:, self.lgeom.rec_ids] = local_mis.detach()
        if self.comm.size > 1:
            full = allreduce_sum(full, self.comm)
        return full

    def regularization(self, field: torch.Tensor) -> torch.Tensor:
        """The penalties on the unknown field; several parameters: the sum of each one's."""
        if field.dim() == 3:
            return sum((self._regularization(f) for f in field.unbind(0)), field.new_zeros(()))
        return self._regularization(field)

    def _regularization(self, field: torch.Tensor) -> torch.Tensor:
        r = self.spec["regularization"]
        if r["tikhonov"] == 0 and r["tv"] == 0:
            return field.new_zeros(())
        grid, block = self.grid, self.block
        fp = halo_exchange(field, self.decomp, self.comm, 1, fill=0.0)
        ny, nx = field.shape
        iy, ix = block.indices(field.device)
        gx = (fp[1 : 1 + ny, 2 : 2 + nx] - field) * (1.0 / grid.dx)
        gy = (fp[2 : 2 + ny, 1 : 1 + nx] - field) * (1.0 / grid.dy)
        gx = torch.where(ix < grid.nx - 1, gx, torch.zeros_like(gx))
        gy = torch.where(iy < grid.ny - 1, gy, torch.zeros_like(gy))
        sq = gx * gx + gy * gy
        out = field.new_zeros(())
        if r["tikhonov"] > 0:
            out = out + 0.5 * r["tikhonov"] * sq.sum()
        if r["tv"] > 0:
            out = out + r["tv"] * torch.sqrt(sq + r["tv_epsilon"] ** 2).sum()
        return out

    def gsum(self, v: float) -> float:
        if self.comm.size == 1:
            return v
        return self.comm.bcast_object(self.comm.allreduce_scalar(v, op="sum"), root=0)

    def model_error(self, field: torch.Tensor) -> float:
        """||m - m_true|| / ||m_true|| over the global grid (nan if the true model is unknown);
        several parameters: over the inverted ones together, each relative to its own size
        (the root of the mean of their squared relative errors)."""
        if self.multi:
            each = self.model_errors(field)
            return math.sqrt(sum(v * v for v in each.values()) / len(each))
        if self.true_local is None:
            return float("nan")
        return self._relative_error(field, self.true_local)

    def model_errors(self, field: torch.Tensor) -> dict[str, float]:
        """Several parameters: each inverted parameter's relative error (nan where its true
        model is unknown)."""
        return {n: float("nan") if self.true_fields[n] is None else self._relative_error(f, self.true_fields[n])
                for n, f in zip(self.inverted, field.unbind(0))}

    def _relative_error(self, field: torch.Tensor, truth: torch.Tensor) -> float:
        d = field.detach() - truth
        num = self.gsum(float((d * d).sum()))
        den = self.gsum(float((truth * truth).sum()))
        return math.sqrt(num / den) if den > 0 else float("nan")

    # ------------------------------------------------------------------ objective
    def evaluate(self, iteration: int | None = None):
        """Collective: loss (same on all ranks) and the full gradient of every parameter."""
        from odecli.app import faults

        unk = self.unknown
        for p in unk.params:
            p.grad = None
        faults.maybe_fail(self.comm.rank, iteration)
        field = unk.field()
        fmax = self.global_max(field)
        if self.multi and math.isfinite(fmax):  # the limit bounds the first parameter
            fmax = self.global_max(field[0]) if self.parameters[0] in self.inverted else -math.inf
        if not math.isfinite(fmax) or fmax > self.limit:
            raise collective(InputError(
                f"{self.spec['file']}: {self._what()} reached {fmax:.6g} during the inversion; "
                f"{self._limit_text()}; set unknown.bounds"))
        with self.solves():
            traces = self.forward(self.coefficient(field))
            res = self._band(traces - self.obs_local)  # = low-passed traces - low-passed data
            mis = (res * res).sum(dim=-1) * (0.5 / self.norm)  # (shots, nrec_local)
            reg = self.regularization(field)
            (mis.sum() + reg).backward()
        self.iterations = list(getattr(self.prop, "last_iterations", None) or [])
        grads = []
        for p, dist in zip(unk.params, unk.distributed):
            gr = p.grad if p.grad is not None else torch.zeros_like(p)
            if not dist and self.comm.size > 1:
                gr = broadcast(allreduce_sum(gr, self.comm), self.comm, root=0)
            grads.append(gr.detach())
        misfit = float(self.full_misfit(mis).sum())
        regv = self.gsum(float(reg.detach()))
        loss = misfit + regv
        if not math.isfinite(loss):
            raise collective(InputError(f"{self.spec['file']}: loss became {loss} (NaN/inf) at "
                                        f"iteration {iteration}; lower the learning rate or dt"))
        self.last = {"misfit": misfit, "regularization": regv, "field": field.detach()}
        return loss, grads

    @contextmanager
    def solves(self):
        """A linear solve that does not converge (``odecli.pde.linear.NotConverged``, raised on
        every rank alike) becomes the spec's one-line error on ``solver``: the settings that
        decide it. Exit 2, as a loss that turns NaN is."""
        try:
            yield
        except not_converged() as exc:
            rtol = self.spec["solver"]["rtol"] if self.spec.get("solver") else float("nan")
            raise collective(SpecError(
                self.spec["file"], "solver",
                f"the linear solve did not converge: relative residual {exc.residual:.3g} after "
                f"{exc.iterations} iterations (rtol {rtol:g}); raise solver.max_iterations or "
                f"solver.rtol, or bound the coefficient (unknown.bounds)")) from None

    def predict_full(self) -> torch.Tensor:
        with torch.no_grad(), self.solves():
            return self.full_traces(self.forward(self.coefficient(self.unknown.field())))
