/* accel_cp_attention on 1, 2 and 4 forked ranks (shm; 2 ranks over tcp too,
 * where all_to_all is the generic fallback), both strategies, MHA, GQA and
 * MQA: each rank's output rows and its gradients of q, k, v equal the rows of
 * the unsharded causal attention (accel_sdpa on the whole sequence, computed
 * on every rank from the same seeds) within 1e-5; RoPE at the shards'
 * positions and the sharded cross-entropy (value and dlogits) equal to the
 * unsharded ones. In bf16 (q, k, v rounded on both sides) within 1e-2
 * relative (a few bf16 ulps) of the unsharded bf16 attention. A local
 * failure of the sharded loss on one rank fails every rank at once. Also the
 * layout helpers (accel_cp_position, accel_cp_shard) and the refusals (heads
 * not divisible by cp under all-to-all, an odd local sequence). Sequences of
 * several query blocks of the all-to-all strategy's blocked attention (the
 * last one short), and the memory it keeps: under the [T, T] square. The
 * decoders' sliding windows and soft-capping (accel__cp_attention) over
 * several query blocks, both strategies, against the unsharded explicit
 * scores (f32 within 1e-5, bf16 within 1e-2, with torch's SDPA numerics
 * and with eager's on both sides), and in f32 the same bit for bit with
 * either numerics; f32 q, k, v under a bf16 autocast (rounded to bf16
 * first, as the unsharded attention takes them) within 5e-4 of its output
 * in 2-norm, with either numerics; the all-to-all band keeps
 * about the window's columns per row, and with soft-capping alone the same
 * as without. The same sums under the reference kernels, whose forward
 * writes each block's rows of the output at the output's strides. */
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/cp.h"
#include "check.h"
#include "dist_group.h"
#include "gradcheck.h"
#include "ops/attention_masked.h"

static int R, N;

/* The local rows (positions of this rank's chunks along dim 2) of a
 * contiguous host array [B, h, T, D]. */
static float *shard_rows(const float *x, int64_t B, int64_t h, int64_t T, int64_t D) {
    int64_t c = T / (2 * N), T2 = 2 * c;
    float *o = malloc((size_t)(B * h * T2 * D) * sizeof *o);
    for (int64_t bh = 0; bh < B * h; bh++)
        for (int64_t t = 0; t < T2; t++)
            memcpy(o + (bh * T2 + t) * D, x + (bh * T + accel_cp_position(t, c, N, R)) * D, (size_t)D * sizeof *o);
    return o;
}

static float *host(const accel_tensor *t) {
    float *v = malloc((size_t)accel_numel(t) * sizeof *v);
    accel_to_floats(t, v);
    return v;
}

/* A persistent leaf of dtype dt with the values v (rounded to dt). */
static accel_tensor *leaf_as(accel_dtype dt, const float *v, int64_t B, int64_t h, int64_t T, int64_t D) {
    accel_tensor *t = accel_tensor_new(dt, ACCEL_SHAPE(B, h, T, D), ACCEL_CPU_DEVICE);
    accel_copy_(t, accel_from_floats(ACCEL_SHAPE(B, h, T, D), v));
    accel_requires_grad_(t, true);
    return t;
}

static accel_tensor *leaf(const float *v, int64_t B, int64_t h, int64_t T, int64_t D) {
    return leaf_as(ACCEL_F32, v, B, h, T, D);
}

/* x as a persistent leaf of dtype dt (x itself for f32; else x is freed). */
static accel_tensor *as_dtype(accel_tensor *x, accel_dtype dt) {
    if (dt == ACCEL_F32) return x;
    float *v = host(x);
    accel_tensor *t = leaf_as(dt, v, x->shape[0], x->shape[1], x->shape[2], x->shape[3]);
    free(v);
    accel_tensor_free(x);
    return t;
}

static int64_t worst_at(const float *a, const float *b, int64_t n, double tol) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabsf(a[i] - b[i]) <= tol * (1 + fabsf(b[i])))) return i;
    return -1;
}

/* The decoders' sliding window of W keys and soft-capping at cap (0: none),
 * and the numerics of their explicit scores under bf16 (upcast: torch's
 * SDPA's, else transformers' eager attention's), on both sides; the
 * forwards under the autocast of dtype autocast (ACCEL_F32: none), their
 * outputs then also within 2-norm distance norm_tol (relative) of the
 * reference's. */
typedef struct case_mask {
    int64_t W;
    double cap;
    bool upcast;
    accel_dtype autocast;
    double norm_tol;
} case_mask;

