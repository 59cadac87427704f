/* GEMM through cuBLASLt: bf16/f16 operands on tensor cores and f32
 * operands, f32 accumulation and f32 C (the table's contract).
 * ACCEL_ALLOW_TF32=1 in the environment lets f32 GEMMs use TF32 tensor
 * cores (PyTorch's torch.backends.cuda.matmul.allow_tf32; off by default).
 *
 * Row-major to column-major: a row-major X with leading dim ld is the
 * column-major X^T with the same ld, so C = op(A) op(B) is computed as
 * C^T = op(B)^T op(A)^T with B as cuBLASLt's first operand.
 *
 * Also the fp8 GEMMs (E4M3/E5M2 with per-tensor scales) of backends/fp8.h,
 * at the end of the file. */
#include <cublasLt.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

enum { WORKSPACE_BYTES = 32u << 20 };

typedef struct lt_thread {
    cublasLtHandle_t handle;
    void *workspace;
} lt_thread;

/* One handle and workspace per thread and device: cuBLASLt handles are not
 * meant to be used by two threads at once. */
static _Thread_local lt_thread tl_lt[ACCEL_CUDA_MAX_DEVICES];

static accel_status lt_check(cublasStatus_t s, int index, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_DEVICE, "cuda:%d: gemm: %s: %s", index, what, cublasLtGetStatusString(s));
}

static lt_thread *lt_of(int index) {
    lt_thread *t = &tl_lt[index];
    if (t->handle) return t;
    if (lt_check(cublasLtCreate(&t->handle), index, "cublasLtCreate") != ACCEL_OK) return NULL;
    if (!(t->workspace = accel__cuda_alloc(index, WORKSPACE_BYTES, 256))) {
        cublasLtDestroy(t->handle);
        t->handle = NULL;
        return NULL;
    }
    return t;
}

static bool allow_tf32(void) {
    const char *s = getenv("ACCEL_ALLOW_TF32");
    return s && *s && strcmp(s, "0") != 0;
}

static bool operand_type(accel_dtype dt, cudaDataType_t *out) {
    switch (dt) {
    case ACCEL_F32: *out = CUDA_R_32F; return true;
    case ACCEL_BF16: *out = CUDA_R_16BF; return true;
    case ACCEL_F16: *out = CUDA_R_16F; return true;
    default: return false;
    }
}

typedef struct lt_plan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulPreference_t pref;
} lt_plan;

static void plan_free(lt_plan *p) {
    if (p->pref) cublasLtMatmulPreferenceDestroy(p->pref);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
}

/* The cuBLASLt descriptors of a row-major GEMM: B is the first operand and
 * A the second (see the file comment). */
static cublasStatus_t plan_init(lt_plan *p, const accel_k_gemm *g, cudaDataType_t ab) {
    cublasComputeType_t ct = ab == CUDA_R_32F && allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasOperation_t opb = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, opa = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s = cublasLtMatmulDescCreate(&p->op, ct, CUDA_R_32F);
    if (!s) s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb);
    if (!s) s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa);
    /* Stored column-major shapes: B^T is [N, K] (or [K, N] stored when
     * trans_b), A^T is [K, M] (or [M, K]), C^T is [N, M]. */
    if (!s) s = cublasLtMatrixLayoutCreate(&p->b, ab, g->trans_b ? g->K : g->N, g->trans_b ? g->N : g->K, g->ldb);
    if (!s) s = cublasLtMatrixLayoutCreate(&p->a, ab, g->trans_a ? g->M : g->K, g->trans_a ? g->K : g->M, g->lda);
    if (!s) s = cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, g->N, g->M, g->ldc);
    if (!s) s = cublasLtMatmulPreferenceCreate(&p->pref);
    size_t ws = WORKSPACE_BYTES;
    if (!s) s = cublasLtMatmulPreferenceSetAttribute(p->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    return s;
}

/* The largest power of two (<= 256) dividing address p. */
static uint32_t alignment_of(const void *p) {
    uint32_t a = 256;
    while (a > 1 && ((uintptr_t)p & (a - 1))) a >>= 1;
    return a;
}

/* Views at element offsets are not 256-byte aligned: cuBLASLt's heuristic
 * must only offer algorithms for the alignment the pointers have. */
static cublasStatus_t plan_align(lt_plan *p, const void *first, const void *second, const void *c) {
    uint32_t a1 = alignment_of(first), a2 = alignment_of(second), ac = alignment_of(c);
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a1, sizeof a1);
    if (!s) s = cublasLtMatmulPreferenceSetAttribute(p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &a2, sizeof a2);
    if (!s) s = cublasLtMatmulPreferenceSetAttribute(p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof ac);
    if (!s) s = cublasLtMatmulPreferenceSetAttribute(p->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof ac);
    return s;
}

static const char *elem(const accel_tensor *t, int64_t off) {
    return (const char *)t->data + off * (int64_t)accel_dtype_size(t->dtype);
}

