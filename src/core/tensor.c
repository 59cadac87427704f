/* Tensor headers: persistent and step-arena tensors, views, element access. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "accel/core.h"
#include "core_internal.h"

int64_t accel_numel(const accel_tensor *t) {
    if (!t) return 0;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t accel_nbytes(const accel_tensor *t) {
    if (!t) return 0;
    return (size_t)accel_numel(t) * accel_dtype_size(t->dtype);
}

void accel__contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

bool accel_is_contiguous(const accel_tensor *t) {
    if (!t) return false;
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

bool accel_same_shape(const accel_tensor *a, const accel_tensor *b) {
    if (!a || !b || a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

const char *accel_shape_str_n(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t off = 0;
    off += (size_t)snprintf(buf + off, n - off, "[");
    for (int i = 0; i < ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (off < n) snprintf(buf + off, n - off, "]");
    return buf;
}

const char *accel_shape_str(const accel_tensor *t, char *buf, size_t n) {
    if (!t) {
        snprintf(buf, n, "(null)");
        return buf;
    }
    return accel_shape_str_n(t->ndim, t->shape, buf, n);
}

bool accel_tensor_check(const accel_tensor *t, const char *op, const char *arg) {
    if (!t) {
        /* Keep an earlier error: a NULL usually comes from a failed op. */
        accel_propagate_error(ACCEL_ERR_INVALID_ARG, "%s: %s is NULL", op, arg);
        return false;
    }
    if (t->magic != ACCEL_TENSOR_MAGIC) {
        accel_set_error(ACCEL_ERR_STATE, "%s: %s is not a live tensor (freed or corrupt)", op, arg);
        return false;
    }
    if ((t->flags & ACCEL_TF_ARENA) && t->gen != accel_arena_generation(accel_step_arena())) {
        accel_set_error(ACCEL_ERR_STATE,
                        "%s: %s is a step tensor used after its step ended (accel_step_reset)",
                        op, arg);
        return false;
    }
    return true;
}

/* Shapes come from files and configs: the bytes of the tensor (the product of
 * the sizes, empty ones counted as 1, x the largest element, 8) must fit in
 * int64, so that numel, nbytes and strides never overflow. */
static bool check_shape(const char *op, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > ACCEL_MAX_DIMS) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: %d dims (at most %d)", op, ndim, ACCEL_MAX_DIMS);
        return false;
    }
    if (ndim && !shape) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: shape is NULL", op);
        return false;
    }
    int64_t bytes = 8;
    bool overflow = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            accel_set_error(ACCEL_ERR_SHAPE, "%s: negative size %lld in dim %d", op,
                            (long long)shape[i], i);
            return false;
        }
        overflow = overflow || __builtin_mul_overflow(bytes, shape[i] ? shape[i] : 1, &bytes);
    }
    if (overflow) {
        char b[160];
        accel_set_error(ACCEL_ERR_SHAPE, "%s: shape %s has too many elements (over 2^60)", op,
                        accel_shape_str_n(ndim, shape, b, sizeof b));
        return false;
    }
    return true;
}

static void init_header(accel_tensor *t, accel_dtype dt, int ndim, const int64_t *shape,
                        accel_device dev) {
    memset(t, 0, sizeof *t);
    t->magic = ACCEL_TENSOR_MAGIC;
    t->dtype = dt;
    t->device = dev;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    accel__contiguous_strides(ndim, shape, t->stride);
    t->ag_first_use = -1;
}

static bool check_dtype(const char *op, accel_dtype dt) {
    if ((unsigned)dt >= ACCEL_DTYPE_COUNT) {
        accel_set_error(ACCEL_ERR_DTYPE, "%s: invalid dtype %d", op, (int)dt);
        return false;
    }
    return true;
}

