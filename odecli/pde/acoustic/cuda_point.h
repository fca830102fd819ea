/* One thread's work in an acoustic leapfrog step: the text both the CUDA kernel (cuda_kernel.cu,
 * compiled by NVRTC) and its host build (cuda_host.c, compiled by the system C compiler, which
 * calls it once per (block, thread) in a loop) include, so the arithmetic CI runs on the CPU is
 * the GPU's.  The includer defines REAL (float or double) and DEVICE (a function qualifier).
 *
 * Fields are C-contiguous (B, ny+4, nx+4), B shots with a ghost ring of width 2 (zeros: the ring
 * of a buffer is never written).  c2dt2 = c^2 dt^2 and the sponge G are (ny, nx); G may be NULL.
 * One thread makes point (i, j) of the block for every shot in turn:
 *
 *   out = G * ((2u - G*u_prev) + c2dt2 * lap(u))
 *
 * each operation rounded on its own, in the order of odecli.pde.acoustic.reference.reference_step
 * (the builds turn contraction into fused multiply-adds off), so a step equals the PyTorch
 * reference bit for bit.  out may be u_prev (each point of u_prev is read by its own thread
 * before that thread writes it).  span[2i], span[2i+1]: the columns of block row i where G is
 * exactly 1; there G is not read (x * 1 == x, so nothing changes but the memory traffic).
 *
 * Sources and receivers ride in the same launch, by tile of 32 x 8 block points (one thread
 * block): src_ptr[t] .. src_ptr[t+1] are tile t's entries, src_at the flat ringed index
 * b*plane + (i+2)*(nx+4) + j+2 of each, in the order the sources are given; after making its
 * point of shot b a thread adds, in that order, src_val[src_idx[k]] for each entry at that point
 * (sequential accumulation, as index_put_ with accumulate does), then writes the point into
 * traces[rec_slot[k]] for each receiver entry there (rec_*, likewise).  NULL pointers: none.
 *
 * The gradient: with lap_out the thread also writes lap(u) of each shot into lap_out
 * (B, ny, nx), the store; with lap_in and grad the step is the adjoint's (the forward step run
 * backward in time on mu = c2dt2 G lambda, see acoustic.c) and adds u * lap_in of every shot, in
 * shot order, into grad (ny, nx): one thread owns each point of grad, so no atomics, and the
 * sum is the CPU's, term for term.
 */

typedef long long odecli_i64;

#define TILE_X 32
#define TILE_Y 8

#define C0 (-5.0 / 2.0)
#define C1 (4.0 / 3.0)
#define C2 (-1.0 / 12.0)

/* thread `thread` of thread block `block` of a launch over tiles_x tiles per row */
DEVICE void acoustic_thread(odecli_i64 block, odecli_i64 thread, odecli_i64 B, odecli_i64 ny,
                            odecli_i64 nx, odecli_i64 tiles_x, const REAL *u, const REAL *u_prev,
                            REAL *out, const REAL *c2dt2, const REAL *sponge,
                            const odecli_i64 *span, double iy2, double ix2, REAL *lap_out,
                            const REAL *lap_in, REAL *grad, const odecli_i64 *src_ptr,
                            const odecli_i64 *src_at, const odecli_i64 *src_idx,
                            const REAL *src_val, const odecli_i64 *rec_ptr,
                            const odecli_i64 *rec_at, const odecli_i64 *rec_slot, REAL *traces)
{
    const odecli_i64 i = (block / tiles_x) * TILE_Y + thread / TILE_X;
    const odecli_i64 j = (block % tiles_x) * TILE_X + thread % TILE_X;
    if (i >= ny || j >= nx)
        return;
    /* the coefficients rounded as acoustic.c's COEFFS and the reference's scalar products */
    const REAL kc = (REAL)(C0 * (ix2 + iy2)), k1x = (REAL)(C1 * ix2), k2x = (REAL)(C2 * ix2);
    const REAL k1y = (REAL)(C1 * iy2), k2y = (REAL)(C2 * iy2);
    const odecli_i64 w = nx + 4, plane = (ny + 4) * w, at = (i + 2) * w + j + 2;
    const REAL cc = c2dt2[i * nx + j];
    const int damped = sponge != 0 && (span == 0 || j < span[2 * i] || j >= span[2 * i + 1]);
    const REAL g = damped ? sponge[i * nx + j] : (REAL)1;
    const odecli_i64 tile = block;
    const odecli_i64 s0 = src_ptr ? src_ptr[tile] : 0, s1 = src_ptr ? src_ptr[tile + 1] : 0;
    const odecli_i64 r0 = rec_ptr ? rec_ptr[tile] : 0, r1 = rec_ptr ? rec_ptr[tile + 1] : 0;
    REAL gsum = grad ? grad[i * nx + j] : (REAL)0;
    for (odecli_i64 b = 0; b < B; ++b) {
        const REAL *r = u + b * plane + at;
        const REAL c = r[0];
        const REAL lap = ((((c * kc) + ((r[-1] + r[1]) * k1x)) + ((r[-2] + r[2]) * k2x))
                          + ((r[-w] + r[w]) * k1y))
                         + ((r[-2 * w] + r[2 * w]) * k2y);
        const odecli_i64 here = b * plane + at;
        const REAL p = u_prev[here];
        REAL v;
        if (damped)
            v = (((c + c) - (p * g)) + (lap * cc)) * g;
        else
            v = ((c + c) - p) + (lap * cc);
        if (lap_out)
            lap_out[(b * ny + i) * nx + j] = lap;
        if (grad)
            gsum = gsum + c * lap_in[(b * ny + i) * nx + j];
        for (odecli_i64 k = s0; k < s1; ++k)
            if (src_at[k] == here)
                v = v + src_val[src_idx[k]];
        out[here] = v;
        for (odecli_i64 k = r0; k < r1; ++k)
            if (rec_at[k] == here)
                traces[rec_slot[k]] = v;
    }
    if (grad)
        grad[i * nx + j] = gsum;
}
