"""Parameterisations of the unknown coefficient field on a rank's block.

* ``grid``: one value per node; each rank owns (and its optimiser updates) its block.
* ``mlp``: ``field = T(T^-1(base) + s * NN(y, x))`` with coordinates scaled to [-1, 1] over the
  grid, through random Fourier features or SIREN layers (:class:`MLPUnknown`), optionally
  pretrained to an initial model; weights are replicated on every rank (same seed) and their
  gradients are all-reduced.
* ``scalars``: a few numbers of an analytic model (e.g. a layered model's speeds), replicated.

Bounds: ``T`` is ``clamp`` (to [low, high]), ``sigmoid`` (low + (high-low)*sigmoid(p)),
``softplus`` (low + softplus(p)) or ``none``.  Grid and scalar parameters live in ``p`` space;
``fixed_border`` cells at the edges keep their initial values. :meth:`Unknown.scales` gives the
optimisers each parameter's natural range (odecli.optim's scale-aware defaults).
"""

from __future__ import annotations

import math

import torch

from odecli.optim.transforms import TRANSFORM_EDGE
from odecli.pde import models
from odecli.pde.grid import Block, Grid


class Transform:
    def __init__(self, kind: str, bounds) -> None:
        self.kind = kind
        self.lo, self.hi = (bounds if bounds is not None else (None, None))

    def forward(self, p: torch.Tensor) -> torch.Tensor:
        if self.kind == "clamp":
            return torch.clamp(p, self.lo, self.hi)
        if self.kind == "sigmoid":
            return self.lo + (self.hi - self.lo) * torch.sigmoid(p)
        if self.kind == "softplus":
            return self.lo + torch.nn.functional.softplus(p)
        return p

    def inverse(self, v: torch.Tensor) -> torch.Tensor:
        if self.kind == "clamp":
            return torch.clamp(v, self.lo, self.hi)
        if self.kind == "sigmoid":
            r = ((v - self.lo) / (self.hi - self.lo)).clamp(TRANSFORM_EDGE, 1 - TRANSFORM_EDGE)
            return torch.log(r) - torch.log1p(-r)
        if self.kind == "softplus":
            r = (v - self.lo).clamp(min=TRANSFORM_EDGE)
            return r + torch.log(-torch.expm1(-r))
        return v.clone()

    @property
    def max_value(self):
        return self.hi if self.kind in ("clamp", "sigmoid") else None

    def scale(self, magnitude: float) -> float:
        """The natural range of the variable the optimiser moves (``p``), for scale-aware steps:
        the bounds' width where ``p`` is in the field's units (clamp, none with bounds), 4 for a
        logit (sigmoid: a step of 1 % of it moves a mid-range value by 1 % of the range), else
        ``magnitude`` (the largest |initial value|, above the lower bound for softplus)."""
        if self.kind == "sigmoid":
            return 4.0
        if self.kind in ("clamp", "none") and self.lo is not None and self.hi is not None:
            return float(self.hi - self.lo)
        return magnitude if math.isfinite(magnitude) and magnitude > 0 else 1.0


class Unknown:
    """Base: ``params`` (leaf tensors), ``distributed`` flags, ``names``, and ``field()``."""

    params: list[torch.Tensor]
    distributed: list[bool]
    names: list[str]

    def __init__(self, spec: dict, grid: Grid, block: Block, dtype, device, base_dir) -> None:
        self.spec, self.grid, self.block = spec, grid, block
        self.dtype, self.device, self.base_dir = dtype, device, base_dir
        self.transform = Transform(spec["transform"], spec["bounds"])
        fb = spec.get("fixed_border", 0)
        self.free = None
        if fb:
            iy, ix = block.indices(device)
            d = torch.minimum(torch.minimum(iy, grid.ny - 1 - iy), torch.minimum(ix, grid.nx - 1 - ix))
            self.free = d >= fb
        self.fixed_values: torch.Tensor | None = None

    def raw_field(self) -> torch.Tensor:
        raise NotImplementedError

    def scales(self, global_max) -> list[float]:
        """Collective: each parameter's natural range (:meth:`Transform.scale`); ``global_max``
        takes a local tensor to its maximum over the ranks."""
        with torch.no_grad():
            out = []
            for p in self.params:
                v = self.transform.forward(p)
                if self.transform.kind == "softplus":
                    v = v - self.transform.lo
                out.append(self.transform.scale(float(global_max(v.abs()))))
            return out

    def field(self) -> torch.Tensor:
        f = self.raw_field()
        if self.free is not None:
            if self.fixed_values is None:
                with torch.no_grad():
                    self.fixed_values = f.detach().clone()
            f = torch.where(self.free, f, self.fixed_values)
        return f


