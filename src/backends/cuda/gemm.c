/* GEMM through cuBLASLt: bf16/f16 operands on tensor cores and f32
 * operands, f32 accumulation, an f32 C or one of the operands' bf16/f16
 * (the table's contract; backend.h: gemm_c16), with the optional bias as
 * cuBLASLt's bias epilogue. ACCEL_ALLOW_TF32=1 in the
 * environment lets f32 GEMMs use TF32 tensor cores (PyTorch's
 * torch.backends.cuda.matmul.allow_tf32; off by default).
 *
 * Row-major to column-major: a row-major X with leading dim ld is the
 * column-major X^T with the same ld, so C = op(A) op(B) is computed as
 * C^T = op(B)^T op(A)^T with B as cuBLASLt's first operand.
 *
 * Plans are cached: the descriptors, layouts and algorithm of each GEMM
 * signature (fp8 ones too) are made once (below, "the plan cache").
 *
 * Also the fp8 GEMMs (E4M3/E5M2 with per-tensor scales) of backends/fp8.h,
 * at the end of the file. */
#include <cublasLt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "cuda_calls.h"
#include "cuda_internal.h"

enum { WORKSPACE_BYTES = 32u << 20 };
/* Past each thread's workspace: 16-byte-aligned slots for the fp8 GEMMs'
 * scale_invs (accel__cuda_fp8_gemm). */
enum { SCALE_SLOTS_BYTES = 256 };

typedef struct lt_thread {
    cublasLtHandle_t handle;
    void *workspace;
} lt_thread;

/* One handle and workspace per thread and device: cuBLASLt handles are not
 * meant to be used by two threads at once. The workspace (and the fp8 scale
 * slots past it) serve one stream: every GEMM of a thread runs on its
 * current stream (accel__cuda_enter), which nothing in the library switches
 * (the backend's set_stream has no caller). A caller that switched a
 * thread's stream with GEMMs in flight would need the workspace keyed by
 * stream (as PyTorch keys its cuBLAS workspaces), or the new stream to wait
 * for the old one's last GEMM. */
static _Thread_local lt_thread tl_lt[ACCEL_CUDA_MAX_DEVICES];

static accel_status lt_check(cublasStatus_t s, int index, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_DEVICE, "cuda:%d: gemm: %s: %s", index, what, cublasLtGetStatusString(s));
}

static lt_thread *lt_of(int index) {
    lt_thread *t = &tl_lt[index];
    if (t->handle) return t;
    if (lt_check(accel__cuda_call.lt_create(&t->handle), index, "cublasLtCreate") != ACCEL_OK) return NULL;
    if (!(t->workspace = accel__cuda_alloc(index, WORKSPACE_BYTES + SCALE_SLOTS_BYTES, 256))) {
        cublasLtDestroy(t->handle);
        t->handle = NULL;
        return NULL;
    }
    return t;
}

static bool operand_type(accel_dtype dt, cudaDataType_t *out) {
    switch (dt) {
    case ACCEL_F32: *out = CUDA_R_32F; return true;
    case ACCEL_BF16: *out = CUDA_R_16BF; return true;
    case ACCEL_F16: *out = CUDA_R_16F; return true;
    default: return false;
    }
}

/* The largest power of two (<= 256) dividing address p. */
static uint32_t alignment_of(const void *p) {
    uint32_t a = 256;
    while (a > 1 && ((uintptr_t)p & (a - 1))) a >>= 1;
    return a;
}

/* Views at element offsets are not 256-byte aligned: cuBLASLt's heuristic
 * must only offer algorithms for the alignments (bytes) the pointers of the
 * first and second operand and of C have. */
static cublasStatus_t pref_align(cublasLtMatmulPreference_t pref, uint32_t first, uint32_t second, uint32_t c) {
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &first,
                                                            sizeof first);
    if (!s) s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &second, sizeof second);
    if (!s) s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &c, sizeof c);
    if (!s) s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &c, sizeof c);
    return s;
}

