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
 * `moving` arguments slot[i] points at base[i] + m * stride[i] bytes (NULL if base[i] is).
 *
 * On several ranks `between` (NULL on one) runs after each launch with the field it wrote (the
 * new u), and returns 0 or an error: the halo exchange of the ghosts the next launch reads
 * (cuda_loop.py; a Python callback, run in order on the launches' stream). */
#include <stddef.h>

typedef int (*launch_fn)(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned shared, void *stream, void **params,
                         void **extra);
typedef int (*between_fn)(void *context, void *written);

int acoustic_run_steps(launch_fn launch, void *function, unsigned blocks, unsigned threads,
                       void *stream, void **params, long long steps, char *first, char *second,
                       long long u_slot, long long prev_slot, long long out_slot,
                       long long moving, const long long *slot, char *const *base,
                       const long long *stride, between_fn between, void *context)
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
        if (between != NULL && between(context, u_prev) != 0)
            return -1;
    }
    return 0;
}

/* The same for the kernel that makes up to `per_launch` steps a launch (cuda_blocks.h): launch
 * L makes steps [L * per_launch, ...), its count in argument steps_slot, reading the two time
 * levels from one pair of buffers and writing them into the other (neighbouring blocks still
 * read the inputs), the pairs swapping each launch: fields = {u_prev_in, u_in, p_out, u_out}
 * of the first launch, in the argument slots field_slot.  The moving arguments advance by
 * stride[i] bytes a step, so by per_launch * stride[i] a launch.  After an odd number of
 * launches the last two time levels are in fields[2], fields[3], else in fields[0], fields[1].
 * `between` (NULL on one rank) runs after each launch with the new u (the exchange). */
int acoustic_run_blocks(launch_fn launch, void *function, unsigned blocks, unsigned threads,
                        void *stream, void **params, long long steps, long long per_launch,
                        char *const *fields, long long steps_slot, const long long *field_slot,
                        long long moving, const long long *slot, char *const *base,
                        const long long *stride, between_fn between, void *context)
{
    char *in_p = fields[0], *in_u = fields[1], *out_p = fields[2], *out_u = fields[3];
    for (long long done = 0; done < steps; done += per_launch) {
        *(long long *)params[steps_slot] = steps - done < per_launch ? steps - done : per_launch;
        *(void **)params[field_slot[0]] = in_p;
        *(void **)params[field_slot[1]] = in_u;
        *(void **)params[field_slot[2]] = out_p;
        *(void **)params[field_slot[3]] = out_u;
        for (long long i = 0; i < moving; ++i)
            *(void **)params[slot[i]] = base[i] ? (void *)(base[i] + done * stride[i]) : NULL;
        const int result = launch(function, blocks, 1, 1, threads, 1, 1, 0, stream, params, NULL);
        if (result != 0)
            return result;
        if (between != NULL && between(context, out_u) != 0)
            return -1;
        char *p = in_p, *u = in_u;
        in_p = out_p;
        in_u = out_u;
        out_p = p;
        out_u = u;
    }
    return 0;
}