class GridUnknown(Unknown):
    def __init__(self, spec, grid, block, dtype, device, base_dir) -> None:
        super().__init__(spec, grid, block, dtype, device, base_dir)
        init = models.evaluate(spec["initial"], grid, block, dtype, device, base_dir=base_dir)
        p = self.transform.inverse(init).detach().clone().requires_grad_(True)
        self.params, self.distributed, self.names = [p], [True], ["field"]

    def raw_field(self):
        return self.transform.forward(self.params[0])


_ACT = {"tanh": torch.tanh, "relu": torch.relu, "sin": torch.sin,
        "softplus": torch.nn.functional.softplus}
FEATURES = ("fourier", "siren", "plain")
PRETRAIN_ITERATIONS = 400  # Adam steps fitting the network to unknown.initial before the inversion
PRETRAIN_LR = 0.01


class MLPUnknown(Unknown):
    """``field = T(T^-1(base) + s * NN(y, x))`` with coordinates scaled to [-1, 1] over the grid and
    ``s`` the spec's ``scale`` carried into ``T``'s variable (so ``scale`` is in the field's units
    for every transform). ``features``: ``fourier`` (the coordinates through fixed random Fourier
    features ``sin/cos(pi B x)``, B ~ N(0, frequency^2), then ``activation`` layers), ``siren``
    (sine layers with SIREN initialisation, first-layer frequency ``pi * frequency``) or ``plain``
    (``activation`` layers on the coordinates). The last layer starts at zero, so the first field
    is ``base`` exactly; with ``initial`` the network is first fitted to that model
    (:meth:`pretrain`), so iteration 1 starts from the field a grid unknown would."""

    def __init__(self, spec, grid, block, dtype, device, base_dir) -> None:
        super().__init__(spec, grid, block, dtype, device, base_dir)
        gen = torch.Generator().manual_seed(int(spec["seed"]))
        self.features = spec.get("features", "plain")
        freq = float(spec.get("frequency", 1.0))
        n_in = 2
        self.fourier_b = None
        if self.features == "fourier":
            nf = int(spec.get("fourier_features", 32))
            b = torch.randn((2, nf), generator=gen, dtype=torch.float64) * freq
            self.fourier_b = (torch.pi * b).to(dtype=dtype, device=device)
            n_in = 2 * nf
        self.omega = torch.pi * freq if self.features == "siren" else 1.0
        sizes = [n_in] + list(spec["hidden"]) + [self._out_size()]
        self.params, self.names = [], []
        last = len(sizes) - 2
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            if i == last and self.features != "plain":
                w = torch.zeros((a, b), dtype=torch.float64)
            elif self.features == "siren":  # Sitzmann et al. 2020: U(-1/a, 1/a), then U(+-sqrt(6/a))/omega
                bound = 1.0 / a if i == 0 else (6.0 / a) ** 0.5 / self.omega
                w = (torch.rand((a, b), generator=gen, dtype=torch.float64) * 2 - 1) * bound
            else:
                std = (1.0 / a) ** 0.5 if i < last else 0.1 * (1.0 / a) ** 0.5
                w = torch.randn((a, b), generator=gen, dtype=torch.float64) * std
            self.params.append(w.to(dtype=dtype, device=device).requires_grad_(True))
            self.params.append(torch.zeros(b, dtype=dtype, device=device).requires_grad_(True))
            self.names += [f"w{i}", f"b{i}"]
        self.distributed = [False] * len(self.params)
        self.inputs = self._inputs(block)
        base = torch.tensor(float(spec["base"]), dtype=torch.float64, requires_grad=True)
        base_p = self.transform.inverse(base)
        slope = float(torch.autograd.grad(base_p, base)[0]) if base_p.requires_grad else 1.0
        self.base_p = float(base_p.detach())
        self.out_scale = float(spec["scale"]) * (slope if math.isfinite(slope) and slope > 0 else 1.0)
        self.act = torch.sin if self.features == "siren" else _ACT[spec["activation"]]
        self.free = None  # the border follows the network at the nearest free node (_inputs)

    def _out_size(self) -> int:
        """The network's outputs: one field (:class:`MultiMLPUnknown`: one per parameter)."""
        return 1

    def _inputs(self, block: Block) -> torch.Tensor:
        """The network's inputs at ``block``'s nodes: coordinates in [-1, 1] over the grid. With a
        ``fixed_border`` a border node takes the nearest free node's coordinates, so the border
        continues the inverted field outwards (a layer reaches the edge) instead of either holding
        the start (a layered model's sponge would keep 83 % of its error) or being inverted (the
        data barely see the sponge: a free network filled it with error, 0.47x instead of 0.31x)."""
        Y, X = block.coords(self.grid, self.dtype, self.device)
        border = int(self.spec.get("fixed_border", 0) or 0)
        if border:
            g = self.grid
            Y = Y.clamp(border * g.dy, (g.ny - 1 - border) * g.dy)
            X = X.clamp(border * g.dx, (g.nx - 1 - border) * g.dx)
        depth, width = self.grid.extent
        return torch.stack([2.0 * Y / depth - 1.0, 2.0 * X / width - 1.0], dim=-1).reshape(-1, 2)

    def network(self, inputs: torch.Tensor) -> torch.Tensor:
        h = inputs
        if self.fourier_b is not None:
            z = h @ self.fourier_b
            h = torch.cat([torch.sin(z), torch.cos(z)], dim=-1)
        n = len(self.params) // 2
        for i in range(n):
            h = h @ self.params[2 * i] + self.params[2 * i + 1]
            if i < n - 1:
                h = self.act(self.omega * h if self.features == "siren" else h)
        return h

    def raw_field(self):
        q = self.base_p + self.out_scale * self.network(self.inputs).reshape(self.block.shape)
        return self.transform.forward(q)

    def scales(self, global_max) -> list[float]:
        """The weights are O(1) by their initialisation: scale 1 (``scale`` maps them to the field)."""
        return [1.0] * len(self.params)

    def pretrain(self, initial: dict | None) -> float:
        """Fit the network to the model ``initial`` on the whole grid (every rank the same, from
        the same seed) by Adam in ``T``'s variable; returns the relative RMS misfit left. With no
        ``initial`` the network already gives ``base`` everywhere and nothing is done."""
        if initial is None:
            return 0.0
        whole = Block(0, self.grid.ny, 0, self.grid.nx)
        target_field = models.evaluate(initial, self.grid, whole, self.dtype, self.device,
                                       base_dir=self.base_dir)
        target = ((self.transform.inverse(target_field) - self.base_p) / self.out_scale).reshape(-1, 1)
        self.fixed_values = None  # a fixed border keeps the pretrained field, not the base
        return fit_network(self.network, self.params, self._inputs(whole), target)


