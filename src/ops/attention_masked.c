/* accel__masked_attention (attention_masked.h): the sliding-window mask and
 * soft-capping over explicit scores, composed of differentiable ops. */
#include <float.h>
#include <math.h>

#include "attention_masked.h"
#include "nn_internal.h"

accel_tensor *accel__window_mask(int64_t rows, int64_t T, int64_t S, int64_t pos, int64_t k0, int64_t W) {
    float *m = accel_arena_alloc(accel_step_arena(), (size_t)(rows * S) * sizeof *m, 64);
    if (!m) return NULL;
    for (int64_t r = 0; r < rows; r++) {
        int64_t qpos = pos + r % T;
        for (int64_t j = k0; j < k0 + S; j++)
            m[r * S + j - k0] = j <= qpos && (!W || j > qpos - W) ? 0.0f : -INFINITY;
    }
    return accel_from_data(ACCEL_F32, 2, (int64_t[]){rows, S}, m);
}

/* t as dt on dev. */
static accel_tensor *as(accel_tensor *t, accel_dtype dt, accel_device dev) {
    if (t && t->dtype != dt) t = accel_to_dtype(t, dt);
    if (t && !accel_device_eq(t->device, dev)) t = accel_to_device(t, dev);
    return t;
}

/* The additive mask [B, 1, T, S] of accel__window_mask's rows with the
 * keys row b does not keep (keep[b S + j] 0; keep NULL: all) and those
 * before the start of the query's packed sequence (start[b T + r];
 * start NULL: none) masked too, every masked entry
 * at half the lowest finite value of dt, not -inf: a query that sees no
 * key at all (a left pad's) gets finite probabilities (equal over all S
 * keys, as transformers' eager attention) where -inf made them NaN, and a
 * masked score plus it stays finite in dt. *live: [B, 1, T, 1] of 1 for
 * the rows that see a key, 0 for the others, or NULL when every row does.
 * Both f32 on the cpu. */
static accel_tensor *pad_mask(int64_t B, int64_t T, int64_t S, int64_t pos, int64_t W, const uint8_t *keep,
                              const int64_t *start, accel_dtype dt, accel_tensor **live) {
    float low = dt == ACCEL_F16 ? -65504.0f / 2 : dt == ACCEL_BF16 ? -3.38953139e38f / 2 : -FLT_MAX / 2;
    float *m = accel_arena_alloc(accel_step_arena(), (size_t)(B * T * S) * sizeof *m, 64);
    float *l = accel_arena_alloc(accel_step_arena(), (size_t)(B * T) * sizeof *l, 64);
    if (!m || !l) return NULL;
    bool dead = false;
    for (int64_t b = 0; b < B; b++)
        for (int64_t r = 0; r < T; r++) {
            int64_t qpos = pos + r, first = start ? start[b * T + r] : 0;
            float *row = m + (b * T + r) * S;
            bool seen = false;
            for (int64_t j = 0; j < S; j++) {
                bool see = (!keep || keep[b * S + j]) && j >= first && j <= qpos && (!W || j > qpos - W);
                row[j] = see ? 0.0f : low;
                seen |= see;
            }
            l[b * T + r] = seen;
            dead |= !seen;
        }
    *live = dead ? accel_from_data(ACCEL_F32, 4, (int64_t[]){B, 1, T, 1}, l) : NULL;
    return !dead || *live ? accel_from_data(ACCEL_F32, 4, (int64_t[]){B, 1, T, S}, m) : NULL;
}

static accel_tensor *like(accel_tensor *t, const accel_tensor *x) { return x ? as(t, x->dtype, x->device) : NULL; }

