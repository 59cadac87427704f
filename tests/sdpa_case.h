/* An attention shape for the sdpa kernel tests (test_cuda_kernels,
 * test_ops_attention_lowp) and its kernel dims. */
#ifndef ACCEL_TESTS_SDPA_CASE_H
#define ACCEL_TESTS_SDPA_CASE_H

#include <math.h>

#include "core/kernels.h"

typedef struct sdpa_case {
    int64_t B, H, Hkv, Tq, Tk, D, Dv;
    bool causal, kv_strided; /* kv_strided: k, v stored [B, Tk, Hkv, D] (a projection's layout) */
} sdpa_case;

/* The kernel dims of c: q and o dense, k and v strided as c says. */
static inline accel_k_sdpa_dims sdpa_case_dims(const sdpa_case *c) {
    accel_k_sdpa_dims d = {.B = c->B, .H = c->H, .Hkv = c->Hkv, .Tq = c->Tq, .Tk = c->Tk, .D = c->D, .Dv = c->Dv,
                           .scale = 1.0f / sqrtf((float)c->D), .causal = c->causal};
    accel_k_sdpa_dense(&d);
    if (c->kv_strided) {
        d.ks[0] = c->Tk * c->Hkv * c->D, d.ks[1] = c->D, d.ks[2] = c->Hkv * c->D;
        d.vs[0] = c->Tk * c->Hkv * c->Dv, d.vs[1] = c->Dv, d.vs[2] = c->Hkv * c->Dv;
    }
    return d;
}

#endif
