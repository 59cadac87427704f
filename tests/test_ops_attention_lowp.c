/* accel_sdpa in bf16 and f16, as autocast hands it the projections: the CPU
 * kernels read q, k, v and dO and write O, dq, dk, dv in their dtype (f32
 * scores, softmax and accumulation). The reference is the f32 path on the
 * same rounded values. On the f32 tiles the kernels feed the same f32
 * numbers to GEMMs (the f32 kernels' provider or another, an order of
 * additions apart), so every result is the f32 one rounded once (within
 * one unit in the last place of the dtype; P, kept in f32, within f32
 * noise). On the native path (accel__cpu_sdpa_native: oneDNN
 * multiplying the dtype, whole query blocks) P and dS are also rounded to
 * the dtype for the GEMMs that take them, and each result may move further
 * by what those roundings can add up to, computed per element from the
 * values (rounding_bounds).
 *   - kernel level: forward and backward kernels with outputs poisoned (NaN)
 *     before the run, k and v strided as the projections' layout, GQA, odd
 *     sizes, several query blocks, Tq < Tk, Tq > Tk, no mask, dq written or
 *     added into, dk and dv added into;
 *     and whole query blocks (Tq, Tk multiples of 64, Tk past the 256-key
 *     chunks), whose seven tile GEMMs run on oneDNN from the bf16 tensors as
 *     stored (P and dS rounded to bf16) where it multiplies bf16 itself;
 *   - the whole-block cases on each provider of the tiles this machine has
 *     (OpenBLAS's or oneDNN's f32 tiles, the native path), forced through
 *     the measured choice (sdpa_tiles.h);
 *   - on each of those providers, 2 to 4 chunks of keys (Tk 320 to 1024,
 *     GQA, MQA, Tq < Tk, Tq > Tk, heads in parallel or not) with every
 *     tensor rows apart as in the projections' [B, T, H, D] (q, k, v and
 *     dO copied dense on the native path) or dense, o, dq, dk and dv in the
 *     dtype or f32 (on the native path f32 rows apart accumulate in
 *     scratch), dq overwritten or added into; nothing written between the
 *     rows;
 *   - oneDNN called where accel__cpu_sdpa_provider says, and a failure
 *     inside it (a oneDNN call that gets no scratchpad, on a worker thread)
 *     returned as the kernel's error;
 *   - op level: accel_sdpa on bf16/f16 leaves with v a transposed view (as
 *     Llama's split_heads gives it): the output's and gradients' dtype and
 *     values; decoding from a KV cache view read in place; the step arena
 *     holding no f32 copy of q, k, v or the output.
 * The f32 path itself is checked by finite differences in test_ops_attention
 * (finite differences in bf16 would measure the rounding, not the
 * gradient). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/gemm.h"
#include "backends/registry.h"
#include "check.h"
#include "gradcheck.h"
#include "ops_fixture.h"
#include "refuse_huge.h"
#include "sdpa_case.h"
#include "sdpa_tiles.h"

static const sdpa_case CASES[] = {
    {2, 6, 2, 67, 67, 37, 29, true, true},    /* GQA, odd sizes, two query blocks, kv heads in parallel */
    {1, 8, 2, 70, 70, 16, 16, true, true},    /* GQA, too few kv heads for 2 threads: query heads in parallel */
    {1, 2, 1, 150, 150, 16, 16, true, false}, /* three blocks, partial last, heads one after another */
    {1, 2, 1, 100, 230, 8, 8, true, true},    /* Tq < Tk */
    {1, 1, 1, 200, 70, 8, 12, true, false},   /* Tq > Tk: whole blocks see no key */
    {1, 4, 4, 33, 45, 16, 24, false, true},   /* no mask */
    /* whole query blocks (the score GEMMs on bf16 operands where oneDNN has them) */
    {2, 6, 2, 128, 128, 37, 29, true, true},  /* GQA, odd head dims, kv strided, kv heads in parallel */
    {1, 2, 1, 128, 384, 16, 24, true, false}, /* Tq < Tk: 320 and 384 keys, past one 256-key chunk; one head at a time */
    {1, 1, 1, 192, 64, 8, 12, true, false},   /* Tq > Tk: two blocks see no key */
    {1, 4, 4, 64, 320, 24, 16, false, true},  /* no mask, 320 keys */
};

/* One unit in the last place at 1 of dt: 2^-7 bf16, 2^-10 f16. */
static double ulp(accel_dtype dt) { return dt == ACCEL_BF16 ? 1.0 / 128 : 1.0 / 1024; }

/* What the native path's roundings of P and dS can add to each result's
 * error, per element of O [B, H, Tq, Dv], dQ [B, H, Tq, D], dK and dV
 * (k's and v's layout). */
typedef struct sdpa_bounds {
    float *o, *dq, *dk, *dv;
} sdpa_bounds;

static sdpa_bounds bounds_new(const sdpa_case *c) {
    int64_t nq = c->B * c->H * c->Tq, nk = c->B * c->Hkv * c->Tk;
    sdpa_bounds b = {calloc((size_t)(nq * c->Dv), 4), calloc((size_t)(nq * c->D), 4), calloc((size_t)(nk * c->D), 4),
                     calloc((size_t)(nk * c->Dv), 4)};
    CHECK(b.o && b.dq && b.dk && b.dv);
    return b;
}

static void bounds_free(sdpa_bounds *b) {
    free(b->o);
    free(b->dq);
    free(b->dk);
    free(b->dv);
}