static const case_mask NO_MASK = {.upcast = true};

/* One case in dtype dt (q, k, v and the output gradient rounded to it, on
 * both sides), compared within tol; returns the number of failed
 * comparisons (printed). With a window or soft-capping the reference is the
 * unsharded model's explicit scores (accel__masked_attention) and the
 * sharded op the decoders' (accel__cp_attention). */
static int one_case_as(accel_pg *pg, accel_cp_strategy s, accel_dtype dt, double tol, int64_t B, int64_t H,
                       int64_t Hkv, int64_t T, int64_t D, case_mask m) {
    const char *name = s == ACCEL_CP_ALLGATHER ? "allgather" : "alltoall";
    accel_tensor *q = as_dtype(gc_randn(1, ACCEL_SHAPE(B, H, T, D)), dt),
                 *k = as_dtype(gc_randn(2, ACCEL_SHAPE(B, Hkv, T, D)), dt),
                 *v = as_dtype(gc_randn(3, ACCEL_SHAPE(B, Hkv, T, D)), dt),
                 *gy = as_dtype(gc_randn(4, ACCEL_SHAPE(B, H, T, D)), dt);
    /* the unsharded reference, on every rank */
    bool masked = m.W || m.cap > 0;
    accel_dtype prev = accel_autocast_begin(m.autocast);
    accel_tensor *y = masked ? accel__masked_attention(q, k, v, 0, m.W, NULL, false, 0.0, m.cap, 0.0, NULL, m.upcast) : accel_sdpa(q, k, v, true, 0.0);
    accel_autocast_end(prev);
    accel_backward_with(y, accel_to_dtype(gy, y->dtype));
    float *ref[4] = {host(y), host(q->grad), host(k->grad), host(v->grad)};
    float *full_in[4] = {host(q), host(k), host(v), host(gy)};
    accel_step_reset();
    int64_t T2 = T / N, hin[4] = {H, Hkv, Hkv, H}, hs[4] = {H, H, Hkv, Hkv}; /* q k v gy; y dq dk dv */
    float *loc[4];
    for (int i = 0; i < 4; i++) loc[i] = shard_rows(full_in[i], B, hin[i], T, D);
    accel_tensor *ql = leaf_as(dt, loc[0], B, H, T2, D), *kl = leaf_as(dt, loc[1], B, Hkv, T2, D),
                 *vl = leaf_as(dt, loc[2], B, Hkv, T2, D);
    prev = accel_autocast_begin(m.autocast);
    accel_tensor *yl = masked ? accel__cp_attention(pg, ql, kl, vl, s, 0.0, m.W, m.cap, m.upcast)
                              : accel_cp_attention(pg, ql, kl, vl, s, 0.0);
    accel_autocast_end(prev);
    accel_tensor *gyl = yl ? accel_to_dtype(accel_from_floats(ACCEL_SHAPE(B, H, T2, D), loc[3]), yl->dtype) : NULL;
    int bad = 0;
    if (!yl || accel_backward_with(yl, gyl) != ACCEL_OK) {
        fprintf(stderr, "rank %d %s H=%lld Hkv=%lld: %s\n", R, name, (long long)H, (long long)Hkv, accel_last_error());
        bad = 1;
    } else {
        const accel_tensor *got[4] = {yl, ql->grad, kl->grad, vl->grad};
        const char *what[4] = {"output", "dq", "dk", "dv"};
        for (int i = 0; i < 4; i++) {
            float *want = shard_rows(ref[i], B, hs[i], T, D), *g = host(got[i]);
            int64_t n = B * hs[i] * T2 * D, at = worst_at(g, want, n, tol);
            if (at >= 0) {
                fprintf(stderr, "rank %d of %d, %s %s H=%lld Hkv=%lld T=%lld W=%lld cap=%g: %s[%lld] = %.8g, "
                        "unsharded %.8g\n", R, N, name, accel_dtype_name(dt), (long long)H, (long long)Hkv,
                        (long long)T, (long long)m.W, m.cap, what[i], (long long)at, g[at], want[at]);
                bad++;
            }
            double dist = i == 0 && m.norm_tol > 0 ? check_rel_dist(g, want, n) : 0.0;
            if (!(dist <= m.norm_tol)) {
                fprintf(stderr, "rank %d of %d, %s under a %s autocast W=%lld cap=%g: the output is %.3g from the "
                        "unsharded one (2-norm, relative; bound %.3g)\n", R, N, name, accel_dtype_name(m.autocast),
                        (long long)m.W, m.cap, dist, m.norm_tol);
                bad++;
            }
            free(want);
            free(g);
        }
    }
    for (int i = 0; i < 4; i++) {
        free(ref[i]);
        free(full_in[i]);
        free(loc[i]);
    }
    accel_tensor *all[] = {q, k, v, gy, ql, kl, vl};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) accel_tensor_free(all[i]);
    accel_step_reset();
    return bad;
}

