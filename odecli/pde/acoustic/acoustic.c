/* Fused leapfrog steps of the 2-D acoustic wave equation, 4th order in space, and their adjoint.
 *
 * One file of ~670 lines on purpose: the forward, the storing forward and the adjoint share one set of
 * vector macros and must round identically, and the compiler sees them together (one translation unit).
 *
 * Fields are C-contiguous (B, ny+4, nx+4): B shots, each with a ghost ring of width 2 around its
 * ny x nx block (the ring holds neighbours' values or zeros at the edge of the grid).
 * c2dt2 = c^2 dt^2 and the sponge G are (ny, nx), shared by all shots; G may be NULL (none).
 *
 *   u_next = G * ((2u - G*u_prev) + c2dt2 * lap(u))      on the block; zeros on the ring.
 *
 * Every operation rounds on its own, in the order of odecli.pde.acoustic.reference.reference_step (build
 * with -ffp-contract=off), so the kernel reproduces the PyTorch reference bit for bit.  It makes
 * one pass over the grid where eager PyTorch makes about twenty full-size temporaries.
 *
 * The kernels are bound by memory traffic, so they skip what they can: span[2i], span[2i+1]
 * give the columns [lo, hi) of block row i where G is exactly 1 (most of the grid), and there
 * G is neither read nor multiplied by (x * 1 == x, so the results stay bit for bit the same).
 * u_next may be the same array as u_prev (each point of u_prev is read once, before its point
 * of u_next is written): the forward recycles two buffers.
 *
 * For the gradient the forward also writes lap(u) of every step, (B, ny, nx) without a ring
 * (or only the block whose gradient is summed, see leapfrog_forward_run's own) and with rows
 * ls >= nx elements apart, into the store the adjoint reads, so the adjoint needs no stencil
 * of u.  The store is written once and read only by the backward, long after: its
 * rows go out with non-temporal (streaming) stores, which skip reading each cache line before
 * writing it.  That read is a third of the store's memory traffic, and the store is most of
 * the gradient's.  The store pads its rows to whole 64-byte lines, so that no line is written
 * in part (see stream_row).
 *
 * The adjoint is the forward step itself.  With lambda_n the adjoint of u_n and r_n the
 * residual injected there, lap being symmetric, mu = c2dt2 G lambda obeys
 *
 *   mu_n = G * ((2 mu_{n+1} - G*mu_{n+2}) + c2dt2 * lap(mu_{n+1})) + c2dt2 G r_n,
 *
 * the forward step run backward in time with the residuals as sources, and the gradient of
 * c2dt2, sum_n G lambda_{n+1} lap(u_n), is (sum_n mu_{n+1} lap(u_n)) / c2dt2.  So
 * leapfrog_forward_run with grad is the adjoint pass: it reads the stored lap(u_n) where the
 * forward writes it and adds mu_{n+1} lap(u_n) into grad.  Against the hand-transposed adjoint
 * it replaced (a scratch ring for c2dt2 G lambda, a second stencil pass), forward + gradient
 * took 4-17 % less time.  Its
 * gradient equals autograd's of the reference to round-off, not bit for bit, and it needs
 * c2dt2 != 0 wherever the gradient is taken.
 */
#include <stddef.h>
#include <stdint.h>
#include <sched.h>
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#define C0 (-5.0 / 2.0)
#define C1 (4.0 / 3.0)
#define C2 (-1.0 / 12.0)

/* lap at column j of the block row whose ringed row starts at r (row stride s) */
#define LAP(r, s, j)                                                                  \
    ((((((r)[(j) + 2] * kc) + (((r)[(j) + 1] + (r)[(j) + 3]) * k1x))                  \
       + (((r)[(j)] + (r)[(j) + 4]) * k2x))                                           \
      + (((r)[(j) + 2 - (s)] + (r)[(j) + 2 + (s)]) * k1y))                            \
     + (((r)[(j) + 2 - 2 * (s)] + (r)[(j) + 2 + 2 * (s)]) * k2y))

#define LINE 64 /* bytes in a cache line */
#define PREFETCH_AHEAD 3072 /* bytes of the store the adjoint prefetches ahead of its reads */
#define FRUN_LAG 2 /* block rows each step runs ahead of the next in leapfrog_forward_run */

/* Copy a row of the store (bytes, a multiple of the element size, dst element-aligned) with
 * streaming stores for its whole 64-byte lines (plain copies of the partial lines at either
 * end), so writing it costs no read of it from memory.  Bits are copied, whatever the type.
 * A row that starts a line and has `room` bytes up to the next row's (the store pads its rows
 * to whole lines) streams its last line whole, padding included (src must hold that much): a
 * partial line costs a read of it from memory, and rows that do not fill their last line
 * made the forward that stores 20 % slower (270 float64 columns against 272).
 * Callers fence (stream_fence) before the store is read. */
/* wider rows are stored directly: their buffer would not fit the stack */
#define STREAM_ROW_MAX 32768
static inline void stream_row(void *restrict dst, const void *restrict src, size_t bytes,
                              size_t room)
{
#if defined(__AVX__)
    char *d = dst;
    const char *s = src;
    size_t head = (64 - ((uintptr_t)d & 63)) & 63, k;
    if (head == 0 && ((bytes + 63) & ~(size_t)63) <= room)
        bytes = (bytes + 63) & ~(size_t)63;
    if (head > bytes)
        head = bytes;
    memcpy(d, s, head);
    for (k = head; k + 64 <= bytes; k += 64) {
        _mm256_stream_si256((__m256i *)(d + k), _mm256_loadu_si256((const __m256i *)(s + k)));
        _mm256_stream_si256((__m256i *)(d + k + 32),
                            _mm256_loadu_si256((const __m256i *)(s + k + 32)));
    }
    memcpy(d + k, s + k, bytes - k);
#else
    (void)room;
    memcpy(dst, src, bytes);
#endif
}
static inline void stream_fence(void)
{
#if defined(__AVX__)
    _mm_sfence();
#endif
}

