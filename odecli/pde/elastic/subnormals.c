/* Subnormal numbers flushed to zero (FTZ) and read as zero (DAZ) for a kernel call's duration,
 * the caller's mode restored on return (the acoustic kernels' rule, acoustic.c).  Ahead of a
 * wave front the 4th-order stencils leave values that decay through the subnormal range, and on
 * Intel cores an operation on one takes a microcode assist of ~100 cycles: the elastic forward
 * at 1040^2, 100 steps, one thread (CPU time, best of 3) took 0.216/0.206 s in float32 without
 * flushing and 0.187/0.186 s with it, 0.397 and 0.365 s in float64; a 200^2 float32 run of
 * 1000 steps 7.6 against 2.0 ns a point and step.  A flushed value is below 2.2e-308
 * (1.2e-38 in float32), far under the round-off of anything the physics carries; the
 * reference agrees bit for bit with PyTorch flushing too (torch.set_flush_denormal). */
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define ELASTIC_FTZ_DAZ 0x8040u
static inline unsigned elastic_flush_subnormals(void)
{
    const unsigned caller = _mm_getcsr();
    _mm_setcsr(caller | ELASTIC_FTZ_DAZ);
    return caller;
}
static inline void elastic_restore_fp_mode(unsigned caller) { _mm_setcsr(caller); }
#define ELASTIC_FLUSHES_SUBNORMALS 1
#else
static inline unsigned elastic_flush_subnormals(void) { return 0; }
static inline void elastic_restore_fp_mode(unsigned caller) { (void)caller; }
#define ELASTIC_FLUSHES_SUBNORMALS 0
#endif

/* Whether the kernels flush subnormals (the tests ask, to flush PyTorch alike). */
int elastic_flushes_subnormals(void) { return ELASTIC_FLUSHES_SUBNORMALS; }
