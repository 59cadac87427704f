/* Shared op plumbing: argument checks, promotion, broadcasting, conversion. */
#include <string.h>

#include "op_internal.h"

bool accel__op_begin_opt(const char *op, int n, accel_tensor *const *in, unsigned optional_mask,
                         accel_device *dev) {
    static const char *ARG[] = {"argument 1", "argument 2", "argument 3", "argument 4",
                                "argument 5", "argument 6", "argument 7", "argument 8"};
    bool have = false, meta = false;
    accel_device d = ACCEL_CPU_DEVICE;
    for (int i = 0; i < n; i++) {
        if (!in[i] && (optional_mask >> i) & 1u) continue;
        if (!accel_tensor_check(in[i], op, ARG[i < 8 ? i : 7])) return false;
        if (in[i]->device.type == ACCEL_DEV_META) {
            meta = true;
            continue;
        }
        if (have && !accel_device_eq(d, in[i]->device)) {
            char x[32], y[32];
            accel_set_error(ACCEL_ERR_DEVICE, "%s: expected all tensors on one device, got %s and %s",
                            op, accel_device_str(d, x, sizeof x),
                            accel_device_str(in[i]->device, y, sizeof y));
            return false;
        }
        d = in[i]->device;
        have = true;
    }
    *dev = meta ? ACCEL_META_DEVICE : d;
    return true;
}

bool accel__op_begin(const char *op, int n, accel_tensor *const *in, accel_device *dev) {
    return accel__op_begin_opt(op, n, in, 0, dev);
}

bool accel__op_check_float(const char *op, const accel_tensor *t, const char *arg) {
    if (accel_dtype_is_float(t->dtype)) return true;
    accel_set_error(ACCEL_ERR_DTYPE, "%s: %s must be a floating tensor, got %s", op, arg,
                    accel_dtype_name(t->dtype));
    return false;
}

static int float_rank(accel_dtype d) {
    switch (d) {
    case ACCEL_F64: return 3;
    case ACCEL_F32: return 2;
    case ACCEL_BF16:
    case ACCEL_F16: return 1;
    default: return 0;
    }
}

accel_dtype accel__promote(accel_dtype a, accel_dtype b) {
    if (a == b) return a;
    int ra = float_rank(a), rb = float_rank(b);
    if (ra == 1 && rb == 1) return ACCEL_F32; /* bf16 with f16 */
    if (ra || rb) return ra >= rb ? a : b;
    /* integers: the wider one (i64 > i32 > i16 > i8/u8 > bool) */
    static const int IRANK[ACCEL_DTYPE_COUNT] = {
        [ACCEL_I64] = 5, [ACCEL_I32] = 4, [ACCEL_I16] = 3, [ACCEL_I8] = 2, [ACCEL_U8] = 2, [ACCEL_BOOL] = 1};
    return IRANK[a] >= IRANK[b] ? a : b;
}

accel_status accel__shape_error2(const char *op, const accel_tensor *a, const accel_tensor *b,
                                 const char *why) {
    char x[96], y[96];
    return accel_set_error(ACCEL_ERR_SHAPE, "%s: shapes %s and %s %s", op,
                           accel_shape_str(a, x, sizeof x), accel_shape_str(b, y, sizeof y), why);
}

bool accel__broadcast_shape(const char *op, const accel_tensor *a, const accel_tensor *b,
                            int *ndim, int64_t *shape) {
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < n; i++) {
        int ia = a->ndim - n + i, ib = b->ndim - n + i;
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            accel__shape_error2(op, a, b, "cannot be broadcast together");
            return false;
        }
        shape[i] = sa == 1 ? sb : sa;
    }
    *ndim = n;
    return true;
}

accel_tensor *accel__op_out(accel_dtype dt, int ndim, const int64_t *shape, accel_device dev) {
    return accel_empty_on(dt, ndim, shape, dev);
}

accel_tensor *accel__contig_as(accel_tensor *t, accel_dtype dt) {
    if (t->dtype == dt && accel_is_contiguous(t)) return t;
    accel_tensor *c = accel_empty_on(dt, t->ndim, t->shape, t->device);
    if (c && accel_copy_(c, t) != ACCEL_OK) return NULL;
    return c;
}

accel_tensor *accel__contig(accel_tensor *t) { return accel__contig_as(t, t->dtype); }

accel_tensor *accel__f32_contig(accel_tensor *t) { return accel__contig_as(t, ACCEL_F32); }

accel_tensor *accel__from_f32(accel_tensor *f32, accel_dtype dt) {
    if (dt == ACCEL_F32) return f32;
    accel_tensor *c = accel_empty_on(dt, f32->ndim, f32->shape, f32->device);
    if (c && accel_copy_(c, f32) != ACCEL_OK) return NULL;
    return c;
}

bool accel__norm_dim(const char *op, int dim, int ndim, int *out) {
    int d = dim < 0 ? dim + ndim : dim;
    if (d < 0 || d >= (ndim ? ndim : 1)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: dim %d out of range for a %d-dim tensor", op, dim,
                        ndim);
        return false;
    }
    *out = d;
    return true;
}
