"""C source of the generated solver's gradient: tape each sample's accepted steps, sweep them backwards.

``direct`` gradients in the PyTorch loop are backpropagation through the solver's own
operations with the step sizes held fixed (the controller's decisions are detached), so they
are the exact gradient of the discrete solution. This is the same gradient written out. The
forward pass (``solve_taped``: the lane solver with a recorder) keeps a tape of each sample's
accepted steps (t, h, y, the stage derivatives K and which output times each step wrote). The
sweep then walks a tape backwards; each step rebuilds its stage states from the stored y and K
(no right-hand side calls) and pulls the cotangent of y1 and of the step's dense outputs back
through ``y1 = y + h * sum_i b_i K_i`` and ``K_i = f(t + c_i h, y + h * sum_j a_ij K_j)`` with the
right-hand side's vector-Jacobian product, ``rhs_pullback`` (generated from the equations by
:mod:`odecli.ode.native.vjp`, or an MLP's layers run backwards by :mod:`odecli.ode.native.mlp`,
whose weight cotangents add up over the samples into one array per block).

Memory: S + 2 states, what the right-hand side kept at each stage (an MLP's hidden activations,
so that its pullback runs no layer forward again) and a few numbers per accepted step, never a
graph. The forward pass keeps tapes up to a byte budget; a sample whose tape would pass it is
dropped and solved again in the backward pass, a few at a time through the lanes (the same
steps, bit for bit, since lanes never mix), so the gradient is the same whatever was kept.

DOP853's 7th-order interpolant evaluates f at three extra stages of the step; the sweep
recomputes them for steps with dense outputs and pulls their cotangents back the same way.

The GPU gradient (:mod:`odecli.ode.gpu.gradient`) is this text too (:func:`taped_solver_source`):
only the tapes' memory and the entry points differ, so the CPU's text is what it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from odecli.ode import _dop853_coefficients as dop853
from odecli.ode.methods import ExplicitRK
from odecli.ode.native.codegen import LANES, generate
from odecli.ode.native.c_literal import c_double

if TYPE_CHECKING:
    from odecli.ode.native.rhs import NativeRhs
    from odecli.ode.native.mlp import NativeMLP


def _stages(method: ExplicitRK) -> str:
    """The step's stage states Y and y1 from (y, h) and the taped K[0..S], as rk_step formed them."""
    lines = ["    memcpy(K, tp->k + n * (S + 1) * N, (S + 1) * N * sizeof(double));",
             "    memcpy(kept, tp->keep + n * (S + 1) * TAPE_KEEP, (S + 1) * TAPE_KEEP * sizeof(double));"
             "  /* TAPE_KEEP is NH or 0 */",
             "    memcpy(Y[0], y, sizeof Y[0]);"]
    for i in range(1, method.n_stages):
        terms = [f"{c_double(w)} * K[{j}][k]" for j, w in enumerate(method.a[i]) if w != 0.0]
        combo = f"y[k] + h * ({' + '.join(terms)})" if terms else "y[k]"
        lines.append(f"    for (int k = 0; k < N; k++) Y[{i}][k] = {combo};")
    terms = [f"{c_double(w)} * K[{j}][k]" for j, w in enumerate(method.b) if w != 0.0]
    combo = f"y[k] + h * ({' + '.join(terms)})" if terms else "y[k]"
    lines.append(f"    for (int k = 0; k < N; k++) y1[k] = {combo};")
    return "\n".join(lines)


def _dense_prepare(method: ExplicitRK) -> str:
    """Before a step's first interpolated output: DOP853's extra stages (Yx, K[S+1..])."""
    if method.interpolant != "dop853":
        return ""
    lines = []
    n_k = method.n_stages + 1
    for e, (a_row, c) in enumerate(zip(dop853.A_EXTRA, dop853.C_EXTRA)):
        terms = [f"{c_double(w)} * K[{j}][k]" for j, w in enumerate(a_row[:n_k]) if w != 0.0]
        lines.append(f"        for (int k = 0; k < N; k++) Yx[{e}][k] = y[k] + h * ({' + '.join(terms)});")
        lines.append(f"        rhs(t + {c_double(c)} * h, Yx[{e}], p, w, K[{n_k}], kept[{n_k}]);")
        n_k += 1
    return "\n".join(lines)


