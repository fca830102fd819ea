/* Fused leapfrog step of the 2-D acoustic wave equation, 4th order in space, and its adjoint.
 *
 * Fields are C-contiguous (B, ny+4, nx+4): B shots, each with a ghost ring of width 2 around its
 * ny x nx block (the ring holds neighbours' values or zeros at the edge of the grid).
 * c2dt2 = c^2 dt^2 and the sponge G are (ny, nx), shared by all shots; G may be NULL (none).
 *
 *   u_next = G * ((2u - G*u_prev) + c2dt2 * lap(u))      on the block; zeros on the ring.
 *
 * Every operation rounds on its own, in the order of odecli.pde.leapfrog.reference_step (build
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
 * and with rows ls >= nx elements apart, into the store the adjoint reads: the adjoint then
 * needs no stencil of u, only the one of its own field, and does about the forward's
 * arithmetic instead of twice it.  The stored values are the very ones the step used, so the
 * gradient is the same bit for bit.  The store is
 * written once and read only by the backward, long after: its rows go out with non-temporal
 * (streaming) stores, which skip reading each cache line before writing it.  That read is a
 * third of the store's memory traffic, and the store is most of the gradient's.  The store
 * pads its rows to whole 64-byte lines, so that no line is written in part (see stream_row).
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

/* h rows in an adjoint step's ring: the stencil's five, so that a slot is written again one row
 * iteration after its last read, while its lines are still in cache.  With 8 a slot was written
 * again four iterations after its last read, when its lines had likely left the cache (writing
 * such a line reads it first): the adjoint took 0-12 % longer in pde_kernel_bench.c from 256^2
 * to 2000^2, forward + gradient 1-5 % longer (pde_kernel_ab.py).  Results do not depend on
 * HROWS. */
#define HROWS 5
#define RUN_LAG 2 /* rows each step runs ahead of the next in leapfrog_adjoint_run */
#define LINE 64 /* bytes in a cache line: copies' rows are whole lines */
#define PREFETCH_MAX_BYTES (112 << 10) /* see leapfrog_adjoint_run: 8 steps of 1750 doubles */
#define PREFETCH_ITERATION_BYTES (16 << 10) /* see prefetch_row */
#define PREFETCH_COLUMNS 64 /* columns of the stencil pass between prefetches */
/* Step j's fused pass reads step j+1's lap at block row qj - 2, which is that step's own row of
 * the same row iteration (prefetched as such a row iteration ahead) only with a lag of 2 rows. */
_Static_assert(RUN_LAG == 2, "prefetch_row takes the fused pass's row for the next step's own");
#define FRUN_LAG 2 /* block rows each step runs ahead of the next in leapfrog_forward_run */
#define HROW(q) (((q) < 0 || (q) >= ny) ? scratch + HROWS * hw : scratch + ((q) % HROWS) * hw)
/* the adjoint's stencil pass: the same sums as LAP, over five separate h rows */
#define LAPT(J)                                                                       \
    (((((hc[(J) + 2] * kc) + ((hc[(J) + 1] + hc[(J) + 3]) * k1x))                     \
       + ((hc[(J)] + hc[(J) + 4]) * k2x))                                             \
      + ((n1[(J) + 2] + s1[(J) + 2]) * k1y))                                          \
     + ((n2[(J) + 2] + s2[(J) + 2]) * k2y))

/* Copy a row of the store (bytes, a multiple of the element size, dst element-aligned) with
 * streaming stores for its whole 64-byte lines (plain copies of the partial lines at either
 * end), so writing it costs no read of it from memory.  Bits are copied, whatever the type.
 * A row that starts a line and has `room` bytes up to the next row's (the store pads its rows
 * to whole lines) streams its last line whole, padding included (src must hold that much): a
 * partial line costs a read of it from memory, and rows that do not fill their last line
 * made the forward that stores 20 % slower (270 float64 columns against 272).
 * Callers fence (stream_fence) before the store is read. */