/* Subnormal numbers flushed to zero (FTZ) and read as zero (DAZ) for the kernel's duration,
 * the caller's mode restored on return.  Ahead of a wave front the 4th-order stencil leaves
 * values that decay through the subnormal range, and on Intel cores every operation on one
 * takes a microcode assist of ~100 cycles: a 2-rank run whose far half the front had not yet
 * reached spent twice the arithmetic of the near half (flushing took that 256x512 forward from
 * 0.18 s to 0.071 s on an Intel AVX-512 VM).  A flushed value is below 2.2e-308 (1.2e-38 in float32), far
 * under the round-off of any value the physics carries.  Devito's operators do the same. */
#if defined(__x86_64__) || defined(__i386__)
#define FTZ_DAZ 0x8040u
static inline unsigned flush_subnormals(void)
{
    const unsigned caller = _mm_getcsr();
    _mm_setcsr(caller | FTZ_DAZ);
    return caller;
}
static inline void restore_fp_mode(unsigned caller) { _mm_setcsr(caller); }
#define FLUSHES_SUBNORMALS 1
#else
static inline unsigned flush_subnormals(void) { return 0; }
static inline void restore_fp_mode(unsigned caller) { (void)caller; }
#define FLUSHES_SUBNORMALS 0
#endif

/* Whether this build flushes (1) or keeps (0) subnormals, so callers follow the compiled rule
 * instead of repeating the preprocessor's test. */
int acoustic_flushes_subnormals(void) { return FLUSHES_SUBNORMALS; }

#define COEFFS(T)                                                                     \
    const T kc = (T)(C0 * (ix2 + iy2)), k1x = (T)(C1 * ix2), k2x = (T)(C2 * ix2);     \
    const T k1y = (T)(C1 * iy2), k2y = (T)(C2 * iy2)

/* Prefetch the lines of columns [j, j1) of the row at pf (unless NULL), for the scalar loop
 * that follows, and return j. */
static inline long prefetch_tail(const char *pf, long j, long j1, size_t size)
{
    if (pf)
        for (long k = j; k < j1; k += LINE / (long)size)
            __builtin_prefetch(pf + k * size, 0, 3);
    if (pf && j < j1)
        __builtin_prefetch(pf + (j1 - 1) * size, 0, 3);
    return j;
}

/* AVX-512 or AVX2 runs of the loop bodies below (FWD_*): out[j] for j in [j, j1), a vector of L
 * columns at a time, with the sponge where g is not NULL, lap_out[j] = lap (else NULL) and
 * grad[j] += u[j] * lap_in[j] (else NULL); each vector prefetches the line of the row at pf
 * (else NULL) under its columns.  Returns where the scalar loop takes over (fewer than L
 * columns from j1), whose lines it has prefetched.  The same operations in the same order as
 * the scalar bodies, so the results are bit for bit theirs.
 * Why: the scalar bodies, vectorized by GCC, read columns j-2 .. j+2 of the centre row as five
 * unaligned vectors, most of which cross a cache line, and those loads (12 per vector) bound
 * the loop.  Here each iteration loads one new vector of the centre row and builds the four
 * shifted ones from it and its neighbours in registers (7 loads per vector).  In C at 1000^2
 * the forward went from 0.62-0.67 to 0.51-0.54 ns a point and step, the storing forward from
 * 0.78-0.97 to 0.65-0.82; the adjoint, bound by its read of the store, gained less.  Built
 * without AVX-512, the 256-bit runs took the forward from 0.53-0.55 to 0.41-0.42 and the
 * adjoint from 0.81-0.83 to 0.67-0.73.  Loads stay within the columns the scalar loop reads: the lanes of the
 * vectors on either side that a run does not use are masked off. */
#if defined(__AVX2__)
#define DEFINE_VECTOR_RUN(T, NAME, V, L, LOAD, LOAD_LAST2, LOAD_FIRST2, STORE, LAP_STORE,      \
                          SET1, ADD, SUB, MUL, NEIGHBOURS)                                    \