accel_tensor *accel_tensor_new(accel_dtype dt, int ndim, const int64_t *shape, accel_device dev) {
    if (!check_shape("accel_tensor_new", ndim, shape) || !check_dtype("accel_tensor_new", dt))
        return NULL;
    if (!accel_device_available(dev)) {
        char b[32];
        accel_set_error(ACCEL_ERR_DEVICE, "accel_tensor_new: device %s is not available",
                        accel_device_str(dev, b, sizeof b));
        return NULL;
    }
    accel_tensor *t = accel_malloc(sizeof *t);
    if (!t) return NULL;
    init_header(t, dt, ndim, shape, dev);
    if (dev.type != ACCEL_DEV_META) {
        size_t nb = accel_nbytes(t);
        t->data = accel_malloc(nb ? nb : 1);
        if (!t->data) {
            accel_free(t);
            return NULL;
        }
        memset(t->data, 0, nb);
        t->flags |= ACCEL_TF_OWNS_DATA;
    }
    return t;
}

accel_tensor *accel_tensor_wrap(void *data, accel_dtype dt, int ndim, const int64_t *shape,
                                accel_device dev) {
    if (!check_shape("accel_tensor_wrap", ndim, shape) || !check_dtype("accel_tensor_wrap", dt))
        return NULL;
    accel_tensor *t = accel_malloc(sizeof *t);
    if (!t) return NULL;
    init_header(t, dt, ndim, shape, dev);
    t->data = data;
    return t;
}

void accel_tensor_free(accel_tensor *t) {
    if (!t) return;
    if (t->magic != ACCEL_TENSOR_MAGIC || (t->flags & ACCEL_TF_ARENA)) {
        accel_set_error(ACCEL_ERR_STATE, "accel_tensor_free: not a live persistent tensor");
        return;
    }
    if (t->grad && !(t->grad->flags & ACCEL_TF_ARENA)) accel_tensor_free(t->grad);
    if (t->flags & ACCEL_TF_OWNS_DATA) accel_free(t->data);
    t->magic = 0;
    accel_free(t);
}

accel_tensor *accel_tensor_clone_persistent(const accel_tensor *src, accel_device dev) {
    if (!accel_tensor_check(src, "accel_tensor_clone_persistent", "src")) return NULL;
    accel_tensor *t = accel_tensor_new(src->dtype, src->ndim, src->shape, dev);
    if (!t) return NULL;
    if (dev.type != ACCEL_DEV_META && src->device.type != ACCEL_DEV_META &&
        accel_copy_(t, src) != ACCEL_OK) {
        accel_tensor_free(t);
        return NULL;
    }
    t->name = src->name;
    return t;
}

void accel_tensor_rebind(accel_tensor *t, void *data, bool copy) {
    if (!accel_tensor_check(t, "accel_tensor_rebind", "t")) return;
    if (!accel_is_contiguous(t) || (t->flags & ACCEL_TF_ARENA)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "accel_tensor_rebind: only a contiguous persistent tensor can be re-pointed");
        return;
    }
    if (copy && t->data && data != t->data) memcpy(data, t->data, accel_nbytes(t));
    if (t->flags & ACCEL_TF_OWNS_DATA) accel_free(t->data);
    t->flags &= ~(uint32_t)(ACCEL_TF_OWNS_DATA | ACCEL_TF_MMAP);
    t->data = data;
}

accel_status accel_tensor_materialize(accel_tensor *t, accel_device dev, accel_dtype dt) {
    if (!accel_tensor_check(t, "accel_tensor_materialize", "t")) return accel_last_status();
    if (!accel_device_available(dev) || dev.type == ACCEL_DEV_META) {
        char b[32];
        return accel_set_error(ACCEL_ERR_DEVICE, "accel_tensor_materialize: cannot materialise on %s",
                               accel_device_str(dev, b, sizeof b));
    }
    size_t nb = (size_t)accel_numel(t) * accel_dtype_size(dt);
    void *p = accel_malloc(nb ? nb : 1);
    if (!p) return ACCEL_ERR_OOM;
    memset(p, 0, nb);
    if (t->flags & ACCEL_TF_OWNS_DATA) accel_free(t->data);
    t->flags = (t->flags & ~(uint32_t)ACCEL_TF_MMAP) | ACCEL_TF_OWNS_DATA;
    t->data = p;
    t->dtype = dt;
    t->device = dev;
    accel__contiguous_strides(t->ndim, t->shape, t->stride);
    return ACCEL_OK;
}

