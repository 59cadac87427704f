/* Zeros stored around the caches (accel__zero_cold_, the gradients'
 * zero_grad; the cpu's accel__cpu_zero_streamed):
 *   - every byte of the range zero and none outside it touched, for every
 *     alignment of the start (the unaligned head, the streamed body, the
 *     tail) and sizes around the 16-byte stores and the 64-byte minimum;
 *   - a tensor, a contiguous view at an odd offset (only its elements), a
 *     strided view (accel_zero_'s fill: only its elements), an empty one, a
 *     tensor past the cpu's 1 MiB threshold (a view at an odd offset in it);
 *   - accel__cpu_zero_streamed of nothing at NULL;
 *   - an optimizer's zero_grad zeroes every gradient it holds. */
#include "accel/accel.h"
#include "backends/cpu/cpu_kernels.h"
#include "check.h"
#include "core/core_internal.h"

static void test_streamed_ranges(void) {
    static const size_t SIZES[] = {0, 1, 15, 16, 17, 63, 64, 65, 79, 80, 81, 100, 1000, 4099, 1 << 16};
    enum { GUARD = 32 };
    unsigned char *buf = malloc((1 << 16) + 2 * GUARD + 64);
    CHECK(buf != NULL);
    for (size_t s = 0; s < sizeof SIZES / sizeof SIZES[0]; s++)
        for (size_t off = 0; off < 18; off++) {
            size_t n = SIZES[s], total = n + 2 * GUARD + off;
            memset(buf, 0xab, total);
            accel__cpu_zero_streamed(buf + GUARD + off, n);
            size_t bad = total;
            for (size_t i = 0; i < total && bad == total; i++) {
                bool inside = i >= GUARD + off && i < GUARD + off + n;
                if (buf[i] != (inside ? 0 : 0xab)) bad = i;
            }
            CHECK_MSG(bad == total, "%zu bytes at offset %zu: byte %zu is 0x%02x", n, off, bad, buf[bad]);
        }
    free(buf);
}

static bool all_equal(const float *v, int64_t n, float x) {
    for (int64_t i = 0; i < n; i++)
        if (v[i] != x) return false;
    return true;
}

static void test_tensors(void) {
    accel_tensor *t = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){37, 29}, ACCEL_CPU_DEVICE);
    CHECK(t && accel_fill_(t, 3.0) == ACCEL_OK);
    float *v = t->data;
    /* rows 1..35 as one contiguous view at an odd element offset */
    accel_tensor *mid = accel_slice(t, 0, 1, 36, 1);
    CHECK(mid && accel_is_contiguous(mid));
    CHECK(accel__zero_cold_(mid) == ACCEL_OK);
    CHECK(all_equal(v, 29, 3.0f) && all_equal(v + 29, 35 * 29, 0.0f) && all_equal(v + 36 * 29, 29, 3.0f));
    /* a strided view (column 5): accel_zero_'s fill, only its elements */
    CHECK(accel_fill_(t, 2.0) == ACCEL_OK);
    accel_tensor *col = accel_slice(t, 1, 5, 6, 1);
    CHECK(col && !accel_is_contiguous(col));
    CHECK(accel__zero_cold_(col) == ACCEL_OK);
    int wrong = 0;
    for (int r = 0; r < 37; r++)
        for (int c = 0; c < 29; c++) wrong += v[r * 29 + c] != (c == 5 ? 0.0f : 2.0f);
    CHECK_MSG(wrong == 0, "%d elements wrong after zeroing a column", wrong);
    accel_tensor *empty = accel_slice(t, 0, 3, 3, 1);
    CHECK(empty && accel__zero_cold_(empty) == ACCEL_OK);
    CHECK(accel__zero_cold_(t) == ACCEL_OK && all_equal(v, 37 * 29, 0.0f));
    /* 1.2 MiB of rows 1..: streamed (the cpu's threshold is 1 MiB) */
    accel_tensor *big = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){301, 1027}, ACCEL_CPU_DEVICE);
    CHECK(big && accel_fill_(big, 1.0) == ACCEL_OK);
    accel_tensor *rows = accel_slice(big, 0, 1, 301, 1);
    CHECK(rows && accel__zero_cold_(rows) == ACCEL_OK);
    const float *bv = big->data;
    CHECK(all_equal(bv, 1027, 1.0f) && all_equal(bv + 1027, 300 * 1027, 0.0f));
    accel__cpu_zero_streamed(NULL, 0);
    CHECK(accel__zero_cold_(NULL) != ACCEL_OK); /* the tensor checks of accel_zero_ */
    accel_clear_error();
    accel_step_reset();
    accel_tensor_free(t);
    accel_tensor_free(big);
}

static void test_zero_grad(void) {
    accel_module *m = accel_linear_new(33, 17, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-3);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h);
    CHECK(m && opt);
    float xs[5 * 33];
    for (int i = 0; i < 5 * 33; i++) xs[i] = (float)(i % 7) - 3.0f;
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(5, 33), xs);
    CHECK(accel_backward(accel_mean_all(accel_module_call(m, x))) == ACCEL_OK);
    accel_tensor *w = accel_module_get_tensor(m, "weight"), *b = accel_module_get_tensor(m, "bias");
    accel_tensor *gw = w ? w->grad : NULL, *gb = b ? b->grad : NULL;
    CHECK(gw && gb && !all_equal(gw->data, 17 * 33, 0.0f));
    CHECK(accel_optimizer_zero_grad(opt) == ACCEL_OK);
    CHECK(all_equal(gw->data, 17 * 33, 0.0f) && all_equal(gb->data, 17, 0.0f));
    accel_step_reset();
    accel_optimizer_free(opt);
    accel_module_free(m);
}

int main(void) {
    RUN(test_streamed_ranges);
    RUN(test_tensors);
    RUN(test_zero_grad);
    accel_thread_cleanup();
    return check_summary();
}