static inline __attribute__((always_inline)) long                                             \
NAME(long j, long j1, long w, const T *restrict r, const T *p,                                \
                    const T *restrict cc, const T *restrict g, T *out, T kc_, T k1x_, T k2x_, \
                    T k1y_, T k2y_, T *restrict lap_out, const T *restrict lap_in,            \
                    T *restrict grad, const char *pf)                                         \
{                                                                                             \
    if (j1 - j < (L))                                                                         \
        return prefetch_tail(pf, j, j1, sizeof(T));                                           \
    const V kc = SET1(kc_), k1x = SET1(k1x_), k2x = SET1(k2x_);                               \
    const V k1y = SET1(k1y_), k2y = SET1(k2y_);                                               \
    const T *c = r + 2; /* the centre: column j of the block is c[j] */                       \
    V before = LOAD_LAST2(c + j - (L)); /* c[j-2], c[j-1] in its last lanes */                \
    V centre = LOAD(c + j);                                                                   \
    for (; j + (L) <= j1; j += (L)) {                                                         \
        if (pf) /* a vector of L columns is a line of the row at pf */                        \
            __builtin_prefetch(pf + j * sizeof(T), 0, 3);                                     \
        const V after = j + 2 * (L) <= j1 ? LOAD(c + j + (L))                                 \
                                          : LOAD_FIRST2(c + j + (L)); /* c[j+L], c[j+L+1] */  \
        V m2, m1, p1, p2; /* columns j-2, j-1, j+1, j+2 */                                    \
        NEIGHBOURS(before, centre, after, m2, m1, p1, p2);                                    \
        const V lap = ADD(ADD(ADD(ADD(MUL(centre, kc), MUL(ADD(m1, p1), k1x)),                \
                                      MUL(ADD(m2, p2), k2x)),                                 \
                                  MUL(ADD(LOAD(c + j - w), LOAD(c + j + w)), k1y)),           \
                              MUL(ADD(LOAD(c + j - 2 * w), LOAD(c + j + 2 * w)), k2y));       \
        if (lap_out)                                                                          \
            LAP_STORE(lap_out + j, lap);                                                      \
        if (g) {                                                                              \
            const V gj = LOAD(g + j);                                                         \
            STORE(out + j, MUL(ADD(SUB(ADD(centre, centre), MUL(LOAD(p + j), gj)),            \
                                   MUL(lap, LOAD(cc + j))), gj));                             \
        } else {                                                                              \
            STORE(out + j, ADD(SUB(ADD(centre, centre), LOAD(p + j)), MUL(lap, LOAD(cc + j)))); \
        }                                                                                     \
        if (grad)                                                                             \
            STORE(grad + j, ADD(LOAD(grad + j), MUL(centre, LOAD(lap_in + j))));              \
        before = centre;                                                                      \
        centre = after;                                                                       \
    }                                                                                         \
    return prefetch_tail(pf, j, j1, sizeof(T));                                               \
}
/* vector_run_W_f64 and vector_run_W_f32 on W-bit vectors (256 or 512), with the masked loads
 * and the neighbour shifts of each type, and streamed_run_W_*: the same with lap_out written
 * by streaming stores (lap_out + j aligned to the vector, see forward_row_lap) */
