/* The image layers of torch.nn: Conv1d, Conv2d, BatchNorm1d, BatchNorm2d,
 * MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Flatten (the ops: ops.h). */
#include <math.h>
#include <string.h>

#include "accel/nn.h"
#include "accel/parallel.h"
#include "nn_internal.h"
#include "ops/nn_internal.h"

/* A per-dim argument, or its default when NULL. */
static void pair_or(int64_t out[2], const int64_t *v, int64_t dflt) {
    out[0] = v ? v[0] : dflt;
    out[1] = v ? v[1] : dflt;
}

/* A module with impl, a copy of the n bytes at args (NULL, error set, on OOM). */
static accel_module *with_args(const accel_module_ops *ops, const void *args, size_t n) {
    void *impl = accel_malloc(n);
    if (!impl) return NULL;
    memcpy(impl, args, n);
    accel_module *m = accel_module_new(ops, impl);
    if (!m) accel_free(impl);
    return m;
}

/* ---- Conv1d, Conv2d */

typedef struct conv_impl {
    int64_t stride[2], padding[2], dilation[2], groups;
    accel_pad_mode mode; /* padding_mode: constant is torch's "zeros" */
} conv_impl;

/* torch's padding_mode other than "zeros": x padded by accel_pad in that mode by the layer's padding (its
 * _reversed_padding_repeated_twice: "same" as the op splits it), the convolution then unpadded; nd 1 or 2
 * dims {H, W} (Conv1d: W alone); NULL with the error set. */
static accel_tensor *pad_by_mode(accel_module *m, accel_tensor *x, int nd, int64_t padding[2]) {
    const conv_impl *c = m->impl;
    accel_tensor *w = accel__module_tensor(m, "weight");
    int64_t pad[4];
    for (int i = 0; i < nd; i++) {
        int dim = 1 - i; /* pad's pairs run from the last dim: W, then H */
        int64_t lo = c->padding[dim], hi = lo;
        if (lo == ACCEL_PADDING_SAME) { /* the weight's kernel: its last nd dims */
            int64_t k = w && w->ndim >= 2 + nd ? w->shape[w->ndim - 1 - i] : 1, total = c->dilation[dim] * (k - 1);
            lo = total / 2;
            hi = total - lo;
        }
        pad[2 * i] = lo;
        pad[2 * i + 1] = hi;
        padding[dim] = 0;
    }
    return accel_pad(x, 2 * nd, pad, c->mode, 0.0);
}

static accel_tensor *conv2d_forward(accel_module *m, accel_tensor *x) {
    const conv_impl *c = m->impl;
    int64_t padding[2] = {c->padding[0], c->padding[1]};
    if (c->mode != ACCEL_PAD_CONSTANT) x = pad_by_mode(m, x, 2, padding);
    return accel_conv2d(x, accel__module_tensor(m, "weight"), accel__module_tensor(m, "bias"), c->stride, padding,
                        c->dilation, c->groups);
}

/* Conv1d keeps its arguments in the second entries (the first: 1-row image). */
static accel_tensor *conv1d_forward(accel_module *m, accel_tensor *x) {
    const conv_impl *c = m->impl;
    int64_t padding[2] = {c->padding[0], c->padding[1]};
    if (c->mode != ACCEL_PAD_CONSTANT) x = pad_by_mode(m, x, 1, padding);
    return accel_conv1d(x, accel__module_tensor(m, "weight"), accel__module_tensor(m, "bias"), c->stride[1],
                        padding[1], c->dilation[1], c->groups);
}

static const accel_module_ops CONV2D_OPS = {"Conv2d", conv2d_forward, NULL};
static const accel_module_ops CONV1D_OPS = {"Conv1d", conv1d_forward, NULL};

/* weight [out, in / groups, kernel...] (nk dims of kernel) and bias [out],
 * torch's init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)). */
