/* The acoustic CUDA kernel's time loop on the host side: one launch per step, the launch's
 * arguments re-pointed in place between launches.  Why C and not Python: at 2000^2 in float32 a
 * step takes the GPU ~15-25 us, and a Python loop that re-points six ctypes arguments and calls
 * the driver takes about as long, so the GPU would wait on Python; here a step costs the
 * driver's launch alone (Deepwave drives its kernels from C++ for the same reason).
 *
 * `launch` has cuLaunchKernel's signature: the driver's own for the GPU, or the kernel's host
 * build's stand-in (acoustic_cu_launch, cuda_build.py), which runs every (block, thread) in
 * a loop; so this loop is the same code on both and the tests run it on the CPU.
 *
 * params[i] points to the storage of argument i (as cuLaunchKernel reads them, copying them at
 * each launch).  Step m of `steps` reads the field `second` as u and `first` as u_prev, writing
 * over `first`, then the two swap roles (the leapfrog's two recycled buffers); each of the
 * `moving` arguments slot[i] points at base[i] + m * stride[i] bytes (NULL if base[i] is). */
#include <stddef.h>

typedef int (*launch_fn)(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned shared, void *stream, void **params,
                         void **extra);

int acoustic_run_steps(launch_fn launch, void *function, unsigned blocks, unsigned threads,
                       void *stream, void **params, long long steps, char *first, char *second,
                       long long u_slot, long long prev_slot, long long out_slot,
                       long long moving, const long long *slot, char *const *base,
                       const long long *stride)
{
    for (long long m = 0; m < steps; ++m) {
        char *u = m % 2 == 0 ? second : first, *u_prev = m % 2 == 0 ? first : second;
        *(void **)params[u_slot] = u;
        *(void **)params[prev_slot] = u_prev;
        *(void **)params[out_slot] = u_prev;
        for (long long i = 0; i < moving; ++i)
            *(void **)params[slot[i]] = base[i] ? (void *)(base[i] + m * stride[i]) : NULL;
        const int result = launch(function, blocks, 1, 1, threads, 1, 1, 0, stream, params, NULL);
        if (result != 0)
            return result;
    }
    return 0;
}
