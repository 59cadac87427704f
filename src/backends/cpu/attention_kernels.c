/* Scaled dot-product attention with grouped-query heads and a bottom-right
 * aligned causal mask: f32 scores, softmax and accumulation. q, k, v, the
 * output, the output's gradient and dq, dk, dv are each f32, bf16 or f16,
 * each at its own strides over batch, head and row (kernels.h: the rows of
 * a head contiguous; a row stride is a tile GEMM's leading dim, or the
 * stride the rows are widened from and rounded back to); lse is dense.
 * Two paths for the seven tile GEMMs of a block of queries, on the provider
 * measured fastest for the tile class (below, "the tile GEMMs and their
 * provider"):
 *   - the native path, where oneDNN multiplies the operands' bf16/f16 dtype
 *     itself and the blocks are whole: every GEMM in that dtype on dense
 *     operands (q, k, v and dO as stored where their rows are contiguous,
 *     else copied), P and dS rounded to it for the GEMMs that take them;
 *   - the f32 tiles elsewhere, on OpenBLAS's sgemm or oneDNN's f32 matmul:
 *     a bf16/f16 tensor is read and written a tile at a time (one head's
 *     keys and values, one block of queries) through per-thread f32 scratch
 *     with the vectorised conversions of fused_kernels.c, never as a
 *     whole-tensor f32 copy, f32 tensors in place.
 * Gradients are accumulated in f32 tiles on both. The forward keeps only
 * each query row's log-sum-exp (f32 [B, H, Tq]); the backward recomputes a
 * block's scores S = Q K^T (one more tile GEMM, 7 in all where P kept would
 * take 6) and its probabilities exp(s S - lse) from it, as FlashAttention
 * does: no [B, H, Tq, Tk] matrix is written in the forward and read back
 * cold in the backward, and a layer's saved memory is O(T), not O(T^2).
 * Heads run in parallel by kv head (its K and V read once for the H / Hkv
 * query heads that share them, forward and backward alike), one OpenMP
 * thread per kv head calling single-threaded GEMMs on blocks of queries;
 * with too few kv heads the forward runs query heads in parallel instead,
 * and with too few heads of either kind they run one after another and
 * each GEMM is split across the threads. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "gemm.h"

/* Queries per block. Under the causal mask the query block [i0, i0+QB) sees
 * keys [0, last_key(i0+QB-1)] only, so the GEMMs skip the masked upper
 * triangle (62% of the square work at T = 4 QB, 53% at 16 QB). */
enum { QB = 64 };

/* Last key query i may see (inclusive); -1 when none. */
static inline int64_t last_key(const accel_k_sdpa_dims *d, int64_t i) {
    if (!d->causal) return d->Tk - 1;
    int64_t l = i + d->Tk - d->Tq;
    return l < -1 ? -1 : l < d->Tk - 1 ? l : d->Tk - 1;
}

/* The first key batch row b sees (dims' key_range: its padding's end). */
static inline int64_t first_key(const accel_k_sdpa_dims *d, int64_t b) {
    return d->key_range ? d->key_range[2 * b] : 0;
}

/* Keys the query block starting at i0 (nq rows) of batch row b needs:
 * [0, kend), kend no further than the row's key_range; 0 when no query of
 * the block sees a key (all of them below the row's first). */
static inline int64_t block_keys(const accel_k_sdpa_dims *d, int64_t b, int64_t i0, int64_t nq) {
    int64_t kend = last_key(d, i0 + nq - 1) + 1;
    if (d->key_range && kend > d->key_range[2 * b + 1]) kend = d->key_range[2 * b + 1];
    return kend > first_key(d, b) ? kend : 0;
}

/* ---- tiles: rows of a tensor as f32 */

/* A tile of `rows` rows of `cols` elements of t, row r at element off + r *
 * stride, as f32 with row stride ld: t's own memory when t is f32 (and,
 * where the GEMMs need `dense` operands, its rows are contiguous), else the
 * caller's scratch (rows x cols, dense). */
typedef struct tile {
    float *p;
    int64_t ld;
} tile;

static bool tile_in_place(const accel_tensor *t, int64_t stride, int64_t cols, bool dense) {
    return t->dtype == ACCEL_F32 && (!dense || stride == cols);
}

static tile tile_at(const accel_tensor *t, int64_t off, int64_t stride, float *scratch, int64_t cols, bool dense) {
    if (tile_in_place(t, stride, cols, dense)) return (tile){(float *)t->data + off, stride};
    return (tile){scratch, cols};
}

static void *elem_ptr(const accel_tensor *t, int64_t off) {
    return (char *)t->data + off * (int64_t)accel_dtype_size(t->dtype);
}

/* tile_at, with the scratch filled from t (read, or read then updated). */
static tile tile_load(const accel_tensor *t, int64_t off, int64_t rows, int64_t cols, int64_t stride, float *scratch,
                      bool dense) {
    tile w = tile_at(t, off, stride, scratch, cols, dense);
    if (w.p == scratch) accel__cpu_to_f32_rows(scratch, elem_ptr(t, off), t->dtype, rows, cols, stride);
    return w;
}

/* A gradient's f32 accumulator tile of t's rows (tile_at): t's values to
 * be added into (tile_load), or where `fresh` (t's old values are not part
 * of the result and are not read) its memory as it is, to be written. */
static tile grad_tile(const accel_tensor *t, int64_t off, int64_t rows, int64_t cols, int64_t stride, float *scratch,
                      bool dense, bool fresh) {
    return fresh ? tile_at(t, off, stride, scratch, cols, dense) : tile_load(t, off, rows, cols, stride, scratch, dense);
}

/* Writes a tile that tile_at gave back into t's rows (stride apart):
 * nothing to do when it is t's own memory, else its dense scratch rows. */
static void tile_store(accel_tensor *t, int64_t off, int64_t rows, int64_t cols, int64_t stride, tile w) {
    if (w.p != (float *)elem_ptr(t, off)) accel__cpu_from_f32_rows(elem_ptr(t, off), t->dtype, w.p, rows, cols, stride);
}

/* Zeroes `rows` rows of `cols` elements of t, stride apart, from off. */
static void rows_zero(accel_tensor *t, int64_t off, int64_t rows, int64_t cols, int64_t stride) {
    size_t es = accel_dtype_size(t->dtype);
    for (int64_t r = 0; r < rows; r++) memset(elem_ptr(t, off + r * stride), 0, (size_t)cols * es);
}

/* Element offset of row i of head h of batch b in a tensor of strides s. */
static inline int64_t row_at(const int64_t s[3], int64_t b, int64_t h, int64_t i) {
    return b * s[0] + h * s[1] + i * s[2];
}

/* Floats of scratch a tile of n elements of t (rows `stride` apart, of
 * `cols`) needs: 0 when t is absent or tile_at uses it in place. */