#define STREAM_ROW_MAX 32768 /* wider rows are stored directly: their buffer would not fit the stack */
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
        _mm256_stream_si256((__m256i *)(d + k + 32), _mm256_loadu_si256((const __m256i *)(s + k + 32)));
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
 * reached spent twice the arithmetic of the near half (benchmarks/RESULTS.md, "PDE: subnormal
 * numbers flushed to zero").  A flushed value is below 2.2e-308 (1.2e-38 in float32), far
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

/* Rows in one adjoint scratch (HROWS h rows and a zero row), so that callers size scratches by
 * the compiled kernel instead of repeating HROWS. */
long acoustic_scratch_rows(void) { return HROWS + 1; }

#define COEFFS(T)                                                                     \
    const T kc = (T)(C0 * (ix2 + iy2)), k1x = (T)(C1 * ix2), k2x = (T)(C2 * ix2);     \
    const T k1y = (T)(C1 * iy2), k2y = (T)(C2 * iy2)

/* Run BODY(j) for j in [0, nx), with the sponge on [0, lo) and [hi, nx) and without it on
 * [lo, hi): DAMPED and PLAIN are the two versions of the loop body. */
#define SPLIT_ROW(i, DAMPED, PLAIN)                                                   \
    do {                                                                              \
        const long lo = sponge ? (long)span[2 * (i)] : 0;                             \
        const long hi = sponge ? (long)span[2 * (i) + 1] : 0;                         \
        if (!sponge) {                                                                \
            for (long j = 0; j < nx; ++j) PLAIN(j);                                   \
        } else {                                                                      \
            for (long j = 0; j < lo; ++j) DAMPED(j);                                  \
            for (long j = lo; j < hi; ++j) PLAIN(j);                                  \
            for (long j = hi > lo ? hi : lo; j < nx; ++j) DAMPED(j);                  \
        }                                                                             \
    } while (0)

/* SPLIT_ROW's three loops over the columns [c0, c1) alone, the plain run being [lo, hi) */
#define SPLIT_RANGE(c0, c1, lo, hi, DAMPED, PLAIN)                                    \
    do {                                                                              \
        const long top = (hi) > (lo) ? (hi) : (lo);                                   \
        const long a0 = (lo) < (c0) ? (c0) : (lo) < (c1) ? (lo) : (c1);               \
        const long a1 = top < (c0) ? (c0) : top < (c1) ? top : (c1);                  \
        for (long j = (c0); j < a0; ++j) DAMPED(j);                                   \
        for (long j = a0; j < a1; ++j) PLAIN(j);                                      \
        for (long j = a1; j < (c1); ++j) DAMPED(j);                                   \
    } while (0)

/* SPLIT_ROW in pieces of PREFETCH_COLUMNS columns, each followed by prefetches of as many
 * bytes of the row at pf (the bytes of nx elements in all): that row comes into cache while
 * the arithmetic runs, a few lines at a time, instead of all at once when it is next read. */
#define SPLIT_ROW_PREFETCHING(i, DAMPED, PLAIN, pf)                                   \
    do {                                                                              \
        const long lo = sponge ? (long)span[2 * (i)] : 0;                             \
        const long hi = sponge ? (long)span[2 * (i) + 1] : nx;                        \
        for (long c0 = 0; c0 < nx; c0 += PREFETCH_COLUMNS) {                          \
            const long c1 = c0 + PREFETCH_COLUMNS < nx ? c0 + PREFETCH_COLUMNS : nx;  \
            SPLIT_RANGE(c0, c1, lo, hi, DAMPED, PLAIN);                               \
            for (long k = c0 * (long)sizeof(real); k < c1 * (long)sizeof(real); k += LINE) \
                __builtin_prefetch((pf) + k, 0, 3);                                   \
        }                                                                             \
    } while (0)

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
/* Block row i of a forward step that also writes its lap(u) into lp (a row of ls >= nx      \
 * elements).  A function, so that lp is a restrict parameter: without it GCC 12 does not    \
 * vectorize the row (2x slower).  The row's lap goes to a buffer on the stack (zeros in the  \
 * padding), then streams to lp. */                                                           \
static inline void forward_row_lap_##SUFFIX(long i, long nx, long ls, const T *restrict r,    \
                                            const T *p, const T *restrict cc,                \
                                            const T *restrict g, const T *restrict sponge,   \
                                            const int64_t *restrict span, T *out,            \
                                            T *restrict lp, double iy2, double ix2)          \
{                                                                                             \
    typedef T real;                                                                           \
    const long w = nx + 4;                                                                    \
    COEFFS(T);                                                                                \
    if (ls > STREAM_ROW_MAX) {                                                                \
        T *restrict buf = lp;                                                                 \
        SPLIT_ROW(i, FWD_DAMPED_LAP, FWD_PLAIN_LAP);                                          \
        return;                                                                               \
    }                                                                                         \
    T row[ls];                                                                                \
    T *restrict buf = row;                                                                    \
    SPLIT_ROW(i, FWD_DAMPED_LAP, FWD_PLAIN_LAP);                                              \
    for (long j = nx; j < ls; ++j)                                                            \
        row[j] = 0;                                                                           \
    stream_row(lp, buf, sizeof(T) * nx, sizeof(T) * ls);                                      \
}                                                                                             \
                                                                                              \