void accel_tensor_to_meta(accel_tensor *t) {
    if (!t) return;
    if (t->flags & ACCEL_TF_OWNS_DATA) accel_free(t->data);
    t->flags &= ~(uint32_t)(ACCEL_TF_OWNS_DATA | ACCEL_TF_MMAP);
    t->data = NULL;
    t->device = ACCEL_META_DEVICE;
}

/* ---- step tensors */

accel_tensor *accel__arena_header(accel_dtype dt, int ndim, const int64_t *shape,
                                  accel_device dev) {
    accel_arena *a = accel_step_arena();
    accel_tensor *t = accel_arena_alloc(a, sizeof *t, 64);
    if (!t) return NULL;
    init_header(t, dt, ndim, shape, dev);
    t->flags = ACCEL_TF_ARENA;
    t->gen = accel_arena_generation(a);
    return t;
}

accel_tensor *accel_empty_on(accel_dtype dt, int ndim, const int64_t *shape, accel_device dev) {
    if (!check_shape("accel_empty", ndim, shape) || !check_dtype("accel_empty", dt)) return NULL;
    if (!accel_device_available(dev)) {
        char b[32];
        accel_set_error(ACCEL_ERR_DEVICE, "accel_empty: device %s is not available",
                        accel_device_str(dev, b, sizeof b));
        return NULL;
    }
    accel_tensor *t = accel__arena_header(dt, ndim, shape, dev);
    if (!t) return NULL;
    if (dev.type != ACCEL_DEV_META) {
        size_t nb = accel_nbytes(t);
        t->data = accel_arena_alloc(accel_step_arena(), nb ? nb : 1, 64);
        if (!t->data) return NULL;
    }
    return t;
}

accel_tensor *accel_empty(accel_dtype dt, int ndim, const int64_t *shape) {
    return accel_empty_on(dt, ndim, shape, ACCEL_CPU_DEVICE);
}

accel_tensor *accel_zeros(accel_dtype dt, int ndim, const int64_t *shape) {
    accel_tensor *t = accel_empty(dt, ndim, shape);
    if (t) memset(t->data, 0, accel_nbytes(t));
    return t;
}

accel_tensor *accel_full(accel_dtype dt, int ndim, const int64_t *shape, double value) {
    accel_tensor *t = accel_empty(dt, ndim, shape);
    if (t && accel_fill_(t, value) != ACCEL_OK) return NULL;
    return t;
}

accel_tensor *accel_ones(accel_dtype dt, int ndim, const int64_t *shape) {
    return accel_full(dt, ndim, shape, 1.0);
}

accel_tensor *accel_arange(accel_dtype dt, int64_t start, int64_t end) {
    int64_t n = end > start ? end - start : 0;
    accel_tensor *t = accel_empty(dt, 1, &n);
    if (!t) return NULL;
    for (int64_t i = 0; i < n; i++) accel__store_elem(t->data, dt, (size_t)i, (double)(start + i));
    return t;
}

accel_tensor *accel_from_data(accel_dtype dt, int ndim, const int64_t *shape, const void *data) {
    accel_tensor *t = accel_empty(dt, ndim, shape);
    if (!t) return NULL;
    if (!data) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_from_data: data is NULL");
        return NULL;
    }
    memcpy(t->data, data, accel_nbytes(t));
    return t;
}

accel_tensor *accel_from_floats(int ndim, const int64_t *shape, const float *data) {
    return accel_from_data(ACCEL_F32, ndim, shape, data);
}

