/* accel_batch_norm (torch.nn.functional.batch_norm) over x [N, C, ...]:
 * the batch_norm kernel sees it as [N, C, S], S the product of the dims
 * after C (1 for [N, C]). Computed in f32 as the other norms. */
#include "accel/parallel.h"
#include "nn_internal.h"

/* Host scratch of a SyncBatchNorm pass in the step arena: a training step
 * allocates nothing from the system after the first. */
static void *step_scratch(size_t bytes) { return accel_arena_alloc(accel_step_arena(), bytes ? bytes : 1, 64); }

typedef struct bn_saved {
    int64_t N, C, S;
    bool training;
    accel_pg *pg;  /* SyncBatchNorm's group (training, 2 ranks or more), else NULL */
    int64_t count; /* with pg: the values per channel over the group */
} bn_saved;

/* SyncBatchNorm's backward: this rank's per-channel sums of g and g * xhat
 * (dbias, dweight: DDP averages them as any gradient), one all-reduce of
 * both, then dx from the group's sums over the group's count.
 * g, x [N, C, S] f32. */
static accel_status sync_bn_backward(accel_node *node, const bn_saved *s, accel_tensor *g) {
    accel_device dev = g->device;
    int64_t C = s->C;
    accel__gbuf gx, gw, gb;
    if (!accel__gbuf_begin(&gx, node->inputs[0]) || !accel__gbuf_begin_zeroed(&gw, node->inputs[1]) ||
        !accel__gbuf_begin_zeroed(&gb, node->inputs[2]))
        return accel_last_status();
    /* the local sums in zeroed scratch of their own: dw / db may already hold
     * an earlier micro-batch's gradient (accumulation), which is no part of
     * this rank's sums; they are added to it after the all-reduce */
    accel_tensor *lw = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(C), dev);
    accel_tensor *lb = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(C), dev);
    accel_tensor *sums = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(2, C), dev);
    float *h = step_scratch(2 * (size_t)C * sizeof *h);
    accel_status st = lw && lb && sums && h ? ACCEL_OK : accel_last_status();
    if (st == ACCEL_OK) st = accel_fill_(lw, 0.0);
    if (st == ACCEL_OK) st = accel_fill_(lb, 0.0);
    accel_k_batch_norm_backward k = {.dw = lw, .db = lb, .g = g, .x = node->saved[0], .w = node->saved[1],
                                     .mean = node->saved[2], .invstd = node->saved[3], .N = s->N, .C = C,
                                     .S = s->S, .training = true};
    if (st == ACCEL_OK) st = ACCEL_KERNEL("sync_batch_norm backward", dev, batch_norm_backward, &k);
    if (st == ACCEL_OK) st = accel_tensor_to_host(lb, h);
    if (st == ACCEL_OK) st = accel_tensor_to_host(lw, h + C);
    if (st == ACCEL_OK) st = accel_pg_all_reduce(s->pg, h, 2 * (size_t)C, ACCEL_F32, ACCEL_REDUCE_SUM);
    if (st == ACCEL_OK) st = accel_tensor_from_host(sums, h);
    accel_k_accumulate aw = {.out = gw.dst, .in = lw}, ab = {.out = gb.dst, .in = lb};
    if (st == ACCEL_OK && gw.dst) st = ACCEL_KERNEL("sync_batch_norm backward", dev, accumulate, &aw);
    if (st == ACCEL_OK && gb.dst) st = ACCEL_KERNEL("sync_batch_norm backward", dev, accumulate, &ab);
    if (st == ACCEL_OK && gx.dst) {
        k = (accel_k_batch_norm_backward){.dx = gx.dst, .g = g, .x = node->saved[0], .w = node->saved[1],
                                          .mean = node->saved[2], .invstd = node->saved[3], .sums = sums,
                                          .N = s->N, .C = C, .S = s->S, .count = s->count, .dx_beta = gx.beta,
                                          .training = true};
        st = ACCEL_KERNEL("sync_batch_norm backward", dev, batch_norm_backward, &k);
    }
    if (st == ACCEL_OK) st = accel__gbuf_end(&gx);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gw);
    return st == ACCEL_OK ? accel__gbuf_end(&gb) : st;
}

