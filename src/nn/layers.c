/* Standard layers: Linear, Embedding, RMSNorm, LayerNorm, Sequential, activations. */
#include <math.h>
#include <string.h>

#include "accel/nn.h"
#include "nn/fp8_modules.h"
#include "arch.h"
#include "nn_internal.h"
#include "ops/fp8_linear.h"
#include "ops/norm.h"

accel_tensor *accel__module_tensor(accel_module *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return m->tensors[i].t;
    return NULL;
}

accel_tensor *accel__new_param(accel_module *m, const char *name, accel_dtype dt, int ndim,
                               const int64_t *shape, accel_device dev) {
    if (!m) return NULL;
    accel_tensor *t = accel_tensor_new(dt, ndim, shape, accel_default_param_device(dev));
    return t ? accel_module_add_param(m, name, t) : NULL;
}

static bool has_data(const accel_tensor *t) { return t && t->device.type != ACCEL_DEV_META; }

static bool check_dims(const char *fn, int64_t a, int64_t b) {
    if (a <= 0 || b <= 0) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: sizes must be positive (got %lld, %lld)", fn,
                        (long long)a, (long long)b);
        return false;
    }
    return true;
}

/* ---- Linear */

accel_tensor *accel__linear_apply(accel_module *m, accel_tensor *x, accel_tensor *w, accel_tensor *b) {
    accel_tensor *fp8 = accel__fp8_linear_meta(m); /* mixed_precision='fp8' (nn/fp8_modules.h) */
    return fp8 ? accel__fp8_linear(x, w, b, fp8, *accel__fp8_autocast()) : accel_linear(x, w, b);
}

static accel_tensor *linear_forward(accel_module *m, accel_tensor *x) {
    return accel__linear_apply(m, x, accel__module_tensor(m, "weight"), accel__module_tensor(m, "bias"));
}

static const accel_module_ops LINEAR_OPS = {"Linear", linear_forward, NULL};

accel_module *accel__linear_create(int64_t in, int64_t out, bool bias, accel_device dev,
                                   accel_dtype dt, double init_std) {
    if (!check_dims("accel_linear_new", in, out)) return NULL;
    accel_module *m = accel_module_new(&LINEAR_OPS, NULL);
    accel_tensor *w = accel__new_param(m, "weight", dt, 2, (int64_t[]){out, in}, dev);
    accel_tensor *b = bias ? accel__new_param(m, "bias", dt, 1, &out, dev) : NULL;
    if (!w || (bias && !b)) {
        accel_module_free(m);
        return NULL;
    }
    if (has_data(w)) {
        double bound = 1.0 / sqrt((double)in);
        accel_status st = init_std > 0 ? accel_rng_normal_(accel_default_rng(), w, 0.0, init_std)
                                       : accel_rng_uniform_(accel_default_rng(), w, -bound, bound);
        if (st == ACCEL_OK && b && init_std <= 0)
            st = accel_rng_uniform_(accel_default_rng(), b, -bound, bound);
        if (st != ACCEL_OK) {
            accel_module_free(m);
            return NULL;
        }
    }
    return m;
}

accel_module *accel_linear_new(int64_t in, int64_t out, bool bias, accel_device dev,
                               accel_dtype dt) {
    return accel__linear_create(in, out, bias, dev, dt, 0.0);
}

/* ---- Embedding */

static accel_tensor *embedding_forward(accel_module *m, accel_tensor *ids) {
    return accel_embedding(ids, accel__module_tensor(m, "weight"));
}

static const accel_module_ops EMBEDDING_OPS = {"Embedding", embedding_forward, NULL};

accel_module *accel__embedding_create(int64_t num, int64_t dim, accel_device dev, accel_dtype dt,
                                      double std) {
    if (!check_dims("accel_embedding_new", num, dim)) return NULL;
    accel_module *m = accel_module_new(&EMBEDDING_OPS, NULL);
    accel_tensor *w = accel__new_param(m, "weight", dt, 2, (int64_t[]){num, dim}, dev);
    if (!w || (has_data(w) && accel_rng_normal_(accel_default_rng(), w, 0.0, std) != ACCEL_OK)) {
        accel_module_free(m);
        return NULL;
    }
    return m;
}

accel_module *accel_embedding_new(int64_t num, int64_t dim, accel_device dev, accel_dtype dt) {
    return accel__embedding_create(num, dim, dev, dt, 1.0);
}

/* ---- norms */

typedef struct norm_impl {
    double eps;
    unsigned roles; /* RMSNorm: accel__rms_norm_create's (ops/norm.h) */
} norm_impl;

static double norm_eps(const accel_module *m) { return ((const norm_impl *)m->impl)->eps; }