static char *elem(const accel_tensor *t, int64_t off) {
    return (char *)t->data + off * (int64_t)accel_dtype_size(t->dtype);
}

/* ---- the plan cache
 *
 * Making the descriptors and asking cuBLASLt's heuristic for an algorithm
 * costs host time at every call, as much as a small GEMM's kernel, and a
 * training step repeats a few signatures. So each signature's plan (the
 * matmul descriptor, the three layouts, the algorithm) is made once and kept
 * in one table for the process, keyed by everything the plan depends on
 * (gemm_key: device, dtypes of A, B and C, compute type, transposes,
 * epilogue, sizes, leading dims, and the alignments of the pointers, which
 * the heuristic's choice depends on). A plan lives in the table's static storage: cuBLASLt's
 * semi-opaque descriptors initialised in place (cublasLt*Init), so nothing
 * is allocated and nothing is left to free at exit. Plans are published
 * under the lock and never changed or evicted, so a thread uses the one it
 * looked up after unlocking (cuBLASLt only reads descriptors). A full table
 * (PLAN_MAX signatures) leaves later signatures uncached: their plan is made
 * on the stack at each call, as before the cache. The results do not depend
 * on the cache: the same signature gets the same algorithm either way. */

enum { KEY_TRANS_A = 1, KEY_TRANS_B = 2, KEY_BIAS = 4, KEY_FP8 = 8 };

/* Every field set (memset first): keys compare with memcmp; no padding.
 * c_type: C's cudaDataType_t (also the bias's). The fp8 GEMMs' signatures
 * (KEY_FP8) share the table: ab is A's fp8 type, b_type B's (0 for the
 * other GEMMs, whose B is of ab). */
typedef struct gemm_key {
    int32_t device, compute, ab, flags; /* cublasComputeType_t, cudaDataType_t of A and B, KEY_* */
    uint32_t align_first, align_second, align_c, align_bias; /* bytes; align_bias 0 without bias */
    int32_t b_type, c_type;
    int64_t M, N, K, lda, ldb, ldc;
} gemm_key;

typedef struct gemm_plan {
    cublasLtMatmulDescOpaque_t op;
    cublasLtMatrixLayoutOpaque_t first, second, c; /* B, A and C in cuBLASLt's view */
    cublasLtMatmulAlgo_t algo;
    bool found; /* false: cuBLASLt has no algorithm for the signature (kept, so as not to ask again) */
    cublasStatus_t heuristic; /* the heuristic's answer (a status, not found = 0, when it had none) */
} gemm_plan;

enum { PLAN_SLOTS = 512, PLAN_MAX = 256 }; /* open addressing: a probe always ends at a free slot */

typedef struct plan_slot {
    gemm_key key;
    gemm_plan plan;
    bool used;
} plan_slot;

static plan_slot g_plans[PLAN_SLOTS];
static int g_nplans;
static pthread_mutex_t g_plans_lock = PTHREAD_MUTEX_INITIALIZER;

static gemm_key key_of(const accel_k_gemm *g, cudaDataType_t ab, cudaDataType_t ct, const void *a, const void *b,
                       const void *c, const void *bias, bool tf32) {
    gemm_key k;
    memset(&k, 0, sizeof k);
    k.device = g->c->device.index;
    k.compute = ab == CUDA_R_32F && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    k.ab = ab;
    k.c_type = ct;
    k.flags = (g->trans_a ? KEY_TRANS_A : 0) | (g->trans_b ? KEY_TRANS_B : 0) | (bias ? KEY_BIAS : 0);
    k.align_first = alignment_of(b);
    k.align_second = alignment_of(a);
    k.align_c = alignment_of(c);
    k.align_bias = bias ? alignment_of(bias) : 0;
    k.M = g->M, k.N = g->N, k.K = g->K, k.lda = g->lda, k.ldb = g->ldb, k.ldc = g->ldc;
    return k;
}

static size_t key_slot(const gemm_key *k) { /* FNV-1a over the key's bytes */
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return (size_t)(h % PLAN_SLOTS);
}