static accel_status bn_backward(accel_node *node, accel_tensor *grad_out) {
    const bn_saved *s = node->ctx;
    accel_tensor *g = accel__f32_contig(grad_out);
    if (!g) return accel_last_status();
    if (s->pg) return sync_bn_backward(node, s, g);
    accel__gbuf gx, gw, gb;
    if (!accel__gbuf_begin(&gx, node->inputs[0]) || !accel__gbuf_begin_zeroed(&gw, node->inputs[1]) ||
        !accel__gbuf_begin_zeroed(&gb, node->inputs[2]))
        return accel_last_status();
    accel_k_batch_norm_backward k = {.dx = gx.dst, .dw = gw.dst, .db = gb.dst, .g = g, .x = node->saved[0],
                                     .w = node->saved[1], .mean = node->saved[2], .invstd = node->saved[3],
                                     .N = s->N, .C = s->C, .S = s->S, .dx_beta = gx.beta, .training = s->training};
    accel_status st = ACCEL_KERNEL("batch_norm backward", g->device, batch_norm_backward, &k);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gx);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gw);
    return st == ACCEL_OK ? accel__gbuf_end(&gb) : st;
}

/* A per-channel tensor: [C] of a float dtype (f32 contiguous when the
 * kernel writes it: the running stats). */
static bool channel_ok(const char *op, accel_tensor *x, accel_tensor *p, const char *what, bool written) {
    if (!p) return true;
    int64_t C = x->shape[1];
    if (!accel__op_check_float(op, p, what)) return false;
    if (p->ndim != 1 || p->shape[0] != C) {
        char why[96];
        snprintf(why, sizeof why, "do not fit (%s must be [%lld], one per channel)", what, (long long)C);
        accel__shape_error2(op, x, p, why);
        return false;
    }
    if (written && (p->dtype != ACCEL_F32 || !accel_is_contiguous(p))) {
        accel_set_error(ACCEL_ERR_DTYPE, "%s: %s must be a contiguous f32 tensor (it is updated in place), got %s",
                        op, what, accel_dtype_name(p->dtype));
        return false;
    }
    return true;
}

/* The checks of accel_batch_norm and accel_sync_batch_norm (op names
 * them); fills s and dev. */
static bool bn_check(const char *OP, accel_tensor *x, accel_tensor *running_mean, accel_tensor *running_var,
                     accel_tensor *weight, accel_tensor *bias, bool training, double momentum, double eps,
                     accel_device *dev, bn_saved *s) {
    accel_tensor *all[5] = {x, weight, bias, running_mean, running_var};
    if (!accel__op_begin_opt(OP, 5, all, 30u, dev) || !accel__op_check_float(OP, x, "x")) return false;
    if (x->ndim < 2) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: x must be [N, C, ...] (2 dims or more), got %d dims", OP, x->ndim);
        return false;
    }
    if (!running_mean != !running_var) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: running_mean and running_var are given together or not at all", OP);
        return false;
    }
    if (!training && !running_mean) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: eval mode (training false) needs running_mean and running_var", OP);
        return false;
    }
    if (!channel_ok(OP, x, weight, "weight", false) || !channel_ok(OP, x, bias, "bias", false) ||
        !channel_ok(OP, x, running_mean, "running_mean", true) || !channel_ok(OP, x, running_var, "running_var", true))
        return false;
    if (!(eps >= 0) || !(momentum >= 0 && momentum <= 1)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: eps = %g must be >= 0 and momentum = %g in [0, 1]", OP, eps,
                        momentum);
        return false;
    }
    *s = (bn_saved){.N = x->shape[0], .C = x->shape[1], .S = accel__prod(x->shape, 2, x->ndim), .training = training};
    return true;
}

/* The result's dtype: x's promoted with weight's and bias's (f32 under
 * autocast). */
static accel_dtype bn_out_dtype(accel_tensor *x, accel_tensor *weight, accel_tensor *bias) {
    accel_dtype dt = x->dtype;
    if (weight) dt = accel__promote(dt, weight->dtype);
    if (bias) dt = accel__promote(dt, bias->dtype);
    return accel_autocast_dtype() != ACCEL_F32 ? ACCEL_F32 : dt;
}

/* Normalises x into out (made by the op) with kernel k (its statistics'
 * fields set: the batch's, the running ones or the group's) and records the
 * backward with s. xf: x as f32 contiguous. */
static accel_tensor *bn_apply(const char *OP, accel_tensor *out, accel_tensor *x, accel_tensor *xf,
                              accel_tensor *weight, accel_tensor *bias, accel_k_batch_norm *k, const bn_saved *s) {
    accel_device dev = out->device;
    accel_tensor *wf = weight ? accel__f32_contig(weight) : NULL, *bf = bias ? accel__f32_contig(bias) : NULL;
    accel_tensor *y = out->dtype == ACCEL_F32 ? out : accel_empty_on(ACCEL_F32, x->ndim, x->shape, dev);
    accel_tensor *mean = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(s->C), dev);
    accel_tensor *invstd = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(s->C), dev);
    if ((weight && !wf) || (bias && !bf) || !y || !mean || !invstd) return NULL;
    k->y = y;
    k->mean = mean;
    k->invstd = invstd;
    k->x = xf;
    k->w = wf;
    k->b = bf;
    if (ACCEL_KERNEL(OP, dev, batch_norm, k) != ACCEL_OK) return NULL;
    if (y != out && accel_copy_(out, y) != ACCEL_OK) return NULL;
    accel_tensor *in[3] = {x, weight, bias};
    accel_node *n = accel_tape_record(s->pg ? "sync_batch_norm" : "batch_norm", bn_backward, out, 3, in);
    if (n) {
        bn_saved *sc = accel_arena_alloc(accel_step_arena(), sizeof *sc, 64);
        if (!sc) return NULL;
        *sc = *s;
        n->ctx = sc;
        n->saved[0] = xf;
        n->saved[1] = wf;
        n->saved[2] = mean;
        n->saved[3] = invstd;
    }
    return out;
}