static int64_t scratch_of(const accel_tensor *t, int64_t n, int64_t stride, int64_t cols, bool dense) {
    return t && !tile_in_place(t, stride, cols, dense) ? n : 0;
}

/* ---- the tile GEMMs and their provider
 *
 * Where oneDNN multiplies the operands' bf16/f16 dtype itself (its units,
 * not f32 panels per call) and the measured choice (below) takes it, all
 * seven tile GEMMs run on it in that dtype with f32 accumulation: the native
 * path. S = Q K^T and dP = dO V^T multiply two tensors of that dtype, and
 * each product of two such values is exact in f32, so they give the f32
 * tiles' values up to the order of the additions; O = P V, dV += P^T dO,
 * dQ = s dS K and dK += s dS^T Q take P and s dS rounded once to the dtype
 * (as PyTorch's CPU flash attention and FlashAttention do), the softmax,
 * its gradient and every accumulator staying f32. Elsewhere the tiles are
 * f32, on OpenBLAS's sgemm or oneDNN's f32 matmul. On oneDNN the GEMMs run
 * only on whole query blocks (Tq and Tk multiples of QB) and with the keys
 * cut into chunks of at most KC, so each is a QB x (64 .. KC) x D(v) GEMM
 * with leading dims fixed per sequence length: oneDNN makes and keeps a primitive per shape and
 * leading dims (~0.1-1 ms of JIT each, in a table of 512 that the linear
 * layers share), and decode's or ragged blocks' shapes, new at every
 * length, would fill it; those stay on OpenBLAS's f32 tiles.
 *
 * The native GEMMs take dense operands and no scale: oneDNN 2.6 runs its
 * brgemm (AMX or AVX512-BF16 tiles, ~3-4 us for a 64 x 256 x 64 product)
 * only then, and gives anything else (rows of a [B, T, H, D] projection
 * H D apart, a chunk of a wider row, an output scale) to gemm:jit, whose
 * bf16 path scales and adds the output in a scalar loop: 20-90 us per tile
 * GEMM measured (ONEDNN_VERBOSE, AMX Xeon), slower than the f32 tiles. So
 * on the native path q, k, v and dO are read in place only where their
 * rows are contiguous (else copied, a head's K and V once for its blocks),
 * the keys-wide operands (S, P, dP, dS of a block) are chunk-major (chunk
 * j, keys [j, j + c), a dense [nq, c] matrix at element nq j), and the
 * scale s goes into the softmax (S) and into dS's rounding. */
enum { KC = 256 };

/* How a call's tile GEMMs run: dt the dtype they multiply (f32: the f32
 * tiles, a bf16/f16 tensor widened a tile at a time; bf16/f16: the native
 * path), on oneDNN or on accel__sgemm. */
typedef struct tiles {
    accel_dtype dt;
    bool dnnl;
} tiles;

static bool native(tiles t) { return t.dt != ACCEL_F32; }

/* The tiles of provider p (accel__gemm_tiles_provider) for operands of dt. */
static tiles tiles_of(accel_dtype dt, int p) {
    if (p == ACCEL__GEMM_PROVIDER_DNNL) return (tiles){dt, true};
    return (tiles){ACCEL_F32, p == ACCEL__GEMM_PROVIDER_DNNL_F32};
}

/* Which dim of a tile GEMM runs over the block's kend keys (cut into KC
 * chunks on oneDNN); the others are the block's nq queries and a head dim n:
 *   KEYS_N  C [nq, kend]  = alpha A [nq, n] B [kend, n]^T        (S, dP)
 *   KEYS_K  C [nq, n]     = alpha A [nq, kend] B [kend, n] + beta C   (O, dQ)
 *   KEYS_M  C [kend, n]   = alpha A [nq, kend]^T B [nq, n] + beta C  (dV, dK) */
typedef enum keys_dim { KEYS_N, KEYS_K, KEYS_M } keys_dim;

/* One of those on t, A and B of dtype t.dt (row strides lda, ldb), C f32
 * (row stride ldc). On the native path the keys-wide operand (C of KEYS_N,
 * A of KEYS_K and KEYS_M) is chunk-major, its row stride unused, alpha is
 * 1 and the others are dense. */
static accel_status tiles_gemm(tiles t, keys_dim kd, int64_t nq, int64_t kend, int64_t n, float alpha, const void *A,
                               int64_t lda, const void *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    size_t es = accel_dtype_size(t.dt);
    int64_t chunk = t.dnnl ? KC : kend;
    for (int64_t j = 0; j < kend; j += chunk) {
        int64_t c = kend - j < chunk ? kend - j : chunk;
        /* the keys-wide operand's chunk: j columns in, or the chunk-major
         * block at nq j; the others' j rows down (B of KEYS_N, KEYS_K; C of
         * KEYS_M) */
        int64_t kw = native(t) ? nq * j : j, ldk = native(t) ? c : kd == KEYS_N ? ldc : lda;
        const char *a = (const char *)A + (size_t)(kd == KEYS_N ? 0 : kw) * es;
        const char *b = (const char *)B + (size_t)(kd == KEYS_M ? 0 : j * ldb) * es;
        int64_t M = kd == KEYS_M ? c : nq, N = kd == KEYS_N ? c : n, K = kd == KEYS_K ? c : kd == KEYS_N ? n : nq;
        float *cj = C + (kd == KEYS_N ? kw : kd == KEYS_M ? j * ldc : 0);
        int64_t la = kd == KEYS_N ? lda : ldk, lc = kd == KEYS_N ? ldk : ldc;
        float bj = kd == KEYS_K && j ? 1.0f : beta; /* O and dQ add the chunks up */
        if (!t.dnnl) {
            accel__sgemm(kd == KEYS_M, kd == KEYS_N, M, N, K, alpha, (const float *)a, la, (const float *)b, ldb, bj,
                         cj, lc);
            continue;
        }
        accel_status st = accel__gemm_on(ACCEL__GEMM_PROVIDER_DNNL, kd == KEYS_M, kd == KEYS_N, M, N, K, alpha, a,
                                         t.dt, la, b, t.dt, ldb, bj, cj, lc);
        if (st != ACCEL_OK) return st;
    }
    return ACCEL_OK;
}

/* The native path's chunk-major keys-wide operands and the f32 rows (row
 * stride ld) the softmax and its gradient work on: nq rows of kend keys. */

/* rows = chunk-major cm. */
static void chunks_to_rows(float *rows, int64_t ld, const float *cm, int64_t nq, int64_t kend) {
    for (int64_t j = 0; j < kend; j += KC) {
        int64_t c = kend - j < KC ? kend - j : KC;
        const float *src = cm + nq * j;
        for (int64_t r = 0; r < nq; r++) memcpy(rows + r * ld + j, src + r * c, (size_t)c * sizeof *rows);
    }
}

