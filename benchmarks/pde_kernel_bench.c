/* Time the acoustic C kernels alone, outside Python: ns per grid-point step of an 8-step
 * adjoint pass, of an 8-step forward pass and of one that stores each step's lap (float64, one
 * thread, one shot), and a hash of every output bit, so two versions of
 * odecli/pde/acoustic/acoustic.c can be compared for speed and for bit-for-bit identical results:
 *
 *   git show HEAD~1:odecli/pde/acoustic/acoustic.c > /tmp/old.c
 *   F="-O3 -march=native -ffp-contract=off -fno-math-errno -fPIC"   # odecli.native's flags
 *   gcc $F -DSRC='"/tmp/old.c"' benchmarks/pde_kernel_bench.c -o /tmp/old
 *   gcc $F -DSRC='"'$PWD'/odecli/pde/acoustic/acoustic.c"' benchmarks/pde_kernel_bench.c -o /tmp/new
 *   for i in 1 2 3; do /tmp/old 256 256; /tmp/new 256 256; done   # alternate: the VM drifts
 *   /tmp/old 37 53 hash; /tmp/new 37 53 hash                        # must print the same hash
 *
 * (Versions from before 2026-12-04's adjoint in the forward's form have other signatures.)
 * STORES=50 cycles the adjoint through 50 stores of 8 laps each, so that (as in a gradient,
 * whose store is written long before it is read) the laps come from memory, not cache; the
 * storing forward writes them in the same cycle.  The fields are random; the sponge is 10
 * cells wide on every side.  Each time is the best of 7 rounds of about 6e7 point-steps.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include SRC

#define STEPS 8

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static double uniform(void) { return rand() / (double)RAND_MAX; }

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s NY NX [hash]\n", argv[0]);
        return 2;
    }
    const long ny = atol(argv[1]), nx = atol(argv[2]), n = STEPS;
    const long w = nx + 4, plane = (ny + 4) * w, ls = (nx + 7) & ~7L; /* rows of whole lines */
    const long stores = getenv("STORES") ? atol(getenv("STORES")) : 1;
    double *A = aligned_alloc(64, sizeof(double) * 2 * plane), *Bf = A + plane;
    double *c2 = aligned_alloc(64, sizeof(double) * 3 * ny * nx), *sp = c2 + ny * nx, *gc = sp + ny * nx;
    double *laps = aligned_alloc(64, sizeof(double) * stores * n * ny * ls);
    int64_t *span = malloc(sizeof(int64_t) * 2 * ny);
    double *lap[STEPS];
    double *f[STEPS + 2];

    srand(1);
    for (long k = 0; k < 2 * plane; ++k) A[k] = 1e-3 * uniform();
    for (long i = 0; i < ny; ++i) {
        const int edge = i < 10 || i >= ny - 10;
        span[2 * i] = edge ? 0 : 10;
        span[2 * i + 1] = edge ? 0 : nx - 10;
        for (long j = 0; j < nx; ++j) {
            c2[i * nx + j] = 0.1 * uniform();
            sp[i * nx + j] = (edge || j < 10 || j >= nx - 10) ? 0.95 : 1.0;
            gc[i * nx + j] = 0;
        }
    }
    for (long k = 0; k < stores * n * ny * ls; ++k) laps[k] = uniform();
    for (int j = 0; j < n; ++j) lap[j] = laps + (n - 1 - j) * ny * ls; /* the adjoint reads the last first */
    for (int j = 0; j < n + 2; ++j) f[j] = (j % 2) ? Bf : A;

    if (argc > 3) { /* an adjoint pass, a forward pass that stores, then hash every bit */
        leapfrog_forward_run_f64(1, ny, nx, n, 0, n, NULL, NULL, f, c2, sp, span, 0.01, 0.01, NULL, NULL,
                                 NULL, NULL, 0, NULL, NULL, NULL, NULL, 0, lap, ls, gc, NULL, NULL);
        leapfrog_forward_run_f64(1, ny, nx, n, 0, n, NULL, NULL, f, c2, sp, span, 0.01, 0.01, NULL, NULL,
                                 NULL, NULL, 0, NULL, NULL, NULL, NULL, 0, lap, ls, NULL, NULL, NULL);
        uint64_t h = 1469598103934665603ULL; /* FNV-1a over A, Bf, grad_c2 and the laps */
        const unsigned char *p = (const unsigned char *)A, *q = (const unsigned char *)gc;
        for (size_t k = 0; k < sizeof(double) * 2 * plane; ++k) h = (h ^ p[k]) * 1099511628211ULL;
        for (size_t k = 0; k < sizeof(double) * ny * nx; ++k) h = (h ^ q[k]) * 1099511628211ULL;
        for (long j = 0; j < n; ++j)
            for (long i = 0; i < ny; ++i)
                for (size_t k = 0; k < sizeof(double) * nx; ++k)
                    h = (h ^ ((const unsigned char *)(lap[j] + i * ls))[k]) * 1099511628211ULL;
        printf("%ldx%ld hash %016llx\n", ny, nx, (unsigned long long)h);
        return 0;
    }

    long reps = 60000000 / (ny * nx * n);
    reps = reps < 3 ? 3 : reps;
    double adjoint = 1e9, forward = 1e9, storing = 1e9;
    for (int round = 0; round < 7; ++round) {
        double t0 = now();
        for (long k = 0; k < reps; ++k) {
            double *cold[STEPS];
            for (int j = 0; j < n; ++j) cold[j] = laps + ((k % stores) * n + n - 1 - j) * ny * ls;
            leapfrog_forward_run_f64(1, ny, nx, n, 0, n, NULL, NULL, f, c2, sp, span, 0.01, 0.01, NULL,
                                     NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL, 0, cold, ls, gc, NULL, NULL);
        }
        const double ta = (now() - t0) / reps / (ny * nx * n) * 1e9;
        adjoint = ta < adjoint ? ta : adjoint;
        for (long k = 0; k < 2 * plane; ++k) A[k] = 1e-3 * uniform(); /* keep the values tame */
        t0 = now();
        for (long k = 0; k < reps; ++k)
            leapfrog_forward_run_f64(1, ny, nx, n, 0, n, NULL, NULL, f, c2, sp, span, 0.01, 0.01, NULL,
                                     NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL, 0, NULL, 0, NULL, NULL, NULL);
        const double tf = (now() - t0) / reps / (ny * nx * n) * 1e9;
        forward = tf < forward ? tf : forward;
        for (long k = 0; k < 2 * plane; ++k) A[k] = 1e-3 * uniform();
        t0 = now();
        for (long k = 0; k < reps; ++k) {
            double *out[STEPS];
            for (int j = 0; j < n; ++j) out[j] = laps + ((k % stores) * n + j) * ny * ls;
            leapfrog_forward_run_f64(1, ny, nx, n, 0, n, NULL, NULL, f, c2, sp, span, 0.01, 0.01, NULL,
                                     NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL, 0, out, ls, NULL, NULL, NULL);
        }
        const double ts = (now() - t0) / reps / (ny * nx * n) * 1e9;
        storing = ts < storing ? ts : storing;
        for (long k = 0; k < 2 * plane; ++k) A[k] = 1e-3 * uniform();
    }
    printf("%ldx%ld  adjoint %.2f  forward %.2f  storing forward %.2f ns/pt  "
           "forward / (storing forward + adjoint) %.3f\n",
           ny, nx, adjoint, forward, storing, forward / (storing + adjoint));
    return 0;
}
