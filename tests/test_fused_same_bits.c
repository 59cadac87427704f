/* The fast RoPE and SwiGLU kernels give exactly the bits of the element by
 * element computation, in every CPU variant this machine runs: RoPE against
 * the reference kernel; SwiGLU, whose reference kernel takes libm's expf,
 * against the same element-wise formulas on vec_math.h's accel__expf (what
 * the fast kernels vectorise), with the intermediate roundings PyTorch's
 * autocast makes (silu(gate), g * up rounded to gate's dtype). Shapes hit
 * the vector loops' tails (half and n not multiples of 16 or 8), T = 1,
 * odd row counts, runs of rows that cross a (b, h), threads; every mix of
 * f32, bf16 and f16, strided x and y (last dim contiguous), beta 1 adding
 * into y. The values include infinities, NaNs (any NaN matches any NaN: which
 * of two NaN operands an operation returns is the compiler's choice),
 * subnormals and values that round to f16's subnormals or past its range.
 * test_ops_fused covers the ops around these kernels and their tolerances. */
#include "accel/accel.h"
#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/vec_math.h"
#include "check.h"
#include "each_cpu_variant.h"

static const accel_dtype DTYPES[3] = {ACCEL_F32, ACCEL_BF16, ACCEL_F16};

static uint64_t rng_state;

static uint64_t next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Mostly N(0, 1)-like values, one in eight special: +-inf, NaN, a
 * subnormal f32, a value below f16's normals, one past f16's range, or
 * exactly halfway between two bf16 values (a tie to round to even). */
static float value(void) {
    float v = (float)((int64_t)(next() % 4000001) - 2000000) * 1e-6f;
    switch (next() % 64) {
    case 0: return INFINITY;
    case 1: return -INFINITY;
    case 2: return NAN;
    case 3: return v * 1e-39f;
    case 4: return v * 1e-6f;
    case 5: return v * 4e4f;
    case 6: return 1.00390625f; /* 1 + 2^-8: a bf16 tie */
    case 7: return v * 100.0f;  /* past expf's range in the sigmoid */
    default: return v;
    }
}

/* A persistent tensor of dt and shape, filled with value()s. */
static accel_tensor *filled(accel_dtype dt, int ndim, const int64_t *shape) {
    accel_tensor *t = accel_tensor_new(dt, ndim, shape, ACCEL_CPU_DEVICE);
    int64_t n = t ? accel_numel(t) : 0;
    for (int64_t i = 0; i < n; i++) accel__store_elem(t->data, dt, (size_t)i, value());
    return t;
}

static accel_tensor *copy_of(accel_tensor *t) {
    accel_tensor *c = accel_tensor_new(t->dtype, t->ndim, t->shape, ACCEL_CPU_DEVICE);
    if (c) memcpy(c->data, t->data, accel_nbytes(t));
    return c;
}

/* Elements of a and b (same dtype and numel, contiguous) whose bits differ,
 * NaNs matching NaNs; the first few printed. */
static int differ(const accel_tensor *a, const accel_tensor *b, const char *what) {
    int bad = 0;
    for (int64_t i = 0, n = accel_numel(a); i < n; i++) {
        float x = (float)accel__load_elem(a->data, a->dtype, (size_t)i);
        float y = (float)accel__load_elem(b->data, b->dtype, (size_t)i);
        size_t es = accel_dtype_size(a->dtype);
        if ((isnan(x) && isnan(y)) || !memcmp((const char *)a->data + i * es, (const char *)b->data + i * es, es))
            continue;
        if (++bad <= 3) fprintf(stderr, "%s [%lld]: %.9g vs %.9g\n", what, (long long)i, x, y);
    }
    return bad;
}

/* ---- RoPE: fast against reference */

/* x [B, H, T, 2 half] of dtype xd, read from a [B, T, H, D] tensor when
 * x_strided, rotated into y of dtype yd (likewise y_strided), beta 0 or 1,
 * both directions; y's tensor compared after both. */