#define DEFINE_RUN_PAIR(T, W, SUFFIX, V, L, X, last2, first2, neighbours)                     \
    DEFINE_VECTOR_RUN(T, vector_run_##W##_##SUFFIX, V, L, _mm##W##_loadu_##X, last2, first2,  \
                      _mm##W##_storeu_##X, _mm##W##_storeu_##X, _mm##W##_set1_##X,            \
                      _mm##W##_add_##X, _mm##W##_sub_##X, _mm##W##_mul_##X, neighbours)       \
    DEFINE_VECTOR_RUN(T, streamed_run_##W##_##SUFFIX, V, L, _mm##W##_loadu_##X, last2, first2,\
                      _mm##W##_storeu_##X, _mm##W##_stream_##X, _mm##W##_set1_##X,            \
                      _mm##W##_add_##X, _mm##W##_sub_##X, _mm##W##_mul_##X, neighbours)
#define DEFINE_VECTOR_RUNS(W, last2_pd, first2_pd, neighbours_pd, last2_ps, first2_ps,        \
                           neighbours_ps)                                                     \
    DEFINE_RUN_PAIR(double, W, f64, __m##W##d, (W) / 64, pd, last2_pd, first2_pd,             \
                    neighbours_pd)                                                            \
    DEFINE_RUN_PAIR(float, W, f32, __m##W, (W) / 32, ps, last2_ps, first2_ps, neighbours_ps)
#endif

#if defined(__AVX2__)
/* 256-bit vectors: the shifts cross the two 128-bit halves with vperm2f128, then move within
 * each half (vshufpd, or vpalignr for 4-byte lanes) */
#define NEIGHBOURS_256_PD(b, c, a, m2, m1, p1, p2)                                            \
    do {                                                                                      \
        m2 = _mm256_permute2f128_pd(b, c, 0x21), m1 = _mm256_shuffle_pd(m2, c, 0x5);          \
        p2 = _mm256_permute2f128_pd(c, a, 0x21), p1 = _mm256_shuffle_pd(c, p2, 0x5);          \
    } while (0)
#define ALIGNR_PS(hi, lo, bytes)                                                              \
    _mm256_castsi256_ps(                                                                      \
        _mm256_alignr_epi8(_mm256_castps_si256(hi), _mm256_castps_si256(lo), (bytes)))
#define NEIGHBOURS_256_PS(b, c, a, m2, m1, p1, p2)                                            \
    do {                                                                                      \
        const __m256 left = _mm256_permute2f128_ps(b, c, 0x21);  /* b4..b7, c0..c3 */         \
        const __m256 right = _mm256_permute2f128_ps(c, a, 0x21); /* c4..c7, a0..a3 */         \
        m2 = ALIGNR_PS(c, left, 8), m1 = ALIGNR_PS(c, left, 12);                              \
        p1 = ALIGNR_PS(right, c, 4), p2 = ALIGNR_PS(right, c, 8);                             \
    } while (0)
#define LAST2_256_PD(q) _mm256_maskload_pd((q), _mm256_set_epi64x(-1, -1, 0, 0))
#define FIRST2_256_PD(q) _mm256_maskload_pd((q), _mm256_set_epi64x(0, 0, -1, -1))
#define LAST2_256_PS(q) _mm256_maskload_ps((q), _mm256_set_epi32(-1, -1, 0, 0, 0, 0, 0, 0))
#define FIRST2_256_PS(q) _mm256_maskload_ps((q), _mm256_set_epi32(0, 0, 0, 0, 0, 0, -1, -1))
DEFINE_VECTOR_RUNS(256, LAST2_256_PD, FIRST2_256_PD, NEIGHBOURS_256_PD, LAST2_256_PS,
                   FIRST2_256_PS, NEIGHBOURS_256_PS)
#endif

#if defined(__AVX512F__)
/* m2, m1, p1, p2: the vectors one and two columns left and right of centre (b, c, a) */
#define NEIGHBOURS_512(SHIFT, L, b, c, a, m2, m1, p1, p2)                                     \
    do {                                                                                      \
        m2 = SHIFT(c, b, (L) - 2), m1 = SHIFT(c, b, (L) - 1);                                 \
        p1 = SHIFT(a, c, 1), p2 = SHIFT(a, c, 2);                                             \
    } while (0)
#define SHIFT_PD(hi, lo, k)                                                                   \
    _mm512_castsi512_pd(                                                                      \
        _mm512_alignr_epi64(_mm512_castpd_si512(hi), _mm512_castpd_si512(lo), (k)))
#define SHIFT_PS(hi, lo, k)                                                                   \
    _mm512_castsi512_ps(                                                                      \
        _mm512_alignr_epi32(_mm512_castps_si512(hi), _mm512_castps_si512(lo), (k)))
#define NEIGHBOURS_512_PD(b, c, a, m2, m1, p1, p2)                                            \
    NEIGHBOURS_512(SHIFT_PD, 8, b, c, a, m2, m1, p1, p2)
#define NEIGHBOURS_512_PS(b, c, a, m2, m1, p1, p2)                                            \
    NEIGHBOURS_512(SHIFT_PS, 16, b, c, a, m2, m1, p1, p2)
#define LAST2_512_PD(q) _mm512_maskz_loadu_pd((__mmask8)0xC0, (q))
#define FIRST2_512_PD(q) _mm512_maskz_loadu_pd((__mmask8)0x03, (q))
#define LAST2_512_PS(q) _mm512_maskz_loadu_ps((__mmask16)0xC000, (q))
#define FIRST2_512_PS(q) _mm512_maskz_loadu_ps((__mmask16)0x0003, (q))
DEFINE_VECTOR_RUNS(512, LAST2_512_PD, FIRST2_512_PD, NEIGHBOURS_512_PD, LAST2_512_PS,
                   FIRST2_512_PS, NEIGHBOURS_512_PS)
#endif

#if !defined(__AVX2__) /* the scalar loops do every column (GCC vectorizes them) */
#define DEFINE_SCALAR_RUN(T, SUFFIX)                                                          \
static inline long scalar_run_##SUFFIX(long j, long j1, long w, const T *r, const T *p,       \
                                       const T *cc, const T *g, T *out, T kc, T k1x, T k2x,   \
                                       T k1y, T k2y, T *lap_out, const T *lap_in, T *grad,    \
                                       const char *pf)                                        \
{                                                                                             \
    (void)w, (void)r, (void)p, (void)cc, (void)g, (void)out, (void)kc, (void)k1x;             \
    (void)k2x, (void)k1y, (void)k2y, (void)lap_out, (void)lap_in, (void)grad;                 \
    return prefetch_tail(pf, j, j1, sizeof(T));                                               \
}
DEFINE_SCALAR_RUN(double, f64)
DEFINE_SCALAR_RUN(float, f32)
#endif

/* The run each kind of pass takes.  The adjoint takes the 256-bit runs even where AVX-512 is
 * there: on the Zen 5 VM they made it 9-18 % faster than the 512-bit ones (0.69-0.72 against
 * 0.75-0.82 ns a point and step at 1000^2, 0.55-0.56 against 0.67-0.69 at 512^2, laps from
 * memory), while the forward and the storing forward are faster on the 512-bit ones. */
#if defined(__AVX512F__)
#define FORWARD_RUN_F64 vector_run_512_f64
#define FORWARD_RUN_F32 vector_run_512_f32
#elif defined(__AVX2__)
#define FORWARD_RUN_F64 vector_run_256_f64
#define FORWARD_RUN_F32 vector_run_256_f32
#else
#define FORWARD_RUN_F64 scalar_run_f64
#define FORWARD_RUN_F32 scalar_run_f32
#endif
#if defined(__AVX512F__)
#define STORING_RUN_F64 streamed_run_512_f64
#define STORING_RUN_F32 streamed_run_512_f32
#elif defined(__AVX2__)
#define STORING_RUN_F64 streamed_run_256_f64
#define STORING_RUN_F32 streamed_run_256_f32
#endif
#if defined(__AVX2__)
#define ADJOINT_RUN_F64 vector_run_256_f64
#define ADJOINT_RUN_F32 vector_run_256_f32
#else
#define ADJOINT_RUN_F64 scalar_run_f64
#define ADJOINT_RUN_F32 scalar_run_f32
#endif

/* KIND's run (FORWARD or ADJOINT) over [j0, j1) (sponge gg, else NULL) with the local names
 * of the kernels below */
#define VECTOR_RUN(KIND, j0, j1, gg, LAP_OUT, LAP_IN, GRAD, PF)                       \
    _Generic((out), double *: KIND##_RUN_F64, float *: KIND##_RUN_F32)(               \
        (j0), (j1), w, r, p, cc, (gg), out, kc, k1x, k2x, k1y, k2y, LAP_OUT, LAP_IN,  \
        GRAD, PF)

/* BODY(j) for j in [a, b): a vector run, then the scalar loop (without vector runs, with PF,
 * in runs of PREFETCH_RUN_COLUMNS columns, each prefetching its lines before its loop). */
#if defined(__AVX2__)
#define RUN_BAND(KIND, a, b, gg, BODY, LAP_OUT, LAP_IN, GRAD, PF)                    \
    for (long j = VECTOR_RUN(KIND, (a), (b), gg, LAP_OUT, LAP_IN, GRAD, PF); j < (b); ++j) \
        BODY(j);
#else
/* prefetching a whole band before its loop made the adjoint 5-10 % slower at 1000^2 than these
 * runs */
#define PREFETCH_RUN_COLUMNS 64L
#define RUN_BAND(KIND, a, b, gg, BODY, LAP_OUT, LAP_IN, GRAD, PF)                    \
    for (long c0 = (a), piece = (PF) ? PREFETCH_RUN_COLUMNS : (b) - (a); c0 < (b);   \
         c0 += piece) {                                                               \
        const long c1 = (b) - c0 > piece ? c0 + piece : (b);                          \
        for (long j = VECTOR_RUN(KIND, c0, c1, gg, LAP_OUT, LAP_IN, GRAD, PF); j < c1; ++j) \
            BODY(j);                                                                  \
    }
#endif

/* Run BODY(j) for j in the columns [JA, JB), with the sponge on [JA, lo) and [hi, JB) and
 * without it on [lo, hi) (the row's span, clamped to the columns): DAMPED and PLAIN are the
 * two versions of the loop body, and KIND's vector runs write LAP_OUT, read LAP_IN and add
 * into GRAD as those bodies do (NULL: not).  PF (else NULL): a row brought into cache while
 * the arithmetic runs, a line per vector of columns (or per piece of PREFETCH_RUN_COLUMNS),
 * instead of all at once when it is next read. */
#define SPLIT_ROW(i, JA, JB, KIND, DAMPED, PLAIN, LAP_OUT, LAP_IN, GRAD, PF)          \
    do {                                                                              \
        const long ja_ = (JA), jb_ = (JB);                                            \
        long lo = sponge ? (long)span[2 * (i)] : 0;                                   \
        long hi = sponge ? (long)span[2 * (i) + 1] : nx;                              \
        lo = lo < ja_ ? ja_ : (lo > jb_ ? jb_ : lo);                                  \
        hi = hi < lo ? lo : (hi > jb_ ? jb_ : hi);                                    \
        RUN_BAND(KIND, ja_, lo, g, DAMPED, LAP_OUT, LAP_IN, GRAD, PF)                 \
        RUN_BAND(KIND, lo, hi, NULL, PLAIN, LAP_OUT, LAP_IN, GRAD, PF)                \
        RUN_BAND(KIND, hi, jb_, g, DAMPED, LAP_OUT, LAP_IN, GRAD, PF)                 \
    } while (0)

/* forward_row_lap's row with the lap streamed from the vector runs (STORING_RUN) straight to
 * lp, which starts a line: without the stack buffer's copy the storing forward took 0.64-0.67
 * ns a point and step against 0.71-0.74 in float64 at 2000^2 (float32 at 1000^2, bound by the
 * memory's writes, did not change).  Every vector must start a line (512-bit) or
 * half of one (256-bit), and no line may be written in part (see stream_row), so the sponge's
 * bands are widened to whole lines (the sponge's formula with G = 1 gives the plain one's bits)
 * and the last, partial line of the row goes through the buffer, padding included. */
#if defined(__AVX2__)
#define STREAMS_RUNS 1
#define STREAMED_ROW(i)                                                                       \
    do {                                                                                      \
        const long per_line = LINE / (long)sizeof(real);                                      \
        const long jl = ca + (cb - ca) / per_line * per_line; /* the last whole line's end */ \
        long lo = sponge ? (long)span[2 * (i)] : ca, hi = sponge ? (long)span[2 * (i) + 1] : cb; \
        lo = lo < ca ? ca : lo;                                                               \
        lo = ca + (lo - ca + per_line - 1) / per_line * per_line;                             \
        lo = lo < jl ? lo : jl;                                                               \
        hi = hi < ca ? ca : hi;                                                               \
        hi = ca + (hi - ca) / per_line * per_line;                                            \
        hi = hi < jl ? hi : jl;                                                               \
        hi = hi > lo ? hi : lo;                                                               \
        RUN_BAND(STORING, ca, lo, g, FWD_DAMPED_LAP, lp - ca, NULL, NULL, NULL)               \
        RUN_BAND(STORING, lo, hi, NULL, FWD_PLAIN_LAP, lp - ca, NULL, NULL, NULL)             \
        if (sponge) {                                                                         \
            RUN_BAND(STORING, hi, jl, g, FWD_DAMPED_LAP, lp - ca, NULL, NULL, NULL)           \
            for (long j = jl; j < cb; ++j)                                                    \
                FWD_DAMPED_LAP(j);                                                            \
        } else {                                                                              \
            for (long j = jl; j < cb; ++j)                                                    \
                FWD_PLAIN_LAP(j);                                                             \
        }                                                                                     \
        if (jl < cb) {                                                                        \
            for (long j = cb; j < jl + per_line; ++j)                                         \
                buf[j] = 0;                                                                   \
            stream_row(lp + (jl - ca), buf + jl, sizeof(real) * per_line, sizeof(real) * per_line); \
        }                                                                                     \
    } while (0)
#else
#define STREAMS_RUNS 0
#define STREAMED_ROW(i) do { } while (0)
#endif

#define DEFINE_KERNELS(T, SUFFIX)                                                             \
/* zero the ghost ring of ringed rows [R0, R1) of one shot's field */                         \
static void zero_ring_##SUFFIX(T *f, long ny, long nx, long R0, long R1)                      \
{                                                                                             \
    const long w = nx + 4;                                                                    \
    for (long R = R0; R < R1; ++R) {                                                          \
        if (R < 2 || R >= ny + 2) {                                                           \
            memset(f + R * w, 0, sizeof(T) * w);                                              \
        } else {                                                                              \
            f[R * w] = f[R * w + 1] = 0;                                                      \
            f[R * w + nx + 2] = f[R * w + nx + 3] = 0;                                        \
        }                                                                                     \
    }                                                                                         \
}                                                                                             \
                                                                                              \
/* Block row i of a forward step over the columns [ca, cb) that also writes their lap(u) into  \
 * lp (a row of ls >= cb - ca elements, column ca first).  A function, so that lp is a        \
 * restrict parameter: without it GCC 12 does not vectorize the row (2x slower).  Where lp    \
 * starts a cache line and its rows are whole lines (the gradient's store), the vector runs   \
 * stream the lap straight to lp (STREAMED_ROW); elsewhere the row's lap goes to a buffer on  \
 * the stack (zeros in the padding), then streams to lp.  (buf and lp - ca are indexed by the \
 * block's column.) */                                                                        \
static inline void forward_row_lap_##SUFFIX(long i, long nx, long ls, long ca, long cb,       \
                                            const T *restrict r, const T *p,                 \
                                            const T *restrict cc, const T *restrict g,       \
                                            const T *restrict sponge,                        \
                                            const int64_t *restrict span, T *out,            \
                                            T *restrict lp, double iy2, double ix2)          \
{                                                                                             \
    typedef T real;                                                                           \
    const long w = nx + 4;                                                                    \
    COEFFS(T);                                                                                \
    if (ls > STREAM_ROW_MAX) {                                                                \
        T *restrict buf = lp - ca;                                                            \
        SPLIT_ROW(i, ca, cb, FORWARD, FWD_DAMPED_LAP, FWD_PLAIN_LAP, buf, NULL, NULL, NULL);  \
        return;                                                                               \
    }                                                                                         \
    T row[ls];                                                                                \
    T *restrict buf = row - ca;                                                               \
    if (STREAMS_RUNS && ((uintptr_t)lp & (LINE - 1)) == 0 && (ls * sizeof(T)) % LINE == 0) {  \
        STREAMED_ROW(i);                                                                      \
        return;                                                                               \
    }                                                                                         \
    SPLIT_ROW(i, ca, cb, FORWARD, FWD_DAMPED_LAP, FWD_PLAIN_LAP, buf, NULL, NULL, NULL);      \
    for (long j = cb - ca; j < ls; ++j)                                                       \
        row[j] = 0;                                                                           \
    stream_row(lp, row, sizeof(T) * (cb - ca), sizeof(T) * ls);                               \
}                                                                                             \
                                                                                              \
