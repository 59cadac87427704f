/* ZeRO-3 (FSDP FULL_SHARD) on a device saves device memory, and its steps
 * allocate nothing. ctest runs it on hostless:0 plainly (one process) and
 * under `accel launch --num_processes 2` and 3, with the hostless granule and
 * with CUDA's 2 MiB (ACCEL_TEST_VM_GRANULE); `test_zero3_device_memory cuda`
 * runs it on cuda:0 (ctest label gpu, tools/gpu_check.sh; exit 77, skipped,
 * without a GPU). A model of L equal Linear units trains a few steps.
 *
 * The virtual memory's pool (backends/vm_pool.h) counts on every backend:
 * between steps no unit's full parameters or gradients are mapped, within a
 * step at most a few units with their gradients, the pool holds no more
 * physical memory than a step maps at once, and after the first step no
 * physical memory is created. On hostless the device bytes (persistent
 * allocations and mapped memory) are bounded too: between steps a rank holds
 * its shards (parameters, averaged gradients, AdamW's two moments: 4 x
 * params/N) and no unit's full parameters or gradients; full buffers that
 * stayed allocated (2 x params on every rank) exceed the bound. On CUDA the
 * caching allocator's bytes (cached blocks of the model's first parameters
 * included) must only not grow after the second step. After the first step
 * no step calls the host allocator (the gather landing and host staging
 * buffers are made at prepare), and on CUDA none creates an event (the
 * backend's event pool and the pool's fences are reused). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "backends/registry.h"
#include "backends/vm_pool.h"
#include "check.h"
#include "count_alloc.h"
#include "cuda_skip.h"

enum { L = 8, H = 256, MB = 4, STEPS = 4 };

static accel_module *stack(accel_device dev) {
    accel_module *l[L];
    for (int i = 0; i < L; i++) l[i] = accel_linear_new(H, H, true, dev, ACCEL_F32);
    return accel_sequential_new(L, l);
}

/* Fixed features or targets [MB, H] for rank r, on dev: persistent, every step reads them. */
static accel_tensor *data(int r, int salt, accel_device dev) {
    float x[MB * H];
    for (int i = 0; i < MB * H; i++) x[i] = (float)((i * 7 + r * 5 + salt * 3) % 13) / 13.0f - 0.5f;
    accel_tensor *t = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){MB, H}, dev);
    CHECK(t && accel_copy_(t, accel_from_floats(ACCEL_SHAPE(MB, H), x)) == ACCEL_OK);
    return t;
}

/* The device's bytes as its backend counts them, the pool's unmapped
 * handles aside: hostless's persistent allocations and mapped memory; on
 * CUDA the caching allocator's cudaMalloc'd bytes (cached blocks too) and
 * the mapped memory. */
static size_t device_bytes(accel_device dev) {
#ifdef ACCEL_HAVE_CUDA
    if (dev.type == ACCEL_DEV_CUDA) return cuda_hooks()->reserved_bytes(dev.index) + accel__vm_stats_of(dev).mapped;
#endif
    return accel__hostless_memory_stats(dev.index).in_use;
}

/* CUDA events the backend has made on dev (its event pool's, the virtual
 * memory's fences); 0 on hostless, whose events are no resource. */
static long events_created(accel_device dev) {
#ifdef ACCEL_HAVE_CUDA
    if (dev.type == ACCEL_DEV_CUDA) return cuda_hooks()->events_created(dev.index);
#endif
    (void)dev;
    return 0;
}

/* What steps 2..STEPS measured: bytes, each the most over those steps, but
 * the counts (summed) and steady_bytes. */
typedef struct measures {
    double between, peak;      /* device bytes (from the base) between steps, at a step's peak (hostless) */
    double mapped_between, mapped_peak, held_between; /* the pool's */
    double steady_bytes[2];    /* device bytes after step 2 and after the last */
    long host_allocs, creates; /* host allocations, physical memory created */
    long events;               /* CUDA events created */
} measures;

static double most(double a, double b) { return a > b ? a : b; }

/* Steps 2..STEPS, measured; the losses of the first and the last. */
static void train(accel_accelerator *acc, accel_module *model, accel_optimizer *opt, accel_tensor *x,
                  accel_tensor *y, size_t base, measures *m, float *first, float *last) {
    accel_device dev = accel_accelerator_device(acc);
    for (int s = 0; s < STEPS; s++) {
        long before = n_allocs, events = events_created(dev);
        int64_t created = accel__vm_stats_of(dev).creates;
        if (dev.type == ACCEL_DEV_HOSTLESS) accel__hostless_reset_peak(dev.index);
        accel__vm_reset_peak(dev);
        accel_tensor *loss = accel_mse_loss(accel_module_call(model, x), y);
        CHECK_MSG(loss != NULL, "step %d: %s", s + 1, accel_last_error());
        if (!loss) break;
        *(s ? last : first) = accel_item(loss);
        CHECK_MSG(accel_accelerator_backward(acc, loss) == ACCEL_OK, "%s", accel_last_error());
        CHECK_MSG(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK, "%s", accel_last_error());
        CHECK(accel_accelerator_zero_grad(acc, opt) == ACCEL_OK);
        accel_step_reset();
        if (s == 0) continue;
        accel__vm_stats v = accel__vm_stats_of(dev);
        m->host_allocs += n_allocs - before;
        m->creates += (long)(v.creates - created);
        m->events += events_created(dev) - events;
        double now = (double)(device_bytes(dev) - base);
        m->steady_bytes[s > 1] = now;
        m->between = most(m->between, now);
        if (dev.type == ACCEL_DEV_HOSTLESS)
            m->peak = most(m->peak, (double)(accel__hostless_memory_stats(dev.index).peak - base));
        m->mapped_between = most(m->mapped_between, (double)v.mapped);
        m->mapped_peak = most(m->mapped_peak, (double)v.mapped_peak);
        m->held_between = most(m->held_between, (double)v.held);
    }
}

