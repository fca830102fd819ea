/* Several acoustic leapfrog steps per launch (temporal blocking), included after cuda_point.h
 * by the CUDA kernel and its host build alike.  The includer defines OX, OY (the output tile),
 * KMAX (steps per launch at most) and SYNC() (__syncthreads() on the GPU, nothing on the host,
 * where one "thread" runs a whole thread block's work, phase after phase).
 *
 * Why: a single step reads u, u_prev and c2dt2 and writes u_next, 16 bytes a point in float32,
 * and memory bandwidth is all it is bound by (the gradient's store and sum make it 48 a point
 * for forward + adjoint).  Here a thread block loads its tile and a halo of 2 KMAX cells (both
 * time levels) into shared memory once, makes up to KMAX steps there, each on a region 2 cells
 * smaller on every side (the cells whose stencil still reads valid values), and writes the
 * tile's last two time levels: per step, a KMAX-th of the field traffic plus the halo's share.
 * The store (lap(u) of every step, for the gradient) is still written and read once a step.
 *
 * Every point is made by the same arithmetic as acoustic_thread (cuda_point.h): results are
 * bit for bit the single-step kernel's, so the reference's.  Sources lie in tile lists that
 * cover the whole halo region (a point in the halo is made, redundantly, with its sources);
 * thread 0 adds them in the given order after each step, so duplicates accumulate in order.
 * Receivers lie in tile lists of the owned tile only.  With lap_mode 1 the step writes lap(u)
 * of its owned points into lap + s * lap_stride (step s of the launch); with 2 it is the
 * adjoint's, reading lap_in there and summing u * lap_in into grad on the owned points, held in
 * shared memory over the launch (shots in turn within a launch, so with several shots the sum
 * runs in another order than the single-step kernel's: equal to round-off, not bit for bit).
 * Fields come in as (u_prev_in, u_in) and leave as (p_out, u_out), other buffers: neighbouring
 * blocks still read the inputs' halos.
 */

#define HALO_CELLS (2 * KMAX)
#define RX (OX + 2 * HALO_CELLS)
#define RY (OY + 2 * HALO_CELLS)

