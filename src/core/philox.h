/* Philox-4x32-10 and its mapping to [0, 1) (internal): the one definition that
 * every device's random numbers come from (src/core/rng.c, the CPU backend's
 * rng kernel, the CUDA kernels), so a (seed, offset) gives the same values on
 * every device. Header-only so that the CUDA kernels compile it as device code. */
#ifndef ACCEL_CORE_PHILOX_H
#define ACCEL_CORE_PHILOX_H

#include <stdint.h>

#ifdef __CUDACC__
#define ACCEL__PHILOX_FN static inline __host__ __device__
#else
#define ACCEL__PHILOX_FN static inline
#endif

/* Four 32-bit words from (key, counter). */
ACCEL__PHILOX_FN void accel__philox(uint64_t key, uint64_t counter, uint32_t out[4]) {
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* 53 bits of two Philox words as a double in [0, 1). */
ACCEL__PHILOX_FN double accel__u32_to_unit(uint32_t a, uint32_t b) {
    uint64_t v = ((uint64_t)a << 21) ^ (uint64_t)b;
    return (double)(v & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

#endif