/* Block rows [i0, i1) of u_next, and its ring on the ringed rows they own (a caller splits   \
 * the rows between threads; the first and last piece own the ring rows above and below);     \
 * with lap (else NULL), their lap(u) too, in rows ls >= nx elements apart. */               \
void leapfrog_forward_##SUFFIX(long B, long ny, long nx, long i0, long i1,                   \
                               const T *restrict up, const T *u_prev,                        \
                               const T *restrict c2dt2, const T *restrict sponge,            \
                               const int64_t *restrict span, double iy2, double ix2,         \
                               T *u_next, T *restrict lap, long ls)                          \
{                                                                                             \
    typedef T real; /* for the loop bodies below */                                          \
    const long w = nx + 4, plane = (ny + 4) * w;                                              \
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
            T *restrict lp = lap ? lap + (b * ny + i) * ls : NULL;                            \
            FORWARD_ROW(i, SUFFIX);                                                           \
        }                                                                                     \
        zero_ring_##SUFFIX(u_next + b * plane, ny, nx, i0 == 0 ? 0 : i0 + 2,                  \
                           i1 == ny ? ny + 4 : i1 + 2);                                       \
    }                                                                                         \
    if (lap)                                                                                  \
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
 * Threads: steps j0 .. j1-1 of the n, with done and ahead as in leapfrog_adjoint_run.        \
 */                                                                                           \