accel_status accel__pad_mask_make(accel__pad_mask *pm, const uint8_t *keep, const int64_t *start, int64_t B, int64_t T,
                                  int64_t S, int64_t pos, int64_t W, accel_dtype dt, accel_device dev) {
    accel_tensor *live = NULL, *mask = pad_mask(B, T, S, pos, W, keep, start, dt, &live);
    *pm = (accel__pad_mask){.W = W, .pos = pos, .dt = dt, .dev = dev, .mask = as(mask, dt, dev),
                            .live = live ? as(live, dt, dev) : NULL};
    return pm->mask && (!live || pm->live) ? ACCEL_OK : accel_last_status();
}

bool accel__pad_mask_fits(const accel__pad_mask *pm, const accel_tensor *q, const accel_tensor *k, int64_t pos,
                          int64_t W, bool upcast) {
    return pm && pm->mask && q && k && pm->W == W && pm->pos == pos && pm->dt == accel__scores_dtype(q, upcast) &&
           accel_device_eq(pm->dev, q->device) && pm->mask->shape[0] == q->shape[0] &&
           pm->mask->shape[2] == q->shape[2] && pm->mask->shape[3] == k->shape[2];
}

accel_tensor *accel__masked_attention(accel_tensor *q, accel_tensor *k, accel_tensor *v, int64_t pos, int64_t W,
                                      const uint8_t *keep, bool unseen_zero, double scale, double cap, double drop,
                                      accel_rng *drop_rng, bool upcast) {
    if (!q || !k || !v) return NULL;
    accel__pad_mask pm = {0};
    if (keep && accel__pad_mask_make(&pm, keep, NULL, q->shape[0], q->shape[2], k->shape[2], pos, W,
                                     accel__scores_dtype(q, upcast), q->device) != ACCEL_OK)
        return NULL;
    return accel__masked_attention_pad(q, k, v, pos, W, keep ? &pm : NULL, unseen_zero, scale, cap, drop, drop_rng,
                                       upcast);
}

accel_tensor *accel__masked_attention_pad(accel_tensor *q, accel_tensor *k, accel_tensor *v, int64_t pos, int64_t W,
                                          const accel__pad_mask *pm, bool unseen_zero, double scale, double cap,
                                          double drop, accel_rng *drop_rng, bool upcast) {
    if (!q || !k || !v) return NULL;
    if (pm && !accel__pad_mask_fits(pm, q, k, pos, W, upcast)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel__masked_attention: the padding mask was made for another "
                        "window, shape, dtype or device");
        return NULL;
    }
    int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], D = q->shape[3], Hkv = k->shape[1], S = k->shape[2];
    int64_t G = H / Hkv;
    /* query head h uses kv head h / G: rows of one kv head's G query heads together */
    accel_tensor *qg = accel_reshape(accel_contiguous(q), 4, (int64_t[]){B, Hkv, G * T, D});
    accel_tensor *mask = !qg ? NULL : pm ? pm->mask : accel__window_mask(T, T, S, pos, 0, W);
    if (!mask) return NULL;
    accel__scores_opts o = {.scale = scale, .cap = cap, .drop = drop, .drop_rng = drop_rng,
                            .live = pm && unseen_zero ? pm->live : NULL, .upcast = upcast};
    accel_tensor *out = accel__scores_attention(qg, k, v, mask, &o); /* [B, Hkv, G T, D] */
    return accel_reshape(out, 4, (int64_t[]){B, H, T, D});
}

/* The dtype explicit scores over q compute in: the autocast's when it is
 * on (q, k and v rounded to it, as torch's autocast hands them to its SDPA),
 * else q's own. */
static accel_dtype compute_dtype(const accel_tensor *q) {
    return accel_autocast_dtype() != ACCEL_F32 ? accel_autocast_dtype() : q->dtype;
}

static bool low_precision(accel_dtype dt) { return dt == ACCEL_BF16 || dt == ACCEL_F16; }

static bool upcasts(const accel_tensor *q, bool upcast) { return upcast && low_precision(compute_dtype(q)); }

accel_dtype accel__scores_dtype(const accel_tensor *q, bool upcast) {
    return upcasts(q, upcast) ? ACCEL_F32 : q->dtype;
}