/* RMSNorm of x by weight w with m's eps, as m's output is read (norm_impl). */
static accel_tensor *rms_norm_of(const accel_module *m, accel_tensor *x, accel_tensor *w) {
    const norm_impl *n = m->impl;
    return accel__rms_norm_with_roles(x, w, n->eps, n->roles);
}

accel_tensor *accel__rms_norm_forward(accel_module *m, accel_tensor *x) {
    return rms_norm_of(m, x, accel__module_tensor(m, "weight"));
}

/* GemmaRMSNorm: x.float() / rms * (1 + weight.float()), rounded once to x's
 * dtype (f32 under autocast, as accel_rms_norm). In x's dtype 1 + weight
 * would round (bf16: a weight of 0.003 gives 1), and so would x / rms. */
accel_tensor *accel__rms_norm_plus_one_forward(accel_module *m, accel_tensor *x) {
    accel_tensor *w = accel_add_scalar(accel_to_dtype(accel__module_tensor(m, "weight"), ACCEL_F32), 1.0);
    /* an f32 x as it is (torch's x.float() is x): an alias node between the
     * residual sum and the norm would take the norm's gradient into a buffer
     * of its own, and the sum would not find the norm's rounding of it */
    accel_tensor *y = x ? rms_norm_of(m, x->dtype == ACCEL_F32 ? x : accel_to_dtype(x, ACCEL_F32), w) : NULL;
    return y && accel_autocast_dtype() == ACCEL_F32 ? accel_to_dtype(y, x->dtype) : y;
}

static const accel_module_ops RMSNORM_OPS = {"RMSNorm", accel__rms_norm_forward, NULL};

static accel_module *norm_module(const accel_module_ops *ops, double eps, const char *fn,
                                 int64_t dim) {
    if (!check_dims(fn, dim, 1)) return NULL;
    norm_impl *impl = accel_malloc(sizeof *impl);
    if (!impl) return NULL;
    *impl = (norm_impl){.eps = eps};
    accel_module *m = accel_module_new(ops, impl);
    if (!m) accel_free(impl);
    return m;
}

accel_module *accel__rms_norm_create(const accel_module_ops *ops, int64_t dim, double eps,
                                    accel_device dev, accel_dtype dt, unsigned roles) {
    accel_module *m = norm_module(ops, eps, "accel_rms_norm_new", dim);
    if (m) ((norm_impl *)m->impl)->roles = roles;
    accel_tensor *w = accel__new_param(m, "weight", dt, 1, &dim, dev);
    if (!w || (has_data(w) && accel_fill_(w, 1.0) != ACCEL_OK)) {
        accel_module_free(m);
        return NULL;
    }
    return m;
}

accel_module *accel_rms_norm_new(int64_t dim, double eps, accel_device dev, accel_dtype dt) {
    return accel__rms_norm_create(&RMSNORM_OPS, dim, eps, dev, dt, 0);
}

accel_tensor *accel__layer_norm_forward(accel_module *m, accel_tensor *x) {
    return accel_layer_norm(x, accel__module_tensor(m, "weight"), accel__module_tensor(m, "bias"),
                            norm_eps(m));
}

static const accel_module_ops LAYERNORM_OPS = {"LayerNorm", accel__layer_norm_forward, NULL};

/* LayerNorm of the given ops, weight 1 when affine, and bias 0 when also bias. */
static accel_module *layer_norm_create(const accel_module_ops *ops, int64_t dim, double eps, bool affine, bool bias,
                                       accel_device dev, accel_dtype dt) {
    accel_module *m = norm_module(ops, eps, "accel_layer_norm_new", dim);
    if (!m || !affine) return m;
    accel_tensor *w = accel__new_param(m, "weight", dt, 1, &dim, dev);
    bool ok = w && (!bias || accel__new_param(m, "bias", dt, 1, &dim, dev));
    if (!ok || (has_data(w) && accel_fill_(w, 1.0) != ACCEL_OK)) {
        accel_module_free(m);
        return NULL;
    }
    return m;
}

accel_module *accel__layer_norm_create(const accel_module_ops *ops, int64_t dim, double eps, accel_device dev,
                                       accel_dtype dt) {
    return layer_norm_create(ops, dim, eps, true, true, dev, dt);
}

accel_module *accel__layer_norm_no_bias_create(int64_t dim, double eps, accel_device dev, accel_dtype dt) {
    return layer_norm_create(&LAYERNORM_OPS, dim, eps, true, false, dev, dt);
}

accel_module *accel_layer_norm_new(int64_t dim, double eps, bool affine, accel_device dev,
                                  accel_dtype dt) {
    return layer_norm_create(&LAYERNORM_OPS, dim, eps, affine, true, dev, dt);
}