OFFSETS = ("amplitude",)  # a model's numbers that are added to a value, not values of the field


def offset_transform(transform: Transform) -> Transform:
    """The transform of an offset (a Gaussian's or checkerboard's ``amplitude``): the unknown's
    bounds are the field's, so an offset may be anything in ``[low - high, high - low]`` and of
    either sign (a slow anomaly's amplitude of -300 under bounds [1500, 2600] must not be clamped
    to 1500); without two bounds (softplus, none) it is free."""
    if transform.kind in ("clamp", "sigmoid"):
        width = transform.hi - transform.lo
        return Transform(transform.kind, (-width, width))
    return Transform("none", None)


class ScalarsUnknown(Unknown):
    """A few numbers of an analytic model. The bounds are the field's: each value-like number
    (a background, a layer's value) goes through the unknown's transform, an offset (amplitude)
    through :func:`offset_transform`, and with two bounds the field is clamped into them (a
    background near a bound plus an amplitude must not leave them: the stability limit is
    checked against the upper bound)."""

    def __init__(self, spec, grid, block, dtype, device, base_dir) -> None:
        super().__init__(spec, grid, block, dtype, device, base_dir)
        self.model = spec["model"]
        self.params, self.names, self.transforms = [], [], []
        for k in spec["trainable"]:
            transform = offset_transform(self.transform) if k in OFFSETS else self.transform
            v = torch.as_tensor(self.model[k], dtype=dtype, device=device)
            self.params.append(transform.inverse(v).detach().clone().requires_grad_(True))
            self.names.append(k)
            self.transforms.append(transform)
        self.distributed = [False] * len(self.params)

    def scales(self, global_max) -> list[float]:
        """One scale for all the model's numbers, the largest's (they are values of one field: a
        Gaussian's amplitude of 50 on a background of 1900 is moved in steps of the field's size);
        an offset with two bounds is measured by the field's range, as the values are."""
        with torch.no_grad():
            each = []
            for p, t in zip(self.params, self.transforms):
                v = t.forward(p)
                if t.kind == "softplus":
                    v = v - t.lo
                each.append(self.transform.scale(float(v.abs().max())) if t.kind == "clamp"
                            else t.scale(float(v.abs().max())))
        return [max(each)] * len(each) if self.transform.kind != "sigmoid" else each

    def values(self) -> dict:
        return {k: t.forward(p) for k, p, t in zip(self.names, self.params, self.transforms)}

    def raw_field(self):
        f = models.evaluate(self.model, self.grid, self.block, self.dtype, self.device,
                            params=self.values(), base_dir=self.base_dir)
        if self.transform.kind in ("clamp", "sigmoid") and any(k in OFFSETS for k in self.names):
            f = torch.clamp(f, self.transform.lo, self.transform.hi)
        return f