void leapfrog_forward_run_##SUFFIX(long B, long ny, long nx, long n, long j0, long j1,        \
                                   int64_t *done, const int64_t *ahead, T *const *f,          \
                                   const T *restrict c2dt2, const T *restrict sponge,         \
                                   const int64_t *restrict span, double iy2, double ix2,      \
                                   const int64_t *src_ptr, const int64_t *src_at,             \
                                   const int64_t *src_idx, const T *src_val, long src_stride, \
                                   const int64_t *rec_ptr, const int64_t *rec_at,             \
                                   const int64_t *rec_slot, T *traces, long rec_stride,       \
                                   T *const *lap, long ls)                                    \
{                                                                                             \
    typedef T real; /* for the loop bodies below */                                           \
    const long w = nx + 4, plane = (ny + 4) * w;                                              \
    const unsigned fp_mode = flush_subnormals();                                              \
    COEFFS(T);                                                                                \
    for (long q = 0; q < ny + (n - 1) * FRUN_LAG; ++q) {                                      \
        if (ahead) /* as in leapfrog_adjoint_run */                                           \
            for (long spins = 0; __atomic_load_n(ahead, __ATOMIC_ACQUIRE) < q; ++spins)       \
                if (spins > 256) sched_yield();                                               \
        for (long j = j0; j < j1; ++j) {                                                      \
            const long i = q - j * FRUN_LAG;                                                  \
            if (i < 0 || i >= ny)                                                             \
                continue;                                                                     \
            T *un = f[j + 2];                                                                 \
            for (long b = 0; b < B; ++b) {                                                    \
                const long row = b * plane + (i + 2) * w;                                     \
                const T *restrict r = f[j + 1] + row;                                         \
                const T *p = f[j] + row + 2;                                                  \
                const T *restrict cc = c2dt2 + i * nx;                                        \
                const T *restrict g = sponge ? sponge + i * nx : NULL;                        \
                T *out = un + row + 2;                                                        \
                T *restrict lp = lap ? lap[j] + (b * ny + i) * ls : NULL;                     \
                FORWARD_ROW(i, SUFFIX);                                                       \
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
    if (lap)                                                                                  \
        stream_fence();                                                                       \
    restore_fp_mode(fp_mode);                                                                 \
}                                                                                             \
                                                                                              \
/* Adjoint of one step, as the adjoint time loop needs it (in place).                         \
 * On entry g holds the adjoint of u_next (its ring is ignored: the forward wrote constants    \
 * there; g is only read) and a the adjoint of u_next of the step after this one (that step    \
 * read u as its u_prev; block only), or zeros.  On exit a holds the whole adjoint of u, ring  \
 * included (for the halo adjoint to send back):                                               \
 *   a = 2 G g + lap^T(c2dt2 G g) - G G a_entry,                                               \
 * and the shot-summed gradient of c2dt2, G g lap(u), is added into grad_c2 (lap: the lap(u)  \
 * the forward stored for this step, ny rows ls apart per shot).  Carrying the next step's g \
 * instead of a stored adjoint of u_prev saves one array write per step.                      \
 * lap is symmetric, so lap^T is the same stencil applied to h = c2dt2 G g padded with zeros.  \
 * Ringed row R of a needs g and a_entry there and h of block rows R-4 .. R: rows are visited \
 * in order, the pass that makes h (and the gradient's terms) two rows ahead of the pass that \
 * makes a, so each row comes from memory once and h lives in a ring of HROWS rows.  The      \
 * second pass reads a_entry and writes a once (a first pass that wrote the pointwise terms   \
 * into a cost one more write of a row per step: 5-15 % of the adjoint).  This call owns      \
 * ringed rows [R0, R1) of a (and block rows [R0-2, R1-2) of grad_c2); h of the two block rows\
 * on either side is recomputed (it only reads g), so pieces of one step can run on threads at\
 * once.  scratch holds (HROWS + 1) rows of nx+8 (4 zero columns each side, then one all-zero \
 * row standing in for rows off the block), one scratch per concurrent call; the caller zeroes\
 * it once, the kernel writes only inside columns.  lap (the step's stored lap, rows ls      \
 * apart) and lap_next (the next step's) are read at block rows q and q-2; with ls = 0 each is \
 * that one row (leapfrog_adjoint_run's copies).  Every pointer is distinct (restrict): no    \
 * alias checks.  prefetch: a row of as many bytes as a block row, brought into cache during  \
 * the stencil pass (NULL: none).                                                             \
 */                                                                                           \
static inline void adjoint_iteration_##SUFFIX(long q, long ny, long nx, long R0, long R1,   \
                                              const T *restrict lap, long ls,                \
                                              const T *restrict c2dt2,                       \
                                              const T *restrict sponge,                      \
                                              const int64_t *restrict span,                  \
                                              const T *restrict g, T *restrict a,            \
                                              double iy2, double ix2, T *restrict grad_c2,   \
                                              T *restrict scratch, int h_made,               \
                                              const T *restrict lap_next,                    \
                                              T *restrict scratch_next, const char *prefetch) \
{                                                                                             \
    typedef T real; /* for the loop bodies below */                                          \
    const long w = nx + 4, hw = nx + 8;                                                       \
    COEFFS(T);                                                                                \
    if (q >= 0 && q < ny && !h_made) { /* block row q: h, and gradient terms if owned */     \
        const long i = q, row = (i + 2) * w + 2;                                              \
        const T *restrict l = lap + i * ls;                                                   \
        const T *restrict cc = c2dt2 + i * nx;                                                \
        const T *restrict s = sponge ? sponge + i * nx : NULL;                                \
        const T *restrict gi = g + row;                                                       \
        T *restrict gc = grad_c2 + i * nx;                                                    \
        T *restrict h = scratch + (i % HROWS) * hw + 4;                                       \
        if (q >= R0 - 2 && q < R1 - 2)                                                        \
            SPLIT_ROW(i, GRAD_H_DAMPED, GRAD_H_PLAIN);                                        \
        else                                                                                  \
            SPLIT_ROW(i, H_DAMPED, H_PLAIN);                                                  \
    }                                                                                         \
    if (q < R0)                                                                               \
        return;                                                                               \
    /* ringed row I = q of a: the stencil over h rows I-4 .. I, centre I-2 */                 \
    const long I = q;                                                                         \
    const T *restrict n2 = HROW(I - 4), *restrict n1 = HROW(I - 3);                           \
    const T *restrict hc = HROW(I - 2);                                                       \
    const T *restrict s1 = HROW(I - 1), *restrict s2 = HROW(I);                               \
    T *restrict out = a + I * w;                                                              \
    if (I < 2 || I >= ny + 2) { /* a ring row: the stencil's terms alone */                   \
        for (long J = 0; J < w; ++J) out[J] = LAPT(J);                                        \
        return;                                                                               \
    }                                                                                         \
    out[0] = LAPT(0);                                                                         \
    out[1] = LAPT(1);                                                                         \
    {   /* block row I-2: the pointwise terms, from g and a_entry, then the stencil's */      \
        const long i = I - 2;                                                                 \
        const T *restrict gi = g + I * w + 2;                                                 \
        const T *restrict s = sponge ? sponge + i * nx : NULL;                                \
        T *restrict ai = out + 2;                                                             \
        if (lap_next) { /* and the next step's first pass over this row, from a in registers */\
            const T *restrict ln = lap_next + i * ls, *restrict cn = c2dt2 + i * nx;          \
            T *restrict gn = grad_c2 + i * nx;                                                \
            T *restrict hn = scratch_next + (i % HROWS) * hw + 4;                             \
            if (prefetch)                                                                     \
                SPLIT_ROW_PREFETCHING(i, ADJ_NEXT_DAMPED, ADJ_NEXT_PLAIN, prefetch);          \
            else                                                                              \
                SPLIT_ROW(i, ADJ_NEXT_DAMPED, ADJ_NEXT_PLAIN);                                \
        } else if (prefetch) {                                                                \
            SPLIT_ROW_PREFETCHING(i, ADJ_DAMPED, ADJ_PLAIN, prefetch);                        \
        } else {                                                                              \
            SPLIT_ROW(i, ADJ_DAMPED, ADJ_PLAIN);                                              \
        }                                                                                     \
    }                                                                                         \
    out[nx + 2] = LAPT(nx + 2);                                                               \
    out[nx + 3] = LAPT(nx + 3);                                                               \
}                                                                                             \
                                                                                              \
void leapfrog_adjoint_##SUFFIX(long B, long ny, long nx, long R0, long R1,                   \
                               const T *restrict lap, long ls, const T *restrict c2dt2,      \
                               const T *restrict sponge, const int64_t *restrict span,       \
                               const T *restrict g, T *restrict a, double iy2, double ix2,   \
                               T *restrict grad_c2, T *restrict scratch)                     \
{                                                                                             \
    const long plane = (ny + 4) * (nx + 4);                                                   \
    const unsigned fp_mode = flush_subnormals();                                              \
    for (long b = 0; b < B; ++b)                                                              \
        for (long q = R0 - 4; q < R1; ++q)                                                    \
            adjoint_iteration_##SUFFIX(q, ny, nx, R0, R1, lap + b * ny * ls, ls, c2dt2, sponge,\
                                       span, g + b * plane, a + b * plane, iy2, ix2,          \
                                       grad_c2, scratch, 0, NULL, NULL, NULL);                \
    restore_fp_mode(fp_mode);                                                                 \
}                                                                                             \
                                                                                              \
