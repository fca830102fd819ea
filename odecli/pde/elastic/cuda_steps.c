/* The elastic CUDA kernels' time loop on the host side: each step, a fixed list of launches
 * (the half steps and what lies between them, cuda_loop.py), some arguments of which move with
 * the step.  Why C and not Python: at 2000^2 a step of the kernels should take an H100 ~0.1-0.2
 * ms, and the Python loop's launch calls (ctypes, torch's current stream and device) cost ~10
 * us each, 4 to 8 a step; here a launch costs the driver's call alone (Deepwave drives its
 * kernels from C++ for the same reason, and the acoustic loop is cuda_steps.c beside it).
 *
 * fn[l] has cuLaunchKernel's signature: the driver's own for the GPU, or a kernel's host
 * build's stand-in (cuda_build.host_source), which runs every (block, thread) in a loop; so
 * this loop is the same code on both and the tests run it on the CPU.
 *
 * params[l] is launch l's argument array (params[l][k] points to the storage of argument k, as
 * cuLaunchKernel reads them, copying them at each launch).  Before step m's launches each
 * moving argument i (of launch launch_of[i], argument slot[i]: a pointer or a 64-bit integer,
 * both 8 bytes) is set to base[i] + m * stride[i]. */
typedef int (*launch_fn)(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned shared, void *stream, void **params,
                         void **extra);

int elastic_run_steps(long long steps, long long launches, const launch_fn *fn,
                      void *const *function, const unsigned *blocks, unsigned threads,
                      void *stream, void **const *params, long long moving,
                      const long long *launch_of, const long long *slot, const long long *base,
                      const long long *stride)
{
    for (long long m = 0; m < steps; ++m) {
        for (long long i = 0; i < moving; ++i)
            *(long long *)params[launch_of[i]][slot[i]] = base[i] + m * stride[i];
        for (long long l = 0; l < launches; ++l) {
            const int result = fn[l](function[l], blocks[l], 1, 1, threads, 1, 1, 0, stream,
                                     params[l], (void **)0);
            if (result != 0)
                return result;
        }
    }
    return 0;
}