def make_unknown(spec: dict, grid: Grid, block: Block, dtype, device, base_dir) -> Unknown:
    cls = {"grid": GridUnknown, "mlp": MLPUnknown, "scalars": ScalarsUnknown}[spec["type"]]
    return cls(spec, grid, block, dtype, device, base_dir)


class StackedUnknown:
    """Several named parameters inverted together, ``field()`` stacked ``(P, ny, nx)`` in the order
    of ``specs`` (name -> that parameter's unknown keys). Grid and scalars unknowns are one
    :class:`Unknown` per parameter, their parameters concatenated; an MLP is one network with an
    output per parameter (:class:`MultiMLPUnknown`), each through its own transform."""

    def __init__(self, specs: dict[str, dict], grid: Grid, block: Block, dtype, device, base_dir) -> None:
        self.parameter_names = list(specs)
        first = next(iter(specs.values()))
        self.spec = first
        if first["type"] == "mlp":
            self.parts: list = []
            self.net = MultiMLPUnknown(list(specs.values()), grid, block, dtype, device, base_dir)
            self.params, self.distributed, self.names = self.net.params, self.net.distributed, self.net.names
            self.transforms = self.net.transforms
            return
        self.net = None
        self.parts = [make_unknown(s, grid, block, dtype, device, base_dir) for s in specs.values()]
        self.params, self.distributed, self.names = [], [], []
        for name, part in zip(self.parameter_names, self.parts):
            self.params += part.params
            self.distributed += part.distributed
            self.names += [f"{name}_{n}" for n in part.names]
        self.transforms = [part.transform for part in self.parts]

    @property
    def transform(self) -> Transform:
        """The first parameter's (the one the stability limit bounds)."""
        return self.transforms[0]

    def field(self) -> torch.Tensor:
        if self.net is not None:
            return self.net.field()
        return torch.stack([part.field() for part in self.parts])

    def scales(self, global_max) -> list[float]:
        if self.net is not None:
            return self.net.scales(global_max)
        return [s for part in self.parts for s in part.scales(global_max)]

    def values(self) -> dict:
        """The scalars unknowns' numbers, ``parameter_number``."""
        return {f"{name}_{k}": v for name, part in zip(self.parameter_names, self.parts)
                if isinstance(part, ScalarsUnknown) for k, v in part.values().items()}

    def pretrain(self, initial: list[dict | None]) -> float:
        return self.net.pretrain(initial) if self.net is not None else 0.0