static int one_case(accel_pg *pg, accel_cp_strategy s, int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t D) {
    return one_case_as(pg, s, ACCEL_F32, 1e-5, B, H, Hkv, T, D, NO_MASK);
}

/* The output and gradients (y, dq, dk, dv, each malloc'd) of the decoders'
 * cp attention with m on this rank's chunks q, k, v [1, 4, 2c, 8] of
 * seeds 21.., f32, under the output gradient of seed 24. 0 on success. */
static int cp_attention_f32(accel_pg *pg, accel_cp_strategy s, case_mask m, int64_t T2, float *out[4]) {
    accel_tensor *x[4];
    for (int i = 0; i < 4; i++) x[i] = gc_randn(21 + (uint64_t)i, ACCEL_SHAPE(1, 4, T2, 8));
    accel_tensor *y = accel__cp_attention(pg, x[0], x[1], x[2], s, 0.0, m.W, m.cap, m.upcast);
    int bad = !y || accel_backward_with(y, x[3]) != ACCEL_OK;
    if (!bad) {
        const accel_tensor *got[4] = {y, x[0]->grad, x[1]->grad, x[2]->grad};
        for (int i = 0; i < 4; i++) out[i] = host(got[i]);
    }
    for (int i = 0; i < 4; i++) accel_tensor_free(x[i]);
    accel_step_reset();
    return bad;
}

/* In f32 the explicit scores' numerics (upcast) change nothing: the cp
 * attention with a window and soft-capping is the same bit for bit either
 * way, output and gradients, over several query blocks (T = 256). */
static int f32_either_numerics(accel_pg *pg, accel_cp_strategy s) {
    int64_t T2 = 256 / N, n = 4 * T2 * 8;
    float *a[4] = {0}, *b[4] = {0};
    int bad = cp_attention_f32(pg, s, (case_mask){.W = 40, .cap = 5.0, .upcast = true}, T2, a) +
              cp_attention_f32(pg, s, (case_mask){.W = 40, .cap = 5.0, .upcast = false}, T2, b);
    for (int i = 0; !bad && i < 4; i++)
        if (memcmp(a[i], b[i], (size_t)n * sizeof(float))) {
            fprintf(stderr, "rank %d of %d, %s f32: output or gradient %d differs with upcast and without\n", R, N,
                    s == ACCEL_CP_ALLGATHER ? "allgather" : "alltoall", i);
            bad++;
        }
    for (int i = 0; i < 4; i++) free(a[i]), free(b[i]);
    return bad;
}

/* A target out of range on the last rank only: accel_cp_cross_entropy fails
 * there, and every other rank fails at once, saying a partner failed (not
 * after the group's timeout, in its next collective). Then a good call on
 * every rank still works (the ranks stayed in step). */
static int loss_fails_together(accel_pg *pg) {
    int bad = 0;
    int64_t V = 5, tg[4] = {1, 2, 3, R == N - 1 ? V : 0};
    accel_tensor *lg = gc_randn(7, ACCEL_SHAPE(4, V));
    accel_tensor *l = accel_cp_cross_entropy(pg, lg, accel_from_data(ACCEL_I64, ACCEL_SHAPE(4), tg), -100);
    const char *want = R == N - 1 ? "out of range" : "1 other rank(s) of the cp group";
    if (l || !strstr(accel_last_error(), want)) {
        fprintf(stderr, "rank %d of %d: a partner's bad target: %s\n", R, N, l ? "no error" : accel_last_error());
        bad++;
    }
    tg[3] = 0;
    l = accel_cp_cross_entropy(pg, lg, accel_from_data(ACCEL_I64, ACCEL_SHAPE(4), tg), -100);
    if (!l || !(fabs(accel_item(l)) > 0)) {
        fprintf(stderr, "rank %d of %d: the next loss: %s\n", R, N, accel_last_error());
        bad++;
    }
    accel_tensor_free(lg);
    accel_clear_error();
    accel_step_reset();
    return bad;
}