/* accel_batch_norm, its errors naming OP (SyncBatchNorm's eval and group
 * of one are BatchNorm under its own name) */
static accel_tensor *batch_norm_as(const char *OP, accel_tensor *x, accel_tensor *running_mean,
                                   accel_tensor *running_var, accel_tensor *weight, accel_tensor *bias, bool training,
                                   double momentum, double eps) {
    accel_device dev;
    bn_saved s;
    if (!bn_check(OP, x, running_mean, running_var, weight, bias, training, momentum, eps, &dev, &s)) return NULL;
    /* torch's rule: exactly one value is refused; an empty batch gives an
     * empty result and leaves the running statistics as they are */
    if (training && s.N * s.S == 1) {
        accel_set_error(ACCEL_ERR_SHAPE, "%s: expected more than 1 value per channel when training, got x [%lld, %lld, ...]",
                        OP, (long long)s.N, (long long)s.C);
        return NULL;
    }
    accel_tensor *out = accel__op_out(bn_out_dtype(x, weight, bias), x->ndim, x->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    accel_tensor *xf = accel__f32_contig(x);
    accel_k_batch_norm k = {.running_mean = training && s.N * s.S == 0 ? NULL : running_mean,
                            .running_var = training && s.N * s.S == 0 ? NULL : running_var, .N = s.N, .C = s.C,
                            .S = s.S, .eps = (float)eps, .momentum = (float)momentum, .training = training};
    return xf ? bn_apply(OP, out, x, xf, weight, bias, &k, &s) : NULL;
}

accel_tensor *accel_batch_norm(accel_tensor *x, accel_tensor *running_mean, accel_tensor *running_var,
                               accel_tensor *weight, accel_tensor *bias, bool training, double momentum,
                               double eps) {
    return batch_norm_as("accel_batch_norm", x, running_mean, running_var, weight, bias, training, momentum, eps);
}

/* The group's mean and biased variance per channel from every rank's
 * (mean, m2 = sum of squared deviations, count), combined in
 * double (Chan et al.): m2 = sum over ranks of m2_r + n_r (mean_r - mean)^2,
 * which keeps the precision a sum of squares minus a squared sum loses.
 * all: n rows of [C means, C m2s, count]. Returns the group's count. */
static int64_t group_stats(const double *all, int n, int64_t C, float *gmean, float *gvar, double *gm2) {
    size_t L = 2 * (size_t)C + 1;
    double cnt = 0.0;
    for (int r = 0; r < n; r++) cnt += all[r * L + 2 * C];
    for (int64_t c = 0; c < C; c++) {
        double m = 0.0, v = 0.0;
        for (int r = 0; r < n; r++) m += all[r * L + 2 * C] * all[r * L + c];
        m = cnt > 0 ? m / cnt : 0.0;
        for (int r = 0; r < n; r++) {
            double d = all[r * L + c] - m;
            v += all[r * L + C + c] + all[r * L + 2 * C] * d * d;
        }
        gmean[c] = (float)m;
        gm2[c] = v;
        gvar[c] = cnt > 0 ? (float)(v / cnt) : 0.0f;
    }
    return (int64_t)cnt;
}

/* running = (1 - momentum) running + momentum * the group's stat (the
 * variance unbiased over the group's count, as torch), in f32 as the
 * batch_norm kernel. */
static accel_status update_running(accel_tensor *rm, accel_tensor *rv, const float *gmean, const double *gm2,
                                   int64_t C, int64_t count, float momentum) {
    float *h = step_scratch(2 * (size_t)C * sizeof *h);
    accel_status st = h ? accel_tensor_to_host(rm, h) : accel_last_status();
    if (st == ACCEL_OK) st = accel_tensor_to_host(rv, h + C);
    for (int64_t c = 0; st == ACCEL_OK && c < C; c++) {
        h[c] = (1.0f - momentum) * h[c] + momentum * gmean[c];
        h[C + c] = (1.0f - momentum) * h[C + c] + momentum * (float)(gm2[c] / (double)(count - 1));
    }
    if (st == ACCEL_OK) st = accel_tensor_from_host(rm, h);
    if (st == ACCEL_OK) st = accel_tensor_from_host(rv, h + C);
    return st;
}

accel_tensor *accel_sync_batch_norm(accel_tensor *x, accel_tensor *running_mean, accel_tensor *running_var,
                                    accel_tensor *weight, accel_tensor *bias, bool training, double momentum,
                                    double eps, accel_pg *pg) {
    static const char *OP = "accel_sync_batch_norm";
    if (!pg) { /* a failed accel_pg_split's NULL: its error is the cause (the chain rule) */
        accel_propagate_error(ACCEL_ERR_INVALID_ARG, "%s: process group is NULL", OP);
        return NULL;
    }
    /* eval, or a group of one: BatchNorm itself, no collective */
    int n = accel_pg_size(pg);
    if (!training || n == 1)
        return batch_norm_as(OP, x, running_mean, running_var, weight, bias, training, momentum, eps);
    accel_device dev;
    bn_saved s;
    if (!bn_check(OP, x, running_mean, running_var, weight, bias, training, momentum, eps, &dev, &s)) return NULL;
    if (dev.type != ACCEL_DEV_CPU && dev.type != ACCEL_DEV_META) {
        char d[32];
        accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: x on %s: SyncBatchNorm runs on cpu tensors", OP,
                        accel_device_str(dev, d, sizeof d));
        return NULL;
    }
    accel_tensor *out = accel__op_out(bn_out_dtype(x, weight, bias), x->ndim, x->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    int64_t C = s.C;
    /* the local mean and m2 in f64: the ranks' means differ by little where the activations' mean is large
     * beside their spread, and the group's variance is made of those differences */
    accel_tensor *xf = accel__f32_contig(x), *lmean = accel_empty_on(ACCEL_F64, ACCEL_SHAPE(C), dev);
    accel_tensor *lm2 = accel_empty_on(ACCEL_F64, ACCEL_SHAPE(C), dev);
    accel_tensor *gmean_t = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(C), dev);
    accel_tensor *gvar_t = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(C), dev);
    size_t L = 2 * (size_t)C + 1;
    /* all: n rows [C means, C m2s, count] gathered, then mine; f: host f32
     * scratch [2, C] (the group's mean and var) */
    double *all = step_scratch((size_t)(n + 1) * L * sizeof *all + (size_t)C * sizeof(double));
    float *f = step_scratch(2 * (size_t)C * sizeof *f);
    accel_status st = xf && lmean && lm2 && gmean_t && gvar_t && all && f ? ACCEL_OK : accel_last_status();
    double *mine = all ? all + (size_t)n * L : NULL, *gm2 = mine ? mine + L : NULL;
    accel_k_batch_norm k = {.mean = lmean, .m2 = lm2, .x = xf, .N = s.N, .C = C, .S = s.S, .training = true};
    if (st == ACCEL_OK) st = ACCEL_KERNEL(OP, dev, batch_norm, &k);
    if (st == ACCEL_OK) st = accel_tensor_to_host(lmean, mine);
    if (st == ACCEL_OK) st = accel_tensor_to_host(lm2, mine + C);
    if (st == ACCEL_OK) {
        mine[2 * C] = (double)(s.N * s.S);
        /* counts gathered as torch does: ranks may hold different batch sizes */
        st = accel_pg_all_gather(pg, mine, all, L, ACCEL_F64);
    }
    if (st == ACCEL_OK) {
        s.count = group_stats(all, n, C, f, f + C, gm2);
        s.pg = pg;
        if (s.count == 1)
            st = accel_set_error(ACCEL_ERR_SHAPE, "%s: expected more than 1 value per channel when training, got 1 "
                                 "over the group's %d ranks (x [%lld, %lld, ...] here)", OP, n, (long long)s.N,
                                 (long long)C);
    }
    /* an empty batch over the whole group leaves the running stats as they are */
    if (st == ACCEL_OK && running_mean && s.count > 0)
        st = update_running(running_mean, running_var, f, gm2, C, s.count, (float)momentum);
    if (st == ACCEL_OK) st = accel_tensor_from_host(gmean_t, f);
    if (st == ACCEL_OK) st = accel_tensor_from_host(gvar_t, f + C);
    if (st != ACCEL_OK) return NULL;
    /* normalised in eval form with the group's statistics */
    k = (accel_k_batch_norm){.running_mean = gmean_t, .running_var = gvar_t, .N = s.N, .C = C, .S = s.S,
                             .eps = (float)eps, .training = false};
    return bn_apply(OP, out, x, xf, weight, bias, &k, &s);
}