accel_status accel__cudak_gemm(accel_k_gemm *g) {
    int index = g->c->device.index;
    cudaDataType_t ab, bb;
    if (!operand_type(g->a->dtype, &ab) || !operand_type(g->b->dtype, &bb) || ab != bb || g->c->dtype != ACCEL_F32)
        return accel_set_error(ACCEL_ERR_DTYPE, "cuda:%d: gemm: operands %s x %s -> %s (A and B both f32, bf16 or f16; C f32)",
                               index, accel_dtype_name(g->a->dtype), accel_dtype_name(g->b->dtype),
                               accel_dtype_name(g->c->dtype));
    if (g->M == 0 || g->N == 0) return ACCEL_OK;
    if (g->K == 0) return accel__cuda_scale_rows(index, (float *)g->c->data + g->c_off, g->M, g->N, g->ldc, g->beta);
    cudaStream_t stream = accel__cuda_enter(index);
    lt_thread *lt = lt_of(index);
    if (!lt) return accel_last_status();
    lt_plan p = {0};
    const void *a = elem(g->a, g->a_off), *b = elem(g->b, g->b_off);
    void *c = (void *)elem(g->c, g->c_off);
    cublasStatus_t cs = plan_init(&p, g, ab);
    if (!cs) cs = plan_align(&p, b, a, c);
    accel_status st = lt_check(cs, index, "descriptors");
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    if (st == ACCEL_OK)
        st = lt_check(cublasLtMatmulAlgoGetHeuristic(lt->handle, p.op, p.b, p.a, p.c, p.c, p.pref, 1, &h, &found),
                      index, "heuristic");
    if (st == ACCEL_OK && !found)
        st = accel_set_error(ACCEL_ERR_UNSUPPORTED, "cuda:%d: gemm: no cuBLASLt algorithm for M=%lld N=%lld K=%lld",
                             index, (long long)g->M, (long long)g->N, (long long)g->K);
    if (st == ACCEL_OK)
        st = lt_check(cublasLtMatmul(lt->handle, p.op, &g->alpha, b, p.b, a, p.a,
                                     &g->beta, c, p.c, c, p.c, &h.algo, lt->workspace, WORKSPACE_BYTES, stream),
                      index, "cublasLtMatmul");
    plan_free(&p);
    return st;
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

static cublasStatus_t fp8_plan_init(lt_plan *p, const accel__cuda_fp8_args *g) {
    cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    cudaDataType_t ct = g->c_dtype == ACCEL_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasStatus_t s = cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (!s) s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
    if (!s) s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n);
    /* cuBLASLt's A is our B: its scale_inv is the A scale pointer */
    if (!s) s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g->b_inv, sizeof g->b_inv);
    if (!s) s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g->a_inv, sizeof g->a_inv);
    if (!s) s = cublasLtMatrixLayoutCreate(&p->b, fp8_type(g->b_fmt), g->K, g->N, g->ldb);
    if (!s) s = cublasLtMatrixLayoutCreate(&p->a, fp8_type(g->a_fmt), g->K, g->M, g->lda);
    if (!s) s = cublasLtMatrixLayoutCreate(&p->c, ct, g->N, g->M, g->ldc);
    if (!s) s = cublasLtMatmulPreferenceCreate(&p->pref);
    size_t ws = WORKSPACE_BYTES;
    if (!s) s = cublasLtMatmulPreferenceSetAttribute(p->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    return s;
}

accel_status accel__cuda_fp8_gemm(int index, const accel__cuda_fp8_args *g) {
    accel_status st = fp8_check(index, g);
    if (st != ACCEL_OK || g->M == 0 || g->N == 0) return st;
    cudaStream_t stream = accel__cuda_enter(index);
    lt_thread *lt = lt_of(index);
    if (!lt) return accel_last_status();
    lt_plan p = {0};
    cublasStatus_t cs = fp8_plan_init(&p, g);
    if (!cs) cs = plan_align(&p, g->b, g->a, g->c);
    st = lt_check(cs, index, "fp8 descriptors");
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    if (st == ACCEL_OK)
        st = lt_check(cublasLtMatmulAlgoGetHeuristic(lt->handle, p.op, p.b, p.a, p.c, p.c, p.pref, 1, &h, &found),
                      index, "fp8 heuristic");
    if (st == ACCEL_OK && !found)
        st = accel_set_error(ACCEL_ERR_UNSUPPORTED,
                             "cuda:%d: fp8_gemm: no cuBLASLt fp8 algorithm for M=%lld N=%lld K=%lld (fp8 GEMMs need "
                             "compute capability >= 8.9)",
                             index, (long long)g->M, (long long)g->N, (long long)g->K);
    if (st == ACCEL_OK)
        st = lt_check(cublasLtMatmul(lt->handle, p.op, &g->alpha, g->b, p.b, g->a, p.a, &g->beta, g->c, p.c, g->c, p.c,
                                     &h.algo, lt->workspace, WORKSPACE_BYTES, stream),
                      index, "fp8 cublasLtMatmul");
    plan_free(&p);
    return st;
}