/* The matmul descriptor of key k in op's storage: B first, A second (see
 * the file comment), and with a bias the bias epilogue. cuBLASLt computes
 * the column-major D = C^T [N, M]; its bias has one element per row of D
 * (N, one per column of our row-major C) and is broadcast along D's
 * columns, which are C's rows: C[m][n] += bias[n], the table's bias. The
 * bias is of C's dtype: cuBLASLt's bias of a GEMM that is neither IMMA nor
 * fp8 is of D's type (cublasLt.h: CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE; said
 * explicitly), so f32 for an f32 C and the bias rounded to C's dtype for a
 * bf16/f16 C (accel__cudak_gemm), added to the f32 sum by the epilogue
 * before the one rounding into D. cuBLASLt reads the pointer's value for its
 * alignment when it chooses an algorithm. */
static cublasStatus_t desc_init(cublasLtMatmulDesc_t op, const gemm_key *k, const void *bias) {
    cublasOperation_t opb = k->flags & KEY_TRANS_B ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opa = k->flags & KEY_TRANS_A ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s = cublasLtMatmulDescInit(op, (cublasComputeType_t)k->compute, CUDA_R_32F);
    if (!s) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb);
    if (!s) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa);
    if (s || !bias) return s;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    int32_t bias_type = k->c_type;
    s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (!s) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type);
    if (!s) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    return s;
}

/* cuBLASLt's heuristic says "no algorithm" with a status too, not only with
 * found = 0: NOT_SUPPORTED for a signature it has no kernel for, and
 * INVALID_VALUE for the bias epilogue on a one-row or one-column operand
 * (M = 1: batch-1 decode; PyTorch keeps bias epilogues away from those).
 * Either is a plan without algorithm: cached, and a biased GEMM adds its
 * bias first instead. */
static bool no_algorithm(cublasStatus_t s) {
    return s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE;
}

/* The plan of key k into p: descriptors, then the heuristic's best algorithm
 * for them (asked through this thread's handle lt; the answer depends on
 * the device and the descriptors, not on the handle), or p->found false
 * when it has none. */
static accel_status plan_build(gemm_plan *p, const gemm_key *k, lt_thread *lt, const void *bias) {
    int index = k->device;
    bool ta = k->flags & KEY_TRANS_A, tb = k->flags & KEY_TRANS_B;
    cudaDataType_t ab = (cudaDataType_t)k->ab;
    cublasLtMatmulPreferenceOpaque_t pref;
    size_t ws = WORKSPACE_BYTES;
    cublasStatus_t s = desc_init(&p->op, k, bias);
    /* Stored column-major shapes: B^T is [N, K] (or [K, N] stored when
     * trans_b), A^T is [K, M] (or [M, K]), C^T is [N, M]. */
    if (!s) s = cublasLtMatrixLayoutInit(&p->first, ab, tb ? k->K : k->N, tb ? k->N : k->K, k->ldb);
    if (!s) s = cublasLtMatrixLayoutInit(&p->second, ab, ta ? k->M : k->K, ta ? k->K : k->M, k->lda);
    if (!s) s = cublasLtMatrixLayoutInit(&p->c, (cudaDataType_t)k->c_type, k->N, k->M, k->ldc);
    if (!s) s = cublasLtMatmulPreferenceInit(&pref);
    if (!s) s = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (!s) s = pref_align(&pref, k->align_first, k->align_second, k->align_c);
    accel_status st = lt_check(s, index, "descriptors");
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    p->heuristic = CUBLAS_STATUS_SUCCESS;
    if (st == ACCEL_OK) {
        p->heuristic = accel__cuda_call.lt_heuristic(lt->handle, &p->op, &p->first, &p->second, &p->c, &p->c, &pref, 1,
                                                     &h, &found);
        if (!no_algorithm(p->heuristic)) st = lt_check(p->heuristic, index, "heuristic");
    }
    p->found = st == ACCEL_OK && p->heuristic == CUBLAS_STATUS_SUCCESS && found > 0;
    if (p->found) p->algo = h.algo;
    return st;
}

