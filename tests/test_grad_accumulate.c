/* The CPU's accumulate kernel (a second gradient added into a first, in the
 * first's layout: accel_grad_accumulate) for every pair of float dtypes and
 * layouts: each element is the f32 sum of the two, rounded once to the
 * destination's dtype (PyTorch's grad accumulation in its opmath type), the
 * same bits as accel_add in f32 followed by accel_to_dtype. Rows wider than
 * the kernel's blocks and more elements than its threading threshold; a
 * transposed destination (a gradient in a view's layout), a source with a
 * stride gap. Before the
 * float path, a bf16 leaf's second gradient took an element-by-element loop
 * with index divisions (30 ms for 1M elements). */
#include <string.h>

#include "accel/accel.h"
#include "backends/registry.h"
#include "check.h"

enum { R = 300, C = 517 }; /* C spans three blocks of 256; R * C > 65536 */

static const accel_dtype FLOATS[] = {ACCEL_F32, ACCEL_BF16, ACCEL_F16};

/* A persistent [R, C] tensor of dtype dt with values from seed. */
static accel_tensor *filled(accel_dtype dt, int64_t r, int64_t c, uint64_t seed) {
    accel_rng g;
    accel_rng_init(&g, seed);
    accel_tensor *f = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){r, c}, ACCEL_CPU_DEVICE);
    accel_tensor *t = accel_tensor_new(dt, 2, (int64_t[]){r, c}, ACCEL_CPU_DEVICE);
    CHECK(f && t && accel_rng_normal_(&g, f, 0.0, 3.0) == ACCEL_OK && accel_copy_(t, f) == ACCEL_OK);
    accel_tensor_free(f);
    return t;
}

/* dst (+)= src through the CPU kernel, checked against accel_add in f32 rounded to dst's dtype. */
static void check_pair(accel_dtype ddt, accel_dtype sdt, int layout) {
    /* layout 0: both contiguous; 1: dst a transposed view of a [C, R] buffer; 2: src every other column of [R, 2C] */
    accel_tensor *dbuf = layout == 1 ? filled(ddt, C, R, 1) : filled(ddt, R, C, 1);
    accel_tensor *sbuf = layout == 2 ? filled(sdt, R, 2 * C, 2) : filled(sdt, R, C, 2);
    accel_tensor *dst = layout == 1 ? accel_transpose(dbuf, 0, 1) : dbuf;
    accel_tensor *src = layout == 2 ? accel_view_raw(sbuf, 2, (int64_t[]){R, C}, (int64_t[]){2 * C, 2}, 1) : sbuf;
    accel_tensor *want = accel_to_dtype(accel_add(accel_to_dtype(dst, ACCEL_F32), accel_to_dtype(src, ACCEL_F32)), ddt);
    accel_k_accumulate k = {.out = dst, .in = src};
    CHECK(want && accel__cpu_backend.kernels.accumulate(&k) == ACCEL_OK);
    int64_t bad = 0;
    for (int64_t i = 0; i < R && want; i++)
        for (int64_t j = 0; j < C; j++) {
            double got = accel_get(dst, (int64_t[]){i, j}), w = accel_get(want, (int64_t[]){i, j});
            bad += memcmp(&got, &w, sizeof got) != 0;
        }
    CHECK_MSG(bad == 0, "accumulate %s += %s, layout %d: %lld elements differ from the f32 sum rounded once",
              accel_dtype_name(ddt), accel_dtype_name(sdt), layout, (long long)bad);
    accel_tensor_free(dbuf);
    accel_tensor_free(sbuf);
    accel_step_reset();
}

static void test_every_float_pair_and_layout(void) {
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 3; s++)
            for (int layout = 0; layout < 3; layout++) check_pair(FLOATS[d], FLOATS[s], layout);
}

/* A bf16 leaf used twice (a tied weight): its gradient is the first
 * contribution rounded to bf16, then the second added in f32 and rounded
 * again, as PyTorch accumulates (whichever contribution comes first). */
static void test_bf16_leaf_used_twice(void) {
    accel_tensor *w = filled(ACCEL_BF16, R, C, 3);
    CHECK(accel_requires_grad_(w, true) == ACCEL_OK);
    accel_tensor *g1 = filled(ACCEL_F32, R, C, 4), *g2 = filled(ACCEL_F32, R, C, 5);
    accel_tensor *loss = accel_add(accel_sum_all(accel_mul(accel_to_dtype(w, ACCEL_F32), g1)),
                                   accel_sum_all(accel_mul(accel_to_dtype(w, ACCEL_F32), g2)));
    CHECK(loss && accel_backward(loss) == ACCEL_OK && w->grad && w->grad->dtype == ACCEL_BF16);
    int64_t bad = 0;
    for (int64_t i = 0; i < R && w->grad; i++)
        for (int64_t j = 0; j < C; j++) {
            int64_t at[2] = {i, j};
            float a = (float)accel_get(g1, at), b = (float)accel_get(g2, at);
            float ab = accel_bf16_to_f32(accel_f32_to_bf16(accel_bf16_to_f32(accel_f32_to_bf16(a)) + b));
            float ba = accel_bf16_to_f32(accel_f32_to_bf16(accel_bf16_to_f32(accel_f32_to_bf16(b)) + a));
            float got = (float)accel_get(w->grad, at);
            bad += got != ab && got != ba;
        }
    CHECK_MSG(bad == 0, "a bf16 leaf's two gradients: %lld elements differ", (long long)bad);
    accel_tensor_free(w);
    accel_tensor_free(g1);
    accel_tensor_free(g2);
    accel_step_reset();
}

int main(void) {
    RUN(test_every_float_pair_and_layout);
    RUN(test_bf16_leaf_used_twice);
    return check_summary();
}
