/* bench_padded_step: what a padded batch's attention_mask costs a training
 * step's forward + backward (accel_llama_loss_ex, accel_backward, the step
 * reset; no optimizer, the gradients adding up as accumulation does): the
 * same ids [B, T] three ways, interleaved over N rounds after warm-up,
 * medians:
 *   - plain:  no mask (accel_llama_loss);
 *   - padded: left padding, row b's first b T / (2 B) positions masked (one
 *             run of kept keys a row: the fused attention's key range);
 *   - holed:  the same number of zeros a row, the first one moved past the
 *             row's first kept key (a 0 between ones: the explicit scores);
 *   - packed: no mask, each row four sequences of T / 4 (position ids
 *             restarting at 0) with no_cache (transformers' use_cache=False:
 *             each sequence attends within itself: on the CPU the fused
 *             attention with a key start per query).
 *
 *     bench_padded_step [--steps N] [--warmup W] [--batch B] [--seq T]
 *                       [--hidden C] [--layers L] [--heads H] [--ffn F] [--vocab V]
 *
 * Prints one line a kind, "kind=... fwd_bwd_ms_median=... cpu_ms_median=...",
 * then "padded_over_plain=... holed_over_plain=... packed_over_plain=..." (medians of same-round
 * ratios), which bench/batch_decode.sh parses. */
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "bench_util.h"

enum { PLAIN, PADDED, HOLED, PACKED, KINDS };
static const char *KIND[KINDS] = {"plain", "padded", "holed", "packed"};

/* The mask [B, T] of kind k (NULL for plain and packed). */
static accel_tensor *mask_of(int k, int64_t B, int64_t T) {
    if (k == PLAIN || k == PACKED) return NULL;
    int64_t *m = malloc((size_t)(B * T) * sizeof *m);
    for (int64_t b = 0; b < B; b++) {
        int64_t pads = b * T / (2 * B);
        for (int64_t t = 0; t < T; t++) m[b * T + t] = t >= pads;
        if (k == HOLED && pads > 0) m[b * T] = 1, m[b * T + pads] = 0; /* 1 0 .. 0 1 0 1 1 ..: a hole */
    }
    accel_tensor *t = accel_tensor_new(ACCEL_I64, 2, (int64_t[]){B, T}, ACCEL_CPU_DEVICE);
    if (t) accel_tensor_from_host(t, m);
    free(m);
    return t;
}

/* The packed kind's position ids [B, T]: four sequences a row, each from 0. */
static accel_tensor *packed_positions(int64_t B, int64_t T) {
    int64_t *p = malloc((size_t)(B * T) * sizeof *p), n = T / 4 > 0 ? T / 4 : 1;
    for (int64_t i = 0; i < B * T; i++) p[i] = i % T % n;
    accel_tensor *t = accel_tensor_new(ACCEL_I64, 2, (int64_t[]){B, T}, ACCEL_CPU_DEVICE);
    if (t) accel_tensor_from_host(t, p);
    free(p);
    return t;
}

int main(int argc, char **argv) {
    bench_llama_args a;
    if (bench_llama_parse("bench_padded_step", "", argc, argv, &a)) return 2;
    accel_llama_config cfg = bench_llama_config(&a);
    accel_manual_seed(0);
    accel_module *model = accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    accel_tensor *ids = bench_llama_ids(&a, 1, ACCEL_CPU_DEVICE), *mask[KINDS], *pos = packed_positions(a.B, a.T);
    for (int k = 0; k < KINDS; k++) mask[k] = mask_of(k, a.B, a.T);
    if (!model || !ids || !mask[PADDED] || !mask[HOLED] || !pos) {
        fprintf(stderr, "bench_padded_step: %s\n", accel_last_error());
        return 1;
    }
    int n = a.steps;
    double *ms = calloc((size_t)(KINDS * n), sizeof *ms), *cpu = calloc((size_t)(KINDS * n), sizeof *cpu);
    double *ratio = calloc((size_t)((KINDS - PADDED) * n), sizeof *ratio);
    for (int r = -a.warmup; r < n; r++)
        for (int k = 0; k < KINDS; k++) {
            long f;
            double c0 = bench_cpu_seconds(&f), t0 = accel_now_seconds();
            accel_llama_inputs in = {.ids = ids, .attention_mask = mask[k], .position_ids = k == PACKED ? pos : NULL,
                                     .no_cache = k == PACKED};
            accel_tensor *loss = accel_llama_loss_ex(model, &in);
            if (!loss || accel_backward(loss) != ACCEL_OK) {
                fprintf(stderr, "bench_padded_step: %s: %s\n", KIND[k], accel_last_error());
                return 1;
            }
            accel_step_reset();
            if (r < 0) continue;
            ms[k * n + r] = 1e3 * (accel_now_seconds() - t0);
            cpu[k * n + r] = 1e3 * (bench_cpu_seconds(&f) - c0);
        }
    for (int r = 0; r < n; r++)
        for (int k = PADDED; k < KINDS; k++) ratio[(k - PADDED) * n + r] = ms[k * n + r] / ms[PLAIN * n + r];
    printf("shape batch=%lld seq=%lld hidden=%lld layers=%lld heads=%lld vocab=%lld rounds=%d\n", (long long)a.B,
           (long long)a.T, (long long)a.C, (long long)a.L, (long long)a.H, (long long)a.V, n);
    for (int k = 0; k < KINDS; k++)
        printf("kind=%s fwd_bwd_ms_median=%.1f cpu_ms_median=%.1f\n", KIND[k], bench_median(ms + k * n, n),
               bench_median(cpu + k * n, n));
    printf("padded_over_plain=%.3f holed_over_plain=%.3f packed_over_plain=%.3f\n", bench_median(ratio, n),
           bench_median(ratio + n, n), bench_median(ratio + 2 * n, n));
    free(ms), free(cpu), free(ratio);
    for (int k = 0; k < KINDS; k++) accel_tensor_free(mask[k]);
    accel_tensor_free(pos);
    accel_tensor_free(ids);
    accel_module_free(model);
    return 0;
}