static accel_status fp8_plan_build(gemm_plan *p, const gemm_key *k, lt_thread *lt, const accel__cuda_fp8_args *g);

static accel_status build(gemm_plan *p, const gemm_key *k, lt_thread *lt, const void *bias,
                          const accel__cuda_fp8_args *fp8) {
    return fp8 ? fp8_plan_build(p, k, lt, fp8) : plan_build(p, k, lt, bias);
}

/* The plan of key k: the table's (made now if the signature is new and the
 * table has room), or one made in *local when the table is full; NULL
 * (error set) when cuBLASLt refuses the descriptors. fp8: the fp8 GEMM's
 * arguments for its signatures (KEY_FP8), else NULL. */
static gemm_plan *plan_get(const gemm_key *k, lt_thread *lt, const void *bias, const accel__cuda_fp8_args *fp8,
                           gemm_plan *local) {
    pthread_mutex_lock(&g_plans_lock);
    size_t i = key_slot(k);
    while (g_plans[i].used && memcmp(&g_plans[i].key, k, sizeof *k)) i = (i + 1) % PLAN_SLOTS;
    plan_slot *slot = &g_plans[i];
    gemm_plan *p = slot->used ? &slot->plan : NULL;
    accel_status st = ACCEL_OK;
    bool room = g_nplans < PLAN_MAX;
    if (!p && room && (st = build(&slot->plan, k, lt, bias, fp8)) == ACCEL_OK) {
        slot->key = *k;
        slot->used = true;
        g_nplans++;
        p = &slot->plan;
    }
    pthread_mutex_unlock(&g_plans_lock);
    if (p || st != ACCEL_OK) return p;
    return build(local, k, lt, bias, fp8) == ACCEL_OK ? local : NULL;
}

int accel__cuda_gemm_plans(void) {
    pthread_mutex_lock(&g_plans_lock);
    int n = g_nplans;
    pthread_mutex_unlock(&g_plans_lock);
    return n;
}

/* ---- the table's gemm */

static accel_status bias_check(int index, const accel_tensor *bias, int64_t N) {
    if (bias->dtype != ACCEL_F32)
        return accel_set_error(ACCEL_ERR_DTYPE, "cuda:%d: gemm: bias must be f32 (got %s)", index,
                               accel_dtype_name(bias->dtype));
    if (accel_numel(bias) != N || !accel_is_contiguous(bias))
        return accel_set_error(ACCEL_ERR_SHAPE, "cuda:%d: gemm: bias must be %lld contiguous elements (N; got %lld%s)",
                               index, (long long)N, (long long)accel_numel(bias),
                               accel_is_contiguous(bias) ? "" : ", strided");
    return ACCEL_OK;
}

/* C = beta C + bias (summed in f32, rounded once into C), then the GEMM
 * onto it with beta 1 and no epilogue: the same sum (the CPU's way,
 * docs/cpu.md) where cuBLASLt has no algorithm with the bias epilogue for a
 * signature. A bf16/f16 C holds beta C + bias rounded before the product is
 * added to it: one rounding more than the CPU's, except when beta is 0 and
 * the bias's values are C's dtype's (a linear's: accel_linear rounds its
 * bias to the compute dtype), where C is the bias exactly. */
static accel_status gemm_bias_first(const accel_k_gemm *g, char *c, const float *bias) {
    accel_status st = accel__cuda_scale_rows(g->c->device.index, c, g->c->dtype, g->M, g->N, g->ldc, g->beta, bias);
    accel_k_gemm plain = *g;
    plain.bias = NULL;
    plain.beta = 1.0f;
    return st == ACCEL_OK ? accel__cudak_gemm(&plain) : st;
}