/* Floats that n elements of dtype dt take (scratch is counted in floats). */
static int64_t floats_of(accel_dtype dt, int64_t n) {
    return ((int64_t)accel_dtype_size(dt) * n + 3) / 4;
}

/* The first error of a parallel loop (each thread's error state is its
 * own), kept with its message to be raised on the calling thread. */
typedef struct first_error {
    accel_status st;
    char msg[512];
} first_error;

static void keep_error(first_error *e, accel_status st) {
    if (st == ACCEL_OK) return;
#pragma omp critical(accel_sdpa_first_error)
    if (e->st == ACCEL_OK) {
        e->st = st;
        snprintf(e->msg, sizeof e->msg, "%s", accel_last_error());
    }
}

static accel_status raise_error(const first_error *e) {
    return e->st == ACCEL_OK ? ACCEL_OK : accel_set_error(e->st, "%s", e->msg);
}

/* ---- the provider, measured per tile class
 *
 * accel__gemm_tiles_provider chooses among OpenBLAS's f32 tiles, oneDNN's
 * f32 tiles and (bf16/f16) the native path per class (dtype, QB, log2 of
 * Tk, log2 of D, threads) with the measured choice of the large GEMMs
 * (gemm_choice.c: the 10% margin, the cache file, rank 0's table, a
 * checkpoint's). One tile GEMM (2^18 to 2^22 multiply-adds) is far below
 * what a single GEMM is timed from, so a candidate is timed on a batch of
 * the tiles instead, run as the kernels run them: each thread, on its own
 * operands, the seven GEMMs of blocks that see a window of the class's keys
 * (K, V and S of the window's size, leading dims as dense tensors have
 * them), enough blocks for TILE_BATCH_MACS multiply-adds a thread. The
 * tiles' conversions (widening on the f32 tiles, P and dS rounded on the
 * native path; a few % of the op) are not timed.
 *
 * The window is all Tk keys up to WINDOW_KEYS, else the first WINDOW_KEYS:
 * a batch's memory (~5 MB a thread at D = 128) and time stay bounded
 * whatever Tk (a whole row of 128k keys would take ~340 MB a thread, and
 * one block of it 100x the batch's multiply-adds), while the class key
 * (log2 of Tk) still gives long contexts choices of their own. The
 * window's rate per multiply-add stands for the whole row's: on oneDNN a
 * row is cut into KC-key chunks anyway, and the window runs the same
 * QB x KC x D(v) GEMMs (whole chunks: WINDOW_KEYS is a multiple of KC),
 * Tk / WINDOW_KEYS times fewer of them; on OpenBLAS one GEMM runs over the
 * row, sgemm packing K, V, P and dS a panel at a time, and the window packs
 * the same panels, its extra packings of the QB-row operands (QB x D each,
 * under 0.1% of the multiply-adds) aside. What differs is where the
 * operands come from: the window's K and V stay in cache where a long row
 * streams them from memory, but each key loaded feeds QB multiply-adds,
 * which keeps the tiles compute-bound on either provider; and S's row
 * stride is the window's, not Tk. */
enum { TILE_BATCH_MACS = 1 << 26, WINDOW_KEYS = 8 * KC };

/* A tile class's batch: operands zeroed at the first run, each thread's
 * [QB, D] Q, [keys, D] K, [keys, Dv] V, [QB, Dv] dO and [QB, keys] P
 * (f32-sized to hold either dtype), then f32 S, O, dQ, dK, dV; keys the
 * window (at most WINDOW_KEYS). mem is the library allocator's
 * (accel_calloc), freed by the caller. */
typedef struct tile_batch {
    accel_dtype dt;
    int64_t keys, D, Dv;
    int nt;
    float *mem;
} tile_batch;

static int64_t batch_floats(const tile_batch *b) {
    int64_t ops = QB * b->D + b->keys * b->D + b->keys * b->Dv + QB * b->Dv + QB * b->keys;
    return 2 * ops; /* the outputs: S as large as P, O as dO, dQ as Q, dK as K, dV as V */
}

/* One thread's blocks of the batch on t, from its memory m. */
static accel_status batch_blocks(const tile_batch *b, tiles t, float *m) {
    int64_t D = b->D, Dv = b->Dv, W = b->keys, es = (int64_t)accel_dtype_size(t.dt);
    char *q = (char *)m, *k = q + QB * D * es, *v = k + W * D * es, *g = v + W * Dv * es, *p = g + QB * Dv * es;
    float *s = m + QB * D + W * D + W * Dv + QB * Dv + QB * W, *o = s + QB * W, *dq = o + QB * Dv, *dk = dq + QB * D,
          *dv = dk + W * D;
    int64_t macs = QB * W * (4 * D + 3 * Dv), blocks = TILE_BATCH_MACS / macs > 1 ? TILE_BATCH_MACS / macs : 1;
    accel_status st = ACCEL_OK;
    for (int64_t r = 0; r < blocks && st == ACCEL_OK; r++) {
        st = tiles_gemm(t, KEYS_N, QB, W, D, 1.0f, q, D, k, D, 0.0f, s, W);
        if (st == ACCEL_OK) st = tiles_gemm(t, KEYS_K, QB, W, Dv, 1.0f, p, W, v, Dv, 0.0f, o, Dv);
        /* the backward's: S again, then the five of its gradients */
        if (st == ACCEL_OK) st = tiles_gemm(t, KEYS_N, QB, W, D, 1.0f, q, D, k, D, 0.0f, s, W);
        if (st == ACCEL_OK) st = tiles_gemm(t, KEYS_M, QB, W, Dv, 1.0f, p, W, g, Dv, 1.0f, dv, Dv);
        if (st == ACCEL_OK) st = tiles_gemm(t, KEYS_N, QB, W, Dv, 1.0f, g, Dv, v, Dv, 0.0f, s, W);
        if (st == ACCEL_OK) st = tiles_gemm(t, KEYS_K, QB, W, D, 1.0f, p, W, k, D, 0.0f, dq, D);
        if (st == ACCEL_OK) st = tiles_gemm(t, KEYS_M, QB, W, D, 1.0f, p, W, q, D, 1.0f, dk, D);
    }
    return st;
}

/* accel__gemm_run: the batch once on provider p; false with the error set
 * (no memory for the batch: the timing fails, the op goes on, gemm.h). */
static bool batch_run(void *ctx, int p) {
    tile_batch *b = ctx;
    int64_t per = batch_floats(b);
    if (!b->mem) b->mem = accel_calloc((size_t)(b->nt * per), sizeof(float));
    if (!b->mem) return false;
    tiles t = tiles_of(b->dt, p);
    first_error err = {ACCEL_OK, ""};
    if (b->nt > 1) {
        accel__blas_single_thread();
#pragma omp parallel num_threads(b->nt)
        keep_error(&err, batch_blocks(b, t, b->mem + omp_get_thread_num() * per));
    } else {
        keep_error(&err, batch_blocks(b, t, b->mem));
    }
    return raise_error(&err) == ACCEL_OK;
}