static void rope_case(const int64_t *s, accel_dtype xd, accel_dtype yd, bool x_strided, bool y_strided, float beta,
                      const char *variant) {
    int64_t B = s[0], H = s[1], T = s[2], half = s[3], D = 2 * half;
    accel_tensor *xt = x_strided ? filled(xd, ACCEL_SHAPE(B, T, H, D)) : filled(xd, ACCEL_SHAPE(B, H, T, D));
    accel_tensor *yt[2];
    yt[0] = y_strided ? filled(yd, ACCEL_SHAPE(B, T, H, D)) : filled(yd, ACCEL_SHAPE(B, H, T, D));
    yt[1] = copy_of(yt[0]);
    accel_tensor *cs = filled(ACCEL_F32, ACCEL_SHAPE(T, half)), *sn = filled(ACCEL_F32, ACCEL_SHAPE(T, half));
    for (int ref = 0; ref < 2; ref++) {
        accel_tensor *x = x_strided ? accel_transpose(xt, 1, 2) : xt, *y = y_strided ? accel_transpose(yt[ref], 1, 2)
                                                                                     : yt[ref];
        bool prev = accel_set_reference_kernels(ref);
        for (int dir = 0; dir < 2; dir++) {
            accel_k_rope k = {.y = y, .x = x, .cos = cs, .sin = sn, .BH = B * H, .T = T, .half = half,
                              .sign = dir ? -1.0f : 1.0f, .beta = beta};
            CHECK(accel__cpuk_rope(&k) == ACCEL_OK);
        }
        accel_set_reference_kernels(prev);
        accel_step_reset();
    }
    CHECK_MSG(differ(yt[0], yt[1], "rope fast vs reference") == 0,
              "%s: [%lld, %lld, %lld, %lld] x %s%s, y %s%s, beta %g", variant, (long long)B, (long long)H,
              (long long)T, (long long)D, accel_dtype_name(xd), x_strided ? " strided" : "", accel_dtype_name(yd),
              y_strided ? " strided" : "", (double)beta);
    accel_tensor *all[] = {xt, yt[0], yt[1], cs, sn};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) accel_tensor_free(all[i]);
}

static void rope_same_bits(const char *variant) {
    /* B, H, T, half: one element; T = 1; odd rows and half 37 (tails of 16
     * and 8); half 24 (a 16 and an 8); half 300 (more than one column
     * block); runs of rows crossing (b, h) on threads (D 600 and D 64) */
    static const int64_t shapes[][4] = {{1, 1, 1, 1}, {1, 3, 1, 5},   {2, 3, 7, 37},
                                        {3, 1, 5, 24}, {1, 2, 3, 300}, {2, 3, 37, 300}, {2, 4, 129, 32}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int xd = 0; xd < 3; xd++)
            for (int yd = 0; yd < 3; yd++)
                for (int layout = 0; layout < 4; layout++)
                    for (int beta = 0; beta < 2; beta++) {
                        if (shapes[s][2] > 7 && (layout == 0 || layout == 3) && xd != yd) continue; /* time */
                        rng_state = 0x9e3779b97f4a7c15ull + s * 977 + (uint64_t)(xd * 31 + yd * 7 + layout * 3 + beta);
                        rope_case(shapes[s], DTYPES[xd], DTYPES[yd], layout & 1, layout & 2, (float)beta, variant);
                    }
}

/* ---- SwiGLU: fast against the element-wise formulas */

static float rounded_to(float v, accel_dtype dt) {
    if (dt == ACCEL_BF16) return accel_bf16_to_f32(accel_f32_to_bf16(v));
    if (dt == ACCEL_F16) return accel_f16_to_f32(accel_f32_to_f16(v));
    return v;
}

static float at(const accel_tensor *t, int64_t i) { return (float)accel__load_elem(t->data, t->dtype, (size_t)i); }

/* The kernels' element formulas, one element at a time (no multiply-add
 * fused: the library's baseline compile has none, and the kernel files
 * forbid clang's). */
