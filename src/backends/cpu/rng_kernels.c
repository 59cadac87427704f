/* Philox draws into a contiguous tensor (normal, uniform, Bernoulli mask). */
#include <math.h>

#include "cpu_kernels.h"

accel_status accel__cpuk_rng(accel_k_rng *a) {
    accel_tensor *t = a->out;
    int64_t n = accel_numel(t);
    uint64_t seed = a->seed, base = a->offset;
    double x = a->a, y = a->b;
    switch (a->kind) {
    case ACCEL_K_RNG_NORMAL:
#pragma omp parallel for if (n > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            uint32_t w[4];
            accel__philox(seed, base + (uint64_t)i, w);
            double u1 = 1.0 - accel__u32_to_unit(w[0], w[1]); /* (0, 1] */
            double u2 = accel__u32_to_unit(w[2], w[3]);
            double z = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
            accel__store_elem(t->data, t->dtype, (size_t)i, x + y * z);
        }
        break;
    case ACCEL_K_RNG_UNIFORM:
#pragma omp parallel for if (n > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            uint32_t w[4];
            accel__philox(seed, base + (uint64_t)i, w);
            accel__store_elem(t->data, t->dtype, (size_t)i, x + (y - x) * accel__u32_to_unit(w[0], w[1]));
        }
        break;
    case ACCEL_K_RNG_BERNOULLI: {
        uint8_t *m = t->data;
#pragma omp parallel for if (n > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            uint32_t w[4];
            accel__philox(seed, base + (uint64_t)i, w);
            m[i] = accel__u32_to_unit(w[0], w[1]) < x;
        }
        break;
    }
    }
    return ACCEL_OK;
}