accel_status accel__cudak_gemm(accel_k_gemm *g) {
    int index = g->c->device.index;
    cudaDataType_t ab, bb, ct;
    /* cuBLASLt's types with f32 compute and scale: A and B of one dtype, D
     * (and C) f32 or, for bf16/f16 A and B, theirs */
    if (!operand_type(g->a->dtype, &ab) || !operand_type(g->b->dtype, &bb) || !operand_type(g->c->dtype, &ct) ||
        ab != bb || (ct != CUDA_R_32F && ct != ab))
        return accel_set_error(ACCEL_ERR_DTYPE,
                               "cuda:%d: gemm: operands %s x %s -> %s (A and B both f32, bf16 or f16; C f32 or, for "
                               "bf16/f16 A and B, their dtype)",
                               index, accel_dtype_name(g->a->dtype), accel_dtype_name(g->b->dtype),
                               accel_dtype_name(g->c->dtype));
    if (g->bias && bias_check(index, g->bias, g->N) != ACCEL_OK) return accel_last_status();
    bool tf32; /* read at every GEMM, as torch's allow_tf32 flag: it may change between steps */
    if (accel__env_bool("ACCEL_ALLOW_TF32", false, &tf32) != ACCEL_OK) return accel_last_status();
    if (g->M == 0 || g->N == 0) return ACCEL_OK;
    const float *bias = g->bias ? (const float *)g->bias->data : NULL;
    char *c = elem(g->c, g->c_off);
    if (g->K == 0) return accel__cuda_scale_rows(index, c, g->c->dtype, g->M, g->N, g->ldc, g->beta, bias);
    bool c16 = ct != CUDA_R_32F;
    /* cuBLASLt's preferences state the alignment of A, B and C, not of the
     * bias: its heuristic may pick a kernel that reads the bias 16 bytes at
     * a time, which faults ("misaligned address", a sticky error) on a bias
     * view at a 4-byte offset (a flat ZeRO/FSDP buffer's). Such a bias goes
     * into C first instead. */
    if (bias && !c16 && alignment_of(bias) < 16) return gemm_bias_first(g, c, bias);
    /* The epilogue's bias: for a bf16/f16 C, a copy rounded to C's dtype
     * (desc_init) in step memory, 256-byte aligned; planned with its
     * pointer, written once the plan has an algorithm. */
    const void *epi_bias = bias;
    if (bias && c16 && !(epi_bias = accel__cuda_step_alloc(index, (size_t)g->N * accel_dtype_size(g->c->dtype), 256)))
        return accel_last_status();
    cudaStream_t stream = accel__cuda_enter(index);
    lt_thread *lt = lt_of(index);
    if (!lt) return accel_last_status();
    const void *a = elem(g->a, g->a_off), *b = elem(g->b, g->b_off);
    gemm_key key = key_of(g, ab, ct, a, b, c, epi_bias, tf32);
    gemm_plan local;
    gemm_plan *p = plan_get(&key, lt, epi_bias, NULL, &local);
    if (!p) return accel_last_status();
    if (!p->found && bias) return gemm_bias_first(g, c, bias);
    if (!p->found)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                               "cuda:%d: gemm: no cuBLASLt algorithm for M=%lld N=%lld K=%lld %s -> %s (its heuristic: "
                               "%s)",
                               index, (long long)g->M, (long long)g->N, (long long)g->K, accel_dtype_name(g->a->dtype),
                               accel_dtype_name(g->c->dtype), cublasLtGetStatusString(p->heuristic));
    if (epi_bias != bias && accel__cuda_scale_rows(index, (void *)epi_bias, g->c->dtype, 1, g->N, g->N, 0.0f, bias) !=
                                ACCEL_OK)
        return accel_last_status();
    /* The bias pointer is part of the matmul descriptor, and differs from call
     * to call: a call with a bias gets its own descriptor, made in place on
     * the stack (no allocation); the cached layouts and algorithm hold. */
    cublasLtMatmulDescOpaque_t own;
    cublasLtMatmulDesc_t op = &p->op;
    if (bias) {
        op = &own;
        if (lt_check(desc_init(op, &key, epi_bias), index, "descriptors") != ACCEL_OK) return accel_last_status();
    }
    return lt_check(cublasLtMatmul(lt->handle, op, &g->alpha, b, &p->first, a, &p->second, &g->beta, c, &p->c, c,
                                   &p->c, &p->algo, lt->workspace, WORKSPACE_BYTES, stream),
                    index, "cublasLtMatmul");
}

