/* Copies between boxes of C-contiguous fields and packed message buffers, for halo exchanges.
 *
 * A box is five int64s: (field, offset, rows, cols, stride): `rows` rows of `cols` contiguous
 * elements, `stride` elements apart, starting `offset` elements into plane 0 of field `field`.
 * Every field has B planes of `plane` elements, and a box covers all of them.  Buffers hold the
 * boxes plane by plane, box by box, row by row: one C call per message, where numpy costs
 * several microseconds per strip and per operation.
 */
#include <stdint.h>
#include <string.h>

/* Run STMT for each row of each box, plane by plane, box by box: f points at the row in its
 * field (of element type T), buf at the row's place in the buffer, cols is its length.  (Used in
 * DEFINE_BOXES, where n, box, B, plane, fields and buf are in scope.) */
#define FOR_BOX_ROWS(T, STMT)                                                                \
    for (long b = 0; b < B; ++b)                                                              \
        for (long i = 0; i < n; ++i) {                                                        \
            const int64_t *x = box + 5 * i;                                                   \
            T *f = fields[x[0]] + b * plane + x[1];                                           \
            const long cols = (long)x[3];                                                     \
            for (long r = 0; r < x[2]; ++r, f += x[4], buf += cols) {                         \
                STMT;                                                                         \
            }                                                                                 \
        }

#define DEFINE_BOXES(T, S)                                                                   \
/* buf <- the boxes; then the boxes are zeroed when `clear` (an adjoint's ghosts) */          \
void boxes_pack_##S(long n, const int64_t *box, long B, long plane, T *const *fields,        \
                    T *restrict buf, int clear)                                              \
{                                                                                             \
    FOR_BOX_ROWS(T, memcpy(buf, f, (size_t)cols * sizeof(T));                                 \
                 if (clear) memset(f, 0, (size_t)cols * sizeof(T)));                          \
}                                                                                             \
                                                                                              \
/* the boxes <- buf (mode 0), += buf (1) or -= buf (2) */                                     \
void boxes_unpack_##S(long n, const int64_t *box, long B, long plane, T *const *fields,      \
                      const T *restrict buf, int mode)                                       \
{                                                                                             \
    FOR_BOX_ROWS(T, if (mode == 0) memcpy(f, buf, (size_t)cols * sizeof(T));                  \
                 else if (mode == 1) for (long c = 0; c < cols; ++c) f[c] += buf[c];          \
                 else for (long c = 0; c < cols; ++c) f[c] -= buf[c]);                        \
}                                                                                             \
                                                                                              \
/* in the boxes: dst <- src * weight (mode 0) or dst -= src (mode 2), then src <- 0; weight  \
 * is one plane (NULL: 1), shared by all planes; the boxes' field numbers are not used */     \
void boxes_move_##S(long n, const int64_t *box, long B, long plane, T *restrict dst,         \
                    T *restrict src, const T *restrict weight, int mode)                     \
{                                                                                             \
    for (long b = 0; b < B; ++b)                                                              \
        for (long i = 0; i < n; ++i) {                                                        \
            const int64_t *x = box + 5 * i;                                                   \
            const long cols = (long)x[3];                                                     \
            for (long r = 0; r < x[2]; ++r) {                                                 \
                const long at = (long)x[1] + r * (long)x[4];                                  \
                T *d = dst + b * plane + at, *s = src + b * plane + at;                       \
                if (mode == 2) for (long c = 0; c < cols; ++c) d[c] -= s[c];                  \
                else if (weight) for (long c = 0; c < cols; ++c) d[c] = s[c] * weight[at + c];\
                else memcpy(d, s, (size_t)cols * sizeof(T));                                  \
                memset(s, 0, (size_t)cols * sizeof(T));                                       \
            }                                                                                 \
        }                                                                                     \
}

DEFINE_BOXES(double, f64)
DEFINE_BOXES(float, f32)