accel_tensor *accel__each_head(accel_tensor *x, accel_tensor *(*fn)(void *ctx, int64_t h, accel_tensor *xh),
                               void *ctx) {
    int64_t n = x->shape[2];
    accel_tensor **heads = accel_arena_alloc(accel_step_arena(), (size_t)n * sizeof *heads, 64);
    if (!heads) return NULL;
    for (int64_t h = 0; h < n; h++)
        if (!(heads[h] = fn(ctx, h, accel_slice(x, 2, h, h + 1, 1)))) return NULL;
    return accel_concat((int)n, heads, 2);
}

/* ---- Conv1D (transformers' GPT-2 projection) */

/* y = x W + b with W [in, out]: transformers' Conv1D keeps the transpose of
 * Linear's layout, and so does accel, so that checkpoints load and save as
 * they are (no transposed copy at load or save). */
static accel_tensor *conv1d_forward(accel_module *m, accel_tensor *x) {
    return accel_add(accel_matmul(x, accel__module_tensor(m, "weight")), accel__module_tensor(m, "bias"));
}

static const accel_module_ops CONV1D_OPS = {"Conv1D", conv1d_forward, NULL};

accel_module *accel__conv1d_create(int64_t in, int64_t out, accel_device dev, accel_dtype dt, double init_std) {
    if (!check_dims("accel__conv1d_create", in, out)) return NULL;
    accel_module *m = accel_module_new(&CONV1D_OPS, NULL);
    accel_tensor *w = accel__new_param(m, "weight", dt, 2, (int64_t[]){in, out}, dev);
    accel_tensor *b = w ? accel__new_param(m, "bias", dt, 1, &out, dev) : NULL;
    if (!b || (has_data(w) && accel_rng_normal_(accel_default_rng(), w, 0.0, init_std) != ACCEL_OK)) {
        accel_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- Sequential */

static accel_tensor *sequential_forward(accel_module *m, accel_tensor *x) {
    /* Checked here, not only by the first layer: with no layer, or a NULL x
     * that stopped the loop at once, NULL (or a dead x) came back with no error. */
    if (!accel_tensor_check(x, "accel_module_call (Sequential)", "x")) return NULL;
    for (int i = 0; i < m->n_children && x; i++) x = accel_module_call(m->children[i], x);
    return x;
}

const accel_module_ops accel__module_list_ops = {"ModuleList", NULL, NULL};

static const accel_module_ops SEQUENTIAL_OPS = {"Sequential", sequential_forward, NULL};

/* children[i] when it is ours to free after a failed add; NULL when it
 * appears earlier in the list (added, or freed, there: looked at first, as it
 * may be freed memory) or has a parent (it belongs to that tree). */
static accel_module *not_added(accel_module **children, int i) {
    for (int j = 0; j < i; j++)
        if (children[j] == children[i]) return NULL;
    return children[i] && !children[i]->parent ? children[i] : NULL;
}

accel_module *accel_sequential_new(int n, accel_module **children) {
    accel_module *m = accel_module_new(&SEQUENTIAL_OPS, NULL);
    bool ok = m != NULL && (n == 0 || children);
    for (int i = 0; i < n && children; i++) {
        if (!ok) { /* we own the children: free the ones not added */
            accel_module_free(not_added(children, i));
            continue;
        }
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        ok = accel_module_add_child(m, name, children[i]) != NULL;
    }
    if (!ok) {
        if (!children) accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_sequential_new: children is NULL");
        accel_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- activations */

static accel_tensor *relu_forward(accel_module *m, accel_tensor *x) { return accel_relu(x); }
static accel_tensor *silu_forward(accel_module *m, accel_tensor *x) { return accel_silu(x); }
static accel_tensor *gelu_forward(accel_module *m, accel_tensor *x) {
    return accel_gelu(x, m->impl != NULL);
}
/* GELU's tanh flag is carried as a non-NULL impl pointer; nothing to free. */
static void no_free(accel_module *m) {}

static const accel_module_ops RELU_OPS = {"ReLU", relu_forward, NULL};
static const accel_module_ops SILU_OPS = {"SiLU", silu_forward, NULL};
static const accel_module_ops GELU_OPS = {"GELU", gelu_forward, no_free};

accel_module *accel_relu_module_new(void) { return accel_module_new(&RELU_OPS, NULL); }
accel_module *accel_silu_module_new(void) { return accel_module_new(&SILU_OPS, NULL); }
accel_module *accel_gelu_module_new(bool tanh_approx) {
    static const char tanh_tag = 1;
    return accel_module_new(&GELU_OPS, tanh_approx ? (void *)&tanh_tag : NULL);
}