/* ---- fp8 GEMMs (cuda_internal.h: accel__cuda_fp8_gemm): E4M3/E5M2
 * operands with their per-tensor scale_inv, f32 accumulation, in cuBLASLt's
 * fp8 "TN" layout. Row-major C = A B^T is column-major C^T = (B^T)^T A^T:
 * the first operand is B (stored [K, N] column-major, transposed), the
 * second A (stored [K, M], not transposed). */

static cudaDataType_t fp8_type(accel__fp8_format f) { return f == ACCEL_FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

static accel_status fp8_check(int index, const accel__cuda_fp8_args *g) {
    if (g->a_fmt == ACCEL_FP8_E5M2 && g->b_fmt == ACCEL_FP8_E5M2)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "cuda:%d: fp8_gemm: E5M2 x E5M2 has no cuBLASLt kernel", index);
    if (g->c_dtype != ACCEL_F32 && g->c_dtype != ACCEL_BF16)
        return accel_set_error(ACCEL_ERR_DTYPE, "cuda:%d: fp8_gemm: C must be f32 or bf16 (got %s)", index,
                               accel_dtype_name(g->c_dtype));
    if (g->K % 16 || g->lda % 16 || g->ldb % 16 || g->lda < g->K || g->ldb < g->K)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "cuda:%d: fp8_gemm: K=%lld, lda=%lld, ldb=%lld: fp8 operands need K and leading dims "
                               "that are multiples of 16 (and >= K)",
                               index, (long long)g->K, (long long)g->lda, (long long)g->ldb);
    return ACCEL_OK;
}

/* The matmul descriptor of g in op's storage: its scale pointers differ
 * from call to call (each layer's fp8 meta), so each call makes its own on
 * the stack; the plan's layouts and algorithm are the signature's. */
static cublasStatus_t fp8_desc_init(cublasLtMatmulDesc_t op, const accel__cuda_fp8_args *g) {
    cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    cublasStatus_t s = cublasLtMatmulDescInit(op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (!s) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
    if (!s) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n);
    /* cuBLASLt's A is our B: its scale_inv is the A scale pointer */
    if (!s) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g->b_inv, sizeof g->b_inv);
    if (!s) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g->a_inv, sizeof g->a_inv);
    return s;
}

static gemm_key fp8_key_of(int index, const accel__cuda_fp8_args *g) {
    gemm_key k;
    memset(&k, 0, sizeof k);
    k.device = index;
    k.compute = CUBLAS_COMPUTE_32F;
    k.ab = fp8_type(g->a_fmt);
    k.b_type = fp8_type(g->b_fmt);
    k.c_type = g->c_dtype == ACCEL_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    k.flags = KEY_FP8;
    k.align_first = alignment_of(g->b);
    k.align_second = alignment_of(g->a);
    k.align_c = alignment_of(g->c);
    k.M = g->M, k.N = g->N, k.K = g->K, k.lda = g->lda, k.ldb = g->ldb, k.ldc = g->ldc;
    return k;
}