/* The stored row for call (step j, shot b) of row iteration q to prefetch, or NULL: see      \
 * leapfrog_adjoint_run.  Calls after the first step's mostly find their h made and read only \
 * the fused pass's row (the next step's own, RUN_LAG rows above theirs), and the last two    \
 * steps' calls are followed by step j0's of iteration q + 1, which reads its own row and the \
 * fused pass's.  A call prefetches the row the next call (the next step's, for shot b B      \
 * calls later) reads; but with at most PREFETCH_ITERATION_BYTES of rows a row iteration, a   \
 * call is over before its prefetches land (128^2: 15 % slower), so (whole_iteration) each    \
 * call prefetches its own step's row of iteration q + 1. */                                  \
static inline const char *prefetch_row_##SUFFIX(const T *const *lap, long ny, long ls, long b, \
                                                long j, long j0, long j1, long q,             \
                                                int whole_iteration)                          \
{                                                                                             \
    long step = j, row = q + 1 - j * RUN_LAG;                                                 \
    if (!whole_iteration && j + 2 < j1)                                                       \
        step = j + 2, row = q - (j + 1) * RUN_LAG - 2;                                        \
    else if (!whole_iteration && j + 2 == j1)                                                 \
        step = j0, row = q + 1 - j0 * RUN_LAG;                                                \
    else if (!whole_iteration)                                                                \
        step = j0 + 1, row = q + 1 - j0 * RUN_LAG - 2;                                        \
    if (step >= j1 || row < 0 || row >= ny)                                                   \
        return NULL;                                                                          \
    return (const char *)(lap[step] + (b * ny + row) * ls);                                   \
}                                                                                             \
                                                                                              \