/* Block row i of an adjoint step in the forward's form (leapfrog_forward_run with grad): the  \
 * step, and gc += u * l at each point, l being the row of the stored lap the matching forward \
 * step used.  The store's bytes PREFETCH_AHEAD past each vector's come into cache while the   \
 * arithmetic runs: the rest of this row, then the start of the next, which the step reads in  \
 * the next row iteration.  (Read on demand, among a dozen other streams, the pass took 1.5 ns \
 * a point and step at 1000^2 against 1.1; two rows ahead, 1.00-1.09 against 0.88-0.94 for     \
 * 3 KB ahead, and 2, 2.5, 3.5 and 4 KB did no better.) */                                   \
static inline void adjoint_row_##SUFFIX(long i, long nx, long ja, long jb,                    \
                                        const T *restrict r, const T *p,                     \
                                        const T *restrict cc, const T *restrict g,           \
                                        const T *restrict sponge,                            \
                                        const int64_t *restrict span, T *out,                \
                                        const T *restrict l, T *restrict gc, double iy2,     \
                                        double ix2)                                          \
{                                                                                             \
    typedef T real;                                                                           \
    const long w = nx + 4;                                                                    \
    const char *pf = (const char *)l + PREFETCH_AHEAD; /* never faults, even past the store */ \
    COEFFS(T);                                                                                \
    SPLIT_ROW(i, ja, jb, ADJOINT, FWD_DAMPED_SUM, FWD_PLAIN_SUM, NULL, l, gc, pf);            \
}                                                                                             \
                                                                                              \