/* A value x rounded to dt is off by at most u |x| + eta (u = 2^-8 bf16,
 * 2^-11 f16; eta = 2^-25, half f16's subnormal spacing, more than bf16's).
 * O = P V and dV = P^T dO take each P_ij off by at most e_ij = u P_ij + eta,
 * so O_i moves by at most sum_j e_ij |V_j| and dV_j by sum_i e_ij |dO_i|;
 * dQ = s dS K and dK = s dS^T Q likewise with u |s dS_ij| + eta (s dS is
 * what is rounded: eta unscaled, as f16's subnormals take s dS sooner than
 * dS), dS = P (dP - delta), dP = dO V^T. delta = dO . O is taken from the
 * output as stored (FlashAttention's), off by at most sum_e |dO_ie| (u |O_ie|
 * + the bound of O_ie above): dS_ij moves by P_ij times that too. q, g and p
 * dense as the kernels read them, k and v (and dK, dV) at d's strides. */
static void rounding_bounds(const accel_k_sdpa_dims *d, accel_dtype dt, bool native, const float *q, const float *k,
                            const float *v, const float *g, const float *p, sdpa_bounds *b) {
    double u = dt == ACCEL_BF16 ? 1.0 / 256 : 1.0 / 2048, eta = ldexp(1.0, -25);
    double up = native ? u : 0.0, etap = native ? eta : 0.0; /* P's and dS's roundings: the native path's */
    double *dp = malloc(sizeof(double) * (size_t)d->Tk);
    CHECK(dp != NULL);
    for (int64_t bh = 0; bh < d->B * d->H; bh++) {
        int64_t kvo = bh / d->H * d->ks[0] + bh % d->H / (d->H / d->Hkv) * d->ks[1];
        int64_t vvo = bh / d->H * d->vs[0] + bh % d->H / (d->H / d->Hkv) * d->vs[1];
        for (int64_t i = 0; i < d->Tq; i++) {
            int64_t r = bh * d->Tq + i, n = d->causal ? i + d->Tk - d->Tq + 1 : d->Tk;
            n = n < 0 ? 0 : n > d->Tk ? d->Tk : n;
            const float *pi = p + r * d->Tk;
            double rs = 0.0;
            for (int64_t j = 0; j < n; j++) {
                dp[j] = 0.0;
                for (int64_t e = 0; e < d->Dv; e++) dp[j] += (double)g[r * d->Dv + e] * v[vvo + j * d->vs[2] + e];
                rs += pi[j] * dp[j];
            }
            for (int64_t j = 0; j < n; j++)
                for (int64_t e = 0; e < d->Dv; e++)
                    b->o[r * d->Dv + e] += (float)((up * pi[j] + etap) * fabs(v[vvo + j * d->vs[2] + e]));
            double dl = 0.0; /* delta's error: O_i as stored */
            for (int64_t e = 0; e < d->Dv; e++) {
                double oe = 0.0;
                for (int64_t j = 0; j < n; j++) oe += pi[j] * v[vvo + j * d->vs[2] + e];
                dl += fabs(g[r * d->Dv + e]) * (u * fabs(oe) + b->o[r * d->Dv + e] + eta);
            }
            for (int64_t j = 0; j < n; j++) {
                double ep = up * pi[j] + etap;
                double es = up * fabs(d->scale * pi[j] * (dp[j] - rs)) + etap + fabs(d->scale) * pi[j] * dl;
                for (int64_t e = 0; e < d->Dv; e++)
                    b->dv[vvo + j * d->vs[2] + e] += (float)(ep * fabs(g[r * d->Dv + e]));
                for (int64_t e = 0; e < d->D; e++) {
                    b->dq[r * d->D + e] += (float)(es * fabs(k[kvo + j * d->ks[2] + e]));
                    b->dk[kvo + j * d->ks[2] + e] += (float)(es * fabs(q[r * d->D + e]));
                }
            }
        }
    }
    free(dp);
}

/* The probabilities P [B, H, Tq, Tk] (malloc'd, 0 past each row's last
 * key) the kernels' log-sum-exp lse [B, H, Tq] stands for: exp(scale q k^T
 * - lse), q dense, k at d's strides, in double. */
static float *probs_of(const accel_k_sdpa_dims *d, const float *q, const float *k, const accel_tensor *lse) {
    const float *l = lse->data;
    float *p = calloc((size_t)(d->B * d->H * d->Tq * d->Tk), sizeof *p);
    CHECK(p != NULL);
    for (int64_t bh = 0; bh < d->B * d->H; bh++) {
        int64_t kvo = bh / d->H * d->ks[0] + bh % d->H / (d->H / d->Hkv) * d->ks[1];
        for (int64_t i = 0; i < d->Tq; i++) {
            int64_t r = bh * d->Tq + i, n = d->causal ? i + d->Tk - d->Tq + 1 : d->Tk;
            n = n < 0 ? 0 : n > d->Tk ? d->Tk : n;
            for (int64_t j = 0; j < n; j++) {
                double dot = 0.0;
                for (int64_t e = 0; e < d->D; e++) dot += (double)q[r * d->D + e] * k[kvo + j * d->ks[2] + e];
                p[r * d->Tk + j] = (float)exp(d->scale * dot - l[r]);
            }
        }
    }
    return p;
}

/* The kernels' lse against the f32 kernels' (rtol, atol; -inf, a row
 * that sees no key, only where the other is -inf too). */
static void check_lse(const char *what, const accel_tensor *got, const accel_tensor *want, double rtol, double atol) {
    const float *g = got->data, *w = want->data;
    int64_t bad = 0, n = accel_numel(want);
    for (int64_t i = 0; i < n; i++) {
        bool ok = isinf(w[i]) ? g[i] == w[i] : fabs((double)g[i] - w[i]) <= atol + rtol * fabs((double)w[i]);
        if (!ok && !bad++) fprintf(stderr, "%s: row %lld: %.9g vs %.9g\n", what, (long long)i, g[i], w[i]);
    }
    CHECK_MSG(bad == 0, "%s: %lld rows off", what, (long long)bad);
}

/* A persistent tensor of dt with n random values (seed) and its f32 twin
 * holding the same (rounded) values. */