static void test_memory_and_allocations(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.zero_stage = 3;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    if (!acc) return;
    accel_device dev = accel_accelerator_device(acc);
    CHECK_MSG(dev.type == ACCEL_DEV_HOSTLESS || dev.type == ACCEL_DEV_CUDA,
              "run on hostless:0 or cuda:0 (ACCEL_DEFAULT_DEVICE)");
    bool hostless = dev.type == ACCEL_DEV_HOSTLESS;
    int n = accel_accelerator_num_processes(acc), r = accel_accelerator_process_index(acc);
    accel_tensor *x = data(r, 0, dev), *y = data(r, 1, dev);
    size_t base = device_bytes(dev);
    accel_manual_seed(7);
    accel_module *model = stack(dev);
    accel_tensor **ps;
    int np = accel_module_parameters(model, &ps);
    double params = 0; /* bytes */
    for (int i = 0; i < np; i++) params += (double)accel_nbytes(ps[i]);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-3);
    accel_optimizer *opt = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, np, ps, &h);
    accel_free(ps);
    CHECK_MSG(accel_accelerator_prepare(acc, model, opt, NULL, NULL) == ACCEL_OK, "%s", accel_last_error());
    /* A unit's full range: its parameters and pieces' padding, to whole mapping granules. */
    double g = (double)accel__backend_of(dev)->mem.vm_granularity(dev.index);
    double unit = ceil((params / L + 64.0 * n) / g) * g;
    double shards = 4 * params / n + 2 * L * 1024.0; /* params, grads, two moments; each unit's piece padded */
    double after_prepare = (double)(device_bytes(dev) - base);
    measures m = {0};
    float first = 0, last = 0;
    train(acc, model, opt, x, y, base, &m, &first, &last);
    CHECK_MSG(last < first, "it trains: loss %g -> %g", first, last);
    if (r == 0)
        printf("zero3 device memory world=%d params=%.0f B granule=%.0f B: after prepare %.0f B, between steps "
               "%.0f B, step peak %.0f B (shards %.0f B, one unit %.0f B); mapped between steps %.0f B, at a step's "
               "peak %.0f B; pool held between steps %.0f B, created in steps 2..%d: %ld\n",
               n, params, g, after_prepare, m.between, m.peak, shards, unit, m.mapped_between, m.mapped_peak,
               m.held_between, STEPS, m.creates);
    CHECK_MSG(m.mapped_between == 0, "between steps: %.0f bytes mapped, want none (no unit gathered)",
              m.mapped_between);
    CHECK_MSG(m.mapped_peak <= 6 * unit, "step peak: %.0f bytes mapped, want <= %.0f (3 units' parameters and "
              "gradients)", m.mapped_peak, 6 * unit);
    CHECK_MSG(m.held_between <= 6 * unit, "between steps the pool holds %.0f bytes, want <= %.0f (what a step maps "
              "at once)", m.held_between, 6 * unit);
    CHECK_MSG(m.creates == 0, "steps 2..%d created physical memory %ld times", STEPS, m.creates);
    CHECK_MSG(m.steady_bytes[1] == m.steady_bytes[0], "device bytes grew from %.0f after step 2 to %.0f",
              m.steady_bytes[0], m.steady_bytes[1]);
    CHECK_MSG(m.host_allocs == 0, "steps 2..%d made %ld allocations", STEPS, m.host_allocs);
    CHECK_MSG(m.events == 0, "steps 2..%d created %ld CUDA events (the event pool reuses freed ones)", STEPS,
              m.events);
    if (hostless) {
        CHECK_MSG(after_prepare <= shards, "after prepare: %.0f device bytes, want <= %.0f (the shards)",
                  after_prepare, shards);
        CHECK_MSG(m.between <= shards, "between steps: %.0f device bytes, want <= %.0f (the shards, no unit "
                  "gathered)", m.between, shards);
        CHECK_MSG(m.peak <= shards + 6 * unit, "step peak: %.0f device bytes, want <= %.0f (the shards + 3 units' "
                  "parameters and gradients)", m.peak, shards + 6 * unit);
    }
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_accelerator_free(acc);
    accel__vm_stats v = accel__vm_stats_of(dev);
    CHECK_MSG(v.mapped == 0 && v.held == 0, "after free: %zu bytes mapped, %zu held by the pool", v.mapped, v.held);
    if (hostless) CHECK_MSG(device_bytes(dev) == base, "device bytes after free: %zu, before: %zu", device_bytes(dev), base);
    accel_tensor_free(x);
    accel_tensor_free(y);
}

/* The device: with `cuda` cuda:0 (false, the reason printed, when there is
 * none); else ACCEL_DEFAULT_DEVICE, or (run plainly) hostless:0. */
static bool pick_device(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "cuda")) {
        if (!cuda_present_or_say_why()) return false;
        setenv("ACCEL_DEFAULT_DEVICE", "cuda:0", 0);
    } else if (!getenv("ACCEL_DEFAULT_DEVICE")) {
        CHECK(accel__hostless_register(1) == ACCEL_OK);
        setenv("ACCEL_DEFAULT_DEVICE", "hostless:0", 1);
    }
    return true;
}

int main(int argc, char **argv) {
    if (!pick_device(argc, argv)) return CUDA_SKIP;
    count_alloc_install();
    RUN(test_memory_and_allocations);
    accel_thread_cleanup();
    accel_set_allocator(NULL);
    return check_summary();
}