/* The fp8 plan of key k (made from g's descriptor), as plan_build. */
static accel_status fp8_plan_build(gemm_plan *p, const gemm_key *k, lt_thread *lt, const accel__cuda_fp8_args *g) {
    cublasLtMatmulPreferenceOpaque_t pref;
    size_t ws = WORKSPACE_BYTES;
    cublasStatus_t s = fp8_desc_init(&p->op, g);
    if (!s) s = cublasLtMatrixLayoutInit(&p->first, (cudaDataType_t)k->b_type, k->K, k->N, k->ldb);
    if (!s) s = cublasLtMatrixLayoutInit(&p->second, (cudaDataType_t)k->ab, k->K, k->M, k->lda);
    if (!s) s = cublasLtMatrixLayoutInit(&p->c, (cudaDataType_t)k->c_type, k->N, k->M, k->ldc);
    if (!s) s = cublasLtMatmulPreferenceInit(&pref);
    if (!s) s = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (!s) s = pref_align(&pref, k->align_first, k->align_second, k->align_c);
    accel_status st = lt_check(s, k->device, "fp8 descriptors");
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    p->heuristic = CUBLAS_STATUS_SUCCESS;
    if (st == ACCEL_OK) {
        p->heuristic = accel__cuda_call.lt_heuristic(lt->handle, &p->op, &p->first, &p->second, &p->c, &p->c, &pref, 1,
                                                     &h, &found);
        if (!no_algorithm(p->heuristic)) st = lt_check(p->heuristic, k->device, "fp8 heuristic");
    }
    p->found = st == ACCEL_OK && p->heuristic == CUBLAS_STATUS_SUCCESS && found > 0;
    if (p->found) p->algo = h.algo;
    return st;
}

/* cuBLASLt's fp8 kernels refuse (NOT_SUPPORTED at cublasLtMatmul, though
 * its heuristic offered them) scale pointers that are not 16-byte aligned
 * (seen on an H200, cuBLASLt 13.1): a meta's scale_invs are adjacent floats.
 * Such scales are copied, on the stream, into the thread's aligned slots
 * past its workspace; the GEMM reads them there. Returns g itself or
 * *staged. */
static const accel__cuda_fp8_args *aligned_scales(int index, const accel__cuda_fp8_args *g, lt_thread *lt,
                                                  cudaStream_t stream, accel__cuda_fp8_args *staged) {
    if (((uintptr_t)g->a_inv | (uintptr_t)g->b_inv) % 16 == 0) return g;
    float *slots = (float *)((char *)lt->workspace + WORKSPACE_BYTES);
    *staged = *g;
    staged->a_inv = slots, staged->b_inv = slots + 4;
    if (accel__cuda_check(cudaMemcpyAsync(slots, g->a_inv, sizeof(float), cudaMemcpyDefault, stream), index,
                          "fp8_gemm: scale copy") != ACCEL_OK ||
        accel__cuda_check(cudaMemcpyAsync(slots + 4, g->b_inv, sizeof(float), cudaMemcpyDefault, stream), index,
                          "fp8_gemm: scale copy") != ACCEL_OK)
        return NULL;
    return staged;
}

accel_status accel__cuda_fp8_gemm(int index, const accel__cuda_fp8_args *args) {
    accel_status st = fp8_check(index, args);
    if (st != ACCEL_OK || args->M == 0 || args->N == 0) return st;
    cudaStream_t stream = accel__cuda_enter(index);
    lt_thread *lt = lt_of(index);
    if (!lt) return accel_last_status();
    accel__cuda_fp8_args staged;
    const accel__cuda_fp8_args *g = aligned_scales(index, args, lt, stream, &staged);
    if (!g) return accel_last_status();
    gemm_key key = fp8_key_of(index, g);
    gemm_plan local;
    gemm_plan *p = plan_get(&key, lt, NULL, g, &local);
    if (!p) return accel_last_status();
    if (!p->found)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                               "cuda:%d: fp8_gemm: no cuBLASLt fp8 algorithm for M=%lld N=%lld K=%lld (its heuristic: "
                               "%s; fp8 GEMMs need compute capability >= 8.9)",
                               index, (long long)g->M, (long long)g->N, (long long)g->K,
                               cublasLtGetStatusString(p->heuristic));
    cublasLtMatmulDescOpaque_t own;
    if (lt_check(fp8_desc_init(&own, g), index, "fp8 descriptors") != ACCEL_OK) return accel_last_status();
    return lt_check(cublasLtMatmul(lt->handle, &own, &g->alpha, g->b, &p->first, g->a, &p->second, &g->beta, g->c,
                                   &p->c, g->c, &p->c, &p->algo, lt->workspace, WORKSPACE_BYTES, stream),
                    index, "fp8 cublasLtMatmul");
}