accel_dtype accel__scores_dtype_of(accel_dtype compute, bool upcast) {
    return upcast && low_precision(compute) ? ACCEL_F32 : compute;
}

/* t rounded to dt (when it is not dt) and made f32: what torch's autocast
 * and SDPA make of an input. */
static accel_tensor *rounded_f32(accel_tensor *t, accel_dtype dt) {
    if (t && t->dtype != dt) t = accel_to_dtype(t, dt);
    return t ? accel_to_dtype(t, ACCEL_F32) : NULL;
}

/* x [B, Hkv, R, n] plus (or with `times`, times) t: t broadcast to x, or
 * t [B, 1, T, n] or [T, n] (T > 1 rows, R a multiple of T) repeated over
 * each T rows of x, through a [B, Hkv, R / T, T, n] view
 * (accel__scores_attention's mask and live). */
static accel_tensor *rows_apply(accel_tensor *x, accel_tensor *t, bool times) {
    if (!x || !t) return NULL;
    int64_t R = x->shape[2], T = t->ndim >= 2 ? t->shape[t->ndim - 2] : 1;
    if (T == 1 || T == R) return times ? accel_mul(x, t) : accel_add(x, t);
    accel_tensor *xv = accel_reshape(x, 5, (int64_t[]){x->shape[0], x->shape[1], R / T, T, x->shape[3]});
    int64_t lead = t->ndim == 4 ? t->shape[0] : 1, n = t->shape[t->ndim - 1];
    accel_tensor *tv = accel_reshape(t, 5, (int64_t[]){lead, 1, 1, T, n});
    return accel_reshape(times ? accel_mul(xv, tv) : accel_add(xv, tv), 4, x->shape);
}

/* The scores, mask, softmax, dropout and P V of accel__scores_attention in
 * the dtype of q, k, v (and the autocast's, when on). */
static accel_tensor *scores_body(accel_tensor *q, accel_tensor *k, accel_tensor *v, accel_tensor *mask,
                                 const accel__scores_opts *o) {
    accel_tensor *m = mask ? like(mask, q) : NULL;
    if (mask && !m) return NULL;
    accel_tensor *scores = accel_mul_scalar(accel_matmul(q, accel_transpose(k, 2, 3)),
                                            o->scale > 0 ? o->scale : 1.0 / sqrt((double)q->shape[3]));
    if (o->cap > 0) scores = accel_mul_scalar(accel_tanh(accel_mul_scalar(scores, 1.0 / o->cap)), o->cap);
    accel_tensor *probs = accel_softmax(m ? rows_apply(scores, m, false) : scores, 3);
    /* torch's SDPA: a query that sees no key gets probabilities 0 (and no gradient) */
    if (o->live) probs = rows_apply(probs, like(o->live, probs), true);
    if (o->drop > 0) probs = accel_dropout(probs, o->drop, true, o->drop_rng);
    return accel_matmul(probs, v);
}

accel_tensor *accel__scores_attention(accel_tensor *q, accel_tensor *k, accel_tensor *v, accel_tensor *mask,
                                      const accel__scores_opts *o) {
    if (!q || !k || !v) return NULL;
    if (!upcasts(q, o->upcast)) return scores_body(q, k, v, mask, o);
    /* torch's SDPA on bf16/f16 inputs: everything in f32, the output rounded once */
    accel_dtype dt = compute_dtype(q);
    accel_tensor *q32 = rounded_f32(q, dt), *k32 = rounded_f32(k, dt), *v32 = rounded_f32(v, dt);
    accel_dtype autocast = accel_autocast_begin(ACCEL_F32);
    accel_tensor *out = q32 && k32 && v32 ? scores_body(q32, k32, v32, mask, o) : NULL;
    accel_autocast_end(autocast);
    return out ? accel_to_dtype(out, dt) : NULL;
}
