/* Tensor headers: persistent and step-arena tensors, views, element access.
 *
 * Storage comes from the tensor's device backend (core/backend.h):
 * persistent data from mem.alloc, step data from mem.step_alloc. Nothing here
 * dereferences a tensor's data: reads and writes go through the backend's
 * copies and kernels, so every function works on every device. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "accel/core.h"
#include "core/backend.h"
#include "core/host_stage.h"
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
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0) return true; /* no element to be out of place (torch's rule) */
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

bool accel__same_data(const accel_tensor *a, const accel_tensor *b) { return a && b && a->data == b->data; }

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
        accel_set_error(ACCEL_ERR_STATE,
                        "%s: %s is not a live tensor (freed, corrupt, or a step tensor whose step ended)", op, arg);
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
bool accel__check_shape(const char *op, int ndim, const int64_t *shape) {
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

void accel__tensor_header(accel_tensor *t, void *data, accel_dtype dt, int ndim, const int64_t *shape,
                          accel_device dev) {
    init_header(t, dt, ndim, shape, dev);
    t->data = data;
}

static bool check_dtype(const char *op, accel_dtype dt) {
    if ((unsigned)dt >= ACCEL_DTYPE_COUNT) {
        accel_set_error(ACCEL_ERR_DTYPE, "%s: invalid dtype %d", op, (int)dt);
        return false;
    }
    return true;
}

/* Zero-filled persistent storage of nb bytes on dev (not meta); NULL + error. */
static void *alloc_zeroed(const accel_backend *be, accel_device dev, size_t nb) {
    void *p = be->mem.alloc(dev.index, nb ? nb : 1, 64);
    if (p && be->mem.memset(dev.index, p, 0, nb) != ACCEL_OK) {
        be->mem.free(dev.index, p);
        return NULL;
    }
    return p;
}

/* Frees t's data if t owns it (persistent tensors), through its device's
 * backend. Every caller is replacing or freeing t's storage: what was
 * prepared from the old bytes goes too. */
static void free_owned(accel_tensor *t) {
    accel__prepared_release(t);
    if (!(t->flags & ACCEL_TF_OWNS_DATA)) return;
    const accel_backend *be = accel__backend_of(t->device);
    ACCEL_ASSERT(be != NULL);
    be->mem.free(t->device.index, t->data);
}

accel_tensor *accel_tensor_new(accel_dtype dt, int ndim, const int64_t *shape, accel_device dev) {
    if (!accel__check_shape("accel_tensor_new", ndim, shape) || !check_dtype("accel_tensor_new", dt))
        return NULL;
    const accel_backend *be = NULL;
    if (dev.type != ACCEL_DEV_META && !(be = accel__backend_for(dev, "accel_tensor_new"))) return NULL;
    accel_tensor *t = accel_malloc(sizeof *t);
    if (!t) return NULL;
    init_header(t, dt, ndim, shape, dev);
    if (be) {
        t->data = alloc_zeroed(be, dev, accel_nbytes(t));
        if (!t->data) {
            accel_free(t);
            return NULL;
        }
        t->flags |= ACCEL_TF_OWNS_DATA;
    }
    return t;
}

accel_tensor *accel_tensor_wrap(void *data, accel_dtype dt, int ndim, const int64_t *shape,
                                accel_device dev) {
    if (!accel__check_shape("accel_tensor_wrap", ndim, shape) || !check_dtype("accel_tensor_wrap", dt))
        return NULL;
    /* A device without a backend, or no memory under elements: the first op
     * on the header read through it (a NULL data segfaulted in the kernel). */
    if (dev.type != ACCEL_DEV_META && !accel__backend_for(dev, "accel_tensor_wrap")) return NULL;
    accel_tensor *t = accel_malloc(sizeof *t);
    if (!t) return NULL;
    init_header(t, dt, ndim, shape, dev);
    if (!data && dev.type != ACCEL_DEV_META && accel_numel(t) > 0) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_tensor_wrap: data is NULL for %lld elements",
                        (long long)accel_numel(t));
        accel_free(t);
        return NULL;
    }
    t->data = data;
    return t;
}