static accel_module *conv_create(const char *fn, const accel_module_ops *ops, int64_t in, int64_t out, int nk,
                                 const int64_t *kernel, const conv_impl *args, bool bias, accel_device dev,
                                 accel_dtype dt) {
    if (in < 1 || out < 1 || args->groups < 1 || in % args->groups || out % args->groups) {
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "%s: in (%lld) and out (%lld) channels must be positive multiples of groups (%lld)", fn,
                        (long long)in, (long long)out, (long long)args->groups);
        return NULL;
    }
    /* torch refuses padding="same" with a stride when the layer is made (Conv1d's are its second entries) */
    if (!accel__same_padding_ok(fn, nk > 1 ? args->padding : (int64_t[]){args->padding[1], args->padding[1]},
                                args->stride))
        return NULL;
    int64_t shape[4] = {out, in / args->groups, kernel[0], nk > 1 ? kernel[1] : 0};
    for (int d = 0; d < nk; d++)
        if (kernel[d] < 1) {
            accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: kernel size %lld must be >= 1", fn, (long long)kernel[d]);
            return NULL;
        }
    accel_module *m = with_args(ops, args, sizeof *args);
    accel_tensor *w = accel__new_param(m, "weight", dt, 2 + nk, shape, dev);
    accel_tensor *b = bias && w ? accel__new_param(m, "bias", dt, 1, &out, dev) : NULL;
    accel_status st = !w || (bias && !b) ? accel_last_status() : ACCEL_OK;
    if (st == ACCEL_OK && w->device.type != ACCEL_DEV_META) {
        /* fan_in = in / groups * prod(kernel), read off the weight made
         * (its numel is checked against int64: the product of the
         * arguments could wrap) */
        double bound = 1.0 / sqrt((double)(accel_numel(w) / out));
        st = accel_rng_uniform_(accel_default_rng(), w, -bound, bound);
        if (st == ACCEL_OK && b) st = accel_rng_uniform_(accel_default_rng(), b, -bound, bound);
    }
    if (st != ACCEL_OK) {
        accel_module_free(m);
        return NULL;
    }
    return m;
}

accel_module *accel_conv2d_new(int64_t in, int64_t out, const int64_t kernel[2], const int64_t stride[2],
                               const int64_t padding[2], const int64_t dilation[2], int64_t groups, bool bias,
                               accel_device dev, accel_dtype dt) {
    if (!kernel) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_conv2d_new: kernel is NULL");
        return NULL;
    }
    conv_impl c = {.groups = groups};
    pair_or(c.stride, stride, 1);
    pair_or(c.padding, padding, 0);
    pair_or(c.dilation, dilation, 1);
    return conv_create("accel_conv2d_new", &CONV2D_OPS, in, out, 2, kernel, &c, bias, dev, dt);
}

accel_module *accel_conv1d_new(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding,
                               int64_t dilation, int64_t groups, bool bias, accel_device dev, accel_dtype dt) {
    conv_impl c = {{1, stride}, {0, padding}, {1, dilation}, groups, ACCEL_PAD_CONSTANT};
    return conv_create("accel_conv1d_new", &CONV1D_OPS, in, out, 1, &kernel, &c, bias, dev, dt);
}

accel_status accel_conv_set_padding_mode(accel_module *conv, accel_pad_mode mode) {
    static const char *FN = "accel_conv_set_padding_mode";
    if (!conv || (conv->ops != &CONV2D_OPS && conv->ops != &CONV1D_OPS))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s is not a Conv1d or Conv2d", FN,
                               conv ? conv->ops->type_name : "module NULL");
    if ((unsigned)mode > ACCEL_PAD_CIRCULAR)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: mode %d is none of accel_pad_mode's", FN, (int)mode);
    ((conv_impl *)conv->impl)->mode = mode;
    return ACCEL_OK;
}

/* ---- BatchNorm1d, BatchNorm2d */

typedef struct bn_impl {
    double eps, momentum; /* momentum < 0: torch's None */
    bool two_d;           /* BatchNorm2d: [N, C, H, W]; BatchNorm1d: [N, C] or [N, C, L] */
    accel_pg *pg;         /* SyncBatchNorm's group (not owned); NULL: the default group */
    bool bound;           /* pg is the preparing accelerator's (accel__sync_batchnorm_bind), not the user's */
} bn_impl;

static const accel_module_ops SYNCBN_OPS;