static void rounded_pair(uint64_t seed, int64_t n, accel_dtype dt, accel_tensor **lp, accel_tensor **f32) {
    accel_tensor *r = gc_randn(seed, ACCEL_SHAPE(n));
    *lp = accel_tensor_new(dt, ACCEL_SHAPE(n), ACCEL_CPU_DEVICE);
    *f32 = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(n), ACCEL_CPU_DEVICE);
    CHECK(r && *lp && *f32 && accel_copy_(*lp, r) == ACCEL_OK && accel_copy_(*f32, *lp) == ACCEL_OK);
    accel_tensor_free(r);
}

/* A persistent tensor of n elements, every byte `byte` (0xFF: NaN in float dtypes). */
static accel_tensor *filled(accel_dtype dt, int64_t n, int byte) {
    accel_tensor *t = accel_tensor_new(dt, ACCEL_SHAPE(n), ACCEL_CPU_DEVICE);
    if (t) memset(t->data, byte, (size_t)n * accel_dtype_size(dt));
    return t;
}

static accel_tensor *poisoned(accel_dtype dt, int64_t n) { return filled(dt, n, 0xFF); }

/* got within one rounding to dt of want (and f32 noise), plus extra[i] for
 * element i where extra is given (the native path's bounds). */
static void check_rounded(const char *what, const sdpa_case *c, accel_dtype dt, accel_tensor *got, accel_tensor *want,
                          const float *extra) {
    int64_t n = accel_numel(want), bad = 0;
    float *g = malloc(sizeof(float) * (size_t)n), *w = malloc(sizeof(float) * (size_t)n);
    CHECK(g && w && accel_same_shape(got, want));
    accel_to_floats(got, g);
    accel_to_floats(want, w);
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)g[i] - w[i]) <= 1e-6 + ulp(dt) * fabs((double)w[i]) + (extra ? extra[i] : 0.0f))) {
            if (!bad) fprintf(stderr, "%s: elem %lld: %.9g vs %.9g (f32 path)\n", what, (long long)i, g[i], w[i]);
            bad++;
        }
    free(g);
    free(w);
    CHECK_MSG(bad == 0, "%s: %s, Tq %lld Tk %lld D %lld causal %d: %lld off", what, accel_dtype_name(dt),
              (long long)c->Tq, (long long)c->Tk, (long long)c->D, c->causal, (long long)bad);
}

static const float *floats(const accel_tensor *t) { return t->data; }

enum { Q, K, V, G, NIN };

/* The backward's dims: k and v dense. */
static accel_k_sdpa_dims dense_dims(const sdpa_case *c) {
    sdpa_case dense = *c;
    dense.kv_strided = false;
    return sdpa_case_dims(&dense);
}

static void check_kernels(const sdpa_case *c, accel_dtype dt) {
    const accel_backend *cpu = &accel__cpu_backend;
    int64_t nq = c->B * c->H * c->Tq, nk = c->B * c->Hkv * c->Tk;
    int64_t n[NIN] = {nq * c->D, nk * c->D, nk * c->Dv, nq * c->Dv};
    accel_tensor *lp[NIN], *hi[NIN];
    for (int i = 0; i < NIN; i++) rounded_pair(40 + (uint64_t)i, n[i], dt, &lp[i], &hi[i]);
    /* forward: O and lse poisoned */
    accel_tensor *o = poisoned(dt, nq * c->Dv), *o32 = poisoned(ACCEL_F32, nq * c->Dv);
    accel_tensor *lse = poisoned(ACCEL_F32, nq), *lse32 = poisoned(ACCEL_F32, nq);
    accel_k_sdpa f = {.o = o, .lse = lse, .q = lp[Q], .k = lp[K], .v = lp[V], .dims = sdpa_case_dims(c)};
    accel_k_sdpa f32 = {.o = o32, .lse = lse32, .q = hi[Q], .k = hi[K], .v = hi[V], .dims = f.dims};
    CHECK(cpu->kernels.sdpa(&f) == ACCEL_OK && cpu->kernels.sdpa(&f32) == ACCEL_OK);
    /* the forward's bounds with k, v as it reads them; the backward's dense */
    bool native = accel__cpu_sdpa_native(dt, &f.dims);
    sdpa_bounds fb = bounds_new(c), bb = bounds_new(c);
    accel_k_sdpa_dims bd = dense_dims(c);
    float *pf = probs_of(&f.dims, floats(hi[Q]), floats(hi[K]), lse32);
    float *pb = probs_of(&bd, floats(hi[Q]), floats(hi[K]), lse32);
    rounding_bounds(&f.dims, dt, native, floats(hi[Q]), floats(hi[K]), floats(hi[V]), floats(hi[G]), pf, &fb);
    rounding_bounds(&bd, dt, native, floats(hi[Q]), floats(hi[K]), floats(hi[V]), floats(hi[G]), pb, &bb);
    free(pf);
    free(pb);
    check_rounded("sdpa output", c, dt, o, o32, fb.o);
    check_lse("sdpa lse", lse, lse32, 1e-6, 1e-6);
    /* backward, twice: dq, dk and dv poisoned (overwritten: dq_beta 0, dkv_overwrite), then added into */
    for (int beta = 0; beta < 2; beta++) {
        accel_tensor *dx[3], *dx32[3];
        int64_t nd[3] = {n[Q], n[K], n[V]};
        for (int i = 0; i < 3; i++) {
            if (beta == 0) {
                dx[i] = poisoned(dt, nd[i]);
                dx32[i] = poisoned(ACCEL_F32, nd[i]);
            } else {
                rounded_pair(50 + (uint64_t)i, nd[i], dt, &dx[i], &dx32[i]);
            }
        }
        /* both from the f32 forward's lse (each recomputes P from its q, k) */
        accel_k_sdpa_backward b = {.dq = dx[Q], .dk = dx[K], .dv = dx[V], .g = lp[G], .q = lp[Q], .k = lp[K],
                                   .v = lp[V], .o = o, .lse = lse32, .dims = bd, .dq_beta = (float)beta,
                                   .dkv_overwrite = beta == 0};
        accel_k_sdpa_backward b32 = {.dq = dx32[Q], .dk = dx32[K], .dv = dx32[V], .g = hi[G], .q = hi[Q], .k = hi[K],
                                     .v = hi[V], .o = o32, .lse = lse32, .dims = b.dims, .dq_beta = (float)beta,
                                     .dkv_overwrite = beta == 0};
        accel_k_sdpa_backward_dense(&b);
        accel_k_sdpa_backward_dense(&b32);
        /* the backward reads k and v dense: the forward's strided ones are another layout of the same values */
        CHECK(cpu->kernels.sdpa_backward(&b) == ACCEL_OK && cpu->kernels.sdpa_backward(&b32) == ACCEL_OK);
        const char *names[3] = {"sdpa dq", "sdpa dk", "sdpa dv"};
        const float *extra[3] = {bb.dq, bb.dk, bb.dv};
        for (int i = 0; i < 3; i++) {
            check_rounded(names[i], c, dt, dx[i], dx32[i], extra[i]);
            accel_tensor_free(dx[i]);
            accel_tensor_free(dx32[i]);
        }
    }
    for (int i = 0; i < NIN; i++) {
        accel_tensor_free(lp[i]);
        accel_tensor_free(hi[i]);
    }
    accel_tensor_free(o);
    accel_tensor_free(o32);
    accel_tensor_free(lse);
    accel_tensor_free(lse32);
    bounds_free(&fb);
    bounds_free(&bb);
    accel_step_reset();
}