static void tensor_free(accel_tensor *t, bool taped) {
    if (!t) return;
    if (t->magic != ACCEL_TENSOR_MAGIC || (t->flags & ACCEL_TF_ARENA)) {
        accel_set_error(ACCEL_ERR_STATE, "accel_tensor_free: not a live persistent tensor");
        return;
    }
    if (t->flags & ACCEL_TF_GRAD) {
        /* Its tensor frees it: freed here, the tensor's .grad would dangle. */
        accel_set_error(ACCEL_ERR_STATE,
                        "accel_tensor_free: the tensor is a gradient (some tensor's .grad), which its tensor "
                        "frees: drop it with accel_tensor_drop_grad (torch's p.grad = None)");
        return;
    }
    if (t->flags & (ACCEL_TF_PARAM | ACCEL_TF_BUFFER)) {
        /* Its module frees it: freeing it here too would free it twice. */
        accel_set_error(ACCEL_ERR_STATE,
                        "accel_tensor_free: \"%s\" is a %s of a module, which owns it (accel_module_free frees it)",
                        t->name ? t->name : "?", t->flags & ACCEL_TF_PARAM ? "parameter" : "buffer");
        return;
    }
    bool own_grad = t->grad && !(t->grad->flags & ACCEL_TF_ARENA);
    if (taped) accel__tape_forget((accel_tensor *[]){t, t->grad}, own_grad ? 2 : 1); /* one pass for both */
    if (own_grad) accel__tensor_free_grad(t->grad, false);
    free_owned(t);
    t->magic = 0;
    accel_free(t);
}

void accel_tensor_free(accel_tensor *t) { tensor_free(t, true); }

void accel__tensor_free_grad(accel_tensor *g, bool taped) {
    if (g && g->magic == ACCEL_TENSOR_MAGIC) g->flags &= ~(uint32_t)ACCEL_TF_GRAD;
    tensor_free(g, taped);
}

void accel__tensor_drop_grad(accel_tensor *t) {
    accel_tensor *g = t->grad;
    t->grad = NULL;
    if (g && !(g->flags & ACCEL_TF_ARENA)) accel__tensor_free_grad(g, true);
}

accel_status accel_tensor_drop_grad(accel_tensor *t) {
    if (!accel_tensor_check(t, "accel_tensor_drop_grad", "t")) return accel_last_status();
    accel_tensor *g = t->grad;
    /* a persistent gradient without memory of its own is a view into a prepared model's gradient buffer: dropped,
     * the next backward made a gradient of its own, and the data-parallel reduction and clipping, which read the
     * buffer, went on with the old one while the optimizer stepped with the new, unreduced one */
    if (g && !(g->flags & (ACCEL_TF_ARENA | ACCEL_TF_OWNS_DATA)))
        return accel_set_error(ACCEL_ERR_STATE, "accel_tensor_drop_grad: %s's gradient is a view into a prepared "
                               "model's gradient buffer, which the data-parallel reduction reads: clear it with "
                               "accel_accelerator_zero_grad (or accel_optimizer_zero_grad), not by dropping it",
                               t->name ? t->name : "the tensor");
    accel__tensor_drop_grad(t);
    return ACCEL_OK;
}