static accel_tensor *bn_forward(accel_module *m, accel_tensor *x) {
    const bn_impl *b = m->impl;
    bool two_d = b->two_d, sync = m->ops == &SYNCBN_OPS;
    if (!accel_tensor_check(x, m->ops->type_name, "x")) return NULL;
    if (sync && (x->ndim < 2 || x->shape[1] == 0)) { /* torch's two checks */
        accel_set_error(ACCEL_ERR_SHAPE, "%s: expected at least 2D input with a non-zero number of channels (got "
                        "%dD input, %lld channels)", m->ops->type_name, x->ndim,
                        x->ndim < 2 ? 0LL : (long long)x->shape[1]);
        return NULL;
    } else if (!sync && (two_d ? x->ndim != 4 : x->ndim != 2 && x->ndim != 3)) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: expected %s input (got %dD input)", m->ops->type_name,
                        two_d ? "4D" : "2D or 3D", x->ndim);
        return NULL;
    }
    accel_tensor *rm = accel__module_tensor(m, "running_mean"), *rv = accel__module_tensor(m, "running_var");
    accel_tensor *nbt = accel__module_tensor(m, "num_batches_tracked");
    double factor = b->momentum < 0 ? 0.0 : b->momentum;
    int64_t batches = 0;
    bool count = m->training && nbt && nbt->device.type != ACCEL_DEV_META;
    if (count) {
        if (accel_tensor_to_host(nbt, &batches) != ACCEL_OK) return NULL;
        batches++;
        if (b->momentum < 0) factor = 1.0 / (double)batches;
    }
    /* SyncBatchNorm synchronises training only (eval without running stats
     * normalises with this rank's batch, as torch), and plain BatchNorm it is
     * without a process group: not distributed, as torch */
    accel_pg *pg = sync && m->training ? b->pg : NULL;
    if (sync && m->training && !pg && accel_dist_is_initialized()) pg = accel_dist_default_group();
    accel_tensor *w = accel__module_tensor(m, "weight"), *bias = accel__module_tensor(m, "bias");
    /* eval without running stats: the batch's (track_running_stats=False) */
    accel_tensor *y = pg ? accel_sync_batch_norm(x, rm, rv, w, bias, true, factor, b->eps, pg)
                         : accel_batch_norm(x, rm, rv, w, bias, m->training || !rm, factor, b->eps);
    if (y && count && accel_tensor_from_host(nbt, &batches) != ACCEL_OK) return NULL;
    return y;
}

static const accel_module_ops BN1D_OPS = {"BatchNorm1d", bn_forward, NULL};
static const accel_module_ops BN2D_OPS = {"BatchNorm2d", bn_forward, NULL};
static const accel_module_ops SYNCBN_OPS = {"SyncBatchNorm", bn_forward, NULL};

static accel_module *bn_create(const char *fn, const accel_module_ops *ops, int64_t C, double eps, double momentum,
                               bool affine, bool track, accel_device dev, accel_dtype dt) {
    if (C < 1 || !(eps >= 0) || !(momentum <= 1)) { /* a NaN momentum too */
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "%s: num_features %lld must be >= 1, eps %g >= 0, momentum %g <= 1 (< 0: None)", fn,
                        (long long)C, eps, momentum);
        return NULL;
    }
    bn_impl args = {eps, momentum, ops == &BN2D_OPS, NULL, false};
    accel_module *m = with_args(ops, &args, sizeof args);
    accel_status st = m ? ACCEL_OK : accel_last_status();
    if (st == ACCEL_OK && affine) {
        accel_tensor *w = accel__new_param(m, "weight", dt, 1, &C, dev);
        st = w && accel__new_param(m, "bias", dt, 1, &C, dev) ? ACCEL_OK : accel_last_status();
        if (st == ACCEL_OK && w->device.type != ACCEL_DEV_META) st = accel_fill_(w, 1.0);
    }
    if (st == ACCEL_OK && track) {
        accel_device d = accel_default_param_device(dev);
        static const char *const names[3] = {"running_mean", "running_var", "num_batches_tracked"};
        accel_tensor *bufs[3] = {accel_tensor_new(ACCEL_F32, 1, &C, d), accel_tensor_new(ACCEL_F32, 1, &C, d),
                                 accel_tensor_new(ACCEL_I64, 0, NULL, d)};
        for (int i = 0; i < 3; i++) { /* each one added, or freed (add_buffer frees the one it refuses) */
            if (!bufs[i] || st != ACCEL_OK) {
                if (st == ACCEL_OK) st = accel_last_status();
                accel_tensor_free(bufs[i]);
            } else if (!accel_module_add_buffer(m, names[i], bufs[i])) {
                st = accel_last_status();
            }
        }
        if (st == ACCEL_OK && d.type != ACCEL_DEV_META) st = accel_fill_(bufs[1], 1.0);
    }
    if (st != ACCEL_OK) {
        accel_module_free(m);
        return NULL;
    }
    return m;
}

accel_module *accel_batch_norm1d_new(int64_t C, double eps, double momentum, bool affine, bool track_running_stats,
                                     accel_device dev, accel_dtype dt) {
    return bn_create("accel_batch_norm1d_new", &BN1D_OPS, C, eps, momentum, affine, track_running_stats, dev, dt);
}

accel_module *accel_batch_norm2d_new(int64_t C, double eps, double momentum, bool affine, bool track_running_stats,
                                     accel_device dev, accel_dtype dt) {
    return bn_create("accel_batch_norm2d_new", &BN2D_OPS, C, eps, momentum, affine, track_running_stats, dev, dt);
}