/* Block rows [i0, i1) of u_next, and its ring on the ringed rows they own (a caller splits   \
 * the rows between threads; the first and last piece own the ring rows above and below);     \
 * with lap (else NULL), their lap(u) too, into a store of the block own (as in               \
 * leapfrog_forward_run) in rows ls elements apart; with lap and grad (else NULL), an adjoint \
 * step instead, as in leapfrog_forward_run. */                                               \
void leapfrog_forward_##SUFFIX(long B, long ny, long nx, long i0, long i1,                   \
                               const T *restrict up, const T *u_prev,                        \
                               const T *restrict c2dt2, const T *restrict sponge,            \
                               const int64_t *restrict span, double iy2, double ix2,         \
                               T *u_next, T *restrict lap, long ls, T *restrict grad,        \
                               const int64_t *restrict own)                                  \
{                                                                                             \
    typedef T real; /* for the loop bodies below */                                          \
    const long w = nx + 4, plane = (ny + 4) * w;                                              \
    OWNED_BLOCK(own);                                                                         \
    const unsigned fp_mode = flush_subnormals();                                              \
    COEFFS(T);                                                                                \
    for (long b = 0; b < B; ++b) {                                                            \
        for (long i = i0; i < i1; ++i) {                                                      \
            const long row = b * plane + (i + 2) * w;                                         \
            const T *restrict r = up + row;                                                   \
            const T *p = u_prev + row + 2;                                                    \
            const T *restrict cc = c2dt2 + i * nx;                                            \
            const T *restrict g = sponge ? sponge + i * nx : NULL;                            \
            T *out = u_next + row + 2;                                                        \
            T *restrict lp = lap && i >= ra && i < rb ? lap + (b * (rb - ra) + i - ra) * ls : NULL; \
            STEP_ROW(i, 0, nx, SUFFIX);                                                       \
        }                                                                                     \
        zero_ring_##SUFFIX(u_next + b * plane, ny, nx, i0 == 0 ? 0 : i0 + 2,                  \
                           i1 == ny ? ny + 4 : i1 + 2);                                       \
    }                                                                                         \
    if (lap && !grad)                                                                         \
        stream_fence();                                                                       \
    restore_fp_mode(fp_mode);                                                                 \
}                                                                                             \
                                                                                              \