/* Adjoint steps k, k-1, ..., k-n+1 in one pass over the whole block (threads: see below),    \
 * with the same arithmetic in the same order as n leapfrog_adjoint calls with the receiver   \
 * injections between them, so the results are bit for bit those.  Step k-j runs j*RUN_LAG    \
 * rows behind step k; its fields alternate: g = A, a = Bf for even j, g = Bf, a = A for odd  \
 * j.  Ringed row q of step k-j's output is final once that step has done row q; it then gets \
 * the residuals of step k-j-1 (receivers sorted by ringed row: rec_ptr[j] their ny+5 CSR     \
 * offsets, rec_ix[j] ringed columns, rec_val[j] (B, nrec[j]) in that order) and is read by   \
 * step k-j-1 right after, still in cache; where it gets none, step k-j-1's first pass over   \
 * that row (h and the gradient's terms) is done in the same loop, from the values just made   \
 * (10 % less time at 256^2 and 1000^2).  Each row of c2dt2, the sponge and grad_c2 is         \
 * loaded once for all n steps, and A and Bf once, besides the n stored lap[0..n-1]          \
 * (of u_k .. u_{k-n+1}): the adjoint is bound by memory traffic once fields leave cache.  A  \
 * step reads its g's rows RUN_LAG rows ahead of where the step behind it overwrites them.    \
 * On exit the adjoint of u_{k-n+1} is in A for even n (and that of u_{k-n+2} in Bf), in Bf   \
 * for odd n.  Shots are interleaved row by row, so grad_c2 sums over shots in the calls'     \
 * order.  scratch: n B adjoint scratches (one per step and shot).                            \
 * The stored lap rows come from memory (the forward streamed them past the caches), and      \
 * the stencil loop, left to fetch them a line at a time among a dozen other streams, spent   \
 * 0.7 ns a point on them, where a plain stream reads a double in 0.2.  So when a call's      \
 * rows take at most PREFETCH_MAX_BYTES a row iteration, its stencil pass prefetches the      \
 * rows a later call reads (prefetch_row), and each call reads its rows in place, from        \
 * cache, the memory reads overlapping the arithmetic.  Longer rows no longer fit, with the   \
 * pass's other rows, in the 1 MB L2 cache of the machine measured, and prefetches made the   \
 * adjoint 3-9 % slower (2000 and 3000 float64 columns; at 1800 the two tie); their rows are  \
 * copied (memcpy) into copies just before each call, which streams them with many loads in  \
 * flight.  (Column strips, so that a pass's rows fit in L2, were slower at 512^2-2000^2:     \
 * benchmarks/RESULTS.md, "PDE: the adjoint pass in column strips".)                         \
 * copies: 2 n B rows of nx rounded up to whole cache lines                                   \
 * (leapfrog.lap_row_stride).  (A buffer of its own: placed after the scratches, the copies   \
 * gained half as much.)  In pde_kernel_bench.c against the copies alone, the adjoint took    \
 * 20-30 % less time at 256^2 and 512^2, 10-15 % less at 1000^2; the copies had taken 12-23 %  \
 * off at 256^2, 512^2 and 2000^2.                                                            \
 * Threads: a call does steps j0 .. j1-1 of the n; the calls for consecutive step ranges run  \
 * at once, each publishing in *done the last iteration q it has finished and waiting before  \
 * iteration q until the call of the steps before it (*ahead) has finished q.  Rows of a step \
 * are then written and read in the one-thread order, and every row of grad_c2 gets its       \
 * steps' terms in step order: results do not depend on the split.  done, ahead: NULL alone.  \
 */                                                                                           \