/* The provider of the tile GEMMs of these dims, operands of dt (their
 * common dtype, else f32): the class's measured choice (`force`: measured
 * again), OpenBLAS for ragged blocks; -1 with the error set. */
static int tiles_provider(accel_dtype dt, const accel_k_sdpa_dims *d, bool force) {
    if (d->Tq <= 0 || d->Tk <= 0 || d->Tq % QB || d->Tk % QB) return ACCEL__GEMM_PROVIDER_OPENBLAS;
    int64_t keys = d->Tk < WINDOW_KEYS ? d->Tk : WINDOW_KEYS;
    tile_batch b = {dt, keys, d->D, d->Dv, accel_num_threads(), NULL};
    /* batch_floats in double: a tile class of a hand-edited cache file
     * (`accel env --measure-gemm`) can name dims whose batch no address
     * space holds (2^47 bytes: x86-64's), where the int64 sizes overflow */
    double floats = 2.0 * (((double)QB + (double)keys) * ((double)d->D + (double)d->Dv) + (double)QB * (double)keys);
    if (floats * b.nt * sizeof(float) > 0x1p47) {
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "attention tiles of %lld keys (timed on %lld), head dims %lld and %lld: their timing batch "
                        "(%d threads) fits in no memory",
                        (long long)d->Tk, (long long)keys, (long long)d->D, (long long)d->Dv, b.nt);
        return -1;
    }
    int p = accel__gemm_tiles_provider(dt, QB, d->Tk, d->D, force, batch_run, &b);
    accel_free(b.mem);
    return p;
}

int accel__cpu_sdpa_provider(accel_dtype dt, const accel_k_sdpa_dims *d) { return tiles_provider(dt, d, false); }

bool accel__cpu_sdpa_native(accel_dtype dt, const accel_k_sdpa_dims *d) {
    return dt != ACCEL_F32 && tiles_provider(dt, d, false) == ACCEL__GEMM_PROVIDER_DNNL;
}

int accel__cpu_sdpa_measure(accel_dtype dt, int64_t Tk, int64_t D) {
    accel_k_sdpa_dims d = {.Tq = QB, .Tk = (Tk + QB - 1) / QB * QB, .D = D, .Dv = D};
    return tiles_provider(dt, &d, true);
}

/* The tiles of a call whose operands are t[0..n). */
static accel_status call_tiles(const accel_tensor *const *t, int n, const accel_k_sdpa_dims *d, tiles *out) {
    accel_dtype dt = t[0]->dtype;
    for (int i = 1; i < n; i++)
        if (t[i]->dtype != dt) dt = ACCEL_F32;
    int p = tiles_provider(dt, d, false);
    if (p < 0) return accel_last_status();
    *out = tiles_of(dt, p);
    return ACCEL_OK;
}

/* ---- forward */

/* The rows' block (attention_rows.c) of the nq score rows of query block
 * i0 of batch row b over keys [0, kend), scaled by scale; with lp their
 * rounding to dt. */
static accel__score_block score_block(const accel_k_sdpa_dims *d, int64_t b, int64_t i0, int64_t nq, int64_t kend,
                                      float scale, void *lp, accel_dtype dt) {
    const int32_t *starts = d->key_start ? d->key_start + b * d->Tq + i0 : NULL;
    return (accel__score_block){.rows = nq, .kend = kend, .n0 = i0 + d->Tk - d->Tq + 1, .k0 = first_key(d, b),
                                .starts = starts, .causal = d->causal, .scale = scale, .lp = lp, .dt = dt, .chunk = KC};
}

/* `floats` floats of a thread's scratch at base (64-byte pieces), the
 * pieces counted in *used; NULL for none or when only counting (base NULL). */
static float *carve(float *base, int64_t *used, int64_t floats) {
    float *p = base && floats ? base + *used : NULL;
    *used += (floats + 15) / 16 * 16;
    return p;
}

/* Scratch for rows x cols = n elements of operand x (rows `stride` apart)
 * as the tile GEMMs read it: on the f32 tiles its widening unless it is
 * f32, on the native path its dense copy unless its rows are contiguous. */
static int64_t operand_scratch(tiles t, const accel_tensor *x, int64_t n, int64_t stride, int64_t cols) {
    if (!native(t)) return scratch_of(x, n, stride, cols, false);
    return x && stride != cols ? floats_of(x->dtype, n) : 0;
}

/* A tile GEMM operand: its first element and its row stride. */
typedef struct operand {
    const void *p;
    int64_t ld;
} operand;

/* rows rows of cols elements of x from off, stride apart, as the tile GEMMs
 * read them (operand_scratch): an f32 tile, or on the native path x's rows,
 * copied dense when they are not. */
static operand tile_operand(tiles t, const accel_tensor *x, int64_t off, int64_t rows, int64_t cols, int64_t stride,
                            float *scratch) {
    if (!native(t)) {
        tile w = tile_load(x, off, rows, cols, stride, scratch, false);
        return (operand){w.p, w.ld};
    }
    if (stride == cols) return (operand){elem_ptr(x, off), cols};
    accel__cpu_copy_rows(scratch, elem_ptr(x, off), x->dtype, rows, cols, stride);
    return (operand){scratch, cols};
}

/* One thread's scratch of the forward: the head's K [Tk, D] and V
 * [Tk, Dv] and a block's Q [QB, D] as operand_scratch says, a block's O
 * [QB, Dv] where it is not written in place, its P [QB, Tk] (f32 rows);
 * on the native path also its S [QB, Tk] (f32) and P rounded to lp
 * [QB, Tk], chunk-major. */
typedef struct fwd_scratch {
    float *k, *v, *q, *o, *pr, *sc;
    void *pl;
} fwd_scratch;

/* The scratch's floats, its pieces set from base (NULL: counted only). */
static int64_t fwd_scratch_at(const accel_k_sdpa *a, tiles t, float *base, fwd_scratch *s) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t n = 0, keys = native(t) ? QB * d->Tk : 0;
    s->k = carve(base, &n, operand_scratch(t, a->k, d->Tk * d->D, d->ks[2], d->D));
    s->v = carve(base, &n, operand_scratch(t, a->v, d->Tk * d->Dv, d->vs[2], d->Dv));
    s->q = carve(base, &n, operand_scratch(t, a->q, QB * d->D, d->qs[2], d->D));
    s->o = carve(base, &n, scratch_of(a->o, QB * d->Dv, d->os[2], d->Dv, native(t)));
    s->pr = carve(base, &n, QB * d->Tk);
    s->sc = carve(base, &n, keys);
    s->pl = carve(base, &n, floats_of(t.dt, keys));
    return n;
}