def _dense_finish(method: ExplicitRK) -> str:
    """After a step's outputs: pull the cotangents of the extra stages and of K[S] back."""
    lines = []
    if method.interpolant == "dop853":
        first = method.n_stages + 1
        for e in reversed(range(len(dop853.C_EXTRA))):
            lines.append("        memset(ys, 0, sizeof ys);")
            c = c_double(dop853.C_EXTRA[e])
            row = first + e
            lines.append(f"        rhs_pullback(t + {c} * h, Yx[{e}], p, w, kept[{row}], kbar[{row}], ys, pbar, wbar);")
            lines.append("        for (int k = 0; k < N; k++) ybar0[k] += ys[k];")
            for j, w in enumerate(dop853.A_EXTRA[e][:first + e]):
                if w != 0.0:
                    lines.append(f"        for (int k = 0; k < N; k++) kbar[{j}][k] += (h * {c_double(w)}) * ys[k];")
    if _uses_last_stage(method):  # K[S] = f(t + h, y1) feeds the interpolant: its cotangent goes to y1
        lines += ["        memset(ys, 0, sizeof ys);",
                  "        rhs_pullback(t + h, y1, p, w, kept[S], kbar[S], ys, pbar, wbar);",
                  "        for (int k = 0; k < N; k++) lam[k] += ys[k];"]
    return "\n".join(lines)


def _dense_cotangent(method: ExplicitRK) -> str:
    """Add one output's cotangent g (at theta) to ybar0 (y), lam (y1) and kbar (the K rows)."""
    if method.interpolant == "dop853":
        # out = y + sum_m c_m T_m with T = (delta, h K0 - delta, 2 delta - h (K[S] + K0), h D_r K),
        # delta = y1 - y and c_m the product of the Horner factors (th, 1 - th, ...) applied after T_m
        n_terms = 3 + len(dop853.D)
        lines = [f"        double c[{n_terms}], run = 1.0;",
                 f"        for (int i = {n_terms - 1}; i >= 0; i--) {{",
                 "            run *= (i % 2 == 0) ? th : (1 - th);",
                 f"            c[{n_terms - 1} - i] = run;",
                 "        }",
                 "        for (int k = 0; k < N; k++) {",
                 "            const double g0 = g[k] * c[0], g1 = g[k] * c[1], g2 = g[k] * c[2];",
                 "            ybar0[k] += g[k] - g0 + g1 - 2 * g2;",
                 "            lam[k] += g0 - g1 + 2 * g2;",
                 "            kbar[0][k] += h * (g1 - g2);",
                 "            kbar[S][k] -= h * g2;"]
        for r, row in enumerate(dop853.D):
            lines.append(f"            const double gd{r} = h * g[k] * c[{3 + r}];")
            lines += [f"            kbar[{j}][k] += gd{r} * {c_double(w)};" for j, w in enumerate(row) if w != 0.0]
        lines.append("        }")
        return "\n".join(lines)
    if method.interpolant == "polynomial":
        assert method.p is not None
        lines = []
        for i, row in enumerate(method.p):
            if not any(row):
                continue
            horner = c_double(row[-1])
            for coefficient in reversed(row[:-1]):
                horner = f"{c_double(coefficient)} + th * ({horner})"
            lines.append(f"        const double w{i} = h * th * ({horner});")
            lines.append(f"        for (int k = 0; k < N; k++) kbar[{i}][k] += g[k] * w{i};")
        lines.append("        for (int k = 0; k < N; k++) ybar0[k] += g[k];")
        return "\n".join(lines)
    return "\n".join([  # cubic Hermite: out = (1-th) y + th y1 + th (th-1) ((1-2th)(y1-y) + (th-1) h K0 + th h KS)
        "        const double q = th * (th - 1), r = q * (1 - 2 * th);",
        "        for (int k = 0; k < N; k++) {",
        "            ybar0[k] += g[k] * ((1 - th) - r);",
        "            lam[k] += g[k] * (th + r);",
        "            kbar[0][k] += g[k] * (q * (th - 1) * h);",
        "            kbar[S][k] += g[k] * (q * th * h);",
        "        }",
    ])


def _uses_last_stage(method: ExplicitRK) -> bool:
    """Whether dense output reads K[S] = f(t + h, y1)."""
    return method.interpolant in ("hermite", "dop853") or (
        method.p is not None and len(method.p) > method.n_stages and any(method.p[method.n_stages]))


