/* accel__dnnl_conv (gemm.h) in the oneDNN plug-in: a convolution pass on
 * oneDNN's convolution primitive, which runs a direct convolution (no
 * im2col matrix) over the whole batch in one parallel region.
 *
 * A kernel larger than 1x1 gets a primitive with its tensors' layouts left
 * to oneDNN (format "any": blocked ones such as nChw16c / OIhw16i16o);
 * accel's plain NCHW / OIHW tensors are reordered into them and the result
 * back. A 1x1 one runs on the plain layouts (oneDNN's gemm:jit then
 * multiplies the images in place, nothing reordered). Measured on the
 * Intel Xeon (Emerald Rapids) 2-vCPU machine, loaded, 2 threads, f32, fwd +
 * bwd data + bwd weights, ms, blocked with the reorders against plain:
 *   3x3 64 x 16 x 32 x 32 -> 16 (the small ResNet)    5.0 vs 37-57
 *   3x3 8 x 64 x 56 x 56 -> 64                        59 vs 181
 *   3x3 64 x 3 x 32 x 32 -> 16 (its first conv)       2.3 vs 7.8
 *   7x7 s2 8 x 3 x 224 x 224 -> 64 (a stem)           53 vs 43 (fwd 7.9
 *                                                      vs 14, dX 35 vs 14)
 *   1x1 8 x 256 x 56 x 56 -> 64                       15.2 vs 8.2
 *   1x1 s2 8 x 64 x 56 x 56 -> 128                    3.0 vs 1.7
 *   1x1 s2 64 x 16 x 32 x 32 -> 32                    1.1 vs 0.7
 *
 * A pass's primitive and each argument's reorder are entries of
 * gemm_dnnl.c's table (dnnl_internal.h), made at the first call of their
 * key (shape, pass, dtypes, thread count) and kept for the process. The
 * blocked copies and the scratchpads live in the step arena for the call. */
#include "backends/cpu/dnnl_internal.h"

#include <stdio.h>
#include <string.h>

/* A primitive's pass (a key's conv.pass). */
typedef enum conv_pass { PASS_FORWARD, PASS_BACKWARD_DATA, PASS_BACKWARD_WEIGHTS } conv_pass;

/* The key of pass of c on this many threads (the primitive's; a reorder's
 * adds its argument). */
static dnnl_key conv_key(const accel__conv_call *c, conv_pass pass) {
    dnnl_key k;
    memset(&k, 0, sizeof k);
    const accel_k_window2d *w = &c->win;
    k.conv = (dnnl_conv_key){.N = c->N, .C = c->C, .H = w->H, .W = w->W, .O = c->O, .G = c->G, .kh = w->kh,
                             .kw = w->kw, .sh = w->sh, .sw = w->sw, .ph = w->ph, .pw = w->pw, .dh = w->dh,
                             .dw = w->dw, .pass = pass, .y_dtype = (int32_t)accel__onednn_dtype(c->y_dt),
                             .bias = pass == PASS_FORWARD ? c->b != NULL : pass == PASS_BACKWARD_WEIGHTS && c->db};
    k.threads = accel__onednn_threads();
    k.dtype = (int32_t)accel__onednn_dtype(c->dt);
    k.kind = KIND_CONV;
    return k;
}

/* The plain descriptors of a convolution: x [N, C, H, W], w [O, C / G, kh,
 * kw] (as [G, O / G, C / G, kh, kw] with groups), y [N, O, Ho, Wo], b [O],
 * of dtype dt (the tag any instead of the plain one when any). */
typedef struct conv_mds {
    dnnl_memory_desc_t x, w, y, b;
} conv_mds;