/* The keys and values of one kv head as the tile GEMMs read them. */
typedef struct kv_head {
    const void *k, *v;
    int64_t ldk, ldv;
} kv_head;

/* The kv head at elements koff of k and voff of v, rows ks and vs apart. */
static kv_head kv_load(tiles t, const accel_tensor *k, int64_t koff, int64_t ks, const accel_tensor *v, int64_t voff,
                       int64_t vs, const accel_k_sdpa_dims *d, float *kscratch, float *vscratch) {
    operand kh = tile_operand(t, k, koff, d->Tk, d->D, ks, kscratch);
    operand vh = tile_operand(t, v, voff, d->Tk, d->Dv, vs, vscratch);
    return (kv_head){kh.p, vh.p, kh.ld, vh.ld};
}

/* The probabilities P [nq, kend] (f32 rows kend apart, into pr) of the
 * query block i0 whose queries are q, keys [0, kend): S = Q K^T (scaled by
 * the GEMM's alpha on the f32 tiles; on the native path chunk-major into sc,
 * the scale in the softmax), then the masked softmax with its lse
 * (forward), or P again from lse (`recompute`: the backward's, the same
 * GEMM on the same operands giving the forward's S). On the native path P
 * also rounded to t.dt, chunk-major, into lp for the GEMMs that take it
 * (the forward's pr rows then hold the unnormalised exponentials). */
static accel_status block_probs(const accel_k_sdpa_dims *d, tiles t, int64_t b, int64_t i0, int64_t nq, int64_t kend,
                                operand q,
                                const kv_head *kv, float *sc, float *pr, void *lp, float *lse, bool recompute) {
    float *rows = pr, scale = 1.0f;
    accel_status st;
    if (native(t)) { /* its rows are sc itself when it is one chunk */
        st = tiles_gemm(t, KEYS_N, nq, kend, d->D, 1.0f, q.p, q.ld, kv->k, kv->ldk, 0.0f, sc, 0);
        if (st != ACCEL_OK) return st;
        if (kend <= KC) rows = sc;
        else chunks_to_rows(pr, kend, sc, nq, kend);
        scale = d->scale;
    } else {
        st = tiles_gemm(t, KEYS_N, nq, kend, d->D, d->scale, q.p, q.ld, kv->k, kv->ldk, 0.0f, pr, kend);
        if (st != ACCEL_OK) return st;
    }
    accel__score_block sb = score_block(d, b, i0, nq, kend, scale, native(t) ? lp : NULL, t.dt);
    if (recompute) accel__cpu_probs_rows(&sb, pr, kend, rows, kend, lse);
    else accel__cpu_softmax_rows(&sb, pr, kend, rows, kend, lse);
    return ACCEL_OK;
}

/* P = softmax(s Q K^T) with its lse (nq rows from lse) and O = P V for the
 * query block at element qoff of q (batch row b), nq rows, keys [0, kend). */
static accel_status block_forward(const accel_k_sdpa *a, tiles t, int64_t b, int64_t i0, int64_t nq, int64_t kend,
                                  int64_t qoff, const kv_head *kv, float *lse, tile ob, fwd_scratch s) {
    const accel_k_sdpa_dims *d = &a->dims;
    operand q = tile_operand(t, a->q, qoff, nq, d->D, d->qs[2], s.q);
    accel_status st = block_probs(d, t, b, i0, nq, kend, q, kv, s.sc, s.pr, s.pl, lse, false);
    if (st != ACCEL_OK) return st;
    return tiles_gemm(t, KEYS_K, nq, kend, d->Dv, 1.0f, native(t) ? s.pl : s.pr, kend, kv->v, kv->ldv, 0.0f, ob.p,
                      ob.ld);
}

/* One (batch, head) bh on its kv head: lse [Tq] and O [Tq, Dv]. */
static accel_status head_forward(const accel_k_sdpa *a, tiles t, int64_t bh, const kv_head *kv, fwd_scratch s) {
    const accel_k_sdpa_dims *d = &a->dims;
    float *lh = (float *)a->lse->data + bh * d->Tq;
    int64_t b = bh / d->H, h = bh % d->H;
    for (int64_t i0 = 0; i0 < d->Tq; i0 += QB) {
        int64_t nq = d->Tq - i0 < QB ? d->Tq - i0 : QB, kend = block_keys(d, b, i0, nq);
        int64_t qoff = row_at(d->qs, b, h, i0), ooff = row_at(d->os, b, h, i0);
        if (kend <= 0) { /* no query of the block sees a key */
            rows_zero(a->o, ooff, nq, d->Dv, d->os[2]);
            for (int64_t r = 0; r < nq; r++) lh[i0 + r] = -INFINITY;
            continue;
        }
        tile ob = tile_at(a->o, ooff, d->os[2], s.o, d->Dv, native(t));
        accel_status st = block_forward(a, t, b, i0, nq, kend, qoff, kv, lh + i0, ob, s);
        if (st != ACCEL_OK) return st;
        tile_store(a->o, ooff, nq, d->Dv, d->os[2], ob);
    }
    return ACCEL_OK;
}

/* Query heads [bh0, bh0 + n) of one kv head: its K and V are read once for
 * all n (kv_load). */
static accel_status heads_forward(const accel_k_sdpa *a, tiles t, int64_t bh0, int64_t n, fwd_scratch s) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t b = bh0 / d->H, hk = bh0 % d->H / (d->H / d->Hkv);
    kv_head kv = kv_load(t, a->k, row_at(d->ks, b, hk, 0), d->ks[2], a->v, row_at(d->vs, b, hk, 0), d->vs[2], d, s.k,
                         s.v);
    for (int64_t i = 0; i < n; i++) {
        accel_status st = head_forward(a, t, bh0 + i, &kv, s);
        if (st != ACCEL_OK) return st;
    }
    return ACCEL_OK;
}

/* t (n elements, contiguous) as f32: t's memory, or an arena conversion. */
static float *whole_f32(const accel_tensor *t, int64_t n) {
    if (t->dtype == ACCEL_F32) return t->data;
    float *c = accel_arena_alloc(accel_step_arena(), (size_t)(n + 1) * sizeof(float), 64);
    if (c) accel__cpu_to_f32(c, t->data, t->dtype, n);
    return c;
}

/* The reference: one query row at a time, double accumulation, on dense f32
 * q, k, v (the op hands the reference dense tensors). */