DEVICE void acoustic_block(odecli_i64 block, int lane_x, int lane_y, int step_x, int step_y,
                           REAL *sa, REAL *sb, REAL *sg, odecli_i64 B, odecli_i64 ny, odecli_i64 nx,
                           odecli_i64 tiles_x, odecli_i64 steps, const REAL *u_prev_in,
                           const REAL *u_in, REAL *p_out, REAL *u_out, const REAL *c2dt2,
                           const REAL *sponge, const odecli_i64 *span, double iy2, double ix2,
                           REAL *lap, odecli_i64 lap_stride, odecli_i64 lap_mode, REAL *grad,
                           const odecli_i64 *src_ptr, const odecli_i64 *src_at,
                           const odecli_i64 *src_idx, const REAL *src_val, odecli_i64 src_stride,
                           const odecli_i64 *rec_ptr, const odecli_i64 *rec_at,
                           const odecli_i64 *rec_slot, REAL *traces, odecli_i64 rec_stride)
{
    /* lanes: step_x by step_y threads (32 x 8 on the GPU, 1 x 1 in the plain host build), lane
     * (lane_x, lane_y) taking every step_x-th column and step_y-th row of each phase's cells */
    const REAL kc = (REAL)(C0 * (ix2 + iy2)), k1x = (REAL)(C1 * ix2), k2x = (REAL)(C2 * ix2);
    const REAL k1y = (REAL)(C1 * iy2), k2y = (REAL)(C2 * iy2);
    const odecli_i64 oy = (block / tiles_x) * OY, ox = (block % tiles_x) * OX;
    const odecli_i64 y0 = oy - HALO_CELLS, x0 = ox - HALO_CELLS; /* the region's first cell */
    const odecli_i64 w = nx + 4, plane = (ny + 4) * w;
    const int adjoint = lap_mode == 2 && grad != 0, first_lane = lane_x == 0 && lane_y == 0;
    const int lane = lane_y * step_x + lane_x, lanes = step_x * step_y;
    if (adjoint)
        for (int r = lane_y; r < OY; r += step_y)
            for (int c = lane_x; c < OX; c += step_x) {
                const odecli_i64 i = oy + r, j = ox + c;
                sg[r * OX + c] = i < ny && j < nx ? grad[i * nx + j] : (REAL)0;
            }
    for (odecli_i64 b = 0; b < B; ++b) {
        REAL *prev = sa, *cur = sb;
        for (int ly = lane_y; ly < RY; ly += step_y)
            for (int lx = lane_x; lx < RX; lx += step_x) {
                const odecli_i64 i = y0 + ly, j = x0 + lx;
                const int inside = i >= -2 && i < ny + 2 && j >= -2 && j < nx + 2;
                const odecli_i64 at = b * plane + (i + 2) * w + j + 2;
                prev[ly * RX + lx] = inside ? u_prev_in[at] : (REAL)0;
                cur[ly * RX + lx] = inside ? u_in[at] : (REAL)0;
            }
        SYNC();
        for (odecli_i64 s = 0; s < steps; ++s) {
            const int m = 2 * (int)(s + 1); /* the margin of cells this step cannot make */
            for (int ly = m + lane_y; ly < RY - m; ly += step_y)
                for (int lx = m + lane_x; lx < RX - m; lx += step_x) {
                    const odecli_i64 i = y0 + ly, j = x0 + lx;
                    if (i < 0 || i >= ny || j < 0 || j >= nx)
                        continue; /* the ring and beyond stay zero */
                    const REAL *r = cur + ly * RX + lx;
                    const REAL c = r[0];
                    const REAL lp = ((((c * kc) + ((r[-1] + r[1]) * k1x)) + ((r[-2] + r[2]) * k2x))
                                     + ((r[-RX] + r[RX]) * k1y))
                                    + ((r[-2 * RX] + r[2 * RX]) * k2y);
                    const REAL cc = c2dt2[i * nx + j];
                    const int damped = sponge != 0 && (span == 0 || j < span[2 * i] || j >= span[2 * i + 1]);
                    const REAL p = prev[ly * RX + lx];
                    REAL v;
                    if (damped) {
                        const REAL g = sponge[i * nx + j];
                        v = (((c + c) - (p * g)) + (lp * cc)) * g;
                    } else {
                        v = ((c + c) - p) + (lp * cc);
                    }
                    const int owned = i >= oy && i < oy + OY && j >= ox && j < ox + OX;
                    if (owned && lap_mode == 1)
                        lap[s * lap_stride + (b * ny + i) * nx + j] = lp;
                    if (owned && adjoint) {
                        const odecli_i64 g_at = (i - oy) * OX + (j - ox);
                        sg[g_at] = sg[g_at] + c * lap[s * lap_stride + (b * ny + i) * nx + j];
                    }
                    prev[ly * RX + lx] = v;
                }
            SYNC();
            if (first_lane && src_ptr)
                for (odecli_i64 k = src_ptr[block]; k < src_ptr[block + 1]; ++k) {
                    const odecli_i64 at = src_at[k], here = at % plane;
                    const odecli_i64 ly = here / w - 2 - y0, lx = here % w - 2 - x0;
                    if (at / plane == b && ly >= m && ly < RY - m && lx >= m && lx < RX - m)
                        prev[ly * RX + lx] = prev[ly * RX + lx] + src_val[s * src_stride + src_idx[k]];
                }
            SYNC();
            if (rec_ptr)
                for (odecli_i64 k = rec_ptr[block] + lane; k < rec_ptr[block + 1]; k += lanes) {
                    const odecli_i64 at = rec_at[k], here = at % plane;
                    if (at / plane == b)
                        traces[s * rec_stride + rec_slot[k]] = prev[(here / w - 2 - y0) * RX + here % w - 2 - x0];
                }
            REAL *t = prev; /* the new field is u now, the old u the next u_prev */
            prev = cur;
            cur = t;
        }
        for (int r = lane_y; r < OY; r += step_y)
            for (int c = lane_x; c < OX; c += step_x) {
                const odecli_i64 i = oy + r, j = ox + c;
                if (i >= ny || j >= nx)
                    continue;
                const int l = (r + HALO_CELLS) * RX + c + HALO_CELLS;
                const odecli_i64 at = b * plane + (i + 2) * w + j + 2;
                p_out[at] = prev[l];
                u_out[at] = cur[l];
            }
        SYNC(); /* the next shot overwrites the shared fields */
    }
    if (adjoint)
        for (int r = lane_y; r < OY; r += step_y)
            for (int c = lane_x; c < OX; c += step_x) {
                const odecli_i64 i = oy + r, j = ox + c;
                if (i < ny && j < nx)
                    grad[i * nx + j] = sg[r * OX + c];
            }
}
