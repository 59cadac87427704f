/* Counter-based RNG (Philox-4x32-10). Element i of a draw depends only on
 * (seed, offset + i), so results never depend on the thread count. A draw
 * reserves its offsets with one atomic add, so threads sharing a generator
 * (the default one) get disjoint values; seeding is not atomic with drawing. */
#include <math.h>

#include "accel/core.h"
#include "core/backend.h"
#include "core_internal.h"

accel_status accel_rng_init(accel_rng *r, uint64_t seed) {
    if (!r) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_rng_init: generator is NULL");
    __atomic_store_n(&r->seed, seed, __ATOMIC_RELAXED);
    __atomic_store_n(&r->offset, 0, __ATOMIC_RELAXED);
    return ACCEL_OK;
}

/* The first of n consecutive offsets, taken for the caller alone. */
static uint64_t reserve(accel_rng *r, uint64_t n) { return __atomic_fetch_add(&r->offset, n, __ATOMIC_RELAXED); }
static uint64_t seed_of(const accel_rng *r) { return __atomic_load_n(&r->seed, __ATOMIC_RELAXED); }

static accel_rng default_rng = {0, 0};

accel_rng accel__rng_get(const accel_rng *r) {
    return (accel_rng){seed_of(r), __atomic_load_n(&r->offset, __ATOMIC_RELAXED)};
}

void accel__rng_set(accel_rng *r, accel_rng v) {
    __atomic_store_n(&r->seed, v.seed, __ATOMIC_RELAXED);
    __atomic_store_n(&r->offset, v.offset, __ATOMIC_RELAXED);
}

accel_rng *accel_default_rng(void) { return &default_rng; }
void accel_manual_seed(uint64_t seed) { (void)accel_rng_init(&default_rng, seed); }

uint64_t accel_rng_next_u64(accel_rng *r) {
    if (!r) r = &default_rng;
    uint32_t w[4];
    accel__philox(seed_of(r), reserve(r, 1), w);
    return ((uint64_t)w[0] << 32) | w[1];
}

double accel_rng_next_double(accel_rng *r) {
    if (!r) r = &default_rng;
    uint32_t w[4];
    accel__philox(seed_of(r), reserve(r, 1), w);
    return accel__u32_to_unit(w[0], w[1]);
}

static bool check_float(const accel_tensor *t, const char *op) {
    if (!accel_tensor_check(t, op, "t")) return false;
    if (!accel_dtype_is_float(t->dtype) || !accel_is_contiguous(t) || t->device.type == ACCEL_DEV_META) {
        char d[32];
        accel_set_error(ACCEL_ERR_DTYPE, "%s: needs a contiguous float tensor with data (got %s on %s)",
                        op, accel_dtype_name(t->dtype), accel_device_str(t->device, d, sizeof d));
        return false;
    }
    return true;
}

/* One draw of the device's rng kernel; advances the generator by numel. */
static accel_status draw(const char *op, accel_rng *r, accel_tensor *t, accel_k_rng_kind kind, double a,
                         double b) {
    if (!r) r = &default_rng;
    /* the offsets are taken before the kernel runs, so concurrent draws get disjoint values */
    uint64_t base = reserve(r, (uint64_t)accel_numel(t));
    accel_k_rng k = {.out = t, .kind = kind, .seed = seed_of(r), .offset = base, .a = a, .b = b};
    accel_status st = ACCEL_KERNEL(op, t->device, rng, &k);
    accel__tensor_written(t);
    return st;
}

/* PyTorch's argument checks (normal_, uniform_, bernoulli_): without them a
 * negative std, an inverted range or a probability past 1 drew values
 * silently (mirrored, out of the range, all kept). */
accel_status accel_rng_normal_(accel_rng *r, accel_tensor *t, double mean, double std) {
    if (!check_float(t, "accel_rng_normal_")) return accel_last_status();
    if (!(std >= 0) || !isfinite(mean))
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_rng_normal_: expects a finite mean and std >= 0.0 (got mean %g, std %g)", mean,
                               std);
    return draw("accel_rng_normal_", r, t, ACCEL_K_RNG_NORMAL, mean, std);
}

accel_status accel_rng_uniform_(accel_rng *r, accel_tensor *t, double lo, double hi) {
    if (!check_float(t, "accel_rng_uniform_")) return accel_last_status();
    if (!(lo <= hi) || !isfinite(hi - lo))
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_rng_uniform_: expects a finite [lo, hi) range, but found lo=%g > hi=%g or an "
                               "infinite one", lo, hi);
    return draw("accel_rng_uniform_", r, t, ACCEL_K_RNG_UNIFORM, lo, hi);
}

accel_status accel_rng_bernoulli_(accel_rng *r, accel_tensor *mask, double keep_prob) {
    if (!accel_tensor_check(mask, "accel_rng_bernoulli_", "mask")) return accel_last_status();
    if ((mask->dtype != ACCEL_U8 && mask->dtype != ACCEL_BOOL) || !accel_is_contiguous(mask))
        return accel_set_error(ACCEL_ERR_DTYPE, "accel_rng_bernoulli_: mask must be contiguous u8/bool");
    if (!(keep_prob >= 0 && keep_prob <= 1))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_rng_bernoulli_: expects keep_prob in [0, 1] (got %g)",
                               keep_prob);
    if (mask->device.type == ACCEL_DEV_META) return ACCEL_OK;
    return draw("accel_rng_bernoulli_", r, mask, ACCEL_K_RNG_BERNOULLI, keep_prob, 0);
}

accel_status accel_rng_randperm(accel_rng *r, int64_t n, int64_t *out) {
    if (!out) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_rng_randperm: out is NULL");
    if (n < 0) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_rng_randperm: n must be >= 0 (got %lld)", (long long)n);
    if (!r) r = &default_rng;
    for (int64_t i = 0; i < n; i++) out[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(accel_rng_next_u64(r) % (uint64_t)(i + 1));
        int64_t t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
    return ACCEL_OK;
}
