/* CPU kernels of the metrics ops: comparisons and where. One element loop
 * each, through the generic strided loads in any dtype (they serve as their
 * own reference versions: metrics tensors are small next to a step's). The
 * scalar rules (accel__round_to, accel__cmp_f/i) are shared with the CUDA kernels. */
#include "core/backend.h"
#include "backends/cpu/cpu_kernels.h"

accel_status accel__cpuk_compare(accel_k_compare *k) {
    accel_tensor *out = k->out, *a = k->a, *b = k->b;
    int nd = out->ndim;
    int64_t sa[ACCEL_MAX_DIMS], sb[ACCEL_MAX_DIMS], n = accel_numel(out);
    accel__broadcast_strides(a, nd, out->shape, sa);
    if (b) accel__broadcast_strides(b, nd, out->shape, sb);
    bool is_float = accel_dtype_is_float(k->dt);
    int64_t si = is_float ? 0 : (int64_t)k->scalar;
    double sf = accel__round_to(k->scalar, k->dt);
    uint8_t *po = out->data;
    for (int64_t i = 0; i < n; i++) {
        int64_t oa = accel__bcast_offset(nd, out->shape, sa, i);
        int64_t ob = b ? accel__bcast_offset(nd, out->shape, sb, i) : 0;
        bool r;
        if (is_float) {
            double x = accel__round_to(accel__load_elem(a->data, a->dtype, (size_t)oa), k->dt);
            double y = b ? accel__round_to(accel__load_elem(b->data, b->dtype, (size_t)ob), k->dt) : sf;
            r = accel__cmp_f(k->op, x, y);
        } else {
            int64_t x = accel__load_i64(a->data, a->dtype, oa);
            r = accel__cmp_i(k->op, x, b ? accel__load_i64(b->data, b->dtype, ob) : si);
        }
        po[i] = r;
    }
    return ACCEL_OK;
}

accel_status accel__cpuk_where(accel_k_where *k) {
    accel_tensor *out = k->out, *c = k->cond, *a = k->a, *b = k->b;
    int nd = out->ndim;
    int64_t sc[ACCEL_MAX_DIMS], sa[ACCEL_MAX_DIMS], sb[ACCEL_MAX_DIMS], n = accel_numel(out);
    accel__broadcast_strides(c, nd, out->shape, sc);
    accel__broadcast_strides(a, nd, out->shape, sa);
    accel__broadcast_strides(b, nd, out->shape, sb);
    bool is_float = accel_dtype_is_float(out->dtype);
    for (int64_t i = 0; i < n; i++) {
        bool pick_a = accel__load_i64(c->data, c->dtype, accel__bcast_offset(nd, out->shape, sc, i)) != 0;
        const accel_tensor *src = pick_a ? a : b;
        int64_t off = accel__bcast_offset(nd, out->shape, pick_a ? sa : sb, i);
        if (is_float) accel__store_elem(out->data, out->dtype, (size_t)i, accel__load_elem(src->data, src->dtype, (size_t)off));
        else accel__store_i64(out->data, out->dtype, i, accel__load_i64(src->data, src->dtype, off));
    }
    return ACCEL_OK;
}
