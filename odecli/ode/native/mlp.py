"""A neural-ODE right-hand side for the generated C solver: ``dy/dt = MLP(y)`` with shared weights.

Why: an MLP's right-hand side is matrix products and an elementwise activation. In eager
PyTorch at neural-ODE sizes (32 states, 64 hidden units, a few hundred samples) the matrix
products run near the core's peak, but ``torch.tanh`` in float64 costs more than both of them,
and every stage pays the solver's per-operation dispatch. Here the layers are C loops inside
the lane solver (:mod:`odecli.ode.native.codegen`): the eight samples in flight share each
loaded weight (blocks of four rows, so each loaded input feeds eight vector FMAs), and the
activations are branch-free polynomial/rational approximations that the compiler vectorises
(Cephes' ``exp`` and ``tanh``, within 1e-15 relative of libm). The weights are read at run time,
so one build serves every set of weights of the same shape.

Each layer sums ``b + w0 x0 + w1 x1 + ...`` left to right with fused multiply-adds, the same in
the one-sample and the lane functions, so samples take the same steps however they share lanes
(bit for bit); against PyTorch (whose matrix products sum in another order) results agree to
round-off.

Gradients: every evaluation keeps its layers' activations (:func:`kept_values`), the gradient's
tapes hold them, and the reverse sweep (:mod:`odecli.ode.native.reverse`) goes back over one
sample at a time with :func:`mlp_pullback_c`, which runs the layers backwards from them (torch
autograd's derivative formulas) and sums the weights' cotangents over the samples of a block.
The one-sample layer (a sample's start, dense-output stages) reads a transposed copy of the
weights and vectorises over rows instead of lanes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

ACTIVATIONS = {"tanh": "act_tanh", "relu": "act_relu", "sigmoid": "act_sigmoid", "silu": "act_silu"}
"""Elementwise activations the C code has, by the name :meth:`NativeMLP.from_module` maps modules to."""
_MODULES = {"Tanh": "tanh", "ReLU": "relu", "Sigmoid": "sigmoid", "SiLU": "silu"}

_ACTIVATION_C = """\
/* e^x = (q + p) / (q - p) * 2^n for |x| <= 708 (Cephes' exp): x = n ln2 + r, e^r by a Pade form
 * in r (p, q), 2^n from the bits of n + 1023, so that a loop of it vectorises (no calls, no int64
 * conversions). Returned as its parts: tanh folds the fraction into its own division. */
static inline void exp_parts(double x, double *restrict p, double *restrict q, double *restrict scale)
{
    const double n = floor(x * 1.4426950408889634073599 + 0.5);
    const double r = (x - n * 6.93145751953125E-1) - n * 1.42860682030941723212E-6;
    const double rr = r * r;
    *p = r * ((1.26177193074810590878E-4 * rr + 3.02994407707441961300E-2) * rr + 9.99999999999999999910E-1);
    *q = ((3.00198505138664455042E-6 * rr + 2.52448340349684104192E-3) * rr + 2.27265548208155028766E-1) * rr
         + 2.00000000000000000009E0;
    const double biased = n + (1023.0 + 6755399441055744.0);  /* 1.5 * 2^52: n + 1023 in the low bits */
    uint64_t bits;
    memcpy(&bits, &biased, sizeof bits);
    bits <<= 52;
    memcpy(scale, &bits, sizeof *scale);
}

static inline double odecli_exp(double x)
{
    double p, q, scale;
    exp_parts(x, &p, &q, &scale);
    return (1.0 + 2.0 * p / (q - p)) * scale;
}

/* Cephes' tanh: x + x z P(z) / Q(z) (z = x^2) below |x| = 0.625, 1 - 2 / (e^2|x| + 1) above
 * (saturated at |x| = 20), with e^2|x| as exp_parts' fraction, so that either branch costs one
 * division. */
