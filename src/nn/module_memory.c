/* Where a module's tensors live: flat per-dtype buffers, devices, meta. */
#include <string.h>

#include "accel/nn.h"
#include "core/link.h"
#include "family.h"
#include "core/core_internal.h"
#include "nn_internal.h"

static int64_t round_up(int64_t x, int64_t m) { return m > 1 ? (x + m - 1) / m * m : x; }

/* *x rounded up to a multiple of m, plus add; false when that, or its bytes
 * at es each, passes int64 (an absurd align_elems or pad_multiple: it
 * wrapped to a small buffer that the parameters were then copied past). */
static bool grow_checked(int64_t *x, int64_t m, int64_t add, size_t es) {
    int64_t r = *x;
    if (m > 1 && (__builtin_add_overflow(r, m - 1, &r) || (r = r / m * m) < 0)) return false;
    if (__builtin_add_overflow(r, add, &r) || r > INT64_MAX / (int64_t)es) return false;
    *x = r;
    return true;
}

/* The flat parameter and gradient memory of b, back to its device. */
static void free_buffer_memory(accel_flat_buffer *b) {
    accel__device_free(b->device, b->params);
    accel__device_free(b->device, b->grads);
    b->params = b->grads = NULL;
}

static void free_buffer_arrays(accel_flat_params *fp) {
    for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) {
        accel_free(fp->buffers[d].tensors);
        accel_free(fp->buffers[d].offsets);
        fp->buffers[d].tensors = NULL;
        fp->buffers[d].offsets = NULL;
    }
}

/* Binds t->grad to a view of the flat gradient memory at g, carrying over
 * any gradient it already had. */
static bool bind_grad(accel_tensor *t, void *g) {
    accel_tensor *view = accel_tensor_wrap(g, t->dtype, t->ndim, t->shape, t->device);
    if (!view) return false;
    if (t->grad) {
        if (accel_copy_(view, t->grad)) { /* a device's failure: t keeps its own gradient */
            accel_tensor_free(view);
            return false;
        }
        if (!(t->grad->flags & ACCEL_TF_ARENA)) accel__tensor_free_grad(t->grad, true);
    }
    view->flags |= ACCEL_TF_GRAD;
    t->grad = view;
    return true;
}

/* The module is being freed first: its tensors go with it, the buffers stay
 * for accel_flat_params_free. */
static void flat_detached(void *owner, void *root) {
    accel_flat_params *fp = owner;
    (void)root;
    for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) fp->buffers[d].n = 0;
    fp->root = NULL;
}

/* skip_meta: parameters on meta are left out (a pipeline stage's others). */
static accel_flat_params *flatten(accel_module *root, int64_t align_elems, int64_t pad_multiple, bool skip_meta) {
    if (align_elems < 1 || pad_multiple < 1) {
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "accel_module_flatten: align_elems (%lld) and pad_multiple (%lld) must be >= 1",
                        (long long)align_elems, (long long)pad_multiple);
        return NULL;
    }
    accel_tensor **ps;
    int n = accel__module_unique_tensors(root, true, &ps);
    if (n < 0) return NULL;
    if (skip_meta) {
        int kept = 0;
        for (int i = 0; i < n; i++)
            if (ps[i]->device.type != ACCEL_DEV_META) ps[kept++] = ps[i];
        n = kept;
    }
    accel_device dev = n ? ps[0]->device : ACCEL_CPU_DEVICE;
    for (int i = 0; i < n; i++) {
        const char *why = ps[i]->device.type == ACCEL_DEV_META ? "on meta"
                          : !accel_is_contiguous(ps[i])        ? "not contiguous"
                          : !accel_device_eq(ps[i]->device, dev) ? "on another device than the first parameter"
                                                                 : NULL;
        if (why) {
            accel_set_error(ACCEL_ERR_DEVICE,
                            "accel_module_flatten: parameter \"%s\" is %s (flatten needs contiguous "
                            "parameters on one device; materialise meta ones with accel_module_to_empty first)",
                            ps[i]->name ? ps[i]->name : "?", why);
            accel_free(ps);
            return NULL;
        }
    }
    accel_flat_params *fp = accel_calloc(1, sizeof *fp);
    if (!fp) {
        accel_free(ps);
        return NULL;
    }
    /* Layout per dtype first, so that nothing is rebound when an allocation fails. */
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        accel_flat_buffer *b = &fp->buffers[ps[i]->dtype];
        b->dtype = ps[i]->dtype;
        ok = grow_checked(&b->numel, align_elems, accel_numel(ps[i]), accel_dtype_size(b->dtype));
        b->n++;
    }
    for (int d = 0; d < ACCEL_DTYPE_COUNT && ok; d++)
        ok = !fp->buffers[d].n || grow_checked(&fp->buffers[d].numel, pad_multiple, 0, accel_dtype_size(d));
    if (!ok) {
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "accel_module_flatten: align_elems %lld and pad_multiple %lld make a flat buffer of more "
                        "than 2^63 bytes", (long long)align_elems, (long long)pad_multiple);
        accel_free(fp);
        accel_free(ps);
        return NULL;
    }
    for (int d = 0; d < ACCEL_DTYPE_COUNT && ok; d++) {
        accel_flat_buffer *b = &fp->buffers[d];
        if (!b->n) continue;
        fp->n_buffers++;
        size_t bytes = (size_t)b->numel * accel_dtype_size(b->dtype);
        b->device = dev;
        /* zero-filled: padding must not hold garbage (ZeRO shards) */
        b->params = accel__device_alloc(dev, bytes, true, "accel_module_flatten");
        b->grads = accel__device_alloc(dev, bytes, true, "accel_module_flatten");
        b->tensors = accel_malloc((size_t)b->n * sizeof *b->tensors);
        b->offsets = accel_malloc((size_t)b->n * sizeof *b->offsets);
        ok = b->params && b->grads && b->tensors && b->offsets;
        b->n = 0;
    }
    if (!ok) {
        for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) free_buffer_memory(&fp->buffers[d]);
        free_buffer_arrays(fp);
        accel_free(fp);
        accel_free(ps);
        return NULL;
    }
    int64_t cursor[ACCEL_DTYPE_COUNT] = {0};
    for (int i = 0; i < n && ok; i++) {
        accel_tensor *t = ps[i];
        accel_flat_buffer *b = &fp->buffers[t->dtype];
        int64_t off = round_up(cursor[t->dtype], align_elems);
        cursor[t->dtype] = off + accel_numel(t);
        size_t es = accel_dtype_size(t->dtype);
        ok = accel_tensor_rebind(t, (char *)b->params + off * (int64_t)es, true) == ACCEL_OK &&
             bind_grad(t, (char *)b->grads + off * (int64_t)es);
        b->tensors[b->n] = t;
        b->offsets[b->n] = off;
        b->n++;
    }
    accel_free(ps);
    if (ok && accel__link_add(&root->links, flat_detached, fp) == ACCEL_OK) fp->root = root;
    else ok = false;
    if (!ok) {
        accel_flat_params_free(fp);
        return NULL;
    }
    return fp;
}