accel_tensor *accel_view_raw(const accel_tensor *t, int ndim, const int64_t *shape,
                             const int64_t *stride, int64_t offset) {
    if (!accel_tensor_check(t, "accel_view_raw", "t") || !check_shape("accel_view_raw", ndim, shape))
        return NULL;
    accel_tensor *v = accel__arena_header(t->dtype, ndim, shape, t->device);
    if (!v) return NULL;
    for (int i = 0; i < ndim; i++) v->stride[i] = stride[i];
    v->data = t->data ? (char *)t->data + offset * (int64_t)accel_dtype_size(t->dtype) : NULL;
    return v;
}

accel_tensor *accel_alias(const accel_tensor *t) {
    if (!accel_tensor_check(t, "accel_alias", "t")) return NULL;
    return accel_view_raw(t, t->ndim, t->shape, t->stride, 0);
}

/* ---- element access */

static int64_t linear_to_offset(const accel_tensor *t, int64_t i) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        off += (i % n) * t->stride[d];
        i /= n;
    }
    return off;
}

void *accel__elem_ptr(const accel_tensor *t, int64_t i) {
    return (char *)t->data + linear_to_offset(t, i) * (int64_t)accel_dtype_size(t->dtype);
}

static bool check_readable(const accel_tensor *t, const char *op) {
    if (!accel_tensor_check(t, op, "t")) return false;
    if (t->device.type != ACCEL_DEV_CPU) {
        accel_set_error(ACCEL_ERR_DEVICE, "%s: tensor is on %s, not cpu", op,
                        accel_device_type_name(t->device.type));
        return false;
    }
    return true;
}

double accel_item(const accel_tensor *t) {
    if (!check_readable(t, "accel_item")) return NAN;
    if (accel_numel(t) != 1) {
        char b[64];
        accel_set_error(ACCEL_ERR_SHAPE, "accel_item: tensor of shape %s has %lld elements, not 1",
                        accel_shape_str(t, b, sizeof b), (long long)accel_numel(t));
        return NAN;
    }
    return accel__load_elem(t->data, t->dtype, 0);
}

static bool index_offset(const accel_tensor *t, const int64_t *idx, int64_t *off, const char *op) {
    *off = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (idx[d] < 0 || idx[d] >= t->shape[d]) {
            accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: index %lld out of range for dim %d of size %lld",
                            op, (long long)idx[d], d, (long long)t->shape[d]);
            return false;
        }
        *off += idx[d] * t->stride[d];
    }
    return true;
}

double accel_get(const accel_tensor *t, const int64_t *idx) {
    int64_t off;
    if (!check_readable(t, "accel_get") || !index_offset(t, idx, &off, "accel_get")) return NAN;
    return accel__load_elem(t->data, t->dtype, (size_t)off);
}

void accel_set(accel_tensor *t, const int64_t *idx, double v) {
    int64_t off;
    if (!check_readable(t, "accel_set") || !index_offset(t, idx, &off, "accel_set")) return;
    accel__store_elem(t->data, t->dtype, (size_t)off, v);
}

accel_status accel_to_floats(const accel_tensor *t, float *out) {
    if (!check_readable(t, "accel_to_floats")) return accel_last_status();
    int64_t n = accel_numel(t);
    if (accel_is_contiguous(t)) {
        accel_convert(out, ACCEL_F32, t->data, t->dtype, (size_t)n);
        return ACCEL_OK;
    }
    for (int64_t i = 0; i < n; i++)
        out[i] = (float)accel__load_elem(t->data, t->dtype, (size_t)linear_to_offset(t, i));
    return ACCEL_OK;
}

accel_status accel_to_int64s(const accel_tensor *t, int64_t *out) {
    if (!check_readable(t, "accel_to_int64s")) return accel_last_status();
    int64_t n = accel_numel(t);
    for (int64_t i = 0; i < n; i++)
        out[i] = (int64_t)accel__load_elem(t->data, t->dtype, (size_t)linear_to_offset(t, i));
    return ACCEL_OK;
}