static inline double act_tanh(double x)
{
    const double a = fabs(x), z = x * x;
    double p, q, scale;
    exp_parts(a < 20.0 ? 2.0 * a : 40.0, &p, &q, &scale);
    const double P = (-9.64399179425052238628E-1 * z - 9.92877231001918586564E1) * z - 1.61468768441708447952E3;
    const double Q = ((z + 1.12811678491632931402E2) * z + 2.23548839060100448583E3) * z + 4.84406305325125486048E3;
    const int big = a > 0.625;
    const double frac = (big ? 2.0 * (q - p) : x * z * P) / (big ? (q + p) * scale + (q - p) : Q);
    return big ? (x < 0.0 ? frac - 1.0 : 1.0 - frac) : x + frac;
}

static inline double act_sigmoid(double x)
{
    const double clipped = x < -708.0 ? -708.0 : (x > 708.0 ? 708.0 : x);
    return 1.0 / (1.0 + odecli_exp(-clipped));
}

static inline double act_relu(double x) { return x < 0.0 ? 0.0 : x; }  /* NaN stays NaN, as in torch */
static inline double act_silu(double x) { return x * act_sigmoid(x); }

/* g * act'(z), from the pre-activation z and the output a, as torch autograd computes it. */
static inline double grad_tanh(double g, double z, double a) { (void)z; return g * (1.0 - a * a); }
static inline double grad_sigmoid(double g, double z, double a) { (void)z; return (g * (1.0 - a)) * a; }
static inline double grad_relu(double g, double z, double a) { (void)z; return a <= 0.0 ? 0.0 : g; }
static inline double grad_silu(double g, double z, double a)
{
    (void)a;
    const double s = act_sigmoid(z);
    return g * (s * (1.0 + z * (1.0 - s)));
}

/* out = w x + b for one sample, from the transposed weights wt (n_in x n_out): the loop over
 * rows is the vector loop, and each row sums b + w0 x0 + w1 x1 + ... in the order dense_lanes does. */
static inline void dense_one(const int n_out, const int n_in, const double *restrict wt, const double *restrict b,
                             const double *restrict x, double *restrict out)
{
    for (int j = 0; j < n_out; j++) out[j] = b[j];
    for (int k = 0; k < n_in; k++)
        for (int j = 0; j < n_out; j++) out[j] = fma(wt[k * n_out + j], x[k], out[j]);
}