static void sdpa_reference(const accel_k_sdpa_dims *d, const float *q, const float *k, const float *v, float *lse,
                           float *o, double *sc) {
    for (int64_t bh = 0; bh < d->B * d->H; bh++) {
        int64_t b = bh / d->H, h = bh % d->H, kvh = b * d->Hkv + h / (d->H / d->Hkv);
        for (int64_t i = 0; i < d->Tq; i++) {
            const float *qi = q + (bh * d->Tq + i) * d->D;
            float *oi = o + (bh * d->Tq + i) * d->Dv;
            int64_t L = last_key(d, i), j0 = first_key(d, b);
            if (d->key_start && d->key_start[b * d->Tq + i] > j0) j0 = d->key_start[b * d->Tq + i];
            if (d->key_range && L >= d->key_range[2 * b + 1]) L = d->key_range[2 * b + 1] - 1;
            double m = -INFINITY, s = 0.0;
            for (int64_t j = j0; j <= L; j++) {
                const float *kj = k + (kvh * d->Tk + j) * d->D;
                double dot = 0.0;
                for (int64_t e = 0; e < d->D; e++) dot += (double)qi[e] * kj[e];
                sc[j] = dot * d->scale;
                m = fmax(m, sc[j]);
            }
            for (int64_t j = j0; j <= L; j++) s += exp(sc[j] - m);
            for (int64_t j = j0; j <= L; j++) sc[j] = exp(sc[j] - m) / s;
            for (int64_t e = 0; e < d->Dv; e++) {
                double acc = 0.0;
                for (int64_t j = j0; j <= L; j++) acc += sc[j] * v[(kvh * d->Tk + j) * d->Dv + e];
                oi[e] = (float)acc;
            }
            lse[bh * d->Tq + i] = L < j0 ? -INFINITY : (float)(m + log(s));
        }
    }
}

/* The reference on dense q, k, v; o dense or at any strides that fit (the
 * context-parallel op's blocks write their rows of the whole output in
 * place), written from a dense f32 result. */
static accel_status reference_forward(const accel_k_sdpa *a) {
    const accel_k_sdpa_dims *d = &a->dims;
    accel_k_sdpa_dims dense = *d;
    accel_k_sdpa_dense(&dense);
    if (memcmp(dense.qs, d->qs, sizeof d->qs) || memcmp(dense.ks, d->ks, sizeof d->ks) ||
        memcmp(dense.vs, d->vs, sizeof d->vs))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "sdpa: the reference kernels take dense q, k and v");
    bool o_dense = !memcmp(dense.os, d->os, sizeof d->os);
    int64_t nq = d->B * d->H * d->Tq, nkv = d->B * d->Hkv * d->Tk;
    const float *q = whole_f32(a->q, nq * d->D), *k = whole_f32(a->k, nkv * d->D), *v = whole_f32(a->v, nkv * d->Dv);
    float *o = a->o->dtype == ACCEL_F32 && o_dense
                   ? a->o->data
                   : accel_arena_alloc(accel_step_arena(), (size_t)(nq * d->Dv + 1) * sizeof(float), 64);
    double *sc = accel_arena_alloc(accel_step_arena(), (size_t)(d->Tk + 1) * sizeof(double), 64);
    if (!q || !k || !v || !o || !sc) return accel_last_status();
    sdpa_reference(d, q, k, v, a->lse->data, o, sc);
    if (o == a->o->data) return ACCEL_OK;
    for (int64_t bh = 0; bh < d->B * d->H; bh++)
        accel__cpu_from_f32_rows(elem_ptr(a->o, row_at(d->os, bh / d->H, bh % d->H, 0)), a->o->dtype,
                                 o + bh * d->Tq * d->Dv, d->Tq, d->Dv, d->os[2]);
    return ACCEL_OK;
}

/* ---- backward */

/* delta_r = dO_r . O_r (f32 sums) for the block's nq rows: rowsum(dP P)
 * computed from the output as stored, as FlashAttention and PyTorch's
 * flash attention do (and the GPU kernels: the two backends agree), Dv
 * products a row where the row sum over P takes kend. go: dO's rows as the
 * tile GEMMs read them (f32, or the native path's dtype). */
static void row_deltas(const accel_k_sdpa_backward *a, tiles t, operand go, int64_t ooff, int64_t nq, float *delta) {
    const accel_k_sdpa_dims *d = &a->dims;
    accel__cpu_dot_rows(delta, go.p, native(t) ? t.dt : ACCEL_F32, go.ld, elem_ptr(a->o, ooff), a->o->dtype, d->os[2],
                        nq, d->Dv);
}

/* One thread's scratch of the backward: the block's P, recomputed, and dP
 * (on the f32 tiles, and on the native path where a row spans chunks), f32
 * rows [QB, Tk]; its rows' deltas [QB]; the kv head's dK, dV [Tk, D(v)]
 * and a block's dQ [QB, D] where they are not accumulated in place; the kv
 * head's K, V [Tk, D(v)] and a block's Q, dO [QB, D(v)] as operand_scratch
 * says; on the native path also a block's
 * S and dP as their GEMMs write them (f32) and P, then s dS, rounded to lp,
 * both chunk-major [QB, Tk]. */
typedef struct bwd_scratch {
    float *pr, *dp, *k, *v, *dk, *dv, *q, *g, *dq, *sc, *delta;
    void *pl;
} bwd_scratch;

/* The scratch's floats, its pieces set from base (NULL: counted only). */
static int64_t bwd_scratch_at(const accel_k_sdpa_backward *a, tiles t, float *base, bwd_scratch *s) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t kd = d->Tk * d->D, kv = d->Tk * d->Dv, n = 0, keys = native(t) ? QB * d->Tk : 0;
    bool dense = native(t);
    s->pr = carve(base, &n, QB * d->Tk);
    s->dp = carve(base, &n, !native(t) || d->Tk > KC ? QB * d->Tk : 0);
    s->dk = carve(base, &n, scratch_of(a->dk, kd, a->dks[2], d->D, dense));
    s->dv = carve(base, &n, scratch_of(a->dv, kv, a->dvs[2], d->Dv, dense));
    s->dq = carve(base, &n, scratch_of(a->dq, QB * d->D, a->dqs[2], d->D, dense));
    s->k = carve(base, &n, operand_scratch(t, a->k, kd, d->ks[2], d->D));
    s->v = carve(base, &n, operand_scratch(t, a->v, kv, d->vs[2], d->Dv));
    s->q = carve(base, &n, operand_scratch(t, a->q, QB * d->D, d->qs[2], d->D));
    s->g = carve(base, &n, operand_scratch(t, a->g, QB * d->Dv, a->gs[2], d->Dv));
    s->delta = carve(base, &n, QB);
    s->sc = carve(base, &n, keys);
    s->pl = carve(base, &n, floats_of(t.dt, keys));
    return n;
}