def _step_reverse(method: ExplicitRK) -> str:
    """Pull lam (cotangent of y1) and kbar back through the step onto ybar0 (cotangent of y)."""
    lines = [f"    for (int k = 0; k < N; k++) kbar[{j}][k] += (h * {c_double(w)}) * lam[k];"
             for j, w in enumerate(method.b) if w != 0.0]
    lines.append("    for (int k = 0; k < N; k++) ybar0[k] += lam[k];")
    for i in reversed(range(method.n_stages)):
        lines.append("    memset(ys, 0, sizeof ys);")
        lines.append(f"    rhs_pullback(t + {c_double(method.c[i])} * h, Y[{i}], p, w, kept[{i}], kbar[{i}], ys, pbar, "
                     "wbar);")
        lines.append("    for (int k = 0; k < N; k++) ybar0[k] += ys[k];")
        for j, w in enumerate(method.a[i]):
            if w != 0.0:
                lines.append(f"    for (int k = 0; k < N; k++) kbar[{j}][k] += (h * {c_double(w)}) * ys[k];")
    return "\n".join(lines)


_RECORDER = """\
/* One accepted step, as the solver took it: output times [p0, p1) came from its dense output. */
typedef struct { double t, h, t_new; int64_t p0, p1; } Step;

enum { TAPE_EMPTY = 0, TAPE_COMPLETE = 1, TAPE_DROPPED = -1 };

/* One sample's accepted steps: the state at the start of each (y: n x N), its stage
 * derivatives K[0..S] (k: n x (S + 1) x N) and what their evaluations kept for the pullback
 * (keep: n x (S + 1) x NH), so that the sweep calls no right-hand side to rebuild the stages;
 * plus what the sweep needs of the solve (outputs written at the start, status). */
typedef struct {
    int64_t n, cap, written_at_start, status, state, bytes;
    Step *steps;
    double *y, *k, *keep;
} Tape;

/* The tapes of the whole batch (indexed by sample) and the bytes this block may hold in them. */
typedef struct Recorder { Tape *of; int64_t budget, used; } Recorder;
"""

_CPU_TAPE_MEMORY = """\
#define TAPE_OF(rec, i) ((rec)->of + (i))  /* sample i's tape */
static void tape_free(Recorder *restrict rec, Tape *restrict tape)
{
    free(tape->steps);
    free(tape->y);
    free(tape->k);
    free(tape->keep);
    rec->used -= tape->bytes;
    memset(tape, 0, sizeof *tape);
}

/* Room for twice the steps, if the budget allows and memory is there: 1 on success. */
static int tape_grow(Recorder *restrict rec, Tape *restrict tape)
{
    const int64_t cap = tape->cap ? 2 * tape->cap : 8;
    const int64_t per_step = sizeof(Step) + ((S + 2) * N + (S + 1) * TAPE_KEEP) * sizeof(double);
    const int64_t more = (cap - tape->cap) * per_step;
    if (rec->used + more > rec->budget) return 0;
    Step *steps = realloc(tape->steps, cap * sizeof(Step));
    if (steps != NULL) tape->steps = steps;
    double *ys = steps == NULL ? NULL : realloc(tape->y, cap * N * sizeof(double));
    if (ys != NULL) tape->y = ys;
    double *ks = ys == NULL ? NULL : realloc(tape->k, cap * (S + 1) * N * sizeof(double));
    if (ks != NULL) tape->k = ks;
    /* + 1 byte: a tape that keeps nothing would ask for 0, and realloc's NULL then is no failure */
    double *kept = ks == NULL ? NULL : realloc(tape->keep, cap * (S + 1) * TAPE_KEEP * sizeof(double) + 1);
    if (kept == NULL) return 0;
    tape->keep = kept;
    tape->cap = cap;
    tape->bytes += more;
    rec->used += more;
    return 1;
}

"""

_RECORD_CALLS = """\
static void record_start(Recorder *rec, const Lanes *L, int l, int busy)
{
    if (rec == NULL) return;
    Tape *tape = TAPE_OF(rec, L->sample[l]);
    tape_free(rec, tape);
    tape->written_at_start = L->ptr[l];
    tape->status = L->status[l];
    tape->state = busy ? TAPE_EMPTY : TAPE_COMPLETE;  /* not busy: nothing to integrate */
}

/* Lane l's accepted step, before take_steps moves it on (y is the step's start). Past the
 * budget (or out of memory) the sample's tape is dropped: the backward pass solves it again. */
static void record_step(Recorder *rec, const Lanes *L, int l, int64_t first_output)
{
    if (rec == NULL) return;
    Tape *tape = TAPE_OF(rec, L->sample[l]);
    if (tape->state == TAPE_DROPPED) return;
    if (tape->n == tape->cap && !tape_grow(rec, tape)) {
        tape_free(rec, tape);
        tape->state = TAPE_DROPPED;
        return;
    }
    const Step step = {.t = L->t[l], .h = L->hs[l], .t_new = L->t_new[l], .p0 = first_output, .p1 = L->ptr[l]};
    double *y = tape->y + tape->n * N, *k = tape->k + tape->n * (S + 1) * N;
    double *kept = tape->keep + tape->n * (S + 1) * TAPE_KEEP;
    tape->steps[tape->n++] = step;
    for (int c = 0; c < N; c++) y[c] = L->y[c][l];
    for (int s = 0; s <= S; s++) {
        for (int c = 0; c < N; c++) k[s * N + c] = L->K[s][c][l];
        for (int c = 0; c < TAPE_KEEP; c++) kept[s * TAPE_KEEP + c] = L->keep[s][c][l];
    }
}

static void record_finish(Recorder *rec, const Lanes *L, int l)
{
    if (rec == NULL) return;
    Tape *tape = TAPE_OF(rec, L->sample[l]);
    tape->status = L->status[l];
    if (tape->state == TAPE_EMPTY) tape->state = TAPE_COMPLETE;
}
"""