/* RoPE at the shards' global positions and the sharded loss, against the
 * unsharded ones; returns the number of failed comparisons. */
static int rope_and_loss(accel_pg *pg) {
    int bad = 0;
    int64_t B = 2, H = 3, T = 4 * N, D = 8, V = 11;
    float inv[4];
    for (int i = 0; i < 4; i++) inv[i] = (float)pow(10000.0, -2.0 * i / (double)D);
    accel_tensor *x = gc_randn(5, ACCEL_SHAPE(B, H, T, D));
    float *ref = host(accel_rope_freqs(x, 0, inv, 1.0)), *xin = host(x);
    float *want = shard_rows(ref, B, H, T, D), *loc = shard_rows(xin, B, H, T, D);
    accel_tensor *xl = accel_from_floats(ACCEL_SHAPE(B, H, T / N, D), loc);
    float *got = host(accel_cp_rope_freqs(xl, N, R, inv, 1.0));
    if (worst_at(got, want, B * H * (T / N) * D, 1e-6) >= 0) {
        fprintf(stderr, "rank %d of %d: rope rows differ\n", R, N);
        bad++;
    }
    free(ref), free(xin), free(want), free(loc), free(got);
    accel_tensor_free(x);
    accel_step_reset();
    /* the loss: targets with ignored positions, unevenly spread over the ranks */
    accel_tensor *lg = gc_randn(6, ACCEL_SHAPE(B, T, V));
    int64_t *tg = malloc((size_t)(B * T) * sizeof *tg);
    for (int64_t i = 0; i < B * T; i++) tg[i] = i % 5 == 1 || i < 3 ? -100 : (i * 7) % V;
    accel_tensor *tgt = accel_from_data(ACCEL_I64, ACCEL_SHAPE(B, T), tg);
    accel_tensor *l = accel_cross_entropy(lg, tgt, -100);
    double lref = accel_item(l);
    accel_backward(l);
    float *gref = host(lg->grad), *lin = host(lg);
    accel_step_reset();
    float *lloc = shard_rows(lin, B, 1, T, V), *gwant = shard_rows(gref, B, 1, T, V);
    accel_tensor *ll = leaf(lloc, B, 1, T / N, V), *lgl = accel_reshape(ll, 3, (int64_t[]){B, T / N, V});
    tgt = accel_from_data(ACCEL_I64, ACCEL_SHAPE(B, T), tg);
    accel_tensor *lcp = accel_cp_cross_entropy(pg, lgl, accel_cp_shard(tgt, N, R), -100);
    if (!lcp || fabs(accel_item(lcp) - lref) > 1e-5 * (1 + fabs(lref)) || accel_backward(lcp) != ACCEL_OK) {
        fprintf(stderr, "rank %d of %d: loss %.8g, unsharded %.8g (%s)\n", R, N, lcp ? accel_item(lcp) : NAN, lref,
                accel_last_error());
        bad++;
    } else {
        float *g = host(ll->grad);
        int64_t at = worst_at(g, gwant, B * (T / N) * V, 1e-5);
        if (at >= 0) {
            fprintf(stderr, "rank %d of %d: dlogits[%lld] = %.8g, unsharded %.8g\n", R, N, (long long)at, g[at],
                    gwant[at]);
            bad++;
        }
        free(g);
    }
    free(tg), free(gref), free(lin), free(lloc), free(gwant);
    accel_tensor_free(lg);
    accel_tensor_free(ll);
    accel_step_reset();
    return bad;
}

/* The all-to-all strategy's attention keeps the probabilities of its query
 * blocks left of the diagonal only: the step arena grows by well under the
 * [T, T] square per local head that one accel_sdpa over the whole sequence
 * allocates (16 blocks of 64 queries at T = 1024: 17/32 of it, plus q, k, v
 * and the output, small at D = 8). */
static int band_memory_of(accel_pg *pg, case_mask m, double limit) {
    int64_t B = 1, H = 4, T = 1024, D = 8, T2 = T / N, h = H / N;
    accel_tensor *x[3];
    for (int i = 0; i < 3; i++) x[i] = gc_randn(11 + (uint64_t)i, ACCEL_SHAPE(B, H, T2, D)); /* requires grad */
    accel_arena *a = accel_step_arena();
    size_t before = accel_arena_used(a);
    accel_tensor *y = accel__cp_attention(pg, x[0], x[1], x[2], ACCEL_CP_ALLTOALL, 0.0, m.W, m.cap, m.upcast);
    double grown = (double)(accel_arena_used(a) - before), square = (double)(B * h * T * T) * sizeof(float);
    int bad = 0;
    if (!y || !(grown < limit * square)) {
        fprintf(stderr, "rank %d of %d: alltoall attention at T %lld (window %lld, cap %g) kept %.0f bytes, the "
                "square is %.0f (%s)\n", R, N, (long long)T, (long long)m.W, m.cap, grown, square,
                y ? "" : accel_last_error());
        bad++;
    }
    for (int i = 0; i < 3; i++) accel_tensor_free(x[i]);
    accel_step_reset();
    return bad;
}