/* A kv head's gradient accumulators, f32: dK and dV [Tk, D(v)]. Fresh
 * ones (grad_tile) hold values in keys [0, written) only, and their
 * GEMMs write (beta 0) until the first block has: the blocks run last
 * first (kv_backward), and the last block's keys reach furthest, so the
 * first write covers every key a later block adds into, and the keys no
 * query sees are zeroed at the end. Zeroing the whole tiles first took a
 * pass over them per kv head (3% of the f32 backward, one thread). */
typedef struct kv_grads {
    tile dkh, dvh;
    float beta;
    int64_t written;
} kv_grads;

/* After a block's dK and dV GEMMs over keys [0, kend). */
static void kv_grads_wrote(kv_grads *gr, int64_t kend) {
    if (gr->beta != 0.0f) return;
    gr->beta = 1.0f;
    gr->written = kend;
}

/* The gradients of query block i0 (nq rows) of head bh: P again from the
 * forward's lse, then on the native path (nq = QB) P and s dS rounded to
 * t.dt, chunk-major, for the GEMMs that take them. */
static accel_status block_backward(const accel_k_sdpa_backward *a, tiles t, int64_t bh, int64_t i0, int64_t nq,
                                   const kv_head *kv, kv_grads *gr, const bwd_scratch *s) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t b = bh / d->H, h = bh % d->H, kend = block_keys(d, b, i0, nq), dqoff = row_at(a->dqs, b, h, i0);
    if (kend <= 0) { /* no key: dQ is zero, nothing reaches dK, dV */
        if (a->dq && a->dq_beta == 0.0f) rows_zero(a->dq, dqoff, nq, d->D, a->dqs[2]);
        return ACCEL_OK;
    }
    /* O's rows for the deltas, asked of the cache now (rows apart in the
     * [B, Tq, H, Dv] layout each waited on memory) */
    int64_t ooff = row_at(d->os, b, h, i0);
    for (int64_t r = 0; r < nq; r++) {
        const char *orow = elem_ptr(a->o, ooff + r * d->os[2]);
        for (size_t at = 0; at < (size_t)d->Dv * accel_dtype_size(a->o->dtype); at += 64) __builtin_prefetch(orow + at);
    }
    operand q = tile_operand(t, a->q, row_at(d->qs, b, h, i0), nq, d->D, d->qs[2], s->q);
    /* P rounded (native path) only for dV's GEMM */
    accel_status st = block_probs(d, t, b, i0, nq, kend, q, kv, s->sc, s->pr, a->dv ? s->pl : NULL,
                                  (float *)a->lse->data + bh * d->Tq + i0, true);
    if (st != ACCEL_OK) return st;
    const float *pb = s->pr;
    operand go = tile_operand(t, a->g, row_at(a->gs, b, h, i0), nq, d->Dv, a->gs[2], s->g);
    if (a->dv) /* dV[0:kend] += P^T dO */
        st = tiles_gemm(t, KEYS_M, nq, kend, d->Dv, 1.0f, native(t) ? s->pl : pb, kend, go.p, go.ld, gr->beta, gr->dvh.p,
                        gr->dvh.ld);
    if (st != ACCEL_OK || (!a->dq && !a->dk)) {
        kv_grads_wrote(gr, kend);
        return st;
    }
    /* dP = dO V^T, then dS in its rows: on the native path the GEMM's
     * chunk-major dP, already rows when it is one chunk */
    float *dp = s->dp;
    int64_t ldp = d->Tk;
    if (native(t)) {
        st = tiles_gemm(t, KEYS_N, nq, kend, d->Dv, 1.0f, go.p, go.ld, kv->v, kv->ldv, 0.0f, s->sc, 0);
        if (kend <= KC) dp = s->sc, ldp = kend;
        else if (st == ACCEL_OK) chunks_to_rows(dp, ldp, s->sc, nq, kend);
    } else {
        st = tiles_gemm(t, KEYS_N, nq, kend, d->Dv, 1.0f, go.p, go.ld, kv->v, kv->ldv, 0.0f, dp, ldp);
    }
    if (st != ACCEL_OK) return st;
    /* the scale: in dS before its rounding on the native path, the GEMMs' alpha on the f32 tiles */
    float alpha = native(t) ? 1.0f : d->scale;
    row_deltas(a, t, go, ooff, nq, s->delta);
    /* dS = scale P (dP - delta) in dP's rows, rounded (native path) for dQ's and dK's GEMMs */
    accel__score_block sb =
        score_block(d, b, i0, nq, kend, native(t) ? d->scale : 1.0f, native(t) ? s->pl : NULL, t.dt);
    accel__cpu_softmax_grad_rows(&sb, pb, kend, dp, ldp, s->delta);
    const void *ds = native(t) ? s->pl : dp;
    if (a->dq) { /* dQ = s dS K (+ dQ) */
        int64_t ld = a->dqs[2];
        tile dqb = a->dq_beta != 0.0f ? tile_load(a->dq, dqoff, nq, d->D, ld, s->dq, native(t))
                                      : tile_at(a->dq, dqoff, ld, s->dq, d->D, native(t));
        st = tiles_gemm(t, KEYS_K, nq, kend, d->D, alpha, ds, ldp, kv->k, kv->ldk, a->dq_beta, dqb.p, dqb.ld);
        if (st != ACCEL_OK) return st;
        tile_store(a->dq, dqoff, nq, d->D, ld, dqb);
    }
    if (a->dk) /* dK[0:kend] += s dS^T Q */
        st = tiles_gemm(t, KEYS_M, nq, kend, d->D, alpha, ds, ldp, q.p, q.ld, gr->beta, gr->dkh.p, gr->dkh.ld);
    kv_grads_wrote(gr, kend);
    return st;
}

/* The gradients of the G query heads of kv head `kvb` (= b * Hkv + kv), block
 * by block of queries, the last first (kv_grads). dK and dV of the kv head
 * are accumulated in f32 over the G heads and written once; K and V are
 * read once (kv_load). */