_SWEEP = """\
/* The cotangent of one sample's y0 and params from those of its outputs (gy: n_eval x N) and
 * final state (gfinal), by the reverse sweep over the tape. */
static void sweep(const Job *restrict job, int64_t i, const Tape *restrict tp, const double *restrict gy,
                  const double *restrict gfinal, double *restrict gy0, double *restrict gp, double *restrict wbar)
{
    const int64_t written_at_start = tp->written_at_start, status = tp->status;
    const double *grid = job->grid + i * job->n_eval, *p = job->params + i * job->n_params, *w = job->shared;
    const double t1 = job->t1[i], dir = t1 >= job->t0[i] ? 1.0 : -1.0;
    double lam[N], pbar[NP] = {0};
    for (int k = 0; k < N; k++) lam[k] = gfinal[k];
    for (int64_t j = 0; j < job->n_eval; j++)  /* finish wrote y at t1 over anything else */
        if (status == SUCCESS && grid[j] == t1)
            for (int k = 0; k < N; k++) lam[k] += gy[j * N + k];
    for (int64_t n = tp->n - 1; n >= 0; n--) {
        const Step step = tp->steps[n];
        const double t = step.t, h = step.h, t_new = step.t_new, *y = tp->y + n * N;
        double K[NK][N], kept[NK][NH], Y[S][N], Yx[{n_extra}][N], y1[N], kbar[NK][N], ybar0[N], ys[N];
        memset(kbar, 0, sizeof kbar);
        memset(ybar0, 0, sizeof ybar0);
{stages}
        int dense = 0;
        for (int64_t j = step.p0; j < step.p1; j++) {  /* inside the span: never t1 */
            const double *g = gy + j * N, t_at = grid[j] * dir * dir;
            if (t_at == t_new) {
                for (int k = 0; k < N; k++) lam[k] += g[k];
                continue;
            }
            const double th = (t_at - t) / (h == 0 ? 1.0 : h);
            if (!dense) {
{prepare}
                dense = 1;
            }
{dense}
        }
        if (dense) {
{finish}
        }
{step}
        memcpy(lam, ybar0, sizeof lam);
    }
    for (int64_t j = 0; j < written_at_start && j < job->n_eval; j++)
        if (!(status == SUCCESS && grid[j] == t1))
            for (int k = 0; k < N; k++) lam[k] += gy[j * N + k];
    memcpy(gy0, lam, sizeof lam);
    memcpy(gp, pbar, job->n_params * sizeof(double));
}

"""