static void test_kernels(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        check_kernels(&CASES[i], ACCEL_BF16);
        check_kernels(&CASES[i], ACCEL_F16);
    }
}

/* A persistent leaf of dt [shape] with random values. */
static accel_tensor *leaf(uint64_t seed, accel_dtype dt, int ndim, const int64_t *shape) {
    accel_tensor *r = gc_randn(seed, ndim, shape), *t = accel_tensor_new(dt, ndim, shape, ACCEL_CPU_DEVICE);
    CHECK(r && t && accel_copy_(t, r) == ACCEL_OK);
    accel_tensor_free(r);
    t->requires_grad = true;
    return t;
}

/* Output and gradients of sdpa(q, k, v^T12) with dO = w (the loss sum(O * w)). */
typedef struct run {
    accel_tensor *o, *g[3];
} run;

static run op_run(accel_tensor *const *in, accel_tensor *w, const sdpa_case *c) {
    accel_tensor *o = accel_sdpa(in[0], in[1], accel_transpose(in[2], 1, 2), c->causal, 0.0);
    CHECK(o && accel_backward(accel_sum_all(accel_mul(o, w))) == ACCEL_OK);
    run r = {.o = accel_tensor_clone_persistent(o, ACCEL_CPU_DEVICE)};
    for (int i = 0; i < 3; i++) {
        r.g[i] = accel_tensor_clone_persistent(in[i]->grad, ACCEL_CPU_DEVICE);
        CHECK(accel_tensor_drop_grad(in[i]) == ACCEL_OK);
    }
    accel_step_reset();
    return r;
}

static void run_free(run *r) {
    accel_tensor_free(r->o);
    for (int i = 0; i < 3; i++) accel_tensor_free(r->g[i]);
}

static void check_op(const sdpa_case *c, accel_dtype dt) {
    /* v stored [B, Tk, Hkv, Dv]: the op sees its transposed view [B, Hkv, Tk, Dv] */
    accel_tensor *in[3] = {leaf(1, dt, ACCEL_SHAPE(c->B, c->H, c->Tq, c->D)),
                           leaf(2, dt, ACCEL_SHAPE(c->B, c->Hkv, c->Tk, c->D)),
                           leaf(3, dt, ACCEL_SHAPE(c->B, c->Tk, c->Hkv, c->Dv))};
    accel_tensor *w = leaf(4, dt, ACCEL_SHAPE(c->B, c->H, c->Tq, c->Dv)), *in32[3], *w32;
    w->requires_grad = false;
    for (int i = 0; i < 3; i++) {
        in32[i] = accel_tensor_clone_persistent(accel_to_dtype(in[i], ACCEL_F32), ACCEL_CPU_DEVICE);
        in32[i]->requires_grad = true;
    }
    w32 = accel_tensor_clone_persistent(accel_to_dtype(w, ACCEL_F32), ACCEL_CPU_DEVICE);
    accel_step_reset();
    run lo = op_run(in, w, c), hi = op_run(in32, w32, c);
    /* the native path's bounds: P from the f32 kernel, v in its stored layout */
    accel_k_sdpa_dims d = dense_dims(c);
    d.vs[0] = c->Tk * c->Hkv * c->Dv, d.vs[1] = c->Dv, d.vs[2] = c->Hkv * c->Dv;
    int64_t nq = c->B * c->H * c->Tq;
    accel_tensor *o32 = poisoned(ACCEL_F32, nq * c->Dv), *lse32 = poisoned(ACCEL_F32, nq);
    accel_k_sdpa f = {.o = o32, .lse = lse32, .q = in32[0], .k = in32[1], .v = in32[2], .dims = d};
    CHECK(accel__cpu_backend.kernels.sdpa(&f) == ACCEL_OK);
    bool native = accel__cpu_sdpa_native(dt, &d);
    sdpa_bounds bd = bounds_new(c);
    float *p32 = probs_of(&d, floats(in32[0]), floats(in32[1]), lse32);
    rounding_bounds(&d, dt, native, floats(in32[0]), floats(in32[1]), floats(in32[2]), floats(w32), p32, &bd);
    free(p32);
    CHECK(lo.o->dtype == dt);
    check_rounded("accel_sdpa output", c, dt, lo.o, hi.o, bd.o);
    const char *names[3] = {"accel_sdpa q grad", "accel_sdpa k grad", "accel_sdpa v grad"};
    const float *extra[3] = {bd.dq, bd.dk, bd.dv};
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(lo.g[i] && lo.g[i]->dtype == dt, "%s: dtype", names[i]);
        check_rounded(names[i], c, dt, lo.g[i], hi.g[i], extra[i]);
    }
    run_free(&lo);
    run_free(&hi);
    bounds_free(&bd);
    accel_tensor_free(o32);
    accel_tensor_free(lse32);
    accel_step_reset();
    for (int i = 0; i < 3; i++) {
        accel_tensor_free(in[i]);
        accel_tensor_free(in32[i]);
    }
    accel_tensor_free(w);
    accel_tensor_free(w32);
}

