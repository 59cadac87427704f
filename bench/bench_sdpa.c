/* bench_sdpa: accel_sdpa alone, forward + backward, on the Llama step's
 * attention (batch 8, 8 heads, seq 256, head dim 64 by default), with q, k, v
 * in the dtype autocast gives them (the projections' outputs, [B, T, h, D]
 * seen as [B, h, T, D] as split_heads makes them; RoPE would make q and k
 * dense). Prints the median wall and process CPU time
 * per call, and the forward's CPU time alone (the machine may be shared:
 * compare CPU time).
 *
 *   bench_sdpa [--mixed_precision no|bf16|fp16] [--batch B] [--seq T] [--heads H]
 *              [--kv-heads Hkv] [--kv-seq Tk] [--hidden C] [--steps N] [--threads N] [--dense-qk 1]
 *
 * --kv-heads (default: --heads) gives grouped-query attention, H / Hkv query
 * heads per kv head. --kv-seq (default: --seq) gives T queries against Tk
 * keys (the mask aligned bottom-right): a long context's tile class at a
 * short query block's cost (--warmup 0 --steps 1 times its first call, the
 * class's timing included where the cache lacks it).
 * --dense-qk 1 gives the kernels q and k as the Llama step does, each head's
 * rows contiguous ([B, h, T, D]: RoPE's output; its copy is timed too), v
 * still the projection's view.
 * (bench_util.h's flags and defaults: the Llama step's heads and head dim
 * C / H; the other model flags are accepted and unused.) */
#include <time.h>

#include "accel/accel.h"
#include "bench_util.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A persistent [B, T, h, D] projection output of dt (random). */
static accel_tensor *projection(uint64_t seed, accel_dtype dt, int64_t B, int64_t T, int64_t h, int64_t D) {
    accel_tensor *t = accel_tensor_new(dt, ACCEL_SHAPE(B, T, h, D), ACCEL_CPU_DEVICE);
    accel_rng r;
    if (!t || accel_rng_init(&r, seed) != ACCEL_OK || accel_rng_normal_(&r, t, 0.0, 1.0) != ACCEL_OK) return NULL;
    return t;
}

/* t copied into the step arena, needing a gradient: an activation as a step
 * has it (its gradient is the first one it gets, not added into an old one). */
static accel_tensor *step_copy(accel_tensor *t) {
    accel_tensor *c = accel_empty_on(t->dtype, t->ndim, t->shape, t->device);
    if (!c || accel_copy_(c, t) != ACCEL_OK) return NULL;
    c->requires_grad = true;
    return c;
}

/* Takes `flag` N out of argv (the shared parser does not know it): N, 0
 * when absent, -1 when it has no value. */
static int64_t take_flag(const char *flag, int *argc, char **argv) {
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], flag)) continue;
        if (i + 1 >= *argc) return -1;
        int64_t n = atoll(argv[i + 1]);
        memmove(argv + i, argv + i + 2, sizeof *argv * (size_t)(*argc - i - 2));
        *argc -= 2;
        return n;
    }
    return 0;
}

int main(int argc, char **argv) {
    bench_llama_args a;
    int64_t kv_heads = take_flag("--kv-heads", &argc, argv), kv_seq = take_flag("--kv-seq", &argc, argv),
            dense_qk = take_flag("--dense-qk", &argc, argv);
    if (bench_llama_parse("bench_sdpa", "threads mixed_precision", argc, argv, &a)) return 2;
    accel_llama_config cfg = bench_llama_config(&a);
    if (kv_heads) cfg.num_key_value_heads = kv_heads;
    if (kv_heads < 0 || cfg.num_attention_heads % cfg.num_key_value_heads) {
        fprintf(stderr, "bench_sdpa: --kv-heads must divide --heads\n");
        return 2;
    }
    if (dense_qk < 0 || dense_qk > 1) {
        fprintf(stderr, "bench_sdpa: --dense-qk must be 0 or 1\n");
        return 2;
    }
    if (kv_seq < 0 || (kv_seq && kv_seq < a.T)) {
        fprintf(stderr, "bench_sdpa: --kv-seq must be at least --seq\n");
        return 2;
    }
    const char *mp = a.mixed_precision;
    accel_dtype dt = !strcmp(mp, "bf16") ? ACCEL_BF16 : !strcmp(mp, "fp16") ? ACCEL_F16 : ACCEL_F32;
    if (dt == ACCEL_F32 && strcmp(mp, "no")) {
        fprintf(stderr, "bench_sdpa: --mixed_precision must be no, bf16 or fp16\n");
        return 2;
    }
    int64_t B = a.B, T = a.T, Tk = kv_seq ? kv_seq : a.T, H = cfg.num_attention_heads, Hkv = cfg.num_key_value_heads,
            D = a.C / a.H;
    int iters = a.steps, threads = a.threads;
    const char *dts = accel_dtype_name(dt);
    accel_set_num_threads(threads);
    accel_tensor *q = projection(1, dt, B, T, H, D), *k = projection(2, dt, B, Tk, Hkv, D),
                 *v = projection(3, dt, B, Tk, Hkv, D);
    if (!q || !k || !v) {
        fprintf(stderr, "bench_sdpa: %s\n", accel_last_error());
        return 1;
    }
    double *wall = malloc(sizeof(double) * (size_t)iters), *cpu = malloc(sizeof(double) * (size_t)iters),
           *fwd = malloc(sizeof(double) * (size_t)iters);
    for (int it = -a.warmup; it < iters; it++) { /* warm-up calls first */
        accel_tensor *x[3] = {step_copy(q), step_copy(k), step_copy(v)};
        long mf;
        double w0 = now(), c0 = bench_cpu_seconds(&mf);
        accel_tensor *qh = accel_transpose(x[0], 1, 2), *kh = accel_transpose(x[1], 1, 2);
        if (dense_qk) qh = accel_contiguous(qh), kh = accel_contiguous(kh);
        accel_tensor *o = accel_sdpa(qh, kh, accel_transpose(x[2], 1, 2), true, 0.0);
        double c1 = bench_cpu_seconds(&mf);
        if (!o || accel_backward(accel_sum_all(o)) != ACCEL_OK) {
            fprintf(stderr, "bench_sdpa: %s\n", accel_last_error());
            return 1;
        }
        accel_step_reset();
        if (it >= 0) {
            wall[it] = now() - w0;
            cpu[it] = bench_cpu_seconds(&mf) - c0;
            fwd[it] = c1 - c0;
        }
    }
    printf("sdpa %s B=%lld H=%lld Hkv=%lld T=%lld Tk=%lld D=%lld threads=%d%s: forward+backward median wall %.2f ms, cpu "
           "%.2f ms (forward cpu %.2f ms)\n",
           dts, (long long)B, (long long)H, (long long)Hkv, (long long)T, (long long)Tk, (long long)D, threads,
           dense_qk ? " dense q, k" : "",
           1e3 * bench_median(wall, iters), 1e3 * bench_median(cpu, iters), 1e3 * bench_median(fwd, iters));
    free(wall);
    free(fwd);
    free(cpu);
    accel_tensor_free(q);
    accel_tensor_free(k);
    accel_tensor_free(v);
    accel_thread_cleanup();
    return 0;
}