class MultiMLPUnknown(MLPUnknown):
    """One network of the coordinates with an output per parameter: output ``k`` is
    ``T_k(T_k^-1(base_k) + s_k * NN_k(y, x))`` (each parameter's own base, scale and transform;
    the layers, features and seed are shared, read from the first parameter's keys)."""

    def __init__(self, specs: list[dict], grid, block, dtype, device, base_dir) -> None:
        self.outputs = len(specs)
        super().__init__(specs[0], grid, block, dtype, device, base_dir)
        self.transforms = [Transform(s["transform"], s["bounds"]) for s in specs]
        self.base_ps, self.out_scales = [], []
        for s, transform in zip(specs, self.transforms):
            base = torch.tensor(float(s["base"]), dtype=torch.float64, requires_grad=True)
            base_p = transform.inverse(base)
            slope = float(torch.autograd.grad(base_p, base)[0]) if base_p.requires_grad else 1.0
            self.base_ps.append(float(base_p.detach()))
            self.out_scales.append(float(s["scale"]) * (slope if math.isfinite(slope) and slope > 0 else 1.0))

    def _out_size(self) -> int:
        return self.outputs

    def raw_field(self):
        out = self.network(self.inputs)  # (nodes, P)
        fields = [t.forward(b + s * out[:, k].reshape(self.block.shape))
                  for k, (t, b, s) in enumerate(zip(self.transforms, self.base_ps, self.out_scales))]
        return torch.stack(fields)

    def pretrain(self, initial) -> float:
        """Fit every output to its parameter's ``initial`` model (an output without one to its
        base) on the whole grid; returns the relative RMS misfit left."""
        if initial is None or all(m is None for m in initial):
            return 0.0
        whole = Block(0, self.grid.ny, 0, self.grid.nx)
        columns = []
        for m, t, b, s in zip(initial, self.transforms, self.base_ps, self.out_scales):
            if m is None:
                columns.append(torch.zeros(self.grid.ny * self.grid.nx, dtype=self.dtype, device=self.device))
                continue
            f = models.evaluate(m, self.grid, whole, self.dtype, self.device, base_dir=self.base_dir)
            columns.append(((t.inverse(f) - b) / s).reshape(-1))
        target = torch.stack(columns, dim=-1)
        self.fixed_values = None  # a fixed border keeps the pretrained field, not the base
        return fit_network(self.network, self.params, self._inputs(whole), target)


def fit_network(network, params: list[torch.Tensor], x: torch.Tensor, target: torch.Tensor) -> float:
    """Fit ``network(x)`` to ``target`` by least squares (:data:`PRETRAIN_ITERATIONS` Adam
    steps): an MLP unknown's pretraining to its initial model. Returns the relative RMS misfit."""
    from odecli.optim.adam import Adam

    opt = Adam(params, PRETRAIN_LR)
    denom = float((target * target).mean()) or 1.0
    loss = torch.zeros(())
    for _ in range(PRETRAIN_ITERATIONS):
        for p in params:
            p.grad = None
        loss = ((network(x) - target) ** 2).mean()
        loss.backward()
        opt.step(float(loss.detach()), [p.grad for p in params], lambda: (0.0, None))
    return float(loss.detach()) ** 0.5 / denom**0.5


__all__ = ["MultiMLPUnknown", "StackedUnknown", "Transform", "Unknown", "make_unknown"]