/* Steps k, k+1, ..., k+n-1 in one pass over the whole block (threads: at the end): step j   \
 * f[j+2] from f[j+1] (u) and f[j] (u_prev), FRUN_LAG block rows behind step j-1, so the rows it\
 * reads come from cache.  f[j+2] may be f[j] (two buffers recycled, as leapfrog_forward allows\
 * u_next = u_prev): in each row iteration step j-1 runs first, so the rows of f[j] it reads are\
 * read before step j overwrites them.  Each row of c2dt2 and the sponge is loaded once for all\
 * n steps.  Once step j has made ringed row R (all shots), the step's sources in that row are\
 * added (src_ptr: ny+5 CSR offsets by ringed row; src_at flat indices into the (B, ny+4, nx+4)\
 * field, stable-sorted by row; the value of source src_idx[k] is src_val[j*src_stride +      \
 * src_idx[k]]) and then its receivers read (rec_ptr, rec_at likewise; traces[j*rec_stride +  \
 * rec_slot[k]]), as the time loop does after a whole step; NULL pointers: none.  Sources and \
 * receivers lie in block rows.  With lap (else NULL), step j writes lap(f[j+1]) into lap[j].  \
 * Results are bit for bit those of n leapfrog_forward calls.                                 \
 * With grad (else NULL) the pass is the adjoint's (see the top of this file): step j reads   \
 * lap[j] instead, row by row in place, prefetching ahead (adjoint_row), and adds             \
 * f[j+1] * lap[j] into grad (ny, nx), summed over shots in order.                            \
 * own (else NULL: the whole block): the block rows [own[0], own[1]) and columns               \
 * [own[2], own[3]) whose gradient is summed (the other cells get the step alone); the store  \
 * lap[j] then holds that block only, (B, own[1] - own[0]) rows of ls >= own[3] - own[2].      \
 * win (else NULL: the whole block): step j makes only block rows [win[4j], win[4j+1]) and    \
 * columns [win[4j+2], win[4j+3]) (which hold own's), the cells its caller keeps exact        \
 * between halo exchanges; the others keep what they held.                                    \
 * Threads: a call does steps j0 .. j1-1 of the n; the calls for consecutive step ranges run  \
 * at once, each publishing in *done the last row iteration q it has finished and waiting     \
 * before iteration q until the call of the steps before it (*ahead) has finished q.  Rows of \
 * a step are then written and read in the one-thread order, and every row of grad gets its   \
 * steps' terms in step order: results do not depend on the split.  done, ahead: NULL alone.  \
 */                                                                                           \
void leapfrog_forward_run_##SUFFIX(long B, long ny, long nx, long n, long j0, long j1,        \
                                   int64_t *done, const int64_t *ahead, T *const *f,          \
                                   const T *restrict c2dt2, const T *restrict sponge,         \
                                   const int64_t *restrict span, double iy2, double ix2,      \
                                   const int64_t *src_ptr, const int64_t *src_at,             \
                                   const int64_t *src_idx, const T *src_val, long src_stride, \
                                   const int64_t *rec_ptr, const int64_t *rec_at,             \
                                   const int64_t *rec_slot, T *traces, long rec_stride,       \
                                   T *const *lap, long ls, T *restrict grad,                  \
                                   const int64_t *restrict win, const int64_t *restrict own)  \
{                                                                                             \
    typedef T real; /* for the loop bodies below */                                           \
    const long w = nx + 4, plane = (ny + 4) * w;                                              \
    OWNED_BLOCK(own);                                                                         \
    const unsigned fp_mode = flush_subnormals();                                              \
    COEFFS(T);                                                                                \
    for (long q = 0; q < ny + (n - 1) * FRUN_LAG; ++q) {                                      \
        if (ahead) /* wait for the steps before this call's to finish row iteration q */      \
            for (long spins = 0; __atomic_load_n(ahead, __ATOMIC_ACQUIRE) < q; ++spins)       \
                if (spins > 256) sched_yield();                                               \
        for (long j = j0; j < j1; ++j) {                                                      \
            const long i = q - j * FRUN_LAG;                                                  \
            if (i < 0 || i >= ny || (win && (i < win[4 * j] || i >= win[4 * j + 1])))        \
                continue;                                                                     \
            const long ja = win ? (long)win[4 * j + 2] : 0, jb = win ? (long)win[4 * j + 3] : nx; \
            T *un = f[j + 2];                                                                 \
            for (long b = 0; b < B; ++b) {                                                    \
                const long row = b * plane + (i + 2) * w;                                     \
                const T *restrict r = f[j + 1] + row;                                         \
                const T *p = f[j] + row + 2;                                                  \
                const T *restrict cc = c2dt2 + i * nx;                                        \
                const T *restrict g = sponge ? sponge + i * nx : NULL;                        \
                T *out = un + row + 2;                                                        \
                T *restrict lp = lap && i >= ra && i < rb ? lap[j] + (b * (rb - ra) + i - ra) * ls : NULL; \
                STEP_ROW(i, ja, jb, SUFFIX);                                                  \
                un[row] = un[row + 1] = un[row + nx + 2] = un[row + nx + 3] = 0;              \
                if (i == 0)                                                                   \
                    memset(un + b * plane, 0, sizeof(T) * 2 * w);                             \
                if (i == ny - 1)                                                              \
                    memset(un + b * plane + (ny + 2) * w, 0, sizeof(T) * 2 * w);              \
            }                                                                                 \
            if (src_ptr)                                                                      \
                for (long k = src_ptr[i + 2]; k < src_ptr[i + 3]; ++k)                        \
                    un[src_at[k]] += src_val[j * src_stride + src_idx[k]];                    \
            if (rec_ptr)                                                                      \
                for (long k = rec_ptr[i + 2]; k < rec_ptr[i + 3]; ++k)                        \
                    traces[j * rec_stride + rec_slot[k]] = un[rec_at[k]];                     \
        }                                                                                     \
        if (done)                                                                             \
            __atomic_store_n(done, q, __ATOMIC_RELEASE);                                      \
    }                                                                                         \
    if (lap && !grad)                                                                         \
        stream_fence();                                                                       \
    restore_fp_mode(fp_mode);                                                                 \
}