_CPU_ENTRIES = """\
#define REPLAY {replay}  /* samples solved again together: lanes stay busy while some finish */

/* solve_samples, keeping each sample's tape in tapes[i] (B of them, zeroed at first) while
 * this block's tapes stay within budget bytes; samples past it are left TAPE_DROPPED. */
int solve_taped(int64_t i0, int64_t i1, int64_t n_eval, int64_t n_params,
                const double *y0, const double *t0, const double *t1, const double *grid,
                const double *params, const double *dt0, int64_t auto_dt0, const double *cfg,
                int64_t max_steps, double *yout, int64_t *istat, double *fstat, double *yfinal,
                const double *shared, Tape *tapes, int64_t budget)
{
    const Job job = make_job(n_eval, n_params, y0, t0, t1, grid, params, dt0, auto_dt0, cfg, max_steps, yout,
                             istat, fstat, yfinal, shared);
    Recorder rec = {.of = tapes, .budget = budget};
    return solve_range(&job, i0, i1 - i0, NULL, &rec);
}

int64_t tape_bytes(void) { return sizeof(Tape); }

/* Everything n tapes hold (a forward pass whose backward never ran, or stopped). */
void free_tapes(Tape *tapes, int64_t n)
{
    Recorder rec = {.of = tapes};
    for (int64_t i = 0; i < n; i++) tape_free(&rec, tapes + i);
}

/* Cotangents of y0 (B x N) and params (B x n_params) for samples [i0, i1), given those of the
 * outputs yout (B x n_eval x N) and y_final (B x N); the cotangent of the shared weights, summed
 * over these samples in order, is added into gw. Samples whose tape the forward pass kept are
 * swept at once; the others are solved again, REPLAY at a time through the lanes (with the
 * forward's arguments, which are solve_samples'; its output arrays are overwritten with the
 * same values). Each tape is freed once swept. 0, or -1 when out of memory. */
int gradient_samples(int64_t i0, int64_t i1, int64_t n_eval, int64_t n_params,
                     const double *y0, const double *t0, const double *t1, const double *grid,
                     const double *params, const double *dt0, int64_t auto_dt0, const double *cfg,
                     int64_t max_steps, double *yout, int64_t *istat, double *fstat, double *yfinal,
                     const double *shared, const double *gy, const double *gfinal, double *gy0, double *gp,
                     Tape *tapes, double *gw)
{
    const Job job = make_job(n_eval, n_params, y0, t0, t1, grid, params, dt0, auto_dt0, cfg, max_steps, yout,
                             istat, fstat, yfinal, shared);
    Recorder rec = {.of = tapes, .budget = INT64_MAX};
    int rc = 0;
    for (int64_t i = i0; i < i1 && rc == 0; i++) {
        if (tapes[i].state != TAPE_COMPLETE) {  /* this sample and the next ones without a tape */
            int64_t order[REPLAY], n = 0;
            for (int64_t j = i; j < i1 && n < REPLAY; j++)
                if (tapes[j].state != TAPE_COMPLETE) order[n++] = j;
            rc = solve_range(&job, 0, n, order, &rec);
            for (int64_t m = 0; m < n && rc == 0; m++)
                if (tapes[order[m]].state != TAPE_COMPLETE) rc = -1;
            if (rc != 0) break;
        }
        sweep(&job, i, tapes + i, gy + i * n_eval * N, gfinal + i * N, gy0 + i * N, gp + i * n_params, gw);
        tape_free(&rec, tapes + i);
    }
    rhs_pullback_flush(gw);
    return rc;
}
""".replace("{replay}", str(2 * LANES))


def generate_reverse(method: ExplicitRK, rhs: NativeRhs | NativeMLP) -> str:
    """The complete C file with ``gradient_samples`` for ``method`` and ``rhs`` (see module doc).

    The file holds the lane solver with the tapes' recorder (:func:`~odecli.ode.native.codegen.generate`;
    ``solve_taped`` is the forward pass), the right-hand side's ``rhs_pullback`` and the sweep.
    Raises ``ValueError`` when the right-hand side cannot be differentiated.
    """
    return taped_solver_source(method, rhs, LANES, _CPU_TAPE_MEMORY, _CPU_ENTRIES)


def taped_solver_source(method: ExplicitRK, rhs: NativeRhs | NativeMLP, lanes: int, tape_memory: str,
                        entries: str) -> str:
    """The lane solver with the tapes' recorder, ``rhs_pullback`` and ``sweep``, then ``entries``.

    What differs between the CPU and the GPU (:func:`odecli.ode.gpu.source.cuda_gradient_source`) is passed in:
    ``tape_memory`` defines ``TAPE_OF(rec, i)`` (sample i's tape), ``tape_free`` and ``tape_grow``
    (the CPU's grow by ``realloc`` under a byte budget; a GPU thread's tape is a preallocated
    slab), and ``entries`` the functions that run the forward pass and the sweep.
    """
    body = (_SWEEP.replace("{stages}", _indent(_stages(method)))
            .replace("{n_extra}", str(len(dop853.C_EXTRA) if method.interpolant == "dop853" else 1))
            .replace("{prepare}", _indent(_indent(_dense_prepare(method))))
            .replace("{finish}", _indent(_dense_finish(method)))
            .replace("{dense}", _indent(_dense_cotangent(method)))
            .replace("{step}", _indent(_step_reverse(method))))
    recorder = (f"#define TAPE_KEEP {rhs.keep_size()}  /* values taped per stage: NH, or none */\n"
                + _RECORDER + tape_memory + _RECORD_CALLS)
    return "\n\n".join([
        generate(method, rhs.c_source(), rhs.n_states, len(rhs.params), lanes=lanes, n_keep=rhs.keep_size(),
                 keep_stages=True, recorder=recorder),
        rhs.pullback_c(),
        body + entries,
    ])


def _indent(block: str) -> str:
    return "\n".join("    " + line if line else line for line in block.splitlines())

