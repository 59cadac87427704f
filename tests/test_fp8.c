/* fp8 without a GPU: the E4M3/E5M2 conversions (the software reference the
 * GPU's casts are tested against in test_cuda_kernels), the delayed-scaling
 * rule of TransformerEngine's recipe, and mixed_precision='fp8' refused with
 * the device's reason. */
#include <math.h>
#include <stdlib.h>

#include "accel/accelerator.h"
#include "backends/fp8.h"
#include "check.h"

static void test_known_codes(void) {
    const accel__fp8_format E4 = ACCEL_FP8_E4M3, E5 = ACCEL_FP8_E5M2;
    CHECK(accel__fp8_encode(1.0f, E4) == 0x38 && accel__fp8_encode(1.0f, E5) == 0x3C);
    CHECK(accel__fp8_encode(448.0f, E4) == 0x7E && accel__fp8_encode(-448.0f, E4) == 0xFE);
    CHECK(accel__fp8_encode(57344.0f, E5) == 0x7B);
    /* saturation: past the max, and infinities (no inf in E4M3; E5M2's are not produced) */
    CHECK(accel__fp8_encode(500.0f, E4) == 0x7E && accel__fp8_encode(INFINITY, E4) == 0x7E);
    CHECK(accel__fp8_encode(-INFINITY, E5) == 0xFB && accel__fp8_encode(1e9f, E5) == 0x7B);
    /* E4M3's subnormals: 2^-9 is the smallest; ties round to even */
    CHECK(accel__fp8_encode(0.001953125f, E4) == 0x01);
    CHECK(accel__fp8_encode(0.0009765625f, E4) == 0x00);      /* half of the smallest: to 0 (even) */
    CHECK(accel__fp8_encode(1.5f * 0.001953125f, E4) == 0x02); /* between 1 and 2 ulps: to 2 */
    CHECK(accel__fp8_encode(1.0625f, E4) == 0x38);             /* between 1.0 and 1.125: to 1.0 */
    CHECK(accel__fp8_encode(1.1875f, E4) == 0x3A);             /* between 1.125 and 1.25: to 1.25 */
    CHECK(accel__fp8_encode(0.0f, E4) == 0x00 && accel__fp8_encode(-0.0f, E4) == 0x80);
    CHECK(accel__fp8_encode(NAN, E4) == 0x7F && isnan(accel__fp8_decode(0x7F, E4)));
    CHECK(isinf(accel__fp8_decode(0x7C, E5)) && isnan(accel__fp8_decode(0x7D, E5)));
    CHECK(accel__fp8_decode(0x7E, E4) == 448.0f && accel__fp8_decode(0x01, E4) == 0.001953125f);
}

/* Every finite code decodes to a value that encodes back to the code, and
 * each value between two neighbours rounds to the nearer one. */
static void test_round_trips(void) {
    for (int f = 0; f < 2; f++) {
        accel__fp8_format fmt = (accel__fp8_format)f;
        for (int c = 0; c < 256; c++) {
            float v = accel__fp8_decode((uint8_t)c, fmt);
            if (!isfinite(v)) continue;
            CHECK_MSG(accel__fp8_encode(v, fmt) == c || (v == 0.0f && (c & 0x7F) == 0), "format %d code 0x%02x", f, c);
            float next = accel__fp8_decode((uint8_t)(c + 1), fmt);
            if ((c & 0x7F) == 0x7F || !isfinite(next) || (c & 0x80) != ((c + 1) & 0x80)) continue;
            float below = v + 0.4f * (next - v), above = v + 0.6f * (next - v);
            CHECK_MSG(accel__fp8_encode(below, fmt) == c && accel__fp8_encode(above, fmt) == c + 1,
                      "format %d between codes 0x%02x and 0x%02x", f, c, c + 1);
        }
    }
}

static void test_delayed_scaling(void) {
    float h[3] = {0};
    accel__fp8_scaling s = accel__fp8_scaling_init(3, false, 0);
    CHECK(s.scale == 1.0f && s.scale_inv == 1.0f);
    accel__fp8_update(&s, h, 2.0f, ACCEL_FP8_E4M3); /* most_recent: 448 / 2 */
    CHECK(s.scale == 224.0f && s.scale_inv == 1.0f / 224.0f);
    accel__fp8_update(&s, h, 8.0f, ACCEL_FP8_E4M3);
    CHECK(s.scale == 56.0f);
    accel__fp8_update(&s, h, 0.0f, ACCEL_FP8_E4M3); /* nothing seen: the scale stays */
    CHECK(s.scale == 56.0f);
    accel__fp8_update(&s, h, NAN, ACCEL_FP8_E4M3);
    accel__fp8_update(&s, h, INFINITY, ACCEL_FP8_E4M3);
    CHECK(s.scale == 56.0f);

    /* "max" over a history of 3, margin 1: the largest amax decides until it falls out */
    float hm[3] = {0};
    accel__fp8_scaling m = accel__fp8_scaling_init(3, true, 1);
    accel__fp8_update(&m, hm, 8.0f, ACCEL_FP8_E5M2);
    CHECK(m.scale == 57344.0f / 8.0f / 2.0f);
    accel__fp8_update(&m, hm, 1.0f, ACCEL_FP8_E5M2);
    accel__fp8_update(&m, hm, 2.0f, ACCEL_FP8_E5M2);
    CHECK(m.scale == 57344.0f / 8.0f / 2.0f);
    accel__fp8_update(&m, hm, 1.0f, ACCEL_FP8_E5M2); /* 8 left the history: max(1, 2, 1) */
    CHECK(m.scale == 57344.0f / 2.0f / 2.0f);
}

/* fp8 is refused, naming the device and why: here the cpu (no GPU, or no
 * CUDA backend); on a GPU below compute capability 8.9 its capability; on an
 * fp8 GPU the missing layer support. */
static void test_refused(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "fp8";
    o.cpu = true;
    CHECK(accel_accelerator_new(&o) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "fp8 mixed precision is not supported on cpu");
    CHECK_STR_CONTAINS(accel_last_error(), "compute capability >= 8.9");
    accel_clear_error();

    setenv("ACCEL_MIXED_PRECISION", "fp8", 1);
    CHECK(accel_accelerator_new(NULL) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "fp8 mixed precision is not supported on");
    if (accel_device_count(ACCEL_DEV_CUDA) == 0) CHECK_STR_CONTAINS(accel_last_error(), "on cpu");
    else CHECK_STR_CONTAINS(accel_last_error(), "on cuda:0");
    unsetenv("ACCEL_MIXED_PRECISION");
    accel_clear_error();

    CHECK(accel__fp8_device_check(ACCEL_CPU_DEVICE, "op") == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "op: fp8 mixed precision is not supported on cpu");
    accel_clear_error();
}

int main(void) {
    RUN(test_known_codes);
    RUN(test_round_trips);
    RUN(test_delayed_scaling);
    RUN(test_refused);
    return check_summary();
}