/* Under the [T, T] square by the band: without a window (or with soft-capping alone) 17/32 of it; with a
 * window of 64 keys each block of 64 rows keeps at most 127 columns: 1/8 of the square (plus q, k, v and
 * the output, 1/32 of it at D = 8: 0.16 measured), where the explicit scores over the square kept it
 * several times over. */
static int band_memory(accel_pg *pg) {
    return band_memory_of(pg, NO_MASK, 0.6) + band_memory_of(pg, (case_mask){.W = 0, .cap = 5.0, .upcast = false}, 0.6) +
           band_memory_of(pg, (case_mask){.W = 64, .cap = 5.0, .upcast = false}, 0.2);
}

static int body(int rank, int world) {
    if (accel_dist_init() != ACCEL_OK) return 10;
    accel_pg *pg = accel_dist_default_group();
    R = rank, N = world;
    int bad = 0;
    for (int s = 0; s < 2; s++) {
        bad += one_case(pg, (accel_cp_strategy)s, 2, 4, 4, 8 * world, 8); /* MHA */
        bad += one_case(pg, (accel_cp_strategy)s, 1, 8, 4, 4 * world, 16); /* GQA (Hkv % cp == 0 up to 4) */
        bad += one_case(pg, (accel_cp_strategy)s, 2, 4, 1, 2 * world, 8); /* MQA: kv heads repeated under alltoall */
        /* bf16 on both sides: within a few bf16 ulps (2^-8 relative) of the unsharded bf16 attention */
        bad += one_case_as(pg, (accel_cp_strategy)s, ACCEL_BF16, 1e-2, 1, 8, 4, 4 * world, 16, NO_MASK);
        /* sequences of several query blocks (alltoall: 64 rows each), the last one short */
        bad += one_case(pg, (accel_cp_strategy)s, 1, 4, 4, 200, 8);
        bad += one_case(pg, (accel_cp_strategy)s, 1, 8, 2, 136, 8); /* GQA, kv heads repeated at cp 4 */
        bad += one_case_as(pg, (accel_cp_strategy)s, ACCEL_BF16, 1e-2, 1, 8, 4, 256, 16, NO_MASK);
        /* the decoders' windows and soft-capping over several query blocks: a window shorter than a block
         * (alltoall: each block's band starts at its first row's window), one longer than it with
         * soft-capping, soft-capping alone (GQA) */
        accel_cp_strategy st = (accel_cp_strategy)s;
        bad += one_case_as(pg, st, ACCEL_F32, 1e-5, 1, 4, 2, 256, 8, (case_mask){.W = 40, .cap = 0.0, .upcast = true});
        bad += one_case_as(pg, st, ACCEL_F32, 1e-5, 1, 4, 4, 200, 8, (case_mask){.W = 70, .cap = 5.0, .upcast = false});
        bad += one_case_as(pg, st, ACCEL_F32, 1e-5, 1, 8, 2, 136, 8, (case_mask){.W = 0, .cap = 3.0, .upcast = false});
        bad += one_case_as(pg, st, ACCEL_BF16, 1e-2, 1, 8, 4, 256, 16, (case_mask){.W = 40, .cap = 5.0, .upcast = false});
        bad += one_case_as(pg, st, ACCEL_BF16, 1e-2, 1, 8, 4, 256, 16, (case_mask){.W = 40, .cap = 0.0, .upcast = true});
        bad += f32_either_numerics(pg, st);
        /* f32 q, k, v under a bf16 autocast, rounded to bf16 first as the unsharded attention takes them: the
         * outputs within 5e-4 in 2-norm (measured: 0 and 2e-7; unrounded inputs under SDPA's numerics, 3e-3) */
        case_mask sdpa = {.W = 40, .upcast = true, .autocast = ACCEL_BF16, .norm_tol = 5e-4}, eager = sdpa;
        eager.cap = 5.0, eager.upcast = false;
        bad += one_case_as(pg, st, ACCEL_F32, 1e-2, 1, 8, 4, 256, 16, sdpa);
        bad += one_case_as(pg, st, ACCEL_F32, 1e-2, 1, 8, 4, 256, 16, eager);
    }
    /* the reference kernels (accel_set_reference_kernels, on both sides): each block of queries writes its
     * rows of the whole output in place, at the output's strides */
    bool ref = accel_set_reference_kernels(true);
    for (int s = 0; s < 2; s++) {
        bad += one_case(pg, (accel_cp_strategy)s, 2, 4, 4, 8 * world, 8);
        bad += one_case(pg, (accel_cp_strategy)s, 1, 8, 2, 136, 8); /* several blocks under alltoall */
        bad += one_case_as(pg, (accel_cp_strategy)s, ACCEL_BF16, 1e-2, 1, 8, 4, 4 * world, 16, NO_MASK);
    }
    accel_set_reference_kernels(ref);
    bad += band_memory(pg);
    if (world > 1) bad += loss_fails_together(pg);
    bad += rope_and_loss(pg);
    /* refusals, before any collective: the ranks stay in step */
    accel_tensor *q3 = accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 3, 4, 8)), *k3 = accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 3, 4, 8));
    if (world > 1 && world != 3) {
        if (accel_cp_attention(pg, q3, k3, k3, ACCEL_CP_ALLTOALL, 0) || accel_last_status() != ACCEL_ERR_SHAPE ||
            !strstr(accel_last_error(), "3 query heads")) bad++;
    }
    accel_tensor *odd = accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 2, 3, 8));
    if (accel_cp_attention(pg, odd, odd, odd, ACCEL_CP_ALLGATHER, 0) || !strstr(accel_last_error(), "even")) bad++;
    accel_clear_error();
    accel_step_reset();
    accel_dist_finalize();
    accel_thread_cleanup();
    return bad ? 20 : 0;
}