void accel__tensor_free_member(accel_tensor *t, bool taped) {
    if (t && t->magic == ACCEL_TENSOR_MAGIC) t->flags &= ~(uint32_t)(ACCEL_TF_PARAM | ACCEL_TF_BUFFER);
    tensor_free(t, taped);
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

accel_status accel_tensor_rebind(accel_tensor *t, void *data, bool copy) {
    if (!accel_tensor_check(t, "accel_tensor_rebind", "t")) return accel_last_status();
    if (!accel_is_contiguous(t) || (t->flags & ACCEL_TF_ARENA))
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_tensor_rebind: only a contiguous persistent tensor can be re-pointed");
    if (copy && !data && t->data && accel_nbytes(t) > 0) /* the copy would write through NULL */
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_tensor_rebind: cannot copy the contents to NULL");
    if (copy && t->data && data != t->data &&
        accel__copy_bytes(t->device, data, t->device, t->data, accel_nbytes(t)) != ACCEL_OK)
        return accel_last_status();
    free_owned(t);
    t->flags &= ~(uint32_t)(ACCEL_TF_OWNS_DATA | ACCEL_TF_MMAP);
    t->data = data;
    return ACCEL_OK;
}

/* The backend of dev when dev has memory and is present; NULL + error naming op. */
static const accel_backend *storage_backend(accel_device dev, const char *op) {
    const accel_backend *be = dev.type == ACCEL_DEV_META ? NULL : accel__backend_of(dev);
    if (!be || !accel_device_available(dev)) {
        char b[32];
        accel_set_error(ACCEL_ERR_DEVICE, "%s: cannot materialise on %s", op, accel_device_str(dev, b, sizeof b));
        return NULL;
    }
    return be;
}

/* Points t at owned contiguous storage p of dtype dt on dev (freeing the old). */
static void adopt_storage(accel_tensor *t, void *p, accel_device dev, accel_dtype dt) {
    free_owned(t);
    t->flags = (t->flags & ~(uint32_t)ACCEL_TF_MMAP) | ACCEL_TF_OWNS_DATA;
    t->data = p;
    t->dtype = dt;
    t->device = dev;
    accel__contiguous_strides(t->ndim, t->shape, t->stride);
}

accel_status accel_tensor_materialize(accel_tensor *t, accel_device dev, accel_dtype dt) {
    /* an invalid dtype has no element size: t got 0 bytes and that dtype, with OK */
    if (!accel_tensor_check(t, "accel_tensor_materialize", "t") || !check_dtype("accel_tensor_materialize", dt))
        return accel_last_status();
    const accel_backend *be = storage_backend(dev, "accel_tensor_materialize");
    if (!be) return accel_last_status();
    void *p = alloc_zeroed(be, dev, (size_t)accel_numel(t) * accel_dtype_size(dt));
    if (!p) return accel_last_status();
    adopt_storage(t, p, dev, dt);
    return ACCEL_OK;
}

accel_status accel__tensor_alloc_uninit(accel_tensor *t, accel_device dev, accel_dtype dt) {
    const accel_backend *be = storage_backend(dev, "accel_tensor_alloc");
    if (!be) return accel_last_status();
    size_t nb = (size_t)accel_numel(t) * accel_dtype_size(dt);
    void *p = be->mem.alloc(dev.index, nb ? nb : 1, 64);
    if (!p) return accel_last_status();
    adopt_storage(t, p, dev, dt);
    return ACCEL_OK;
}

void *accel__device_alloc(accel_device dev, size_t bytes, bool zeroed, const char *op) {
    const accel_backend *be = storage_backend(dev, op);
    if (!be) return NULL;
    return zeroed ? alloc_zeroed(be, dev, bytes) : be->mem.alloc(dev.index, bytes ? bytes : 1, 64);
}

void accel__device_free(accel_device dev, void *p) {
    const accel_backend *be = accel__backend_of(dev);
    if (be && p) be->mem.free(dev.index, p);
}

bool accel__device_host_addressable(accel_device d) {
    const accel_backend *be = accel__backend_of(d);
    return be && be->host_addressable;
}

void *accel__host_ptr(const accel_tensor *t, const char *op) {
    if (accel__device_host_addressable(t->device)) return t->data;
    char b[32];
    accel_set_error(ACCEL_ERR_DEVICE, "%s: tensor on %s is not in host memory", op,
                    accel_device_str(t->device, b, sizeof b));
    return NULL;
}

void *accel__device_ptr(const accel_tensor *t) { return t->data; }

accel_status accel_tensor_to_device_(accel_tensor *t, accel_device dev) {
    if (!accel_tensor_check(t, "accel_tensor_to_device_", "t")) return accel_last_status();
    if (t->flags & ACCEL_TF_ARENA)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_tensor_to_device_: t is a step tensor (use accel_to_device)");
    if (accel_device_eq(t->device, dev)) return ACCEL_OK;
    if (dev.type == ACCEL_DEV_META) {
        accel_tensor_to_meta(t);
        return ACCEL_OK;
    }
    accel_tensor *c = accel_tensor_clone_persistent(t, dev);
    if (!c) return accel_last_status();
    /* Steal c's memory into t. */
    free_owned(t);
    t->data = c->data;
    t->flags = (t->flags & ~(uint32_t)ACCEL_TF_MMAP) | ACCEL_TF_OWNS_DATA;
    t->device = dev;
    memcpy(t->stride, c->stride, sizeof t->stride);
    c->flags &= ~(uint32_t)ACCEL_TF_OWNS_DATA;
    accel_tensor_free(c);
    return ACCEL_OK;
}

accel_status accel_tensor_to_meta(accel_tensor *t) {
    if (!accel_tensor_check(t, "accel_tensor_to_meta", "t")) return accel_last_status();
    if (t->flags & ACCEL_TF_ARENA) /* its data is the step pool's: meta would leave its readers none */
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_tensor_to_meta: t is a step tensor (only a persistent "
                               "tensor moves to meta)");
    accel__tape_forget_data(&t, 1); /* a graph that read it cannot backpropagate through it any more */
    accel__tensor_drop_data(t);
    return ACCEL_OK;
}

void accel__tensor_drop_data(accel_tensor *t) {
    free_owned(t);
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
    if (!accel__check_shape("accel_empty", ndim, shape) || !check_dtype("accel_empty", dt)) return NULL;
    const accel_backend *be = NULL;
    if (dev.type != ACCEL_DEV_META && !(be = accel__backend_for(dev, "accel_empty"))) return NULL;
    accel_tensor *t = accel__arena_header(dt, ndim, shape, dev);
    if (!t) return NULL;
    if (be) {
        size_t nb = accel_nbytes(t);
        t->data = be->mem.step_alloc(dev.index, nb ? nb : 1, 64);
        if (!t->data) return NULL;
    }
    return t;
}

accel_tensor *accel_empty(accel_dtype dt, int ndim, const int64_t *shape) {
    return accel_empty_on(dt, ndim, shape, accel_default_device());
}

accel_tensor *accel_zeros(accel_dtype dt, int ndim, const int64_t *shape) {
    accel_tensor *t = accel_empty(dt, ndim, shape);
    if (t && accel_zero_(t) != ACCEL_OK) return NULL;
    return t;
}

/* Whether v converts to integer dtype dt (truncated toward zero, as a cast):
 * C's conversion of a NaN or of a value out of the type's range is undefined
 * (int32 got INT_MIN for NaN and 1e10, silently); PyTorch refuses them too
 * ("value cannot be converted to type int32_t without overflow"). Floating
 * dtypes and bool take any value. */
static accel_status check_value_fits(accel_dtype dt, double v, const char *op) {
    double lo, hi;
    if (!accel__int_dtype_range(dt, &lo, &hi) || (trunc(v) >= lo && trunc(v) < hi)) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: value %g cannot be converted to %s without overflow", op, v,
                           accel_dtype_name(dt));
}