/* dst = src (same shape, any strides and dtypes), row by row over the last
 * dim: a row whose elements are adjacent in both is one memcpy/convert (the
 * transposes of attention heads copy 64-float runs), others go element by
 * element. Rows are independent: large copies run on the OpenMP threads. */
static void copy_strided(accel_tensor *dst, const accel_tensor *src, int64_t n) {
    if (n == 0 || dst->ndim == 0) return;
    int last = dst->ndim - 1;
    int64_t W = dst->shape[last], rows = n / W;
    int64_t ds_ = dst->stride[last], ss = src->stride[last];
    size_t des = accel_dtype_size(dst->dtype), ses = accel_dtype_size(src->dtype);
    bool same = dst->dtype == src->dtype;
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        char *d = (char *)dst->data + linear_to_offset(dst, r * W) * (int64_t)des;
        const char *s = (const char *)src->data + linear_to_offset(src, r * W) * (int64_t)ses;
        if (ds_ == 1 && ss == 1) {
            if (same) memcpy(d, s, (size_t)W * des);
            else accel_convert(d, dst->dtype, s, src->dtype, (size_t)W);
        } else if (same) {
            for (int64_t j = 0; j < W; j++) memcpy(d + j * ds_ * (int64_t)des, s + j * ss * (int64_t)ses, des);
        } else {
            for (int64_t j = 0; j < W; j++)
                accel__store_elem(d + j * ds_ * (int64_t)des, dst->dtype, 0,
                                  accel__load_elem(s + j * ss * (int64_t)ses, src->dtype, 0));
        }
    }
}

accel_status accel_copy_(accel_tensor *dst, const accel_tensor *src) {
    if (!accel_tensor_check(dst, "accel_copy_", "dst") || !accel_tensor_check(src, "accel_copy_", "src"))
        return accel_last_status();
    if (!accel_same_shape(dst, src)) {
        char a[64], b[64];
        return accel_set_error(ACCEL_ERR_SHAPE, "accel_copy_: destination shape %s != source shape %s",
                               accel_shape_str(dst, a, sizeof a), accel_shape_str(src, b, sizeof b));
    }
    if (dst->device.type == ACCEL_DEV_META) return ACCEL_OK;
    if (src->device.type == ACCEL_DEV_META)
        return accel_set_error(ACCEL_ERR_DEVICE, "accel_copy_: source is on meta (it has no data)");
    int64_t n = accel_numel(dst);
    if (accel_is_contiguous(dst) && accel_is_contiguous(src)) {
        accel_convert(dst->data, dst->dtype, src->data, src->dtype, (size_t)n);
        return ACCEL_OK;
    }
    copy_strided(dst, src, n);
    return ACCEL_OK;
}

accel_status accel_fill_(accel_tensor *t, double v) {
    if (!accel_tensor_check(t, "accel_fill_", "t")) return accel_last_status();
    if (t->device.type == ACCEL_DEV_META) return ACCEL_OK;
    int64_t n = accel_numel(t);
    if (accel_is_contiguous(t) && t->dtype == ACCEL_F32) {
        float *p = t->data;
        for (int64_t i = 0; i < n; i++) p[i] = (float)v;
        return ACCEL_OK;
    }
    for (int64_t i = 0; i < n; i++) accel__store_elem(accel__elem_ptr(t, i), t->dtype, 0, v);
    return ACCEL_OK;
}

accel_status accel_zero_(accel_tensor *t) {
    if (!accel_tensor_check(t, "accel_zero_", "t")) return accel_last_status();
    if (t->device.type == ACCEL_DEV_META) return ACCEL_OK;
    if (accel_is_contiguous(t)) {
        memset(t->data, 0, accel_nbytes(t));
        return ACCEL_OK;
    }
    return accel_fill_(t, 0.0);
}
