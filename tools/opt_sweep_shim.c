/* tools/opt_sweep_shim.c: the one call of tools/sweep_optim.py that ctypes
 * cannot make plainly: an accelerator from a few options (the options
 * struct is passed by pointer and is too large to mirror in Python). Built
 * by the sweep as a shared library against build/'s libaccel.so.
 * NULL + accel_last_error() when accel_accelerator_new refuses. */
#include "accel/accel.h"
#include "accel/accelerator.h"

accel_accelerator *opt_sweep_accelerator(const char *mixed_precision, int accumulation_steps, bool split_batches,
                                         bool no_step_scheduler_with_optimizer, double init_scale,
                                         double growth_factor, double backoff_factor, int64_t growth_interval) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = mixed_precision;
    o.gradient_accumulation_steps = accumulation_steps;
    o.split_batches = split_batches;
    o.no_step_scheduler_with_optimizer = no_step_scheduler_with_optimizer;
    o.init_scale = init_scale;
    o.growth_factor = growth_factor;
    o.backoff_factor = backoff_factor;
    o.growth_interval = growth_interval;
    o.cpu = true;
    return accel_accelerator_new(&o);
}