static void test_op(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        check_op(&CASES[i], ACCEL_BF16);
        check_op(&CASES[i], ACCEL_F16);
    }
}

/* Whole query blocks run their tile GEMMs on oneDNN exactly where the
 * library says (accel__cpu_sdpa_provider: dnnl or dnnl_f32; never for
 * ragged blocks; mixed dtypes as f32). Shown by making every oneDNN call
 * ask for 2 GiB more scratchpad than it needs, which the allocator
 * refuses: on oneDNN both kernels fail with the out-of-memory error of
 * whichever worker thread met it, on OpenBLAS no oneDNN call is made and
 * they succeed. Then, back to normal, the same kernels run. */
static void test_scores_path(void) {
    const accel_backend *cpu = &accel__cpu_backend;
    int prev_threads = accel_num_threads();
    accel_set_num_threads(2);
    sdpa_case c = {2, 6, 2, 128, 128, 37, 29, true, true}, ragged = c;
    ragged.Tq = ragged.Tk = 127;
    accel_k_sdpa_dims d = sdpa_case_dims(&c), dr = sdpa_case_dims(&ragged);
    /* asked before the allocator refuses anything: a class measured under it would see oneDNN fail */
    int bf16_p = accel__cpu_sdpa_provider(ACCEL_BF16, &d), mixed_p = accel__cpu_sdpa_provider(ACCEL_F32, &d);
    bool native = accel__cpu_sdpa_native(ACCEL_BF16, &d);
    CHECK(native == (bf16_p == ACCEL__GEMM_PROVIDER_DNNL));
    CHECK(accel__cpu_sdpa_provider(ACCEL_BF16, &dr) == ACCEL__GEMM_PROVIDER_OPENBLAS);
    CHECK(!accel__cpu_sdpa_native(ACCEL_F32, &d));
    CHECK(mixed_p == ACCEL__GEMM_PROVIDER_OPENBLAS || mixed_p == ACCEL__GEMM_PROVIDER_DNNL);
    int64_t nq = c.B * c.H * c.Tq, nk = c.B * c.Hkv * c.Tk;
    int64_t n[NIN] = {nq * c.D, nk * c.D, nk * c.Dv, nq * c.Dv};
    accel_tensor *lp[NIN];
    for (int i = 0; i < NIN; i++) lp[i] = leaf(60 + (uint64_t)i, ACCEL_BF16, ACCEL_SHAPE(n[i]));
    accel_tensor *o = poisoned(ACCEL_BF16, nq * c.Dv), *lse = poisoned(ACCEL_F32, nq);
    accel_tensor *dq = poisoned(ACCEL_BF16, n[Q]), *dk = filled(ACCEL_BF16, n[K], 0), *dv = filled(ACCEL_BF16, n[V], 0);
    accel_k_sdpa f = {.o = o, .lse = lse, .q = lp[Q], .k = lp[K], .v = lp[V], .dims = d};
    accel_k_sdpa_backward b = {.dq = dq, .dk = dk, .dv = dv, .g = lp[G], .q = lp[Q], .k = lp[K], .v = lp[V], .o = o,
                               .lse = lse, .dims = dense_dims(&c)};
    accel_k_sdpa_backward_dense(&b);
    accel_tensor *v16 = filled(ACCEL_F16, n[V], 0);
    accel_k_sdpa mixed = f;
    mixed.v = v16;
    accel__gemm_test_scratchpad((size_t)2 << 30);
    accel_set_allocator(&(accel_allocator){refuse_huge, free_huge, NULL});
    accel_status ms = cpu->kernels.sdpa(&mixed);
    char mmsg[256];
    snprintf(mmsg, sizeof mmsg, "%s", ms == ACCEL_OK ? "" : accel_last_error());
    accel_status fs = cpu->kernels.sdpa(&f);
    char fmsg[256];
    snprintf(fmsg, sizeof fmsg, "%s", fs == ACCEL_OK ? "" : accel_last_error());
    accel_status bs = cpu->kernels.sdpa_backward(&b);
    char bmsg[256];
    snprintf(bmsg, sizeof bmsg, "%s", bs == ACCEL_OK ? "" : accel_last_error());
    accel_set_allocator(NULL);
    accel__gemm_test_scratchpad(0);
    if (mixed_p == ACCEL__GEMM_PROVIDER_DNNL)
        CHECK_MSG(ms == ACCEL_ERR_OOM && strstr(mmsg, "out of memory allocating"), "mixed: %d %s", (int)ms, mmsg);
    else
        CHECK_MSG(ms == ACCEL_OK, "bf16 q, k with f16 v: %s", mmsg);
    if (bf16_p != ACCEL__GEMM_PROVIDER_OPENBLAS) {
        CHECK_MSG(fs == ACCEL_ERR_OOM && strstr(fmsg, "out of memory allocating"), "forward: %d %s", (int)fs, fmsg);
        CHECK_MSG(bs == ACCEL_ERR_OOM && strstr(bmsg, "out of memory allocating"), "backward: %d %s", (int)bs, bmsg);
    } else {
        CHECK_MSG(fs == ACCEL_OK && bs == ACCEL_OK, "%s %s", fmsg, bmsg);
    }
    accel_step_reset();
    CHECK(cpu->kernels.sdpa(&f) == ACCEL_OK && cpu->kernels.sdpa_backward(&b) == ACCEL_OK);
    for (int i = 0; i < NIN; i++) accel_tensor_free(lp[i]);
    accel_tensor_free(v16);
    accel_tensor_free(o);
    accel_tensor_free(lse);
    accel_tensor_free(dq);
    accel_tensor_free(dk);
    accel_tensor_free(dv);
    accel_step_reset();
    accel_set_num_threads(prev_threads);
}

