/* bench_rope_swiglu: the CPU kernels of RoPE and SwiGLU alone (the kernel
 * entries the ops call, no autograd around them) on the Llama step's shapes:
 * batch 8, seq 256, hidden 512 in 8 heads (head dim 64), ffn 1536, operands
 * in the dtype autocast gives them. Per kernel the median wall and process
 * CPU time of a call:
 *
 *   rope fwd      y [B, H, T, D] = rope(x), x the [B, T, H, D] projection seen as [B, H, T, D]
 *   rope bwd      dx (in x's [B, T, H, D] layout) = rope^-1(dy), dy contiguous
 *   swiglu fwd    out = silu(gate) * up, [B T, F]
 *   swiglu bwd    dgate, dup from g, gate, up
 *
 *   bench_rope_swiglu [--mixed_precision no|bf16|fp16] [--threads N] [--steps N] [--warmup N]
 *                     [--batch B] [--seq T] [--hidden C] [--heads H] [--ffn F]
 *
 * (bench_util.h's flags; the other model flags are accepted and unused.)
 * The machine may be shared: compare CPU time, and A/B builds in turn. */
#include <time.h>

#include "accel/accel.h"
#include "backends/cpu/cpu_kernels.h"
#include "bench_util.h"
#include "llama_gemms.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A persistent tensor of dt and shape (ndim dims), normal random values. */
static accel_tensor *randn(uint64_t seed, accel_dtype dt, int ndim, const int64_t *shape) {
    accel_tensor *t = accel_tensor_new(dt, ndim, shape, ACCEL_CPU_DEVICE);
    accel_rng r;
    if (!t || accel_rng_init(&r, seed) != ACCEL_OK || accel_rng_normal_(&r, t, 0.0, 1.0) != ACCEL_OK) return NULL;
    return t;
}

enum { ROPE_FWD, ROPE_BWD, SWIGLU_FWD, SWIGLU_BWD, N_KERNELS };
static const char *const NAMES[N_KERNELS] = {"rope fwd", "rope bwd", "swiglu fwd", "swiglu bwd"};

typedef struct operands {
    accel_k_rope rope[2]; /* forward, backward */
    accel_k_swiglu swiglu;
    accel_k_swiglu_backward swiglu_backward;
} operands;

static accel_status run(operands *o, int kernel) {
    switch (kernel) {
    case ROPE_FWD: return accel__cpuk_rope(&o->rope[0]);
    case ROPE_BWD: return accel__cpuk_rope(&o->rope[1]);
    case SWIGLU_FWD: return accel__cpuk_swiglu(&o->swiglu);
    default: return accel__cpuk_swiglu_backward(&o->swiglu_backward);
    }
}

int main(int argc, char **argv) {
    bench_llama_args a;
    if (bench_llama_parse("bench_rope_swiglu", "threads mixed_precision", argc, argv, &a)) return 2;
    const char *mp = a.mixed_precision;
    accel_dtype dt = !strcmp(mp, "bf16") ? ACCEL_BF16 : !strcmp(mp, "fp16") ? ACCEL_F16 : ACCEL_F32;
    if (dt == ACCEL_F32 && strcmp(mp, "no")) {
        fprintf(stderr, "bench_rope_swiglu: --mixed_precision must be no, bf16 or fp16\n");
        return 2;
    }
    int64_t B = a.B, T = a.T, H = a.H, D = a.C / a.H, N = a.B * a.T, F = a.F;
    if (D % 2) {
        fprintf(stderr, "bench_rope_swiglu: the head dim must be even\n");
        return 2;
    }
    accel_set_num_threads(a.threads);
    /* the projection [B, T, H, D] and its gradient in that layout, seen as [B, H, T, D]; the tables [T, D / 2] */
    accel_tensor *proj = randn(1, dt, ACCEL_SHAPE(B, T, H, D)), *dproj = randn(2, dt, ACCEL_SHAPE(B, T, H, D));
    accel_tensor *y = randn(3, dt, ACCEL_SHAPE(B, H, T, D)), *dy = randn(4, dt, ACCEL_SHAPE(B, H, T, D));
    accel_tensor *cs = randn(5, ACCEL_F32, ACCEL_SHAPE(T, D / 2)), *sn = randn(6, ACCEL_F32, ACCEL_SHAPE(T, D / 2));
    accel_tensor *gate = randn(7, dt, ACCEL_SHAPE(N, F)), *up = randn(8, dt, ACCEL_SHAPE(N, F)),
                 *out = randn(9, dt, ACCEL_SHAPE(N, F)), *g = randn(10, dt, ACCEL_SHAPE(N, F)),
                 *dgate = randn(11, dt, ACCEL_SHAPE(N, F)), *dup = randn(12, dt, ACCEL_SHAPE(N, F));
    accel_tensor *x = accel_transpose(proj, 1, 2), *dx = accel_transpose(dproj, 1, 2);
    if (!x || !dx || !y || !dy || !cs || !sn || !gate || !up || !out || !g || !dgate || !dup) {
        fprintf(stderr, "bench_rope_swiglu: %s\n", accel_last_error());
        return 1;
    }
    operands o = {
        .rope = {{.y = y, .x = x, .cos = cs, .sin = sn, .BH = B * H, .T = T, .half = D / 2, .sign = 1.0f},
                 {.y = dx, .x = dy, .cos = cs, .sin = sn, .BH = B * H, .T = T, .half = D / 2, .sign = -1.0f}},
        .swiglu = {.out = out, .gate = gate, .up = up},
        .swiglu_backward = {.dgate = dgate, .dup = dup, .g = g, .gate = gate, .up = up},
    };
    char cpu[512], load[64];
    const char *wait = getenv("OMP_WAIT_POLICY");
    printf("%sOMP_WAIT_POLICY=%s\nload average before: %s\n", accel_cpu_describe(cpu, sizeof cpu),
           wait ? wait : "(unset)", llama_loadavg(load, sizeof load));
    printf("%s, %d threads, rope x [%lld, %lld, %lld, %lld], swiglu [%lld, %lld]; median of %d calls:\n",
           accel_dtype_name(dt), a.threads, (long long)B, (long long)H, (long long)T, (long long)D, (long long)N,
           (long long)F, a.steps);
    double *wall = malloc(sizeof(double) * (size_t)a.steps), *cpus = malloc(sizeof(double) * (size_t)a.steps);
    for (int k = 0; k < N_KERNELS; k++) {
        for (int it = -a.warmup; it < a.steps; it++) {
            long mf;
            double w0 = now(), c0 = bench_cpu_seconds(&mf);
            if (run(&o, k) != ACCEL_OK) {
                fprintf(stderr, "bench_rope_swiglu: %s: %s\n", NAMES[k], accel_last_error());
                return 1;
            }
            if (it < 0) continue;
            wall[it] = now() - w0;
            cpus[it] = bench_cpu_seconds(&mf) - c0;
        }
        printf("  %-11s wall %7.3f ms  cpu %7.3f ms\n", NAMES[k], 1e3 * bench_median(wall, a.steps),
               1e3 * bench_median(cpus, a.steps));
    }
    printf("load average after: %s\n", llama_loadavg(load, sizeof load));
    free(wall);
    free(cpus);
    accel_tensor *all[] = {proj, dproj, y, dy, cs, sn, gate, up, out, g, dgate, dup};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) accel_tensor_free(all[i]);
    accel_step_reset();
    accel_thread_cleanup();
    return 0;
}