/* Every BatchNorm1d/2d under m becomes a SyncBatchNorm in place: the same
 * impl (eps, momentum) and tensors, only the type and the group change; a
 * SyncBatchNorm already takes the new group (torch converts it again). */
static void convert_tree(accel_module *m, accel_pg *pg) {
    if (m->ops == &BN1D_OPS || m->ops == &BN2D_OPS || m->ops == &SYNCBN_OPS) {
        m->ops = &SYNCBN_OPS;
        bn_impl *b = m->impl;
        b->pg = pg;
        b->bound = false;
    }
    for (int i = 0; i < m->n_children; i++) convert_tree(m->children[i], pg);
}

void accel__sync_batchnorm_bind(accel_module *m, accel_pg *dp) {
    if (m->ops == &SYNCBN_OPS) {
        bn_impl *b = m->impl;
        if (!b->pg || b->bound) {
            b->pg = dp;
            b->bound = dp != NULL;
        }
    }
    for (int i = 0; i < m->n_children; i++) accel__sync_batchnorm_bind(m->children[i], dp);
}

accel_status accel_convert_sync_batchnorm(accel_module *m, accel_pg *pg) {
    if (!m) /* a failed constructor's NULL: its error is the cause */
        return accel_propagate_error(ACCEL_ERR_INVALID_ARG, "accel_convert_sync_batchnorm: module is NULL");
    convert_tree(m, pg);
    return ACCEL_OK;
}

/* ---- pooling, Flatten */

typedef struct pool_impl {
    int64_t kernel[2], stride[2], padding[2], dilation[2];
    bool ceil_mode, count_include_pad;
} pool_impl;

static accel_tensor *max_pool_forward(accel_module *m, accel_tensor *x) {
    const pool_impl *p = m->impl;
    return accel_max_pool2d(x, p->kernel, p->stride, p->padding, p->dilation, p->ceil_mode);
}

static accel_tensor *avg_pool_forward(accel_module *m, accel_tensor *x) {
    const pool_impl *p = m->impl;
    return accel_avg_pool2d(x, p->kernel, p->stride, p->padding, p->ceil_mode, p->count_include_pad);
}

static accel_tensor *adaptive_forward(accel_module *m, accel_tensor *x) {
    return accel_adaptive_avg_pool2d(x, ((const pool_impl *)m->impl)->kernel);
}

static accel_tensor *flatten_forward(accel_module *m, accel_tensor *x) {
    const int *d = m->impl;
    return accel_flatten(x, d[0], d[1]);
}

static const accel_module_ops MAXPOOL_OPS = {"MaxPool2d", max_pool_forward, NULL};
static const accel_module_ops AVGPOOL_OPS = {"AvgPool2d", avg_pool_forward, NULL};
static const accel_module_ops ADAPTIVE_OPS = {"AdaptiveAvgPool2d", adaptive_forward, NULL};
static const accel_module_ops FLATTEN_OPS = {"Flatten", flatten_forward, NULL};

static accel_module *pool_create(const accel_module_ops *ops, const int64_t *kernel, const int64_t *stride,
                                 const int64_t *padding, const int64_t *dilation, bool ceil_mode, bool include_pad) {
    if (!kernel) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: the kernel (output size) is NULL", ops->type_name);
        return NULL;
    }
    pool_impl p = {.ceil_mode = ceil_mode, .count_include_pad = include_pad};
    pair_or(p.kernel, kernel, 0);
    pair_or(p.stride, stride ? stride : kernel, 0);
    pair_or(p.padding, padding, 0);
    pair_or(p.dilation, dilation, 1);
    return with_args(ops, &p, sizeof p);
}

accel_module *accel_max_pool2d_new(const int64_t kernel[2], const int64_t stride[2], const int64_t padding[2],
                                   const int64_t dilation[2], bool ceil_mode) {
    return pool_create(&MAXPOOL_OPS, kernel, stride, padding, dilation, ceil_mode, false);
}

accel_module *accel_avg_pool2d_new(const int64_t kernel[2], const int64_t stride[2], const int64_t padding[2],
                                   bool ceil_mode, bool count_include_pad) {
    return pool_create(&AVGPOOL_OPS, kernel, stride, padding, NULL, ceil_mode, count_include_pad);
}

accel_module *accel_adaptive_avg_pool2d_new(const int64_t output_size[2]) {
    return pool_create(&ADAPTIVE_OPS, output_size, NULL, NULL, NULL, false, false);
}

accel_module *accel_flatten_new(int start_dim, int end_dim) {
    const int d[2] = {start_dim, end_dim};
    return with_args(&FLATTEN_OPS, d, sizeof d);
}
