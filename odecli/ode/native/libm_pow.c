/* pow(x, y) for W lanes at once, equal to the system's pow bit for bit (pasted into generated
 * solvers after their header, which defines W and includes math.h, stdint.h and string.h).
 *
 * Why: the step-size controller raises every lane's 1/err to the power 1/k on each attempt,
 * and glibc's pow is a scalar call (15-23 ns on the 2-core VMs, a third of the solver's time).
 * Its algorithm (log in double-double from a 128-entry table and a polynomial, then exp from a
 * 128-entry table of 2^(j/128)) has no branch on the common path, so written as a loop over
 * lanes it vectorises. That loop is below, with glibc's own tables (libm_pow_tables.h, read
 * from the system's libm by tools/libm_pow_tables.py) and a fused multiply-add exactly where
 * glibc's x86-64 FMA build has one (its compiler contracts a*b + c; these solvers are built
 * with -ffp-contract=off, so every fma is written out). The results, and so every sample's
 * steps, stay those of the scalar pow (and of scipy, which calls it).
 *
 * Lanes off the common path (x <= 0, subnormal, inf or NaN; |y| < 2^-65 or >= 2^63;
 * |y log x| < 2^-54 or >= 512) call pow itself. When the library loads it compares the two on
 * a few thousand inputs and keeps to pow alone if any differ (another libm, a CPU without FMA).
 */

#if defined(__FMA__) && defined(__GLIBC__) && defined(__x86_64__)
#define POW_LANES_BUILT 1
#include "libm_pow_tables.h"

static inline uint64_t pow_bits(double x) { uint64_t u; memcpy(&u, &x, sizeof u); return u; }
static inline double pow_double(uint64_t u) { double x; memcpy(&x, &u, sizeof x); return x; }

/* x[l]^y on every lane by the common path; slow[l] marks lanes whose out[l] must come from pow.
 * Not inlined: pow_lanes and the load check share one copy (a second costs 0.07 s of each build). */
__attribute__((noinline)) static void pow_lanes_common(const double *restrict x, double y, double *restrict out,
                                                        int64_t *restrict slow)
{
    for (int l = 0; l < W; l++) {
        /* log x = k ln2 + log c + log1p(z/c - 1), x = 2^k z, z in [0x1.69555p-1, 0x1.69555p0),
         * c the centre of z's table interval (z/c - 1 is exact). */
        const uint64_t ix = pow_bits(x[l]), offset = ix - 0x3fe6955500000000ULL;
        const uint64_t i = (offset >> 45) & 127;
        const double k = pow_double(0x4338000000000000ULL + (uint64_t)((int64_t)offset >> 52)) - 0x1.8p52;
        const double z = pow_double(ix - (offset & 0xfffULL << 52));
        const double r = fma(z, LOG_INVC[i], -1.0);
        const double t1 = fma(k, LOG_LN2HI, LOG_LOGC[i]), t2 = t1 + r;
        const double lo1 = fma(k, LOG_LN2LO, LOG_LOGCTAIL[i]), lo2 = t1 - t2 + r;
        const double ar = LOG_POLY[0] * r, ar2 = r * ar, ar3 = r * ar2;
        const double hi = t2 + ar2, lo3 = fma(ar, r, -ar2), lo4 = t2 - hi + ar2;
        const double q = fma(ar2, fma(ar2, fma(r, LOG_POLY[6], LOG_POLY[5]), fma(r, LOG_POLY[4], LOG_POLY[3])),
                             fma(r, LOG_POLY[2], LOG_POLY[1]));
        const double lo = fma(ar3, q, lo1 + lo2 + lo3 + lo4);
        const double log_hi = hi + lo, log_lo = hi - log_hi + lo;
        /* e = y log x as e_hi + e_lo; exp e = 2^(j/128) exp s with e = j ln2/128 + s. */
        const double e_hi = y * log_hi, e_lo = fma(y, log_lo, fma(y, log_hi, -e_hi));
        const double j_shifted = fma(EXP_INVLN2N, e_hi, EXP_SHIFT), j = j_shifted - EXP_SHIFT;
        const uint64_t ij = pow_bits(j_shifted);
        const double s = fma(j, EXP_NEGLN2LON, fma(j, EXP_NEGLN2HIN, e_hi)) + e_lo;
        /* 2^(j/128) = scale (1 + tail) */
        const double tail = pow_double(EXP_TAB[2 * (ij & 127)]);
        const double scale = pow_double(EXP_TAB[2 * (ij & 127) + 1] + (ij << 45));
        const double s2 = s * s;
        const double p = fma(s2 * s2, fma(s, EXP_C[3], EXP_C[2]), fma(s2, fma(s, EXP_C[1], EXP_C[0]), tail + s));
        out[l] = fma(scale, p, scale);
        const uint64_t top_e = (pow_bits(e_hi) >> 52) & 0x7ff;
        slow[l] = ((ix >> 52) - 1 >= 0x7fe) | (top_e - 0x3c9 >= 0x408 - 0x3c9);
    }
}

