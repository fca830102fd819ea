/* What solve_range tells a recorder of accepted steps: nothing, in the solver alone (the
 * gradient's tapes are one, odecli.ode.native.reverse). */
typedef struct Recorder Recorder;
static inline void record_start(Recorder *rec, const Lanes *L, int l, int busy)
{
    (void)rec; (void)L; (void)l; (void)busy;
}
static inline void record_step(Recorder *rec, const Lanes *L, int l, int64_t first_output)
{
    (void)rec; (void)L; (void)l; (void)first_output;
}
static inline void record_finish(Recorder *rec, const Lanes *L, int l) { (void)rec; (void)L; (void)l; }