void leapfrog_adjoint_run_##SUFFIX(long B, long ny, long nx, long n, long j0, long j1,       \
                                   int64_t *done, const int64_t *ahead,                      \
                                   const T *const *lap, long ls,                             \
                                   const T *restrict c2dt2, const T *restrict sponge,        \
                                   const int64_t *restrict span, T *A, T *Bf, double iy2,    \
                                   double ix2, T *restrict grad_c2, T *restrict scratch,     \
                                   const int64_t *const *rec_ptr,                            \
                                   const int64_t *const *rec_ix, const long *nrec,           \
                                   const T *const *rec_val, T *restrict copies)              \
{                                                                                             \
    const long w = nx + 4, plane = (ny + 4) * w, R1 = ny + 4, ring = (HROWS + 1) * (nx + 8);   \
    const long per_line = LINE / sizeof(T), cs = (nx + per_line - 1) / per_line * per_line;   \
    const long rows_bytes = (j1 - j0) * B * cs * (long)sizeof(T); /* a row iteration's */     \
    const int prefetching = rows_bytes <= PREFETCH_MAX_BYTES;                                 \
    const int whole_iteration = rows_bytes <= PREFETCH_ITERATION_BYTES;                       \
    T *const own = copies + 2 * j0 * B * cs, *const next = own + cs; /* this call's copies */ \
    const unsigned fp_mode = flush_subnormals();                                              \
    for (long q = -4; q < R1 + (n - 1) * RUN_LAG; ++q) {                                      \
        if (ahead) /* steps j0.. read what step j0-1 (another thread) makes in iteration q */ \
            for (long spins = 0; __atomic_load_n(ahead, __ATOMIC_ACQUIRE) < q; ++spins)       \
                if (spins > 256) sched_yield();                                               \
        int h_made = 0; /* whether step j-1 made step j's h and gradient terms this round */ \
        for (long j = j0; j < j1; ++j) {                                                      \
            const long qj = q - j * RUN_LAG;                                                  \
            if (qj < -4 || qj >= R1) {                                                        \
                h_made = 0;                                                                   \
                continue;                                                                     \
            }                                                                                 \
            /* row qj of step j is row qj of step j+1's g: in a row where step j's output     \
             * gets no residuals, step j+1's first pass there is done with step j's second */ \
            const int fuse = j + 1 < j1 && qj >= 2 && qj < ny + 2                             \
                             && rec_ptr[j][qj] == rec_ptr[j][qj + 1];                         \
            T *g = (j % 2 == 0) ? A : Bf, *a = (j % 2 == 0) ? Bf : A;                         \
            for (long b = 0; b < B; ++b) {                                                    \
                T *ab = a + b * plane;                                                        \
                /* step j's rows, and step j+1's for the fused pass: in place, or copied */   \
                const T *mine = lap[j] + b * ny * ls;                                         \
                const T *theirs = fuse ? lap[j + 1] + b * ny * ls : NULL;                     \
                if (!prefetching && qj >= 0 && qj < ny && !h_made) /* block row qj */         \
                    memcpy(own, mine + qj * ls, sizeof(T) * nx);                              \
                if (!prefetching && fuse) /* block row qj - 2 */                              \
                    memcpy(next, theirs + (qj - 2) * ls, sizeof(T) * nx);                     \
                adjoint_iteration_##SUFFIX(qj, ny, nx, 0, R1, prefetching ? mine : own,       \
                                           prefetching ? ls : 0, c2dt2, sponge, span,         \
                                           g + b * plane, ab, iy2, ix2, grad_c2,              \
                                           scratch + (j * B + b) * ring, h_made,              \
                                           !fuse ? NULL : prefetching ? theirs : next,        \
                                           fuse ? scratch + ((j + 1) * B + b) * ring : NULL,  \
                                           prefetching ? prefetch_row_##SUFFIX(lap, ny, ls, b, j, \
                                                                               j0, j1, q,    \
                                                                               whole_iteration) \
                                                       : NULL);                               \
                if (j + 1 < n && qj >= 0) {                                                   \
                    const int64_t *ptr = rec_ptr[j], *ix = rec_ix[j];                         \
                    const T *val = rec_val[j] + b * nrec[j];                                  \
                    for (long k = ptr[qj]; k < ptr[qj + 1]; ++k) ab[qj * w + ix[k]] += val[k]; \
                }                                                                             \
            }                                                                                 \
            h_made = fuse;                                                                    \
        }                                                                                     \
        if (done)                                                                             \
            __atomic_store_n(done, q, __ATOMIC_RELEASE);                                      \
    }                                                                                         \
    restore_fp_mode(fp_mode);                                                                 \
}                                                                                             \

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
/* block row i of a forward step, and its lap(u) where lp is not NULL */
#define FORWARD_ROW(i, SUFFIX)                                                        \
    do {                                                                              \
        if (lp)                                                                       \
            forward_row_lap_##SUFFIX(i, nx, ls, r, p, cc, g, sponge, span, out, lp, iy2, ix2); \
        else                                                                          \
            SPLIT_ROW(i, FWD_DAMPED, FWD_PLAIN);                                      \
    } while (0)