accel_flat_params *accel_module_flatten(accel_module *root, int64_t align_elems, int64_t pad_multiple) {
    return flatten(root, align_elems, pad_multiple, false);
}

accel_flat_params *accel__module_flatten_present(accel_module *root, int64_t align_elems, int64_t pad_multiple) {
    return flatten(root, align_elems, pad_multiple, true);
}

void accel_flat_params_free(accel_flat_params *fp) {
    if (!fp) return;
    if (fp->root) accel__link_remove(&fp->root->links, fp);
    for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) {
        accel_flat_buffer *b = &fp->buffers[d];
        for (int i = 0; i < b->n; i++) {
            accel_tensor *t = b->tensors[i];
            void *own = accel__device_alloc(t->device, accel_nbytes(t), false, "accel_flat_params_free");
            /* out of memory or a failed copy: better no data than a dangling pointer */
            if (own && accel_tensor_rebind(t, own, true) != ACCEL_OK) {
                accel__device_free(t->device, own);
                own = NULL;
            }
            if (own) t->flags |= ACCEL_TF_OWNS_DATA;
            else (void)accel_tensor_rebind(t, NULL, false); /* a live contiguous persistent tensor: cannot fail */
            /* The grad view points into the buffer freed below: give the
             * parameter a gradient of its own. */
            accel_tensor *g = t->grad;
            t->grad = g ? accel_tensor_clone_persistent(g, t->device) : NULL;
            if (t->grad) t->grad->flags |= ACCEL_TF_GRAD;
            accel__tensor_free_grad(g, true);
        }
        free_buffer_memory(b);
    }
    free_buffer_arrays(fp);
    accel_free(fp);
}

/* ---- devices and meta */


accel_status accel_module_to(accel_module *root, accel_device dev) {
    if (!accel_device_available(dev)) {
        char b[32];
        return accel_set_error(ACCEL_ERR_DEVICE, "accel_module_to: device %s is not available",
                               accel_device_str(dev, b, sizeof b));
    }
    accel_tensor **ts;
    int n = accel__module_unique_tensors(root, false, &ts);
    if (n < 0) return accel_last_status();
    for (int i = 0; i < n; i++)
        if (ts[i]->device.type == ACCEL_DEV_META && dev.type != ACCEL_DEV_META) {
            accel_set_error(ACCEL_ERR_DEVICE,
                            "accel_module_to: \"%s\" is on meta and has no data to move "
                            "(use accel_module_to_empty, then load weights)",
                            ts[i]->name ? ts[i]->name : "?");
            accel_free(ts);
            return ACCEL_ERR_DEVICE;
        }
    accel_status st = ACCEL_OK;
    for (int i = 0; i < n && st == ACCEL_OK; i++) {
        accel_tensor *t = ts[i];
        if (accel_device_eq(t->device, dev)) continue;
        accel__tensor_drop_grad(t);
        st = accel_tensor_to_device_(t, dev); /* in place: every holder of t sees the move */
    }
    accel_free(ts);
    return st;
}

accel_status accel_module_to_empty(accel_module *root, accel_device dev, int dt) {
    if (dt >= ACCEL_DTYPE_COUNT)
        return accel_set_error(ACCEL_ERR_DTYPE, "accel_module_to_empty: invalid dtype %d", dt);
    accel_tensor **ts;
    int n = accel__module_unique_tensors(root, false, &ts);
    if (n < 0) return accel_last_status();
    accel_status st = ACCEL_OK;
    for (int i = 0; i < n && st == ACCEL_OK; i++) {
        if (ts[i]->device.type != ACCEL_DEV_META) continue;
        accel__tensor_drop_grad(ts[i]);
        st = accel_tensor_materialize(ts[i], dev, dt < 0 ? ts[i]->dtype : (accel_dtype)dt);
    }
    accel_free(ts);
    return st;
}