static dnnl_status_t conv_describe(const dnnl_conv_key *k, int64_t Ho, int64_t Wo, dnnl_data_type_t x_dt,
                                   dnnl_data_type_t w_dt, dnnl_data_type_t y_dt, dnnl_data_type_t b_dt, bool any,
                                   conv_mds *m) {
    dnnl_dims_t x = {k->N, k->C, k->H, k->W}, y = {k->N, k->O, Ho, Wo}, b = {k->O};
    dnnl_dims_t w = {k->O, k->C, k->kh, k->kw}, wg = {k->G, k->O / k->G, k->C / k->G, k->kh, k->kw};
    bool g = k->G > 1;
    dnnl_format_tag_t t4 = any ? dnnl_format_tag_any : dnnl_nchw;
    dnnl_format_tag_t tw = any ? dnnl_format_tag_any : g ? dnnl_goihw : dnnl_oihw;
    dnnl_status_t s = dnnl_memory_desc_init_by_tag(&m->x, 4, x, x_dt, t4);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&m->w, g ? 5 : 4, g ? wg : w, w_dt, tw);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&m->y, 4, y, y_dt, t4);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&m->b, 1, b, b_dt, dnnl_x);
    return s;
}

/* The primitive description of c's pass (key: its key) into *pd, on
 * layouts "any" but for a 1x1 kernel (above); a backward pass's is made
 * after the forward's, its hint. */
static dnnl_status_t conv_pd(const accel__conv_call *c, const dnnl_key *key, dnnl_primitive_desc_t *pd,
                             const char **what) {
    const dnnl_conv_key *k = &key->conv;
    dnnl_engine_t engine = accel__onednn_engine("accel_conv2d");
    dnnl_data_type_t dt = (dnnl_data_type_t)key->dtype;
    conv_mds fwd, bwd;
    dnnl_dims_t strides = {k->sh, k->sw}, dil = {k->dh - 1, k->dw - 1}, pad_l = {k->ph, k->pw};
    /* the right padding that ends at the last output, as oneDNN checks it
     * (below ph where the stride leaves input rows unread: negative is fine) */
    dnnl_dims_t pad_r = {(c->win.Ho - 1) * k->sh + (k->kh - 1) * k->dh + 1 - k->H - k->ph,
                         (c->win.Wo - 1) * k->sw + (k->kw - 1) * k->dw + 1 - k->W - k->pw};
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t hint = NULL;
    dnnl_convolution_desc_t d;
    bool fwd_pass = k->pass == PASS_FORWARD;
    /* the forward's y in its own dtype: bf16 (rounded once from the f32
     * sums) or f32; dt in the backward's hint */
    *what = "convolution memory description";
    bool blocked = k->kh * k->kw > 1;
    dnnl_status_t s = conv_describe(k, c->win.Ho, c->win.Wo, dt, dt, fwd_pass ? (dnnl_data_type_t)k->y_dtype : dt,
                                    dt, blocked, &fwd);
    if (s == dnnl_success) *what = "attributes", s = accel__onednn_attributes(1.0f, 0.0f, &attr);
    if (s == dnnl_success)
        *what = "forward convolution description",
        s = dnnl_dilated_convolution_forward_desc_init(&d, dnnl_forward_training, dnnl_convolution_direct, &fwd.x,
                                                       &fwd.w, fwd_pass && k->bias ? &fwd.b : NULL, &fwd.y, strides,
                                                       dil, pad_l, pad_r);
    if (s == dnnl_success)
        *what = fwd_pass ? "forward convolution primitive description"
                         : "forward convolution primitive description (the backward's hint)",
        s = dnnl_primitive_desc_create(fwd_pass ? pd : &hint, &d, fwd_pass ? attr : NULL, engine, NULL);
    if (s == dnnl_success && k->pass != PASS_FORWARD) {
        /* the gradients in f32 (dx, dw, db), whatever dt */
        *what = "convolution memory description";
        s = conv_describe(k, c->win.Ho, c->win.Wo, k->pass == PASS_BACKWARD_DATA ? dnnl_f32 : dt,
                          k->pass == PASS_BACKWARD_WEIGHTS ? dnnl_f32 : dt, dt, dnnl_f32, blocked, &bwd);
        if (s == dnnl_success && k->pass == PASS_BACKWARD_DATA)
            *what = "backward-data convolution description",
            s = dnnl_dilated_convolution_backward_data_desc_init(&d, dnnl_convolution_direct, &bwd.x, &bwd.w, &bwd.y,
                                                                 strides, dil, pad_l, pad_r);
        else if (s == dnnl_success)
            *what = "backward-weights convolution description",
            s = dnnl_dilated_convolution_backward_weights_desc_init(&d, dnnl_convolution_direct, &bwd.x, &bwd.w,
                                                                    k->bias ? &bwd.b : NULL, &bwd.y, strides, dil,
                                                                    pad_l, pad_r);
        if (s == dnnl_success)
            *what = "backward convolution primitive description",
            s = dnnl_primitive_desc_create(pd, &d, attr, engine, hint);
    }
    if (hint) dnnl_primitive_desc_destroy(hint);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return s;
}