/* a step's gradient terms and h at column j from its G g there (gj) */
#define GRAD_H(gj, gc, l, cc, h, j) (gc[j] += (gj) * l[j], h[j] = (gj) * cc[j])
#define GRAD_H_DAMPED(j)                                                              \
    do {                                                                              \
        const real gj = gi[j] * s[j];                                                 \
        GRAD_H(gj, gc, l, cc, h, j);                                                  \
    } while (0)
#define GRAD_H_PLAIN(j) GRAD_H(gi[j], gc, l, cc, h, j)
#define H_DAMPED(j) (h[j] = (gi[j] * s[j]) * cc[j])
#define H_PLAIN(j) (h[j] = gi[j] * cc[j])
/* a block point of the adjoint: its pointwise terms, then the stencil's (in LAPT's columns);
 * ADJ_NEXT_*: and the next step's GRAD_H from it (gn, ln, cn, hn: that step's rows) */
#define ADJ_DAMPED(j)                                                                 \
    do {                                                                              \
        const real gj = gi[j] * s[j];                                                 \
        ai[j] = ((gj + gj) + (-((ai[j] * s[j]) * s[j]))) + LAPT((j) + 2);             \
    } while (0)
#define ADJ_PLAIN(j)                                                                  \
    do {                                                                              \
        const real gj = gi[j];                                                        \
        ai[j] = ((gj + gj) - ai[j]) + LAPT((j) + 2);                                  \
    } while (0)
#define ADJ_NEXT_DAMPED(j)                                                            \
    do {                                                                              \
        ADJ_DAMPED(j);                                                                \
        const real go = ai[j] * s[j];                                                 \
        GRAD_H(go, gn, ln, cn, hn, j);                                                \
    } while (0)
#define ADJ_NEXT_PLAIN(j)                                                             \
    do {                                                                              \
        ADJ_PLAIN(j);                                                                 \
        GRAD_H(ai[j], gn, ln, cn, hn, j);                                             \
    } while (0)

DEFINE_KERNELS(double, f64)
DEFINE_KERNELS(float, f32)
DEFINE_POINTS(double, f64)
DEFINE_POINTS(float, f32)