static void swiglu_expected(const accel_k_swiglu *f, const accel_k_swiglu_backward *b) {
    accel_dtype rt = f->gate->dtype;
    for (int64_t i = 0, n = accel_numel(f->gate); i < n; i++) {
        float x = at(f->gate, i), u = at(f->up, i), g = at(b->g, i);
        float s = 1.0f / (1.0f + accel__expf(-x));
        accel__store_elem(f->out->data, f->out->dtype, (size_t)i, rounded_to(x * s, rt) * u);
        if (b->dgate) {
            float d = rounded_to(g * u, rt) * (s * (1.0f + x * (1.0f - s)));
            accel__store_elem(b->dgate->data, b->dgate->dtype, (size_t)i,
                              b->dgate_beta != 0.0f ? d + at(b->dgate, i) : d);
        }
        if (b->dup) {
            float d = g * rounded_to(x * s, rt);
            accel__store_elem(b->dup->data, b->dup->dtype, (size_t)i, b->dup_beta != 0.0f ? d + at(b->dup, i) : d);
        }
    }
}

/* gate of gd, up of ud, out and g of od; dgate in gate's dtype and dup in
 * up's (as the op makes them), `grads` 1: dgate only, 2: dup only, 3: both;
 * beta for both. */
static void swiglu_case(int64_t n, accel_dtype gd, accel_dtype ud, accel_dtype od, int grads, float beta,
                        const char *variant) {
    accel_tensor *gate = filled(gd, ACCEL_SHAPE(n)), *up = filled(ud, ACCEL_SHAPE(n)), *g = filled(od, ACCEL_SHAPE(n));
    accel_tensor *out[2], *dgate[2], *dup[2];
    out[0] = filled(od, ACCEL_SHAPE(n));
    dgate[0] = filled(gd, ACCEL_SHAPE(n));
    dup[0] = filled(ud, ACCEL_SHAPE(n));
    out[1] = copy_of(out[0]);
    dgate[1] = copy_of(dgate[0]);
    dup[1] = copy_of(dup[0]);
    for (int want = 0; want < 2; want++) {
        accel_k_swiglu f = {.out = out[want], .gate = gate, .up = up};
        accel_k_swiglu_backward b = {.dgate = grads & 1 ? dgate[want] : NULL, .dup = grads & 2 ? dup[want] : NULL,
                                     .g = g, .gate = gate, .up = up, .dgate_beta = beta, .dup_beta = beta};
        if (want) {
            swiglu_expected(&f, &b);
            continue;
        }
        CHECK(accel__cpuk_swiglu(&f) == ACCEL_OK && accel__cpuk_swiglu_backward(&b) == ACCEL_OK);
    }
    CHECK_MSG(differ(out[0], out[1], "swiglu out") == 0 && differ(dgate[0], dgate[1], "swiglu dgate") == 0 &&
                  differ(dup[0], dup[1], "swiglu dup") == 0,
              "%s: n %lld, gate %s, up %s, out %s, grads %d, beta %g", variant, (long long)n, accel_dtype_name(gd),
              accel_dtype_name(ud), accel_dtype_name(od), grads, (double)beta);
    accel_tensor *all[] = {gate, up, g, out[0], out[1], dgate[0], dgate[1], dup[0], dup[1]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) accel_tensor_free(all[i]);
}

static void swiglu_same_bits(const char *variant) {
    /* one element; tails of 16 and 8; a block of 512 and a tail; threads
     * (above 32768) with a tail */
    static const int64_t sizes[] = {1, 37, 1045, 33333};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int gd = 0; gd < 3; gd++)
            for (int ud = 0; ud < 3; ud++)
                for (int od = 0; od < 3; od++)
                    for (int grads = 1; grads < 4; grads++)
                        for (int beta = 0; beta < 2; beta++) {
                            if (sizes[s] > 1045 && (grads != 3 || (gd != ud && od != gd))) continue; /* time */
                            rng_state = 0x2545f4914f6cdd1dull + s * 131 + (uint64_t)(gd * 97 + ud * 17 + od * 5 + grads * 2 + beta);
                            swiglu_case(sizes[s], DTYPES[gd], DTYPES[ud], DTYPES[od], grads, (float)beta, variant);
                        }
}

static void both_same_bits(const char *variant) {
    rope_same_bits(variant);
    swiglu_same_bits(variant);
}

int main(void) {
    each_cpu_variant(both_same_bits);
    return check_summary();
}