/* The same for W lanes, four rows at a time: each loaded x[k] feeds four rows' accumulators. */
static inline void dense_lanes(const int n_out, const int n_in, const double *restrict w, const double *restrict b,
                               const double (*restrict x)[W], double (*restrict out)[W])
{
    int j = 0;
    for (; j + 4 <= n_out; j += 4) {
        double a0[W], a1[W], a2[W], a3[W];
        for (int l = 0; l < W; l++) { a0[l] = b[j]; a1[l] = b[j + 1]; a2[l] = b[j + 2]; a3[l] = b[j + 3]; }
        const double *w0 = w + j * n_in, *w1 = w0 + n_in, *w2 = w1 + n_in, *w3 = w2 + n_in;
        for (int k = 0; k < n_in; k++)
            for (int l = 0; l < W; l++) {
                a0[l] = fma(w0[k], x[k][l], a0[l]);
                a1[l] = fma(w1[k], x[k][l], a1[l]);
                a2[l] = fma(w2[k], x[k][l], a2[l]);
                a3[l] = fma(w3[k], x[k][l], a3[l]);
            }
        for (int l = 0; l < W; l++) {
            out[j][l] = a0[l]; out[j + 1][l] = a1[l]; out[j + 2][l] = a2[l]; out[j + 3][l] = a3[l];
        }
    }
    for (; j < n_out; j++) {
        double acc[W];
        for (int l = 0; l < W; l++) acc[l] = b[j];
        for (int k = 0; k < n_in; k++)
            for (int l = 0; l < W; l++) acc[l] = fma(w[j * n_in + k], x[k][l], acc[l]);
        for (int l = 0; l < W; l++) out[j][l] = acc[l];
    }
}
"""


@dataclass(frozen=True, eq=False)
class NativeMLP:
    """``dy/dt = MLP(y)``: dense layers, each followed by an activation or none, weights shared by all samples.

    ``weights[i]`` is layer i's (out, in) matrix, ``biases[i]`` its (out,) vector (numpy arrays
    or torch tensors) and ``activations[i]`` a key of :data:`ACTIVATIONS` or "" for none. The
    first layer's inputs and the last layer's outputs are the states. Tensors are read at every
    solve (so an optimiser's in-place updates are seen), and those that require grad receive
    gradients through :func:`~odecli.ode.native.solve_native`. There are no per-sample
    parameters (``params`` is empty); per-sample variation comes from ``y0`` and the time spans.
    """

    weights: tuple[Any, ...]
    biases: tuple[Any, ...]
    activations: tuple[str, ...]
    params: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.weights or not (len(self.weights) == len(self.biases) == len(self.activations)):
            raise ValueError("an MLP needs at least one layer, with one weight matrix, bias and activation each")
        for i, (w, b, act) in enumerate(zip(self.weights, self.biases, self.activations)):
            if w.ndim != 2 or tuple(b.shape) != (w.shape[0],):
                raise ValueError(f"layer {i}: weight must be (out, in) and bias (out,), got {tuple(w.shape)} and "
                                 f"{tuple(b.shape)}")
            if i and w.shape[1] != self.weights[i - 1].shape[0]:
                raise ValueError(f"layer {i} takes {w.shape[1]} inputs but layer {i - 1} gives "
                                 f"{self.weights[i - 1].shape[0]}")
            if act and act not in ACTIVATIONS:
                raise ValueError(f"layer {i}: unknown activation {act!r} (expected one of {sorted(ACTIVATIONS)})")
        if self.weights[0].shape[1] != self.weights[-1].shape[0]:
            raise ValueError(f"the MLP maps {self.weights[0].shape[1]} states to {self.weights[-1].shape[0]} "
                             "derivatives: a right-hand side needs as many outputs as inputs")

    @classmethod
    def from_module(cls, module: Any) -> "NativeMLP":
        """The MLP of a ``torch.nn.Sequential`` of ``Linear`` layers and ``Tanh``/``ReLU``/``Sigmoid``/``SiLU``.

        It holds the module's own parameter tensors (no copy), so one ``NativeMLP`` follows the
        module through training. ``Identity`` modules are skipped; anything else raises
        ``ValueError`` naming it.
        """
        import torch

        modules = list(module) if isinstance(module, torch.nn.Sequential) else [module]
        weights: list[Any] = []
        biases: list[Any] = []
        activations: list[str] = []
        for index, layer in enumerate(modules):
            kind = type(layer).__name__
            if isinstance(layer, torch.nn.Linear):
                weights.append(layer.weight)
                biases.append(np.zeros(layer.out_features) if layer.bias is None else layer.bias)
                activations.append("")
            elif kind in _MODULES and weights and not activations[-1]:
                activations[-1] = _MODULES[kind]
            elif isinstance(layer, torch.nn.Identity):
                continue
            else:
                where = "before any Linear layer" if not weights else "after another activation"
                raise ValueError(f"module {index} ({kind}) cannot run in the generated solver: expected Linear "
                                 f"layers, each followed by at most one of {sorted(_MODULES)}"
                                 + (f" ({kind} {where})" if kind in _MODULES else ""))
        return cls(tuple(weights), tuple(biases), tuple(activations))

    @property
    def n_states(self) -> int:
        return int(self.weights[0].shape[1])

    c_flags = ("-fno-trapping-math",)
    """Lets GCC if-convert (and so vectorise) the activations' two branches."""

    def shared_weights(self) -> np.ndarray:
        """What the C code reads, layer by layer: the weights (out, in), the bias, the weights transposed."""
        parts = []
        for w, b in zip(self.weights, self.biases):
            w, b = _float64(w), _float64(b)
            parts += [w.ravel(), b, w.T.ravel()]
        return np.concatenate(parts)

    def tensors(self) -> list[tuple[int, Any]]:
        """``(offset in shared_weights, tensor)`` for every weight and bias that is a tensor requiring grad."""
        found = []
        for w, b, (w_at, b_at, _) in zip(self.weights, self.biases, _offsets(self._shapes())):
            found += [(at, value) for value, at in ((w, w_at), (b, b_at)) if getattr(value, "requires_grad", False)]
        return found

    def c_source(self) -> str:
        """``rhs`` and ``rhs_lanes`` (see :func:`odecli.ode.native.codegen.equations_c`) for this shape."""
        return mlp_c(self._shapes(), self.activations)

    def pullback_c(self) -> str:
        """``rhs_pullback`` and ``rhs_pullback_flush`` for the gradient sweep (:mod:`odecli.ode.native.reverse`)."""
        return mlp_pullback_c(self._shapes(), self.activations)

    def gradient_size(self) -> int:
        """Doubles of the weights' cotangent array each block of the sweep fills (:func:`gradient_size`)."""
        return gradient_size(self._shapes())

    def keep_size(self) -> int:
        """Values an evaluation keeps for its pullback (:func:`kept_values`)."""
        return kept_values(self._shapes(), self.activations)[1]

    def _shapes(self) -> list[tuple[int, int]]:
        return [(int(w.shape[0]), int(w.shape[1])) for w in self.weights]


def _float64(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().double().numpy()
    return np.ascontiguousarray(value, dtype=np.float64)


def _offsets(shapes: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """Per layer, where its weights, bias and transposed weights start in the shared array."""
    found, offset = [], 0
    for n_out, n_in in shapes:
        found.append((offset, offset + n_out * n_in, offset + n_out * n_in + n_out))
        offset += 2 * n_out * n_in + n_out
    return found


def kept_values(shapes: list[tuple[int, int]],
                activations: tuple[str, ...]) -> tuple[list[tuple[int | None, int | None]], int]:
    """Where each layer's pre-activation z and output a sit among the values an evaluation keeps
    for its pullback (None: not kept), and how many values that is.

    Kept: every hidden layer's a (the next layer's input, whose outer product with g is that
    layer's weight gradient), a last layer's a when it has an activation, and z for SiLU, whose
    derivative reads z where the others read a. The pullback then runs no layer forward again.
    """
    found, at = [], 0
    for i, ((n_out, _), act) in enumerate(zip(shapes, activations)):
        z_at = a_at = None
        if act == "silu":
            z_at, at = at, at + n_out
        if act or i < len(shapes) - 1:
            a_at, at = at, at + n_out
        found.append((z_at, a_at))
    return found, at


def mlp_c(shapes: list[tuple[int, int]], activations: tuple[str, ...]) -> str:
    """C for an MLP with layer ``shapes`` (out, in): depends on the shapes only, not on weight values.

    The layers' z and a are written where :func:`kept_values` places them in ``keep``, so the
    gradient's tapes hold them at no extra cost.
    """
    kept, _ = kept_values(shapes, activations)
    one, lanes = [], []
    for i, ((n_out, n_in), act, (w, b, wt)) in enumerate(zip(shapes, activations, _offsets(shapes))):
        z_at, a_at = kept[i]
        src_one, src_lanes = ("y", "Y") if i == 0 else (f"keep + {kept[i - 1][1]}", f"KEEP + {kept[i - 1][1]}")
        z_spot = z_at if z_at is not None else a_at  # without SiLU the activation runs in place
        z_one, z_lanes = ("dy", "DY") if z_spot is None else (f"keep + {z_spot}", f"KEEP + {z_spot}")
        one.append(f"    dense_one({n_out}, {n_in}, w + {wt}, w + {b}, {src_one}, {z_one});")
        lanes += ["#if W == 1  /* one lane: the one-sample layer, vectorised over rows */",
                  f"    dense_one({n_out}, {n_in}, w + {wt}, w + {b}, &({src_lanes})[0][0], &({z_lanes})[0][0]);",
                  "#else",
                  f"    dense_lanes({n_out}, {n_in}, w + {w}, w + {b}, (const double (*)[W])({src_lanes}), "
                  f"{z_lanes});",
                  "#endif"]
        if act:
            f = ACTIVATIONS[act]
            one.append(f"    for (int j = 0; j < {n_out}; j++) keep[{a_at} + j] = {f}(keep[{z_spot} + j]);")
            lanes.append(f"    for (int j = 0; j < {n_out} * W; j++) (&KEEP[{a_at}][0])[j] = "
                         f"{f}((&KEEP[{z_spot}][0])[j]);")
        if i == len(shapes) - 1 and a_at is not None:
            one.append(f"    memcpy(dy, keep + {a_at}, {n_out} * sizeof(double));")
            lanes.append(f"    memcpy(DY, KEEP + {a_at}, {n_out} * W * sizeof(double));")
    body_one, body_lanes = "\n".join(one), "\n".join(lanes)
    return _ACTIVATION_C + f"""
/* One sample's right-hand side (start of a sample, initial step, dense-output stages). */
static inline void rhs(double t, const double *restrict y, const double *restrict p, const double *restrict w,
                       double *restrict dy, double *restrict keep)
{{
    (void)t; (void)p;
{body_one}
}}

/* All W lanes at once: each weight is loaded once for the eight samples in flight. */
static inline void rhs_lanes(const double *restrict tl, double Y[restrict N][W], double P[restrict NP][W],
                             const double *restrict w, double DY[restrict N][W], double KEEP[restrict NH][W])
{{
    (void)tl; (void)P;
{body_lanes}
}}
"""


RANK = 32
"""Pullbacks whose weight updates are gathered before they are added in (see :func:`mlp_pullback_c`)."""

_RANK_UPDATE_C = """
/* One vector register of doubles (eight with AVX-512, else four): GCC's vector extension, so
 * that the blocked update below is vector code (the auto-vectoriser leaves its register blocks
 * scalar). Unaligned: rows start anywhere. */
#ifdef __AVX512F__
#define VD 8
#else
#define VD 4
#endif
typedef double vd __attribute__((vector_size(VD * sizeof(double)), aligned(8)));

/* wbar (n_out x n_in) += sum over u < count of g[u] (n_out) times a[u] (n_in), outer products:
 * blocks of 4 rows x 2 VD columns stay in registers over all u, so each wbar element is loaded and
 * stored once per RANK pullbacks instead of once per pullback. */
static void rank_update(const int n_out, const int n_in, const int count, const double *restrict g,
                        const double *restrict a, double *restrict wbar)
{
    int j = 0;
    for (; j + 4 <= n_out; j += 4) {
        int k = 0;
        for (; k + 2 * VD <= n_in; k += 2 * VD) {
            vd *r0 = (vd *)(wbar + j * n_in + k), *r1 = (vd *)(wbar + (j + 1) * n_in + k);
            vd *r2 = (vd *)(wbar + (j + 2) * n_in + k), *r3 = (vd *)(wbar + (j + 3) * n_in + k);
            vd s00 = r0[0], s01 = r0[1], s10 = r1[0], s11 = r1[1];
            vd s20 = r2[0], s21 = r2[1], s30 = r3[0], s31 = r3[1];
            for (int u = 0; u < count; u++) {
                const double *gu = g + u * n_out + j;
                const vd *au = (const vd *)(a + u * n_in + k);
                const vd a0 = au[0], a1 = au[1];
                s00 += gu[0] * a0; s01 += gu[0] * a1; s10 += gu[1] * a0; s11 += gu[1] * a1;
                s20 += gu[2] * a0; s21 += gu[2] * a1; s30 += gu[3] * a0; s31 += gu[3] * a1;
            }
            r0[0] = s00; r0[1] = s01; r1[0] = s10; r1[1] = s11;
            r2[0] = s20; r2[1] = s21; r3[0] = s30; r3[1] = s31;
        }
        for (; k < n_in; k++)
            for (int r = 0; r < 4; r++)
                for (int u = 0; u < count; u++)
                    wbar[(j + r) * n_in + k] += g[u * n_out + j + r] * a[u * n_in + k];
    }
    for (; j < n_out; j++)
        for (int u = 0; u < count; u++)
            for (int k = 0; k < n_in; k++)
                wbar[j * n_in + k] += g[u * n_out + j] * a[u * n_in + k];
}
"""


def _staging(shapes: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], int]:
    """Where ``wbar`` gathers each layer's RANK g rows and input rows (after the shared layout), and
    where their count goes."""
    found, at = [], _offsets(shapes + [(0, 0)])[-1][0]  # the end of the shared layout
    for n_out, n_in in shapes:
        found.append((at, at + RANK * n_out))
        at += RANK * (n_out + n_in)
    return found, at


def gradient_size(shapes: list[tuple[int, int]]) -> int:
    """Doubles of one block's ``wbar``: the shared layout, then per layer RANK gathered (g, a) pairs, then a count."""
    return _staging(shapes)[1] + 1


def mlp_pullback_c(shapes: list[tuple[int, int]], activations: tuple[str, ...]) -> str:
    """``rhs_pullback``: ``ybar += v^T df/dy`` and the weights' ``wbar += v^T df/dw`` at one sample's y.

    The layers' z and a come from ``keep`` (what the evaluation at y kept, :func:`kept_values`),
    so the pullback only runs backward: g * act'(z), the bias gradient, and w^T g for the layer
    below. The weights' gradient, the outer product of g and the layer's input, is gathered:
    each pullback stores its (g, input) pairs, and every RANK pullbacks (and at the end of a
    block, ``rhs_pullback_flush``) one blocked rank-RANK update adds them in. ``wbar`` is laid
    out as the shared weights (its transposed parts stay zero), followed by the gathered pairs
    and their count (:func:`gradient_size`).
    """
    offsets = _offsets(shapes)
    staging, count = _staging(shapes)
    kept, _ = kept_values(shapes, activations)
    n_layers = len(shapes)
    flush = [f"    rank_update({n_out}, {n_in}, n, wbar + {staging[i][0]}, wbar + {staging[i][1]}, wbar + {w});"
             for i, ((n_out, n_in), (w, _, _)) in enumerate(zip(shapes, offsets))]
    backward = ["    const int n = (int)wbar[%d];" % count,
                f"    double g{n_layers - 1}[{shapes[-1][0]}];",
                f"    memcpy(g{n_layers - 1}, v, sizeof g{n_layers - 1});"]
    for i in reversed(range(n_layers)):
        (n_out, n_in), act, (w, b, _) = shapes[i], activations[i], offsets[i]
        src = "y" if i == 0 else f"keep + {kept[i - 1][1]}"
        if act:
            z_at, a_at = kept[i]
            z = f"keep[{z_at} + j]" if z_at is not None else f"keep[{a_at} + j]"  # read for SiLU only
            backward.append(f"    for (int j = 0; j < {n_out}; j++) g{i}[j] = grad_{act}(g{i}[j], {z}, "
                            f"keep[{a_at} + j]);")
        backward += [f"    for (int j = 0; j < {n_out}; j++) wbar[{b} + j] += g{i}[j];",
                     f"    memcpy(wbar + {staging[i][0]} + n * {n_out}, g{i}, sizeof g{i});",
                     f"    memcpy(wbar + {staging[i][1]} + n * {n_in}, {src}, {n_in} * sizeof(double));"]
        below = "ybar" if i == 0 else f"g{i - 1}"
        if i:
            backward.append(f"    double g{i - 1}[{n_in}];")
            backward.append(f"    memset(g{i - 1}, 0, sizeof g{i - 1});")
        backward += [f"    for (int j = 0; j < {n_out}; j++)",
                     f"        for (int k = 0; k < {n_in}; k++) {below}[k] = fma(w[{w} + j * {n_in} + k], g{i}[j], "
                     f"{below}[k]);"]
    backward += [f"    wbar[{count}] = n + 1;", f"    if (n + 1 == {RANK}) rhs_pullback_flush(wbar);"]
    body, flush_body = "\n".join(backward), "\n".join(flush)
    return _RANK_UPDATE_C + f"""
/* Add the gathered outer products into the weights' gradient. */
static void rhs_pullback_flush(double *restrict wbar)
{{
    const int n = (int)wbar[{count}];
{flush_body}
    wbar[{count}] = 0;
}}

/* ybar += v^T df/dy and wbar += v^T df/dw for one sample at y, whose evaluation kept keep (no
 * per-sample parameters: pbar stays). */
static inline void rhs_pullback(double t, const double *restrict y, const double *restrict p,
                                const double *restrict w, const double *restrict keep, const double *restrict v,
                                double *restrict ybar, double *restrict pbar, double *restrict wbar)
{{
    (void)t; (void)p; (void)pbar;
{body}
}}
"""