accel_tensor *accel_full(accel_dtype dt, int ndim, const int64_t *shape, double value) {
    if (check_value_fits(dt, value, "accel_full") != ACCEL_OK) return NULL;
    accel_tensor *t = accel_empty(dt, ndim, shape);
    if (t && accel_fill_(t, value) != ACCEL_OK) return NULL;
    return t;
}

accel_tensor *accel_ones(accel_dtype dt, int ndim, const int64_t *shape) {
    return accel_full(dt, ndim, shape, 1.0);
}

accel_tensor *accel_arange(accel_dtype dt, int64_t start, int64_t end) {
    /* end - start is computed unsigned: a span past int64 (arange(INT64_MIN,
     * INT64_MAX)) overflowed the subtraction (undefined behaviour) */
    if (end > start && (uint64_t)end - (uint64_t)start > (uint64_t)INT64_MAX) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_arange: [%lld, %lld) holds more than INT64_MAX elements",
                        (long long)start, (long long)end);
        return NULL;
    }
    int64_t n = end > start ? end - start : 0;
    accel_tensor *host = accel_empty_on(dt, 1, &n, ACCEL_CPU_DEVICE);
    if (!host) return NULL;
    for (int64_t i = 0; i < n; i++) accel__store_elem(host->data, dt, (size_t)i, (double)(start + i));
    accel_device dev = accel_default_device();
    if (dev.type == ACCEL_DEV_CPU) return host;
    accel_tensor *t = accel_empty_on(dt, 1, &n, dev);
    return t && accel_copy_(t, host) == ACCEL_OK ? t : NULL;
}