/* One step's point work in one call: field[add[k]] += vals[k] in order (the sources, or the
 * receivers' residuals), then out[k] = field[get[k]] (the receivers).  Indices are flat into
 * the whole (B, ny+4, nx+4) array.  Done in Python, each is a torch indexing op that costs as
 * much as a small grid's stencil pass. */
#define DEFINE_POINTS(T, SUFFIX)                                                              \
void scatter_gather_##SUFFIX(T *field, const int64_t *restrict add, const T *restrict vals,   \
                             long nadd, const int64_t *restrict get, long nget,              \
                             T *restrict out)                                                \
{                                                                                             \
    for (long k = 0; k < nadd; ++k) field[add[k]] += vals[k];                                  \
    for (long k = 0; k < nget; ++k) out[k] = field[get[k]];                                    \
}

/* Loop bodies for SPLIT_ROW (they use the names of the kernels above; real is their T). */
#define FWD_DAMPED(j)                                                                 \
    do {                                                                              \
        const real c = r[(j) + 2];                                                       \
        out[j] = (((c + c) - p[j] * g[j]) + LAP(r, w, j) * cc[j]) * g[j];             \
    } while (0)
#define FWD_PLAIN(j)                                                                  \
    do {                                                                              \
        const real c = r[(j) + 2];                                                       \
        out[j] = ((c + c) - p[j]) + LAP(r, w, j) * cc[j];                             \
    } while (0)
#define FWD_DAMPED_LAP(j)                                                             \
    do {                                                                              \
        const real c = r[(j) + 2], l = LAP(r, w, j);                                     \
        buf[j] = l;                                                                   \
        out[j] = (((c + c) - p[j] * g[j]) + l * cc[j]) * g[j];                        \
    } while (0)
#define FWD_PLAIN_LAP(j)                                                              \
    do {                                                                              \
        const real c = r[(j) + 2], l = LAP(r, w, j);                                     \
        buf[j] = l;                                                                   \
        out[j] = ((c + c) - p[j]) + l * cc[j];                                        \
    } while (0)
#define FWD_DAMPED_SUM(j)                                                             \
    do {                                                                              \
        const real c = r[(j) + 2];                                                       \
        out[j] = (((c + c) - p[j] * g[j]) + LAP(r, w, j) * cc[j]) * g[j];             \
        gc[j] += c * l[j];                                                            \
    } while (0)
#define FWD_PLAIN_SUM(j)                                                              \
    do {                                                                              \
        const real c = r[(j) + 2];                                                       \
        out[j] = ((c + c) - p[j]) + LAP(r, w, j) * cc[j];                             \
        gc[j] += c * l[j];                                                            \
    } while (0)
/* block row i of a forward step, and its lap(u) where lp is not NULL */
/* Block row i of a step over the columns [ja, jb), which hold the owned ones [ca, cb): where lp
 * (a row of the store) is given, the adjoint's with grad, summing the gradient on [ca, cb), else
 * the forward's, writing lap(u) of [ca, cb) into lp; the step alone on the other columns. */
#define STEP_ROW(i, ja, jb, SUFFIX)                                                   \
    do {                                                                              \
        if (lp) {                                                                     \
            if (ja < ca)                                                              \
                SPLIT_ROW(i, ja, ca, FORWARD, FWD_DAMPED, FWD_PLAIN, NULL, NULL, NULL, NULL); \
            if (grad)                                                                 \
                adjoint_row_##SUFFIX(i, nx, ca, cb, r, p, cc, g, sponge, span, out,   \
                                     lp - ca, grad + i * nx, iy2, ix2);               \
            else                                                                      \
                forward_row_lap_##SUFFIX(i, nx, ls, ca, cb, r, p, cc, g, sponge, span, \
                                         out, lp, iy2, ix2);                          \
            if (cb < jb)                                                              \
                SPLIT_ROW(i, cb, jb, FORWARD, FWD_DAMPED, FWD_PLAIN, NULL, NULL, NULL, NULL); \
        } else {                                                                      \
            SPLIT_ROW(i, ja, jb, FORWARD, FWD_DAMPED, FWD_PLAIN, NULL, NULL, NULL, NULL); \
        }                                                                             \
    } while (0)
/* the rows [ra, rb) and columns [ca, cb) of the owned block own, or of the whole block */
#define OWNED_BLOCK(own)                                                              \
    const long ra = (own) ? (long)(own)[0] : 0, rb = (own) ? (long)(own)[1] : ny;    \
    const long ca = (own) ? (long)(own)[2] : 0, cb = (own) ? (long)(own)[3] : nx
DEFINE_KERNELS(double, f64)
DEFINE_KERNELS(float, f32)
DEFINE_POINTS(double, f64)
DEFINE_POINTS(float, f32)