static void run(int world, bool shm) {
    dist_group g = {.world = world, .one_machine = shm, .timeout = "60", .kill_after_s = 120};
    CHECK(dist_group_runs_ok(&g, body, "%d ranks (%s)", world, shm ? "shm" : "tcp"));
}

/* Forked like the others (a process that ran OpenMP must not fork a group). */
static void test_one_process(void) { run(1, true); }
static void test_two_shm(void) { run(2, true); }
static void test_four_shm(void) { run(4, true); }
static void test_two_tcp(void) { run(2, false); }

static void test_layout(void) {
    /* cp 2, c 3: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2 */
    CHECK(accel_cp_position(0, 3, 2, 0) == 0 && accel_cp_position(2, 3, 2, 0) == 2);
    CHECK(accel_cp_position(3, 3, 2, 0) == 9 && accel_cp_position(5, 3, 2, 0) == 11);
    CHECK(accel_cp_position(0, 3, 2, 1) == 3 && accel_cp_position(3, 3, 2, 1) == 6);
    /* out of range: -1 and an error naming the numbers, never a division by zero */
    CHECK(accel_cp_position(1, 0, 2, 0) == -1);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_cp_position: position 1 of rank 0 among 2 with chunks of 0");
    CHECK(accel_cp_position(6, 3, 2, 0) == -1 && accel_cp_position(0, 3, 2, 2) == -1 && accel_cp_position(-1, 3, 2, 0) == -1);
    int64_t ids[2 * 12];
    for (int i = 0; i < 24; i++) ids[i] = i;
    accel_tensor *b = accel_from_data(ACCEL_I64, ACCEL_SHAPE(2, 12), ids);
    accel_tensor *s = accel_cp_shard(b, 2, 1);
    CHECK(s && s->shape[0] == 2 && s->shape[1] == 6);
    int64_t got[12], want[12] = {3, 4, 5, 6, 7, 8, 15, 16, 17, 18, 19, 20};
    if (s) {
        accel_to_int64s(s, got);
        CHECK(memcmp(got, want, sizeof got) == 0);
    }
    CHECK(!accel_cp_shard(b, 5, 0) && strstr(accel_last_error(), "2*cp = 10"));
    accel_clear_error();
    accel_step_reset();
}

int main(void) {
    setenv("OMP_NUM_THREADS", "1", 0);
    RUN(test_one_process);
    RUN(test_two_shm);
    RUN(test_four_shm);
    RUN(test_two_tcp);
    RUN(test_layout);
    return check_summary();
}