accel_tensor *accel_from_data(accel_dtype dt, int ndim, const int64_t *shape, const void *data) {
    if (!data) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_from_data: data is NULL");
        return NULL;
    }
    accel_tensor *t = accel_empty(dt, ndim, shape);
    if (!t || accel_tensor_from_host(t, data) != ACCEL_OK) return NULL;
    return t;
}

accel_tensor *accel_from_floats(int ndim, const int64_t *shape, const float *data) {
    return accel_from_data(ACCEL_F32, ndim, shape, data);
}

bool accel__element_span(int ndim, const int64_t *shape, const int64_t *stride, int64_t offset, int64_t *lo,
                         int64_t *hi) {
    *lo = *hi = offset;
    for (int i = 0; i < ndim; i++) {
        int64_t reach;
        if (__builtin_mul_overflow(shape[i] - 1, stride[i], &reach)) return false;
        if (__builtin_add_overflow(reach < 0 ? *lo : *hi, reach, reach < 0 ? lo : hi)) return false;
    }
    return true;
}

accel_tensor *accel_view_raw(const accel_tensor *t, int ndim, const int64_t *shape,
                             const int64_t *stride, int64_t offset) {
    if (!accel_tensor_check(t, "accel_view_raw", "t") || !accel__check_shape("accel_view_raw", ndim, shape))
        return NULL;
    if (ndim && !stride) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_view_raw: stride is NULL");
        return NULL;
    }
    /* The view must lie in the elements t reaches: past them it read and
     * wrote whatever memory came next (a silent wrong answer, or a fault). */
    int64_t n = 1, lo, hi, tlo, thi;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    if (n > 0 && (accel_numel(t) == 0 || !accel__element_span(ndim, shape, stride, offset, &lo, &hi) ||
                  !accel__element_span(t->ndim, t->shape, t->stride, 0, &tlo, &thi) || lo < tlo || hi > thi)) {
        char b[96];
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "accel_view_raw: a view of shape %s at offset %lld reaches past the %lld elements of t "
                        "(shape %s)", accel_shape_str_n(ndim, shape, b, sizeof b), (long long)offset,
                        (long long)accel_numel(t), accel_shape_str(t, (char[96]){0}, 96));
        return NULL;
    }
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

/* ---- keeping a step tensor across an arena rewind */

/* The calling thread's bounce buffer: persistent memory on one device, grown
 * to the largest tensor kept so far, so that alike steps allocate nothing. */
static _Thread_local struct {
    void *data;
    size_t cap;
    accel_device dev;
} tl_bounce;

void accel__bounce_free(void) {
    accel__device_free(tl_bounce.dev, tl_bounce.data);
    tl_bounce.data = NULL;
    tl_bounce.cap = 0;
}

/* A step header over the bounce buffer, shaped like t. */
static accel_tensor *bounce_like(const accel_tensor *t) {
    size_t nb = accel_nbytes(t);
    if (!tl_bounce.data || tl_bounce.cap < nb || !accel_device_eq(tl_bounce.dev, t->device)) {
        accel__bounce_free();
        tl_bounce.data = accel__device_alloc(t->device, nb, false, "accel__rewind_keeping");
        if (!tl_bounce.data) return NULL;
        tl_bounce.cap = nb;
        tl_bounce.dev = t->device;
    }
    accel_tensor *b = accel__arena_header(t->dtype, t->ndim, t->shape, t->device);
    if (b) b->data = tl_bounce.data;
    return b;
}