/* Decoding without a graph: the kernels read a bf16/f16 KV cache view
 * (positions [0, 23) of [B, Hkv, 40, D]) in place, a few queries at the end. */
static void test_cache_in_place(void) {
    for (int i = 0; i < 2; i++) {
        accel_dtype dt = i ? ACCEL_F16 : ACCEL_BF16;
        accel_tensor *q = leaf(5, dt, ACCEL_SHAPE(2, 6, 3, 16)), *kc = leaf(6, dt, ACCEL_SHAPE(2, 3, 40, 16)),
                     *vc = leaf(7, dt, ACCEL_SHAPE(2, 3, 40, 16));
        q->requires_grad = kc->requires_grad = vc->requires_grad = false;
        accel_tensor *k = accel_slice(kc, 2, 0, 23, 1), *v = accel_slice(vc, 2, 0, 23, 1);
        accel_tensor *o = accel_sdpa(q, k, v, true, 0.0);
        accel_tensor *o32 = accel_sdpa(accel_to_dtype(q, ACCEL_F32), accel_to_dtype(k, ACCEL_F32),
                                       accel_to_dtype(v, ACCEL_F32), true, 0.0);
        CHECK(o && o->dtype == dt);
        sdpa_case c = {2, 6, 3, 3, 23, 16, 16, true, true};
        check_rounded("accel_sdpa on a cache view", &c, dt, o, o32, NULL);
        accel_step_reset();
        accel_tensor_free(q);
        accel_tensor_free(kc);
        accel_tensor_free(vc);
    }
}

/* Under autocast the forward allocates the bf16 output, each query row's
 * f32 log-sum-exp and the kernel's per-thread tiles (on the f32 tiles a
 * head's K and V, a block's Q and O and P rows, in f32; on the native path,
 * q, k and v dense here, a block's S, P rows and O in f32 and P in bf16),
 * nothing the size of q, k, v or the output in f32 (an f32 copy of q alone
 * is 4x the tiles here) and no probability matrix [B, H, T, T] (f32: 1.7x
 * the rest here). */
static void test_no_f32_copies(void) {
    int prev_threads = accel_num_threads();
    accel_set_num_threads(2);
    int64_t B = 4, H = 8, T = 64, D = 32;
    accel_tensor *q = leaf(1, ACCEL_BF16, ACCEL_SHAPE(B, H, T, D)), *k = leaf(2, ACCEL_BF16, ACCEL_SHAPE(B, H, T, D));
    accel_step_reset();
    size_t before = accel_arena_used(accel_step_arena());
    accel_dtype ac = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *o = accel_sdpa(q, k, k, true, 0.0);
    accel_autocast_end(ac);
    size_t used = accel_arena_used(accel_step_arena()) - before;
    size_t out = (size_t)(B * H * T * D) * 2, lse = (size_t)(B * H * T) * 4,
           tiles = 2 * (size_t)(2 * T * D + 2 * 64 * D + 3 * 64 * T) * 4, slack = 4096;
    size_t peak = accel_arena_peak(accel_step_arena()) - before;
    CHECK(o && o->dtype == ACCEL_BF16);
    CHECK_MSG(peak <= out + lse + tiles + slack, "the forward took %zu bytes of the step arena, %zu expected", peak,
              out + lse + tiles);
    /* the tiles are the call's scratch, given back after it: every layer's are not kept to the step's end */
    CHECK_MSG(used <= out + lse + slack, "the forward kept %zu bytes of the step arena, %zu expected (its tiles: %zu)",
              used, out + lse, tiles);
    accel_step_reset();
    accel_tensor_free(q);
    accel_tensor_free(k);
    accel_set_num_threads(prev_threads);
}

/* The whole-block cases once more on each provider of the tile GEMMs this
 * machine has for the dtype (OpenBLAS's f32 tiles, oneDNN's f32 tiles,
 * oneDNN in the dtype: the native path), each against the f32 kernels
 * with the bounds of the path taken. */
static void test_each_provider(void) {
    static const int P[] = {ACCEL__GEMM_PROVIDER_OPENBLAS, ACCEL__GEMM_PROVIDER_DNNL_F32, ACCEL__GEMM_PROVIDER_DNNL};
    static const accel_dtype DT[] = {ACCEL_BF16, ACCEL_F16};
    for (size_t t = 0; t < 2; t++)
        for (size_t i = 0; i < sizeof P / sizeof P[0]; i++) {
            if (!(accel__gemm_tiles_candidates(DT[t]) & 1u << P[i])) continue;
            sdpa_tiles_force(P[i]);
            for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
                accel_k_sdpa_dims d = sdpa_case_dims(&CASES[c]);
                if (d.Tq % 64 || d.Tk % 64) continue;
                int got = accel__cpu_sdpa_provider(DT[t], &d);
                CHECK_MSG(!sdpa_tiles_measured() || got == P[i], "%s forced %s: got %d", accel_dtype_name(DT[t]),
                          accel__gemm_provider_name((accel__gemm_provider)P[i]), got);
                check_kernels(&CASES[c], DT[t]);
            }
            check_op(&CASES[6], DT[t]);
            sdpa_tiles_unforce();
        }
}

/* ---- layouts on each provider: q, k, v and dO as the projections leave
 * them and o, dq, dk, dv in the inputs' dtype or f32, over keys in several
 * 256-key chunks, so that a wrong offset or leading dim on any path (the
 * native path's copies, chunk-major operands and f32 outputs accumulated
 * in scratch) fails */