/* "f32 conv forward 64 x 16 x 32 x 32 -> 16, 3x3 s1 p1 d1 g1" into out. */
static void conv_name(const dnnl_key *key, char *out, size_t n) {
    static const char *const PASS[] = {"forward", "backward-data", "backward-weights"};
    const dnnl_conv_key *k = &key->conv;
    snprintf(out, n, "%s conv %s %lld x %lld x %lld x %lld -> %lld, %lldx%lld s%lld,%lld p%lld,%lld d%lld,%lld g%lld",
             key->dtype == dnnl_bf16 ? "bf16" : "f32", PASS[k->pass], (long long)k->N, (long long)k->C,
             (long long)k->H, (long long)k->W, (long long)k->O, (long long)k->kh, (long long)k->kw, (long long)k->sh,
             (long long)k->sw, (long long)k->ph, (long long)k->pw, (long long)k->dh, (long long)k->dw,
             (long long)k->G);
}

/* Fills e with its pass's primitive (accel__onednn_create_fn); none
 * (prim NULL, success) where oneDNN has no implementation or only its
 * reference loop. */
static accel_status conv_create(const void *ctx, dnnl_entry *e) {
    const accel__conv_call *c = ctx;
    dnnl_primitive_desc_t pd = NULL;
    const char *what;
    dnnl_status_t s = conv_pd(c, &e->key, &pd, &what);
    if (s == dnnl_unimplemented) return ACCEL_OK;
    if (s == dnnl_success) {
        const char *impl = "unknown";
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
        bool src_diff = e->key.conv.pass == PASS_BACKWARD_DATA;
        bool w_diff = e->key.conv.pass == PASS_BACKWARD_WEIGHTS, y_diff = e->key.conv.pass != PASS_FORWARD;
        e->a_md = *dnnl_primitive_desc_query_md(pd, src_diff ? dnnl_query_diff_src_md : dnnl_query_src_md, 0);
        e->b_md = *dnnl_primitive_desc_query_md(pd, w_diff ? dnnl_query_diff_weights_md : dnnl_query_weights_md, 0);
        e->c_md = *dnnl_primitive_desc_query_md(pd, y_diff ? dnnl_query_diff_dst_md : dnnl_query_dst_md, 0);
        if (e->key.conv.bias)
            e->w_md = *dnnl_primitive_desc_query_md(pd, w_diff ? dnnl_query_diff_weights_md : dnnl_query_weights_md, 1);
        if (accel__onednn_reference_impl(impl)) snprintf(e->impl, sizeof e->impl, "%s", impl);
        else what = "convolution primitive creation", s = accel__onednn_primitive_from(pd, e);
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (s == dnnl_success) return ACCEL_OK;
    char name[160], why[256];
    conv_name(&e->key, name, sizeof name);
    snprintf(why, sizeof why, "%s (%s)", what, name);
    return accel__onednn_error("accel_conv2d", why, s);
}

/* A reorder's ends: from and to, and whether it adds into to. */
typedef struct reorder_ctx {
    const dnnl_memory_desc_t *from, *to;
    bool accumulate;
} reorder_ctx;

static accel_status reorder_create(const void *ctx, dnnl_entry *e) {
    const reorder_ctx *r = ctx;
    e->b_md = *r->from;
    e->w_md = *r->to;
    const char *what;
    dnnl_status_t s = accel__onednn_reorder_create(e, r->accumulate ? 1.0f : 0.0f, &what);
    if (s == dnnl_success) return ACCEL_OK;
    char name[160], why[256];
    conv_name(&e->key, name, sizeof name);
    snprintf(why, sizeof why, "%s (%s, argument %d)", what, name, (int)e->key.conv.arg);
    return accel__onednn_error("accel_conv2d", why, s);
}

/* One argument of a pass: its plain memory p of descriptor plain, the
 * primitive's layout of it (conv_md), and for an output the beta to apply. */
typedef struct conv_arg {
    int arg;
    const dnnl_memory_desc_t *conv_md;
    dnnl_memory_desc_t plain;
    const void *p;
    bool output;
    float beta;
} conv_arg;

/* Runs the reorder of argument a of the pass of key between from (at src)
 * and to (at dst). */
static accel_status reorder(const dnnl_key *key, const conv_arg *a, const dnnl_memory_desc_t *from, const void *src,
                            const dnnl_memory_desc_t *to, const void *dst) {
    dnnl_key k = *key;
    k.kind = KIND_CONV_REORDER;
    k.conv.arg = a->arg;
    k.conv.accumulate = a->output && a->beta != 0.0f;
    reorder_ctx r = {from, to, k.conv.accumulate};
    dnnl_entry local;
    const dnnl_entry *e = accel__onednn_entry_get(&k, reorder_create, &r, &local);
    if (!e) return accel_last_status();
    accel__onednn_arg args[2] = {{DNNL_ARG_FROM, &e->b_md, src}, {DNNL_ARG_TO, &e->w_md, dst}};
    accel_status st = accel__onednn_execute(e, 2, args, "convolution reorder");
    if (local.prim) dnnl_primitive_destroy(local.prim);
    return st;
}

/* dy in a primitive's layout, made once for both backward passes where
 * their layouts agree. */
typedef struct shared_dy {
    const dnnl_memory_desc_t *md;
    const void *copy;
} shared_dy;

/* Runs e, the primitive of k's pass of c, on c's tensors: each argument in
 * the primitive's layout, a copy in the step arena (the caller rewinds it)
 * reordered in for an input where that differs from the plain one, or for
 * an output where it does or where the output is to be added to its
 * destination (the reorder back adds). */
static accel_status run_pass(const accel__conv_call *c, const dnnl_key *k, const dnnl_entry *e, shared_dy *dy) {
    dnnl_data_type_t dt = (dnnl_data_type_t)k->dtype;
    conv_pass pass = (conv_pass)k->conv.pass;
    conv_mds plain;
    dnnl_status_t s = conv_describe(&k->conv, c->win.Ho, c->win.Wo, pass == PASS_BACKWARD_DATA ? dnnl_f32 : dt,
                                    pass == PASS_BACKWARD_WEIGHTS ? dnnl_f32 : dt,
                                    pass == PASS_FORWARD ? (dnnl_data_type_t)k->conv.y_dtype : dt,
                                    pass == PASS_FORWARD ? dt : dnnl_f32, false, &plain);
    if (s != dnnl_success) return accel__onednn_error("accel_conv2d", "convolution memory description", s);
    conv_arg args[4];
    int n = 0;
    switch (pass) {
    case PASS_FORWARD:
        args[n++] = (conv_arg){DNNL_ARG_SRC, &e->a_md, plain.x, c->x, false, 0};
        args[n++] = (conv_arg){DNNL_ARG_WEIGHTS, &e->b_md, plain.w, c->w, false, 0};
        if (c->b) args[n++] = (conv_arg){DNNL_ARG_BIAS, &e->w_md, plain.b, c->b, false, 0};
        args[n++] = (conv_arg){DNNL_ARG_DST, &e->c_md, plain.y, c->y, true, 0};
        break;
    case PASS_BACKWARD_DATA:
        args[n++] = (conv_arg){DNNL_ARG_DIFF_DST, &e->c_md, plain.y, c->dy, false, 0};
        args[n++] = (conv_arg){DNNL_ARG_WEIGHTS, &e->b_md, plain.w, c->w, false, 0};
        args[n++] = (conv_arg){DNNL_ARG_DIFF_SRC, &e->a_md, plain.x, c->dx, true, c->dx_beta};
        break;
    case PASS_BACKWARD_WEIGHTS:
        args[n++] = (conv_arg){DNNL_ARG_SRC, &e->a_md, plain.x, c->x, false, 0};
        args[n++] = (conv_arg){DNNL_ARG_DIFF_DST, &e->c_md, plain.y, c->dy, false, 0};
        args[n++] = (conv_arg){DNNL_ARG_DIFF_WEIGHTS, &e->b_md, plain.w, c->dw, true, c->dw_beta};
        if (c->db) args[n++] = (conv_arg){DNNL_ARG_DIFF_BIAS, &e->w_md, plain.b, c->db, true, c->db_beta};
        break;
    }
    accel_arena *arena = accel_step_arena();
    accel__onednn_arg run[4];
    const void *at[4];
    accel_status st = ACCEL_OK;
    for (int i = 0; i < n && st == ACCEL_OK; i++) {
        conv_arg *a = &args[i];
        at[i] = a->p;
        if (dnnl_memory_desc_equal(a->conv_md, &a->plain) && !(a->output && a->beta != 0.0f)) {
            run[i] = (accel__onednn_arg){a->arg, a->conv_md, a->p};
            continue;
        }
        bool reuse = a->arg == DNNL_ARG_DIFF_DST && dy->copy && dnnl_memory_desc_equal(dy->md, a->conv_md);
        void *copy = reuse ? (void *)dy->copy : accel_arena_alloc(arena, dnnl_memory_desc_get_size(a->conv_md), 64);
        if (!copy) st = accel_last_status();
        else if (!a->output && !reuse) st = reorder(k, a, &a->plain, a->p, a->conv_md, copy);
        if (st == ACCEL_OK && a->arg == DNNL_ARG_DIFF_DST) *dy = (shared_dy){a->conv_md, copy};
        at[i] = copy;
        run[i] = (accel__onednn_arg){a->arg, a->conv_md, copy};
    }
    if (st == ACCEL_OK) st = accel__onednn_execute(e, n, run, "convolution execution");
    for (int i = 0; i < n && st == ACCEL_OK; i++)
        if (args[i].output && at[i] != args[i].p)
            st = reorder(k, &args[i], args[i].conv_md, at[i], &args[i].plain, args[i].p);
    return st;
}

accel_status accel__onednn_conv(const accel__conv_call *c, bool *ran) {
    *ran = false;
    conv_pass passes[2];
    int np = 0;
    if (c->pass == ACCEL_K_CONV_FORWARD) passes[np++] = PASS_FORWARD;
    if (c->pass == ACCEL_K_CONV_BACKWARD && c->dx) passes[np++] = PASS_BACKWARD_DATA;
    if (c->pass == ACCEL_K_CONV_BACKWARD && c->dw) passes[np++] = PASS_BACKWARD_WEIGHTS;
    /* every pass's primitive first: where one has none, nothing runs */
    dnnl_key keys[2];
    dnnl_entry local[2] = {{.prim = NULL}, {.prim = NULL}};
    const dnnl_entry *e[2] = {NULL, NULL};
    accel_status st = ACCEL_OK;
    bool all = true;
    for (int i = 0; i < np && st == ACCEL_OK; i++) {
        keys[i] = conv_key(c, passes[i]);
        e[i] = accel__onednn_entry_get(&keys[i], conv_create, c, &local[i]);
        if (!e[i]) st = accel_last_status();
        else all = all && e[i]->prim;
    }
    if (st == ACCEL_OK && all) {
        accel_arena *arena = accel_step_arena();
        accel_arena_mark mark = accel_arena_mark_now(arena);
        shared_dy dy = {NULL, NULL};
        for (int i = 0; i < np && st == ACCEL_OK; i++) st = run_pass(c, &keys[i], e[i], &dy);
        accel_arena_rewind(arena, mark);
        *ran = st == ACCEL_OK;
    }
    for (int i = 0; i < np; i++)
        if (local[i].prim) dnnl_primitive_destroy(local[i].prim);
    return st;
}