accel_tensor *accel__rewind_keeping(accel_arena_mark m, const accel_tensor *y) {
    accel_arena *a = accel_step_arena();
    if (!accel_tensor_check(y, "accel__rewind_keeping", "y")) {
        accel_arena_rewind(a, m);
        return NULL;
    }
    bool meta = y->device.type == ACCEL_DEV_META;
    accel_tensor *b = meta ? NULL : bounce_like(y);
    bool ok = meta || (b && accel_copy_(b, y) == ACCEL_OK);
    accel_dtype dt = y->dtype;
    int ndim = y->ndim;
    int64_t shape[ACCEL_MAX_DIMS];
    memcpy(shape, y->shape, (size_t)ndim * sizeof *shape);
    accel_device dev = y->device;
    accel_arena_rewind(a, m); /* y and b die here; the bounce memory does not */
    accel_tensor *out = ok ? accel_empty_on(dt, ndim, shape, dev) : NULL;
    if (!out || meta) return out;
    b = bounce_like(out);
    return b && accel_copy_(out, b) == ACCEL_OK ? out : NULL;
}

/* ---- moving bytes between devices */

/* n bytes from src (device from, backend bf) to dst (device to, backend bt)
 * of two backends: through host memory, one chunk at a time, in a lease of
 * from's staging pool (core/host_stage.h: pinned where from's backend can,
 * the same lease from copy to copy, so alike steps allocate nothing). */
static accel_status move_through_host(const accel_backend *bt, accel_device to, unsigned char *dst,
                                      const accel_backend *bf, accel_device from, const unsigned char *src,
                                      size_t n) {
    size_t chunk = accel__stage_chunk_bytes(); /* a whole chunk even for less: the lease every copy shares */
    unsigned char *h = accel__stage_acquire(from, chunk, "accel_copy_");
    if (!h) return accel_last_status();
    accel_status st = ACCEL_OK;
    for (size_t off = 0; off < n && st == ACCEL_OK; off += chunk) {
        size_t m = n - off < chunk ? n - off : chunk;
        st = bf->mem.copy_to_host(from.index, h, src + off, m);
        if (st == ACCEL_OK) st = bt->mem.copy_to_device(to.index, dst + off, h, m);
    }
    accel__stage_release(from, h);
    return st;
}

/* n bytes from src (on device from) to dst (on device to), contiguous both. */
static accel_status move_bytes(accel_device to, void *dst, accel_device from, const void *src, size_t n) {
    const accel_backend *bt = accel__backend_for(to, "accel_copy_"), *bf = accel__backend_for(from, "accel_copy_");
    if (!bt || !bf) return accel_last_status();
    if (n == 0) return ACCEL_OK;
    if (from.type == ACCEL_DEV_CPU) return bt->mem.copy_to_device(to.index, dst, src, n);
    if (to.type == ACCEL_DEV_CPU) return bf->mem.copy_to_host(from.index, dst, src, n);
    if (bt == bf) return bt->mem.copy_device(to.index, dst, from.index, src, n);
    return move_through_host(bt, to, dst, bf, from, src, n);
}

accel_status accel__copy_bytes(accel_device to, void *dst, accel_device from, const void *src, size_t n) {
    accel_status st = move_bytes(to, dst, from, src, n);
    accel__storage_written(dst, n); /* a failed copy may have written part */
    return st;
}

/* t itself when contiguous, else a contiguous step copy on t's device. */
static const accel_tensor *dense_on_device(const accel_tensor *t) {
    if (accel_is_contiguous(t)) return t;
    accel_tensor *c = accel_empty_on(t->dtype, t->ndim, t->shape, t->device);
    return c && accel_copy_(c, t) == ACCEL_OK ? c : NULL;
}

static bool check_data(const accel_tensor *t, const char *op) {
    if (!accel_tensor_check(t, op, "t")) return false;
    if (t->device.type == ACCEL_DEV_META) {
        accel_set_error(ACCEL_ERR_DEVICE, "%s: tensor is on meta (it has no data)", op);
        return false;
    }
    return true;
}