/* Whole query blocks, 1 to 4 chunks of keys on oneDNN (kv_strided unused:
 * check_layout lays every tensor out itself). */
static const sdpa_case CHUNKED[] = {
    {2, 4, 2, 128, 512, 32, 32, true, false},  /* GQA, Tq < Tk: 448 and 512 keys; kv heads in parallel */
    {1, 4, 1, 64, 1024, 16, 24, false, false}, /* MQA, no mask, four chunks: query heads in parallel */
    {1, 2, 1, 320, 320, 24, 16, true, false},  /* GQA, 64 .. 320 keys, one chunk then 256 + 64; one head at a time */
    {1, 2, 2, 512, 320, 16, 16, true, false},  /* Tq > Tk: three blocks see no key, then 64 .. 320 keys */
};

/* The memory of a [B, heads, T, n] tensor: dense, or rows apart as in
 * [B, T, heads + 1, n] (a projection's layout with a spare head slot, the
 * gap between the heads' rows that nothing may write). */
typedef struct layout {
    bool apart;
    int64_t B, heads, T, n, s[3], numel;
} layout;

static layout layout_of(bool apart, int64_t B, int64_t heads, int64_t T, int64_t n) {
    int64_t slots = apart ? heads + 1 : heads;
    layout l = {apart, B, heads, T, n, {T * slots * n, n, slots * n}, B * T * slots * n};
    if (!apart) l.s[1] = T * n, l.s[2] = n;
    return l;
}

/* A tensor of dt in layout l: dense [B, heads, T, n] src's values
 * (converted) where src is given, every other byte `fill`. */
static accel_tensor *laid_out(const layout *l, accel_dtype dt, const accel_tensor *src, int fill) {
    accel_tensor *t = filled(dt, l->numel, fill);
    CHECK(t != NULL);
    size_t es = accel_dtype_size(dt), ss = src ? accel_dtype_size(src->dtype) : 0;
    for (int64_t bh = 0; src && bh < l->B * l->heads; bh++)
        for (int64_t i = 0; i < l->T; i++) {
            int64_t at = bh / l->heads * l->s[0] + bh % l->heads * l->s[1] + i * l->s[2];
            int64_t from = (bh * l->T + i) * l->n;
            accel_convert((char *)t->data + (size_t)at * es, dt, (const char *)src->data + (size_t)from * ss,
                          src->dtype, (size_t)l->n);
        }
    return t;
}

/* t (layout l) as a dense [B, heads, T, n] tensor of its dtype; checks
 * that the gap still holds `fill` bytes. */
static accel_tensor *gathered(const char *what, const layout *l, const accel_tensor *t, int fill) {
    size_t es = accel_dtype_size(t->dtype), row = (size_t)l->n * es;
    accel_tensor *d = filled(t->dtype, l->B * l->heads * l->T * l->n, 0);
    CHECK(d != NULL);
    int64_t bad = 0;
    for (int64_t b = 0; b < l->B; b++)
        for (int64_t i = 0; i < l->T; i++)
            for (int64_t h = 0; h < (l->apart ? l->heads + 1 : l->heads); h++) {
                const char *src = (const char *)t->data + (size_t)(b * l->s[0] + h * l->s[1] + i * l->s[2]) * es;
                if (h < l->heads) {
                    memcpy((char *)d->data + (size_t)(((b * l->heads + h) * l->T + i) * l->n) * es, src, row);
                    continue;
                }
                for (size_t e = 0; e < row; e++) bad += (unsigned char)src[e] != (unsigned char)fill;
            }
    CHECK_MSG(bad == 0, "%s: %lld bytes written between the rows", what, (long long)bad);
    return d;
}

/* The kernels on case c with q, k, v and dO of dt and o, dq, dk, dv of od,
 * every one rows apart or dense, against the f32 kernels on the same
 * values dense (the bounds of check_kernels); dq overwritten (poisoned
 * first), then added into; dk, dv added into. */