static accel_status kv_backward(const accel_k_sdpa_backward *a, tiles t, int64_t kvb, const bwd_scratch *s) {
    const accel_k_sdpa_dims *d = &a->dims;
    int64_t G = d->H / d->Hkv, b = kvb / d->Hkv, kv = kvb % d->Hkv;
    int64_t dkoff = row_at(a->dks, b, kv, 0), dvoff = row_at(a->dvs, b, kv, 0);
    kv_head kvh = kv_load(t, a->k, row_at(d->ks, b, kv, 0), d->ks[2], a->v, row_at(d->vs, b, kv, 0), d->vs[2], d, s->k,
                          s->v);
    bool fresh = a->dkv_overwrite;
    kv_grads gr = {{NULL, d->D}, {NULL, d->Dv}, fresh ? 0.0f : 1.0f, fresh ? 0 : d->Tk};
    if (a->dk) gr.dkh = grad_tile(a->dk, dkoff, d->Tk, d->D, a->dks[2], s->dk, native(t), fresh);
    if (a->dv) gr.dvh = grad_tile(a->dv, dvoff, d->Tk, d->Dv, a->dvs[2], s->dv, native(t), fresh);
    accel_status st = ACCEL_OK;
    int64_t last = d->Tq > 0 ? (d->Tq - 1) / QB * QB : -1; /* the last block's first query */
    for (int64_t gi = 0; gi < G && st == ACCEL_OK; gi++)
        for (int64_t i0 = last; i0 >= 0 && st == ACCEL_OK; i0 -= QB)
            st = block_backward(a, t, b * d->H + kv * G + gi, i0, d->Tq - i0 < QB ? d->Tq - i0 : QB, &kvh, &gr, s);
    if (st != ACCEL_OK) return st;
    for (int64_t r = gr.written; r < d->Tk; r++) { /* keys no query saw */
        if (a->dk) memset(gr.dkh.p + r * gr.dkh.ld, 0, (size_t)d->D * sizeof(float));
        if (a->dv) memset(gr.dvh.p + r * gr.dvh.ld, 0, (size_t)d->Dv * sizeof(float));
    }
    if (a->dk) tile_store(a->dk, dkoff, d->Tk, d->D, a->dks[2], gr.dkh);
    if (a->dv) tile_store(a->dv, dvoff, d->Tk, d->Dv, a->dvs[2], gr.dvh);
    return ACCEL_OK;
}

/* The strides s of `what` fit the kernels: none negative, rows of n
 * elements at least a row apart (the tile GEMMs' leading dims). */
static bool rows_fit(const char *op, const char *what, const int64_t s[3], int64_t n) {
    if (s[0] >= 0 && s[1] >= 0 && s[2] >= n) return true;
    accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s's strides (%lld, %lld, %lld) do not fit rows of %lld elements", op,
                    what, (long long)s[0], (long long)s[1], (long long)s[2], (long long)n);
    return false;
}

static bool fwd_strides_fit(const accel_k_sdpa_dims *d) {
    return rows_fit("sdpa", "q", d->qs, d->D) && rows_fit("sdpa", "k", d->ks, d->D) &&
           rows_fit("sdpa", "v", d->vs, d->Dv) && rows_fit("sdpa", "o", d->os, d->Dv);
}

/* Heads run in parallel (one serial sgemm per block) when there are enough of
 * them to keep the threads busy; otherwise one after another on the
 * multi-threaded GEMM. */
static bool heads_parallel(int64_t n_heads) { return n_heads >= 2 * accel_num_threads(); }

/* Per-thread scratch of `floats` floats for nt threads (one spare float so
 * that none is a zero-size allocation). */
static float *thread_scratch(int nt, int64_t floats) {
    return accel_arena_alloc(accel_step_arena(), (size_t)(nt * floats + 1) * sizeof(float), 64);
}

accel_status accel__cpuk_sdpa(accel_k_sdpa *k) {
    const accel_k_sdpa_dims *d = &k->dims;
    if (!fwd_strides_fit(d)) return accel_last_status();
    if (accel_reference_kernels()) return reference_forward(k);
    /* A unit of work is the G query heads of a kv head (its K and V read
     * once), or one query head when too few kv heads would keep the
     * threads busy and enough query heads would. */
    const accel_tensor *ops[3] = {k->q, k->k, k->v};
    tiles t;
    accel_status st = call_tiles(ops, 3, d, &t);
    if (st != ACCEL_OK) return st;
    fwd_scratch fs;
    int64_t G = d->H / d->Hkv, per = fwd_scratch_at(k, t, NULL, &fs);
    int64_t heads = heads_parallel(d->B * d->Hkv) || !heads_parallel(d->B * d->H) ? G : 1;
    int64_t units = d->B * d->H / heads;
    bool par = heads_parallel(units);
    int nt = par ? accel_num_threads() : 1;
    float *scratch = thread_scratch(nt, per);
    if (!scratch) return accel_last_status();
    first_error err = {ACCEL_OK, ""};
    if (par) {
        accel__blas_single_thread();
#pragma omp parallel for num_threads(nt) schedule(dynamic)
        for (int64_t i = 0; i < units; i++) {
            fwd_scratch ts;
            fwd_scratch_at(k, t, scratch + omp_get_thread_num() * per, &ts);
            keep_error(&err, heads_forward(k, t, i * heads, heads, ts));
        }
    } else {
        fwd_scratch_at(k, t, scratch, &fs);
        for (int64_t i = 0; i < units && err.st == ACCEL_OK; i++)
            keep_error(&err, heads_forward(k, t, i * heads, heads, fs));
    }
    return raise_error(&err);
}

accel_status accel__cpuk_sdpa_backward(accel_k_sdpa_backward *k) {
    const accel_k_sdpa_dims *d = &k->dims;
    static const char *OP = "sdpa backward";
    if (!k->o || !k->lse)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: the forward's o and lse are required", OP);
    if (!rows_fit(OP, "q", d->qs, d->D) || !rows_fit(OP, "k", d->ks, d->D) || !rows_fit(OP, "v", d->vs, d->Dv) ||
        !rows_fit(OP, "o", d->os, d->Dv) || !rows_fit(OP, "g", k->gs, d->Dv) ||
        (k->dq && !rows_fit(OP, "dq", k->dqs, d->D)) || (k->dk && !rows_fit(OP, "dk", k->dks, d->D)) ||
        (k->dv && !rows_fit(OP, "dv", k->dvs, d->Dv)))
        return accel_last_status();
    const accel_tensor *ops[4] = {k->g, k->q, k->k, k->v};
    tiles t;
    accel_status st = call_tiles(ops, 4, d, &t);
    if (st != ACCEL_OK) return st;
    bwd_scratch s;
    int64_t nkv = d->B * d->Hkv, per = bwd_scratch_at(k, t, NULL, &s);
    bool par = heads_parallel(nkv);
    int nt = par ? accel_num_threads() : 1;
    float *scratch = thread_scratch(nt, per);
    if (!scratch) return accel_last_status();
    first_error err = {ACCEL_OK, ""};
    if (par) {
        accel__blas_single_thread();
#pragma omp parallel for num_threads(nt) schedule(dynamic)
        for (int64_t i = 0; i < nkv; i++) {
            bwd_scratch ts;
            bwd_scratch_at(k, t, scratch + omp_get_thread_num() * per, &ts);
            keep_error(&err, kv_backward(k, t, i, &ts));
        }
    } else {
        bwd_scratch_at(k, t, scratch, &s);
        for (int64_t i = 0; i < nkv && err.st == ACCEL_OK; i++) keep_error(&err, kv_backward(k, t, i, &s));
    }
    return raise_error(&err);
}