accel_status accel_tensor_to_host(const accel_tensor *t, void *dst) {
    if (!check_data(t, "accel_tensor_to_host")) return accel_last_status();
    if (!dst) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_tensor_to_host: dst is NULL");
    const accel_tensor *d = dense_on_device(t);
    if (!d) return accel_last_status();
    return accel__copy_bytes(ACCEL_CPU_DEVICE, dst, d->device, d->data, accel_nbytes(d));
}

accel_status accel_tensor_from_host(accel_tensor *t, const void *src) {
    if (!check_data(t, "accel_tensor_from_host")) return accel_last_status();
    if (!src) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_tensor_from_host: src is NULL");
    if (accel_is_contiguous(t)) return accel__copy_bytes(t->device, t->data, ACCEL_CPU_DEVICE, src, accel_nbytes(t));
    accel_tensor h; /* a header on the stack: host access allocates nothing */
    init_header(&h, t->dtype, t->ndim, t->shape, ACCEL_CPU_DEVICE);
    h.data = (void *)src;
    return accel_copy_(t, &h);
}

/* Checks that [byte_off, byte_off + n) lies inside contiguous tensor t with data. */
static bool check_range(const accel_tensor *t, size_t byte_off, size_t n, const char *op) {
    if (!check_data(t, op)) return false;
    if (!accel_is_contiguous(t) || byte_off > accel_nbytes(t) || n > accel_nbytes(t) - byte_off) {
        char b[64];
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: bytes [%zu, %zu) of a %s tensor of %zu bytes%s", op, byte_off,
                        byte_off + n, accel_shape_str(t, b, sizeof b), accel_nbytes(t),
                        accel_is_contiguous(t) ? "" : " (not contiguous)");
        return false;
    }
    return true;
}

accel_status accel__tensor_write_bytes(accel_tensor *t, size_t byte_off, const void *src, size_t n) {
    if (!check_range(t, byte_off, n, "accel_tensor_write_bytes")) return accel_last_status();
    return accel__copy_bytes(t->device, (char *)t->data + byte_off, ACCEL_CPU_DEVICE, src, n);
}

accel_status accel__tensor_read_bytes(const accel_tensor *t, size_t byte_off, void *dst, size_t n) {
    if (!check_range(t, byte_off, n, "accel_tensor_read_bytes")) return accel_last_status();
    return accel__copy_bytes(ACCEL_CPU_DEVICE, dst, t->device, (const char *)t->data + byte_off, n);
}

/* ---- element access */

void *accel__elem_ptr(const accel_tensor *t, int64_t i) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        off += (i % n) * t->stride[d];
        i /= n;
    }
    return (char *)t->data + off * (int64_t)accel_dtype_size(t->dtype);
}

/* Element at element offset off of t, through a copy of its bytes. */
static double load_at(const accel_tensor *t, int64_t off) {
    uint64_t v = 0;
    size_t es = accel_dtype_size(t->dtype);
    if (accel__copy_bytes(ACCEL_CPU_DEVICE, &v, t->device, (const char *)t->data + off * (int64_t)es, es) != ACCEL_OK)
        return NAN;
    return accel__load_elem(&v, t->dtype, 0);
}

double accel_item(const accel_tensor *t) {
    if (!check_data(t, "accel_item")) return NAN;
    if (accel_numel(t) != 1) {
        char b[64];
        accel_set_error(ACCEL_ERR_SHAPE, "accel_item: tensor of shape %s has %lld elements, not 1",
                        accel_shape_str(t, b, sizeof b), (long long)accel_numel(t));
        return NAN;
    }
    return load_at(t, 0);
}

static bool index_offset(const accel_tensor *t, const int64_t *idx, int64_t *off, const char *op) {
    *off = 0;
    if (t->ndim && !idx) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: index is NULL", op);
        return false;
    }
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
    if (!check_data(t, "accel_get") || !index_offset(t, idx, &off, "accel_get")) return NAN;
    return load_at(t, off);
}

