/* The core's accel__dnnl_* (gemm.h): the oneDNN provider lives in the
 * plug-in libaccel-dnnl.so (dnnl_hooks.h), loaded by the first of these
 * calls. Without it oneDNN supports nothing (gemm.c then uses OpenBLAS) and
 * a call that needs it fails naming why the plug-in did not load. */
#include "backends/cpu/dnnl_hooks.h"
#include "backends/plugin.h"

static const accel__dnnl_hooks *dnnl(void) { return accel__plugin_hooks_named("dnnl"); }

static accel_status missing(const char *fn) {
    return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: oneDNN is not available: %s", fn,
                           accel__plugin_reason_named("dnnl"));
}

accel_status accel__dnnl_gemm(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                              float alpha, const void *A, int64_t lda, const void *B, int64_t ldb, float beta,
                              void *C, accel_dtype c_dt, int64_t ldc) {
    const accel__dnnl_hooks *h = dnnl();
    return h ? h->gemm(dt, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, c_dt, ldc)
             : missing("accel__dnnl_gemm");
}

accel_status accel__dnnl_weight_layout(accel_dtype dt, bool trans_b, int64_t N, int64_t K, size_t *bytes,
                                       accel__pair_layout *pairs) {
    const accel__dnnl_hooks *h = dnnl();
    return h ? h->weight_layout(dt, trans_b, N, K, bytes, pairs) : missing("accel__dnnl_weight_layout");
}

accel_status accel__dnnl_weight_pack(accel_dtype dt, bool trans_b, int64_t N, int64_t K, const void *B, void *dst) {
    const accel__dnnl_hooks *h = dnnl();
    return h ? h->weight_pack(dt, trans_b, N, K, B, dst) : missing("accel__dnnl_weight_pack");
}

accel_status accel__dnnl_gemm_packed(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                     float alpha, const void *A, int64_t lda, const void *packed, float beta, void *C,
                                     accel_dtype c_dt, int64_t ldc, bool *ran) {
    const accel__dnnl_hooks *h = dnnl();
    return h ? h->gemm_packed(dt, trans_a, trans_b, M, N, K, alpha, A, lda, packed, beta, C, c_dt, ldc, ran)
             : missing("accel__dnnl_gemm_packed");
}

const char *accel__dnnl_impl(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K) {
    const accel__dnnl_hooks *h = dnnl();
    if (h) return h->impl(dt, trans_a, trans_b, M, N, K);
    missing("accel__dnnl_impl");
    return NULL;
}

accel_status accel__dnnl_scratchpad(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                    float beta, accel_dtype c_dt, size_t *bytes) {
    const accel__dnnl_hooks *h = dnnl();
    *bytes = 0;
    return h ? h->scratchpad(dt, trans_a, trans_b, M, N, K, beta, c_dt, bytes) : missing("accel__dnnl_scratchpad");
}

accel_status accel__dnnl_conv(const accel__conv_call *c, bool *ran) {
    const accel__dnnl_hooks *h = dnnl();
    *ran = false;
    return h ? h->conv(c, ran) : missing("accel__dnnl_conv");
}

void accel__dnnl_version(char *out, size_t n) {
    const accel__dnnl_hooks *h = dnnl();
    if (h) h->version(out, n);
    else snprintf(out, n, "none");
}

bool accel__dnnl_supports(accel_dtype dt, char *impl, size_t size) {
    const accel__dnnl_hooks *h = dnnl();
    return h && h->supports(dt, impl, size);
}

const char *accel__dnnl_unavailable(void) { return dnnl() ? NULL : accel__plugin_reason_named("dnnl"); }