static void check_layout(const sdpa_case *c, accel_dtype dt, accel_dtype od, bool apart) {
    const accel_backend *cpu = &accel__cpu_backend;
    int64_t nq = c->B * c->H * c->Tq, nk = c->B * c->Hkv * c->Tk;
    int64_t n[NIN] = {nq * c->D, nk * c->D, nk * c->Dv, nq * c->Dv};
    layout L[NIN] = {layout_of(apart, c->B, c->H, c->Tq, c->D), layout_of(apart, c->B, c->Hkv, c->Tk, c->D),
                     layout_of(apart, c->B, c->Hkv, c->Tk, c->Dv), layout_of(apart, c->B, c->H, c->Tq, c->Dv)};
    accel_tensor *lp[NIN], *hi[NIN], *in[NIN];
    for (int i = 0; i < NIN; i++) {
        rounded_pair(70 + (uint64_t)i, n[i], dt, &lp[i], &hi[i]);
        in[i] = laid_out(&L[i], dt, lp[i], 0x3c);
    }
    accel_k_sdpa_dims bd = dense_dims(c), d = bd;
    memcpy(d.qs, L[Q].s, sizeof d.qs);
    memcpy(d.ks, L[K].s, sizeof d.ks);
    memcpy(d.vs, L[V].s, sizeof d.vs);
    memcpy(d.os, L[G].s, sizeof d.os);
    accel_tensor *o = laid_out(&L[G], od, NULL, 0xFF), *o32 = poisoned(ACCEL_F32, n[G]);
    accel_tensor *lse = poisoned(ACCEL_F32, nq), *lse32 = poisoned(ACCEL_F32, nq);
    accel_k_sdpa f = {.o = o, .lse = lse, .q = in[Q], .k = in[K], .v = in[V], .dims = d};
    accel_k_sdpa f32 = {.o = o32, .lse = lse32, .q = hi[Q], .k = hi[K], .v = hi[V], .dims = bd};
    CHECK(cpu->kernels.sdpa(&f) == ACCEL_OK && cpu->kernels.sdpa(&f32) == ACCEL_OK);
    bool native = accel__cpu_sdpa_native(dt, &d);
    sdpa_bounds b = bounds_new(c);
    float *p32 = probs_of(&bd, floats(hi[Q]), floats(hi[K]), lse32);
    rounding_bounds(&bd, dt, native, floats(hi[Q]), floats(hi[K]), floats(hi[V]), floats(hi[G]), p32, &b);
    free(p32);
    char what[96];
    snprintf(what, sizeof what, "sdpa output (%s, %s)", accel_dtype_name(od), apart ? "rows apart" : "dense");
    accel_tensor *got = gathered(what, &L[G], o, 0xFF);
    check_rounded(what, c, dt, got, o32, b.o);
    accel_tensor_free(got);
    check_lse("sdpa lse", lse, lse32, 1e-6, 1e-6);
    for (int beta = 0; beta < 2; beta++) {
        accel_tensor *dx[3], *dx32[3];
        for (int i = 0; i < 3; i++) {
            if (beta == 0) { /* poisoned: overwritten (dq_beta 0, dkv_overwrite) */
                dx[i] = laid_out(&L[i], od, NULL, 0xFF);
                dx32[i] = poisoned(ACCEL_F32, n[i]);
            } else {
                accel_tensor *init;
                rounded_pair(80 + (uint64_t)i, n[i], dt, &init, &dx32[i]);
                dx[i] = laid_out(&L[i], od, init, 0x3c);
                accel_tensor_free(init);
            }
        }
        accel_k_sdpa_backward k = {.dq = dx[Q], .dk = dx[K], .dv = dx[V], .g = in[G], .q = in[Q], .k = in[K],
                                   .v = in[V], .o = o, .lse = lse32, .dims = d, .dq_beta = (float)beta,
                                   .dkv_overwrite = beta == 0};
        memcpy(k.gs, L[G].s, sizeof k.gs);
        memcpy(k.dqs, L[Q].s, sizeof k.dqs);
        memcpy(k.dks, L[K].s, sizeof k.dks);
        memcpy(k.dvs, L[V].s, sizeof k.dvs);
        accel_k_sdpa_backward k32 = {.dq = dx32[Q], .dk = dx32[K], .dv = dx32[V], .g = hi[G], .q = hi[Q],
                                     .k = hi[K], .v = hi[V], .o = o32, .lse = lse32, .dims = bd,
                                     .dq_beta = (float)beta, .dkv_overwrite = beta == 0};
        accel_k_sdpa_backward_dense(&k32);
        CHECK(cpu->kernels.sdpa_backward(&k) == ACCEL_OK && cpu->kernels.sdpa_backward(&k32) == ACCEL_OK);
        const char *names[3] = {"sdpa dq", "sdpa dk", "sdpa dv"};
        const float *extra[3] = {b.dq, b.dk, b.dv};
        for (int i = 0; i < 3; i++) {
            snprintf(what, sizeof what, "%s (%s, %s, dq_beta %d)", names[i], accel_dtype_name(od),
                     apart ? "rows apart" : "dense", beta);
            got = gathered(what, &L[i], dx[i], beta == 0 ? 0xFF : 0x3c);
            check_rounded(what, c, dt, got, dx32[i], extra[i]);
            accel_tensor_free(got);
            accel_tensor_free(dx[i]);
            accel_tensor_free(dx32[i]);
        }
    }
    for (int i = 0; i < NIN; i++) {
        accel_tensor_free(lp[i]);
        accel_tensor_free(hi[i]);
        accel_tensor_free(in[i]);
    }
    accel_tensor_free(o);
    accel_tensor_free(o32);
    accel_tensor_free(lse);
    accel_tensor_free(lse32);
    bounds_free(&b);
    accel_step_reset();
}

/* CHUNKED on each provider of the tiles this machine has, each tensor
 * rows apart or dense, the outputs in the dtype or f32 (on the native
 * path f32 outputs rows apart accumulate in scratch, dense ones in place). */
static void test_layouts(void) {
    static const int P[] = {ACCEL__GEMM_PROVIDER_OPENBLAS, ACCEL__GEMM_PROVIDER_DNNL_F32, ACCEL__GEMM_PROVIDER_DNNL};
    static const accel_dtype DT[] = {ACCEL_BF16, ACCEL_F16};
    for (size_t t = 0; t < 2; t++)
        for (size_t i = 0; i < sizeof P / sizeof P[0]; i++) {
            if (!(accel__gemm_tiles_candidates(DT[t]) & 1u << P[i])) continue;
            sdpa_tiles_force(P[i]);
            for (size_t c = 0; c < sizeof CHUNKED / sizeof CHUNKED[0]; c++)
                for (int apart = 0; apart < 2; apart++) {
                    accel_k_sdpa_dims d = sdpa_case_dims(&CHUNKED[c]);
                    int got = accel__cpu_sdpa_provider(DT[t], &d);
                    CHECK_MSG(!sdpa_tiles_measured() || got == P[i], "%s forced %s: got %d", accel_dtype_name(DT[t]),
                              accel__gemm_provider_name((accel__gemm_provider)P[i]), got);
                    check_layout(&CHUNKED[c], DT[t], DT[t], apart);
                    check_layout(&CHUNKED[c], DT[t], ACCEL_F32, apart);
                }
            sdpa_tiles_unforce();
        }
}

int main(void) {
    RUN(test_kernels);
    RUN(test_each_provider);
    RUN(test_layouts);
    RUN(test_scores_path);
    RUN(test_op);
    RUN(test_cache_in_place);
    RUN(test_no_f32_copies);
    accel_thread_cleanup();
    return check_summary();
}