accel_status accel_set(accel_tensor *t, const int64_t *idx, double v) {
    int64_t off;
    if (!check_data(t, "accel_set") || !index_offset(t, idx, &off, "accel_set")) return accel_last_status();
    if (check_value_fits(t->dtype, v, "accel_set") != ACCEL_OK) return accel_last_status();
    uint64_t b = 0;
    size_t es = accel_dtype_size(t->dtype);
    accel__store_elem(&b, t->dtype, 0, v);
    return accel__copy_bytes(t->device, (char *)t->data + off * (int64_t)es, ACCEL_CPU_DEVICE, &b, es);
}

/* All of t's elements, converted to dtype dt, into the contiguous host array out. */
static accel_status to_host_as(const accel_tensor *t, accel_dtype dt, void *out, const char *op) {
    if (!check_data(t, op)) return accel_last_status();
    if (!out) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: out is NULL", op);
    accel_tensor o;
    init_header(&o, dt, t->ndim, t->shape, ACCEL_CPU_DEVICE);
    o.data = out;
    return accel_copy_(&o, t);
}

accel_status accel_to_floats(const accel_tensor *t, float *out) {
    return to_host_as(t, ACCEL_F32, out, "accel_to_floats");
}

accel_status accel_to_int64s(const accel_tensor *t, int64_t *out) {
    return to_host_as(t, ACCEL_I64, out, "accel_to_int64s");
}

/* dst = src by dst's device's copy kernel (any dtypes, strides). */
static accel_status copy_kernel(accel_tensor *dst, const accel_tensor *src) {
    accel_k_copy k = {.out = dst, .in = (accel_tensor *)src};
    accel_status st = ACCEL_KERNEL("accel_copy_", dst->device, copy, &k);
    accel__tensor_written(dst);
    return st;
}

/* dst = src across two devices: src made contiguous on its device, its bytes
 * moved, then converted/scattered on dst's device when dst needs it. */
static accel_status copy_across(accel_tensor *dst, const accel_tensor *src) {
    const accel_tensor *s = dense_on_device(src);
    if (!s) return accel_last_status();
    if (dst->dtype == s->dtype && accel_is_contiguous(dst))
        return accel__copy_bytes(dst->device, dst->data, s->device, s->data, accel_nbytes(s));
    accel_tensor *tmp = accel_empty_on(s->dtype, s->ndim, s->shape, dst->device);
    if (!tmp || accel__copy_bytes(dst->device, tmp->data, s->device, s->data, accel_nbytes(s)) != ACCEL_OK)
        return accel_last_status();
    return copy_kernel(dst, tmp);
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
    if (accel_numel(dst) == 0) return ACCEL_OK;
    if (!accel_device_eq(dst->device, src->device)) return copy_across(dst, src);
    return copy_kernel(dst, src);
}

accel_status accel_fill_(accel_tensor *t, double v) {
    if (!accel_tensor_check(t, "accel_fill_", "t")) return accel_last_status();
    if (check_value_fits(t->dtype, v, "accel_fill_") != ACCEL_OK) return accel_last_status();
    if (t->device.type == ACCEL_DEV_META || accel_numel(t) == 0) return ACCEL_OK;
    accel_k_fill k = {.out = t, .value = v};
    accel_status st = ACCEL_KERNEL("accel_fill_", t->device, fill, &k);
    accel__tensor_written(t);
    return st;
}

/* accel_zero_, through the backend's memset_cold where cold and it has one. */
static accel_status zero(accel_tensor *t, bool cold) {
    if (!accel_tensor_check(t, "accel_zero_", "t")) return accel_last_status();
    if (t->device.type == ACCEL_DEV_META) return ACCEL_OK;
    if (!accel_is_contiguous(t)) return accel_fill_(t, 0.0);
    const accel_backend *be = accel__backend_for(t->device, "accel_zero_");
    if (!be) return accel_last_status();
    accel_status st = cold && be->mem.memset_cold ? be->mem.memset_cold(t->device.index, t->data, accel_nbytes(t))
                                                  : be->mem.memset(t->device.index, t->data, 0, accel_nbytes(t));
    accel__tensor_written(t);
    return st;
}

accel_status accel__zero_cold_(accel_tensor *t) { return zero(t, true); }

accel_status accel_zero_(accel_tensor *t) { return zero(t, false); }