/* Exponents whose powers take the common path (|y| in [2^-65, 2^63)). */
static inline int pow_lanes_exponent_ok(double y)
{
    return ((pow_bits(y) >> 52) & 0x7ff) - 0x3be < 0x43e - 0x3be;
}
#endif

/* Whether pow_lanes takes the vector path: the load check passed and odecli_pow_lanes allows it. */
#ifndef __CUDACC_RTC__
static int pow_lanes_exact = 0, pow_lanes_wanted = 1;
#endif

static void pow_lanes(const double *restrict x, double y, double *restrict out)
{
#ifdef POW_LANES_BUILT
    if (pow_lanes_exact && pow_lanes_wanted && pow_lanes_exponent_ok(y)) {
        int64_t slow[W];
        pow_lanes_common(x, y, out, slow);
        for (int l = 0; l < W; l++)
            if (slow[l]) out[l] = pow(x[l], y);
        return;
    }
#endif
    for (int l = 0; l < W; l++) out[l] = pow(x[l], y);
}

#ifndef __CUDACC_RTC__  /* host code: a GPU build (odecli.ode.gpu) takes pow alone */
/* Compare the vector path with pow on 4096 inputs: the controllers' exponents over x in
 * [2^-64, 2^64), random mantissas. Any difference means another pow: use that one alone. */
__attribute__((constructor)) static void pow_lanes_check(void)
{
#ifdef POW_LANES_BUILT
    static const double exponents[] = {1.0 / 5, 1.0 / 4, 1.0 / 3, 1.0 / 8, 0.7 / 5, -0.4 / 5, 0.3 / 4, 2.5};
    const int n_exponents = sizeof exponents / sizeof exponents[0];
    uint64_t state = 0x9e3779b97f4a7c15ULL;
    double x[W], fast[W];
    int64_t slow[W];
    for (int round = 0; round < 4096 / W; round++) {
        const double y = exponents[round % n_exponents];
        for (int l = 0; l < W; l++) {
            state = state * 6364136223846793005ULL + 1442695040888963407ULL;
            x[l] = pow_double(((1023ULL - 64 + (state >> 57)) << 52) | (state >> 12 & 0xfffffffffffffULL));
        }
        pow_lanes_common(x, y, fast, slow);
        for (int l = 0; l < W; l++)
            if (!slow[l] && pow_bits(fast[l]) != pow_bits(pow(x[l], y))) return;
    }
    pow_lanes_exact = 1;
#endif
}

/* Let the vector path be used (on != 0) or not; returns whether pow_lanes now takes it
 * (benchmarks compare the two, tests check that both give the same solutions). */
int odecli_pow_lanes(int on)
{
    pow_lanes_wanted = on != 0;
    return pow_lanes_exact && pow_lanes_wanted;
}
#endif
