/* CPU GEMM: OpenBLAS sgemm, a reference loop, the choice of provider per
 * dtype and shape (oneDNN's matmul is gemm_dnnl.c), and operands converted
 * to the compute dtype. */
#include "backends/cpu/gemm.h"
#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/openblas_core.h"
#include "backends/cpu/openblas_lazy.h"
#include "backends/cpu/pair_pack.h"

#include <limits.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "accel/cpu.h"
#include "core/cpuinfo.h"
#include "core/prepared.h"

void accel__sgemm_ref(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                      float *C, int64_t ldc) {
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double s = 0.0;
            for (int64_t k = 0; k < K; k++) {
                float a = trans_a ? A[k * lda + i] : A[i * lda + k];
                float b = trans_b ? B[j * ldb + k] : B[k * ldb + j];
                s += (double)a * (double)b;
            }
            float *c = &C[i * ldc + j];
            *c = (float)(alpha * s + (beta == 0.0f ? 0.0 : (double)beta * *c));
        }
    }
}

/* OpenBLAS (Debian's pthread build) keeps its own thread pool, which fights
 * the OpenMP pool of the other ops for the cores: each spins (sched_yield,
 * GOMP spin-wait) while the other works. So BLAS runs single-threaded on the
 * calling thread, and large GEMMs are split into independent row (or
 * column) blocks that the OpenMP threads compute, one sgemm each: one thread
 * pool in the process, and each block runs at the 1-thread sgemm speed. */
void accel__blas_single_thread(void) {
    if (!omp_in_parallel() && accel__openblas_get_num_threads() != 1) accel__openblas_set_num_threads(1);
}

static void blas_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                       int64_t ldc) {
    accel__cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

/* Rows of op(A) up to which accel__sgemm computes one matrix-vector product
 * per row. */
enum { SMALL_M = 4 };

/* A GEMM of a few rows of op(A) (M <= SMALL_M): one matrix-vector product
 * per row, over column blocks of C. B is f32, or, with trans_b only, bf16
 * (a bf16 weight read as it is stored: accel__cpu_gemm_bf16w_nt). */
typedef struct small_gemm {
    bool trans_a, trans_b;
    int64_t M, K;
    float alpha, beta;
    const float *A;
    int64_t lda;
    const void *B;
    accel_dtype b_dt;
    int64_t ldb;
    float *C;
    int64_t ldc;
} small_gemm;

/* Columns [lo, lo+n) of C rows [0, M): sgemm would pack all of B for a
 * handful of rows, which costs more than the product itself (decode: one
 * token, M = 1, against the weights). */
static void small_m_block(const small_gemm *g, int64_t lo, int64_t n) {
    if (g->b_dt == ACCEL_BF16) {
        accel__cpu_gemm_bf16w_nt(g->M, n, g->K, g->alpha, g->A, g->lda, (const uint16_t *)g->B + lo * g->ldb,
                                 g->ldb, g->beta, g->C + lo, g->ldc);
        return;
    }
    const float *B = g->B;
    for (int64_t i = 0; i < g->M; i++) {
        const float *x = g->trans_a ? g->A + i : g->A + i * g->lda; /* row i of op(A) */
        int incx = g->trans_a ? (int)g->lda : 1;
        float *y = g->C + i * g->ldc + lo;
        if (g->beta == 0.0f) memset(y, 0, (size_t)n * sizeof(float)); /* NaNs in C are ignored */
        if (g->trans_b) /* B [N, K]: y = alpha B[lo:lo+n] x + beta y */
            accel__cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)g->K, g->alpha, B + lo * g->ldb, (int)g->ldb, x,
                        incx, g->beta, y, 1);
        else /* B [K, N]: y = alpha B[:, lo:lo+n]^T x + beta y */
            accel__cblas_sgemv(CblasRowMajor, CblasTrans, (int)g->K, (int)n, g->alpha, B + lo, (int)g->ldb, x, incx,
                        g->beta, y, 1);
    }
}

/* All N columns of a small-M GEMM, split across the threads when large. */
static void small_m_gemm(const small_gemm *g, int64_t N) {
    if (omp_in_parallel()) {
        small_m_block(g, 0, N);
        return;
    }
    accel__blas_single_thread();
    int nt = accel_num_threads();
    /* Column blocks of B (rows of the weight for a linear), at least 64
     * wide, ~2 per thread. A matrix-vector product is memory bound: on
     * the 2-core box one thread streams a 512x1024 weight as fast as two
     * (~11 GB/s, either way) and skips the wake-up of the other, so
     * only products of 4M+ multiply-adds (an lm_head) are split. */
    int64_t nb = N / 64 < 2 * nt ? N / 64 : 2 * nt;
    if (nt <= 1 || nb < 2 || (double)g->M * (double)N * (double)g->K < 4e6) {
        small_m_block(g, 0, N);
        return;
    }
    int64_t blk = ((N + nb - 1) / nb + 15) / 16 * 16;
    nb = (N + blk - 1) / blk;
#pragma omp parallel for num_threads(nt) schedule(dynamic)
    for (int64_t b = 0; b < nb; b++) {
        int64_t lo = b * blk, n = N - lo < blk ? N - lo : blk;
        small_m_block(g, lo, n);
    }
}

/* Rows (columns) of C per block of a split GEMM, at least. Every block's
 * sgemm packs the whole other operand again (all of op(B), K x N floats, for
 * a row block), which costs about 8 / rows of the block's multiply-adds
 * (packing ~0.5 cycle a float, 16 multiply-adds a cycle on AVX2 + FMA): 12%
 * for the 64-row blocks a dW = dY^T X of 512 rows over 2048 tokens was cut
 * into before, under 1% from 1024 rows. On the Llama step (Zen3, 2
 * threads) the packing fell from 8.7% to 6.9% of the samples
 * (bench/results/llama_step_profile.md). */
enum { MIN_BLOCK = 1024 };

/* Blocks of a split GEMM over len rows (columns) on nt threads: a multiple
 * of nt (equal shares), at most 4 per thread (dynamic, so a core slowed by
 * another process does not hold the others up), each of MIN_BLOCK or more
 * where len allows it, else one per thread. With fewer than 64 rows per
 * thread, one block per 64 rows (0 or 1: not split). */
static int64_t gemm_blocks(int64_t len, int nt) {
    if (len / 64 < nt) return len / 64;
    int64_t per_thread = len / ((int64_t)nt * MIN_BLOCK);
    per_thread = per_thread < 1 ? 1 : per_thread > 4 ? 4 : per_thread;
    return per_thread * nt;
}

void accel__sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                  int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || accel_reference_kernels()) {
        accel__sgemm_ref(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (M <= SMALL_M) {
        small_m_gemm(&(small_gemm){trans_a, trans_b, M, K, alpha, beta, A, lda, B, ACCEL_F32, ldb, C, ldc}, N);
        return;
    }
    if (omp_in_parallel()) { /* a caller's thread: BLAS is already single-threaded */
        blas_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    accel__blas_single_thread();
    int nt = accel_num_threads();
    bool by_rows = M >= N;
    int64_t len = by_rows ? M : N;
    int64_t nb = gemm_blocks(len, nt);
    /* below ~1 MFLOP a parallel region costs more than it saves */
    if (nt <= 1 || nb < 2 || (double)M * (double)N * (double)K < 5e5) {
        blas_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int64_t blk = ((len + nb - 1) / nb + 15) / 16 * 16;
    nb = (len + blk - 1) / blk;
#pragma omp parallel for num_threads(nt) schedule(dynamic)
    for (int64_t b = 0; b < nb; b++) {
        int64_t lo = b * blk, n = len - lo < blk ? len - lo : blk;
        if (by_rows) /* rows [lo, lo+n) of op(A) and C */
            blas_sgemm(trans_a, trans_b, n, N, K, alpha, trans_a ? A + lo : A + lo * lda, lda, B, ldb, beta,
                       C + lo * ldc, ldc);
        else /* columns [lo, lo+n) of op(B) and C */
            blas_sgemm(trans_a, trans_b, M, n, K, alpha, A, lda, trans_b ? B + lo * ldb : B + lo, ldb, beta,
                       C + lo, ldc);
    }
}

/* ---- providers */

/* Shapes on which oneDNN's f32 matmul measured faster than OpenBLAS's
 * sgemm with 2 threads (bench_matmul; docs/cpu.md), per CPU kind: a CPU
 * with every feature in `needs` and none in `lacks`. An entry matches the
 * transposes, N and K exactly (the weight of a layer) and M >= min_m (the
 * tokens of a batch). Shapes not listed stay on OpenBLAS. */
typedef struct f32_dnnl_shape {
    uint32_t needs, lacks;
    bool trans_a, trans_b;
    int64_t N, K, min_m;
} f32_dnnl_shape;

static const f32_dnnl_shape F32_DNNL_SHAPES[] = {
    /* Sapphire Rapids class (AVX-512 with AMX), 2 vCPUs
     * (a measurement of 2 threads on that machine): 2048 x 512 x 1536 NN, the dX of the
     * MLP up projection: oneDNN brg:avx512_core 258 GFLOP/s, OpenBLAS 178.
     * The three other shapes measured there were faster on OpenBLAS. */
    {ACCEL_CPU_AVX512F | ACCEL_CPU_AMX_BF16, 0, false, false, 512, 1536, 1024},
};

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static int env_mode; /* accel__gemm_mode, or -1 when ACCEL_GEMM is not a mode */
static char env_value[48];
static _Atomic int set_mode = -1; /* accel__gemm_set_mode's, or -1 */

static void env_read(void) {
    const char *v = getenv("ACCEL_GEMM");
    snprintf(env_value, sizeof env_value, "%s", v ? v : "");
    if (!v || !strcmp(v, "auto")) env_mode = ACCEL__GEMM_AUTO; /* empty is no mode (core/env.h) */
    else if (!strcmp(v, "openblas")) env_mode = ACCEL__GEMM_OPENBLAS;
    /* dnnl without its plug-in is no mode, as in a build without oneDNN:
     * said once by every GEMM, not a oneDNN call failing in each */
    else if (!strcmp(v, "dnnl") && accel__gemm_have_dnnl() && !accel__dnnl_unavailable()) env_mode = ACCEL__GEMM_DNNL;
    else env_mode = -1;
}

bool accel__gemm_have_dnnl(void) {
#ifdef ACCEL_HAVE_DNNL
    return true;
#else
    return false;
#endif
}

accel_status accel__gemm_set_mode(accel__gemm_mode mode) {
    if (mode != ACCEL__GEMM_AUTO && mode != ACCEL__GEMM_OPENBLAS && mode != ACCEL__GEMM_DNNL)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel__gemm_set_mode: %d is not a GEMM mode", (int)mode);
    if (mode == ACCEL__GEMM_DNNL && !accel__gemm_have_dnnl())
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel__gemm_set_mode: this build has no oneDNN");
    if (mode == ACCEL__GEMM_DNNL && accel__dnnl_unavailable())
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel__gemm_set_mode: the oneDNN plug-in did not load: %s",
                               accel__dnnl_unavailable());
    set_mode = mode;
    return ACCEL_OK;
}

/* Why ACCEL_GEMM holds no mode, into out. */
static void env_mode_error(char *out, size_t n) {
    bool dnnl = !strcmp(env_value, "dnnl");
    const char *unloaded = dnnl && accel__gemm_have_dnnl() ? accel__dnnl_unavailable() : NULL;
    if (unloaded)
        snprintf(out, n, "ACCEL_GEMM=dnnl: the oneDNN plug-in did not load: %s", unloaded);
    else if (dnnl)
        snprintf(out, n, "ACCEL_GEMM=dnnl: this build has no oneDNN (install libdnnl-dev and reconfigure)");
    else
        snprintf(out, n, "ACCEL_GEMM=%s: expected auto, openblas or dnnl", env_value);
}

/* The mode in force, or -1 when ACCEL_GEMM holds no mode. */
static int mode_now(void) {
    int m = set_mode;
    if (m >= 0) return m;
    pthread_once(&env_once, env_read);
    return env_mode;
}

/* oneDNN's implementation of a dt GEMM on this CPU, probed once per dtype:
 * its name into impl, or false when oneDNN has none (or is not built in). */
static bool dnnl_probe(accel_dtype dt, const char **impl) {
#ifdef ACCEL_HAVE_DNNL
    /* asked by every GEMM call (attention's thousands of tile GEMMs a
     * layer, from every thread): the answer, once made, is read without
     * the lock */
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static atomic_bool probed[3];
    static bool ok[3];
    static char name[3][64];
    int i = dt == ACCEL_BF16 ? 1 : dt == ACCEL_F16 ? 2 : 0;
    if (!atomic_load_explicit(&probed[i], memory_order_acquire)) {
        pthread_mutex_lock(&lock);
        if (!atomic_load_explicit(&probed[i], memory_order_relaxed)) {
            ok[i] = accel__dnnl_supports(dt, name[i], sizeof name[i]);
            atomic_store_explicit(&probed[i], true, memory_order_release);
        }
        pthread_mutex_unlock(&lock);
    }
    *impl = name[i];
    return ok[i];
#else
    (void)dt;
    *impl = "";
    return false;
#endif
}

/* The CPU multiplies dt in hardware: AMX or AVX512 units for it. */
static bool cpu_has_units(accel_dtype dt) {
    uint32_t f = accel_cpu_info_get()->features;
    if (dt == ACCEL_BF16) return (f & (ACCEL_CPU_AMX_BF16 | ACCEL_CPU_AVX512_BF16)) != 0;
    if (dt == ACCEL_F16) return (f & (ACCEL_CPU_AMX_FP16 | ACCEL_CPU_AVX512_FP16)) != 0;
    return false;
}

/* In auto: a low-precision dtype goes to oneDNN when the CPU has units for
 * it and oneDNN uses them (its choice is no reference loop). */
static bool auto_dnnl_lowp(accel_dtype dt) {
    const char *impl;
    return cpu_has_units(dt) && dnnl_probe(dt, &impl) && strncmp(impl, "ref", 3) != 0;
}

enum { F32_TABLE_LEN = sizeof F32_DNNL_SHAPES / sizeof F32_DNNL_SHAPES[0] };

/* Whether entry e of the f32 table applies to this CPU. */
static bool entry_here(const f32_dnnl_shape *e) {
    uint32_t f = accel_cpu_info_get()->features;
    return (f & e->needs) == e->needs && !(f & e->lacks);
}

static const f32_dnnl_shape *f32_table_entry(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K) {
    for (size_t i = 0; i < F32_TABLE_LEN; i++) {
        const f32_dnnl_shape *e = &F32_DNNL_SHAPES[i];
        if (entry_here(e) && e->trans_a == trans_a && e->trans_b == trans_b && e->N == N && e->K == K &&
            M >= e->min_m)
            return e;
    }
    return NULL;
}

/* Entries of the f32 table that apply to this CPU. */
static int f32_table_entries_here(void) {
    int n = 0;
    for (size_t i = 0; i < F32_TABLE_LEN; i++) n += entry_here(&F32_DNNL_SHAPES[i]);
    return n;
}

/* oneDNN is a candidate beside OpenBLAS for dt GEMMs: it has a matmul of
 * dt, and for bf16/f16 one that is no reference loop. */
static bool dnnl_candidate(accel_dtype dt) {
    const char *impl;
    return dnnl_probe(dt, &impl) && (dt == ACCEL_F32 || strncmp(impl, "ref", 3) != 0);
}

/* oneDNN's f32 matmul on widened panels (ACCEL__GEMM_PROVIDER_DNNL_F32) is
 * a candidate for dt GEMMs: dt is bf16 or f16 and oneDNN is one for f32. */
static bool dnnl_f32_candidate(accel_dtype dt) { return dt != ACCEL_F32 && dnnl_candidate(ACCEL_F32); }

/* OpenBLAS runs a core below this CPU (openblas_core.h: its SSE3 Prescott
 * kernels on an AVX-512 Xeon it does not know) and oneDNN's f32 matmul is
 * here: the rule then gives OpenBLAS's f32 work to oneDNN. */
static bool blas_gives_way(void) { return dnnl_candidate(ACCEL_F32) && accel__openblas_core_below(); }

/* bf16/f16 where OpenBLAS gives way and oneDNN has no matmul of dt: oneDNN
 * on f32 panels (accel__gemm_on widens dt for it), as ACCEL_GEMM=dnnl does
 * there. dt's GEMMs then count as oneDNN's (accel__gemm_native), so the ops
 * hand dt operands over as they are and every GEMM widens them per call
 * (accel__gemm_widens_per_call): a GEMM of dt operands and one of the same
 * values widened by the op run on the same provider, with the same bits. */
static bool lowp_on_dnnl_f32(accel_dtype dt) {
    const char *impl;
    return dt != ACCEL_F32 && !dnnl_probe(dt, &impl) && blas_gives_way();
}

/* The provider of a dt GEMM in auto mode: the rule (for f32 the table, or
 * oneDNN where OpenBLAS gives way; for bf16/f16 oneDNN where the CPU has
 * units for dt, or oneDNN on f32 panels: lowp_on_dnnl_f32) is the prior;
 * with two candidates a large shape's class is timed (gemm_choice.c; always when `force`) and keeps the
 * rule's choice unless another wins by a margin. Where OpenBLAS gives way,
 * decode's few f32 rows (M <= SMALL_M) are timed whatever their size:
 * OpenBLAS's sgemv per row is memory bound and may keep up with oneDNN on a
 * fallback core, which only measuring tells. */
static int auto_provider(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, bool force,
                         bool weight) {
    bool can = dnnl_candidate(dt), gives_way = blas_gives_way();
    int rule = ACCEL__GEMM_PROVIDER_OPENBLAS;
    if (dt == ACCEL_F32 && can && (gives_way || f32_table_entry(trans_a, trans_b, M, N, K)))
        rule = ACCEL__GEMM_PROVIDER_DNNL;
    else if (dt != ACCEL_F32 && (auto_dnnl_lowp(dt) || lowp_on_dnnl_f32(dt))) rule = ACCEL__GEMM_PROVIDER_DNNL;
    uint32_t candidates = 1u << ACCEL__GEMM_PROVIDER_OPENBLAS | (can ? 1u << ACCEL__GEMM_PROVIDER_DNNL : 0);
    /* a transposed A (dW = dY^T X) also on oneDNN's row blocks (gemm.h) */
    if (can && trans_a) candidates |= 1u << ACCEL__GEMM_PROVIDER_DNNL_ROWS;
    /* bf16/f16 also as oneDNN's f32 matmul on widened panels (gemm.h) */
    if (dnnl_f32_candidate(dt)) candidates |= 1u << ACCEL__GEMM_PROVIDER_DNNL_F32;
    bool skinny = dt == ACCEL_F32 && gives_way && M <= SMALL_M;
    /* an f32 weight's form is oneDNN's only where measured (form_faster),
     * so its class times oneDNN on the form: the plain weight's timing
     * undersold oneDNN by the panel copies the form saves (Zen 4, quiet:
     * oneDNN 1-9% faster than OpenBLAS on the plain weight, 7-12% on the
     * form) */
    if (weight && dt == ACCEL_F32 && !skinny)
        return accel__gemm_choose_weight(dt, trans_a, trans_b, M, N, K, rule, candidates, force);
    return accel__gemm_choose(dt, trans_a, trans_b, M, N, K, rule, candidates, force, skinny);
}

/* The mode in force after the checks every GEMM makes (ACCEL_GEMM,
 * ACCEL_CPU_ISA), or -1 with the error set. */
static int mode_checked(void) {
    int mode = mode_now();
    if (mode < 0) {
        char why[1024]; /* the plug-in's reason names the folders it looked in */
        env_mode_error(why, sizeof why);
        accel_set_error(strcmp(env_value, "dnnl") ? ACCEL_ERR_INVALID_ARG : ACCEL_ERR_UNSUPPORTED, "%s", why);
        return -1;
    }
    return accel__cpu_isa_check() == ACCEL_OK ? mode : -1;
}

/* accel__gemm_provider_for, or for a weight GEMM (accel__gemm_weight_provider_for). */
static int provider_for(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, bool weight) {
    int mode = mode_checked();
    if (mode < 0) return -1;
    if (accel_reference_kernels()) return ACCEL__GEMM_PROVIDER_REFERENCE;
    if (mode == ACCEL__GEMM_AUTO) return auto_provider(dt, trans_a, trans_b, M, N, K, false, weight);
    /* ACCEL_GEMM=dnnl: the f32 matmul exists on every CPU */
    return mode == ACCEL__GEMM_DNNL ? ACCEL__GEMM_PROVIDER_DNNL : ACCEL__GEMM_PROVIDER_OPENBLAS;
}

int accel__gemm_provider_for(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K) {
    return provider_for(dt, trans_a, trans_b, M, N, K, false);
}

int accel__gemm_weight_provider_for(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K) {
    return provider_for(dt, trans_a, trans_b, M, N, K, true);
}


int accel__gemm_tiles_provider(accel_dtype dt, int64_t qb, int64_t keys, int64_t d, bool force, accel__gemm_run run,
                               void *ctx) {
    const char *impl;
    int mode = mode_checked();
    if (mode < 0) return -1;
    bool lowp = dt != ACCEL_F32;
    if (!force && (accel_reference_kernels() || mode == ACCEL__GEMM_OPENBLAS)) return ACCEL__GEMM_PROVIDER_OPENBLAS;
    if (!force && mode == ACCEL__GEMM_DNNL)
        return !lowp || dnnl_probe(dt, &impl) ? ACCEL__GEMM_PROVIDER_DNNL : ACCEL__GEMM_PROVIDER_DNNL_F32;
    int rule = lowp && auto_dnnl_lowp(dt) ? ACCEL__GEMM_PROVIDER_DNNL : ACCEL__GEMM_PROVIDER_OPENBLAS;
    /* OpenBLAS on a fallback core is no prior either (ACCEL_GEMM_MEASURE=0, a rank's table) */
    if (rule == ACCEL__GEMM_PROVIDER_OPENBLAS && blas_gives_way())
        rule = lowp ? ACCEL__GEMM_PROVIDER_DNNL_F32 : ACCEL__GEMM_PROVIDER_DNNL;
    accel__gemm_class c = accel__gemm_class_of(dt, false, false, qb, keys, d, ACCEL__GEMM_OP_SDPA_TILES);
    return accel__gemm_choose_run(&c, rule, accel__gemm_tiles_candidates(dt), force, run, ctx);
}

uint32_t accel__gemm_tiles_candidates(accel_dtype dt) {
    uint32_t c = 1u << ACCEL__GEMM_PROVIDER_OPENBLAS;
    if (dnnl_f32_candidate(dt)) c |= 1u << ACCEL__GEMM_PROVIDER_DNNL_F32;
    if (dnnl_candidate(dt)) c |= 1u << ACCEL__GEMM_PROVIDER_DNNL; /* f32's dnnl, or dt's own matmul */
    return c;
}

void accel__gemm_library_versions(char *out, size_t n) {
    char dnnl[64] = "none";
#ifdef ACCEL_HAVE_DNNL
    accel__dnnl_version(dnnl, sizeof dnnl);
#endif
    snprintf(out, n, "openblas=%s;dnnl=%s", accel__openblas_get_config(), dnnl);
}

const char *accel__gemm_provider_name(accel__gemm_provider p) {
    return p == ACCEL__GEMM_PROVIDER_REFERENCE   ? "reference"
           : p == ACCEL__GEMM_PROVIDER_DNNL      ? "dnnl"
           : p == ACCEL__GEMM_PROVIDER_DNNL_ROWS ? "dnnl_rows"
           : p == ACCEL__GEMM_PROVIDER_DNNL_F32  ? "dnnl_f32"
                                                 : "openblas";
}

bool accel__gemm_is_dnnl(int p) {
    return p == ACCEL__GEMM_PROVIDER_DNNL || p == ACCEL__GEMM_PROVIDER_DNNL_ROWS || p == ACCEL__GEMM_PROVIDER_DNNL_F32;
}

bool accel__gemm_native(accel_dtype dt) {
    if (dt == ACCEL_F32) return true;
    return accel__gemm_provider_for(dt, false, true, 1, 1, 1) == ACCEL__GEMM_PROVIDER_DNNL;
}

bool accel__gemm_widens_per_call(accel_dtype dt) {
    const char *impl;
    return dt != ACCEL_F32 && accel__gemm_native(dt) && !dnnl_probe(dt, &impl);
}

int accel__gemm_weight_forms(accel_dtype dt) {
    const char *impl;
    int mode = mode_now();
    if (mode < 0 || mode == ACCEL__GEMM_OPENBLAS || accel_reference_kernels() || !dnnl_probe(dt, &impl)) return 0;
    if (mode == ACCEL__GEMM_DNNL) return 2;
    /* f32 in auto: only weights of the table's few shapes get forms; a per-model
     * estimate cannot tell them, and counting every weight would claim a copy
     * of the whole model (docs/cpu.md) */
    return dt != ACCEL_F32 && auto_dnnl_lowp(dt) ? 2 : 0;
}

/* What the f32 GEMM runs on, in the mode. */
static void describe_f32(int mode, char *out, size_t n) {
    const char *impl;
    if (mode == ACCEL__GEMM_DNNL && dnnl_probe(ACCEL_F32, &impl)) {
        snprintf(out, n, "dnnl (%s; ACCEL_GEMM=dnnl)", impl);
        return;
    }
    int entries = mode == ACCEL__GEMM_AUTO && dnnl_probe(ACCEL_F32, &impl) ? f32_table_entries_here() : 0;
    if (mode == ACCEL__GEMM_AUTO && blas_gives_way())
        snprintf(out, n, "dnnl (%s; OpenBLAS runs a core below this CPU: BLAS core); up to %d rows the faster of it and "
                 "OpenBLAS's sgemv per row, measured", impl, SMALL_M);
    else if (entries)
        snprintf(out, n, "openblas; dnnl (%s) on %d measured shape%s (docs/cpu.md)", impl, entries,
                 entries == 1 ? "" : "s");
    else if (mode == ACCEL__GEMM_AUTO && accel__gemm_have_dnnl() && accel__dnnl_unavailable())
        snprintf(out, n, "openblas (the oneDNN plug-in did not load: %s)", accel__dnnl_unavailable());
    else
        snprintf(out, n, "openblas%s", mode == ACCEL__GEMM_OPENBLAS ? " (ACCEL_GEMM=openblas)" : "");
}

/* What a GEMM of low-precision dtype dt runs on, in the mode. */
static void describe_lowp(int mode, accel_dtype dt, char *out, size_t n) {
    const char *impl, *name = accel_dtype_name(dt);
    bool can = dnnl_probe(dt, &impl);
    if (mode == ACCEL__GEMM_DNNL && can) snprintf(out, n, "dnnl (%s; ACCEL_GEMM=dnnl)", impl);
    else if (mode == ACCEL__GEMM_DNNL)
        snprintf(out, n, "dnnl on f32 operands (oneDNN has no %s matmul here; ACCEL_GEMM=dnnl)", name);
    else if (mode == ACCEL__GEMM_AUTO && can && auto_dnnl_lowp(dt)) snprintf(out, n, "dnnl (%s)", impl);
    else if (mode == ACCEL__GEMM_AUTO && lowp_on_dnnl_f32(dt))
        snprintf(out, n, "dnnl on f32 operands widened per call (oneDNN has no %s matmul here; OpenBLAS runs a core "
                 "below this CPU: BLAS core)", name);
    else if (mode == ACCEL__GEMM_OPENBLAS) snprintf(out, n, "openblas on f32 operands (ACCEL_GEMM=openblas)");
    else if (!accel__gemm_have_dnnl()) snprintf(out, n, "openblas on f32 operands (oneDNN not built in)");
    else if (accel__dnnl_unavailable())
        snprintf(out, n, "openblas on f32 operands (the oneDNN plug-in did not load: %s)", accel__dnnl_unavailable());
    else if (!can) snprintf(out, n, "openblas on f32 operands (oneDNN has no %s matmul here)", name);
    else if (!cpu_has_units(dt)) snprintf(out, n, "openblas on f32 operands (no %s units)", name);
    else snprintf(out, n, "openblas on f32 operands (oneDNN would run %s)", impl);
    size_t used = strlen(out);
    if (mode == ACCEL__GEMM_AUTO && dt == ACCEL_BF16 && !strncmp(out, "openblas", 8) && used < n)
        snprintf(out + used, n - used, "; up to %d rows against a bf16 weight: accel's bf16-weight kernel", SMALL_M);
}

/* In auto mode, where dt has two candidates: that a large GEMM takes its
 * class's measured choice, after out's line. */
static void describe_measured(int mode, accel_dtype dt, char *out, size_t n) {
    size_t used = strlen(out);
    if (mode == ACCEL__GEMM_AUTO && (dnnl_candidate(dt) || dnnl_f32_candidate(dt)) && used < n)
        snprintf(out + used, n - used, "; from 2^26 multiply-adds, its shape class's measured choice (GEMM choices)");
}

const char *accel__gemm_describe(char *buf, size_t size) {
    if (!buf || size == 0) return buf;
    int mode = mode_now();
    if (mode < 0) {
        char why[1024]; /* the plug-in's reason names the folders it looked in */
        env_mode_error(why, sizeof why);
        snprintf(buf, size, "GEMM: none (%s)\n", why);
        return buf;
    }
    if (accel_reference_kernels()) {
        snprintf(buf, size, "GEMM: reference (accel_set_reference_kernels)\n");
        return buf;
    }
    char f32[384], bf16[384], f16[384]; /* a oneDNN implementation name is up to 191 bytes */
    describe_f32(mode, f32, sizeof f32);
    describe_lowp(mode, ACCEL_BF16, bf16, sizeof bf16);
    describe_lowp(mode, ACCEL_F16, f16, sizeof f16);
    describe_measured(mode, ACCEL_F32, f32, sizeof f32);
    describe_measured(mode, ACCEL_BF16, bf16, sizeof bf16);
    describe_measured(mode, ACCEL_F16, f16, sizeof f16);
    snprintf(buf, size, "GEMM f32: %s\nGEMM bf16: %s\nGEMM f16: %s\n", f32, bf16, f16);
    return buf;
}

/* ---- accel__gemm */

/* A [rows, cols] panel with leading dim ld of dtype from as contiguous
 * dtype to (ld = cols), in the step arena; p itself when the dtypes match. */
static const void *as_dtype(const void *p, accel_dtype from, accel_dtype to, int64_t rows, int64_t cols,
                            int64_t ld) {
    if (from == to) return p;
    size_t ts = accel_dtype_size(to), fs = accel_dtype_size(from);
    char *f = accel_arena_alloc(accel_step_arena(), (size_t)(rows * cols) * ts, 64);
    if (!f) return NULL;
    /* The vectorised, threaded conversion: a bf16 weight widened for every
     * call costs as much as the GEMM itself at decode's M = 1. */
    const char *src = p;
    if (ld == cols) accel__cpu_convert(f, to, src, from, rows * cols);
    else
        for (int64_t r = 0; r < rows; r++)
            accel__cpu_convert(f + (size_t)(r * cols) * ts, to, src + (size_t)(r * ld) * fs, from, cols);
    return f;
}

/* A few rows against a bf16 weight (Y = X W^T at decode) where OpenBLAS
 * would run on an f32 copy of the whole weight made for the call: the
 * skinny kernel reads the weight as bf16 instead, half the bytes of the f32
 * weight and a fifth of the widen-then-sgemv traffic. In auto mode only
 * (ACCEL_GEMM=openblas keeps OpenBLAS). */
static bool bf16_weight_path(int provider, bool trans_a, bool trans_b, int64_t M, int64_t K, accel_dtype b_dt) {
    return provider == ACCEL__GEMM_PROVIDER_OPENBLAS && mode_now() == ACCEL__GEMM_AUTO && b_dt == ACCEL_BF16 &&
           !trans_a && trans_b && M <= SMALL_M && K > 0;
}

static bool gemm_dtype_ok(accel_dtype dt) {
    return dt == ACCEL_F32 || dt == ACCEL_BF16 || dt == ACCEL_F16;
}

/* The operands' dtype when they share one, f32 otherwise. */
static accel_dtype compute_dtype(accel_dtype a, accel_dtype b) { return a == b ? a : ACCEL_F32; }

/* Whether the sizes fit the BLAS int. */
static bool sizes_fit(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc) {
    int64_t big = M > N ? M : N;
    big = big > K ? big : K;
    int64_t ld = lda > ldb ? lda : ldb;
    ld = ld > ldc ? ld : ldc;
    return big <= INT_MAX && ld <= INT_MAX;
}

int accel__gemm_measure(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, bool weight) {
    if (!gemm_dtype_ok(dt) || M <= 0 || N <= 0 || K <= 0 || !sizes_fit(M, N, K, 1, 1, 1))
        return ACCEL__GEMM_PROVIDER_OPENBLAS;
    return auto_provider(dt, trans_a, trans_b, M, N, K, true, weight);
}

size_t accel__gemm_dnnl_scratchpad(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                   float beta, accel_dtype c_dt) {
#ifdef ACCEL_HAVE_DNNL
    const char *impl;
    int mode = mode_now();
    if (mode < 0 || accel_reference_kernels() || !gemm_dtype_ok(dt) || M <= 0 || N <= 0 || K <= 0 ||
        !sizes_fit(M, N, K, 1, 1, 1) || !dnnl_probe(ACCEL_F32, &impl))
        return 0;
    if (mode != ACCEL__GEMM_DNNL && !(mode == ACCEL__GEMM_AUTO && dt != ACCEL_F32 && auto_dnnl_lowp(dt))) return 0;
    if (!dnnl_probe(dt, &impl)) dt = c_dt = ACCEL_F32; /* widened per call (accel__gemm_on) */
    size_t bytes;
    if (accel__dnnl_scratchpad(dt, trans_a, trans_b, M, N, K, beta, c_dt, &bytes) != ACCEL_OK) return 0;
    return bytes + accel__gemm_test_scratchpad_bytes();
#else
    (void)dt, (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)beta, (void)c_dt;
    return 0;
#endif
}

/* accel__gemm, op(B) a layer's weight where `weight` (its provider then
 * accel__gemm_weight_provider_for's). */
static accel_status gemm_of(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                            accel_dtype a_dt, int64_t lda, const void *B, accel_dtype b_dt, int64_t ldb, float beta,
                            float *C, int64_t ldc, bool weight) {
    if (!gemm_dtype_ok(a_dt) || !gemm_dtype_ok(b_dt))
        return accel_set_error(ACCEL_ERR_DTYPE, "accel_gemm: unsupported operand dtypes %s and %s",
                               accel_dtype_name(a_dt), accel_dtype_name(b_dt));
    if (!sizes_fit(M, N, K, lda, ldb, ldc))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                               "accel_gemm: matrix sizes M=%lld N=%lld K=%lld exceed the BLAS int range",
                               (long long)M, (long long)N, (long long)K);
    if (M <= 0 || N <= 0) return ACCEL_OK;
    int provider = provider_for(compute_dtype(a_dt, b_dt), trans_a, trans_b, M, N, K, weight);
    if (provider < 0) return accel_last_status();
    return accel__gemm_on(provider, trans_a, trans_b, M, N, K, alpha, A, a_dt, lda, B, b_dt, ldb, beta, C, ldc);
}

accel_status accel__gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                         accel_dtype a_dt, int64_t lda, const void *B, accel_dtype b_dt, int64_t ldb, float beta,
                         float *C, int64_t ldc) {
    return gemm_of(trans_a, trans_b, M, N, K, alpha, A, a_dt, lda, B, b_dt, ldb, beta, C, ldc, false);
}

#ifdef ACCEL_HAVE_DNNL
/* accel__dnnl_gemm on row blocks of C (ACCEL__GEMM_PROVIDER_DNNL_ROWS):
 * gemm_blocks' split over the OpenMP threads, each block a matmul that
 * oneDNN plans for the one thread running it (its primitives are keyed by
 * the threads they run on). Inside a parallel region, or with too few rows
 * to split, the whole GEMM on the calling thread. A block's error (each
 * thread's error state is its own) is raised on the calling thread. */
static accel_status dnnl_rows_gemm(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                   float alpha, const void *A, int64_t lda, const void *B, int64_t ldb, float beta,
                                   float *C, int64_t ldc) {
    int nt = omp_in_parallel() ? 1 : accel_num_threads();
    int64_t nb = nt > 1 ? gemm_blocks(M, nt) : 0;
    if (nb < 2) return accel__dnnl_gemm(dt, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ACCEL_F32, ldc);
    size_t es = accel_dtype_size(dt);
    int64_t blk = ((M + nb - 1) / nb + 15) / 16 * 16;
    nb = (M + blk - 1) / blk;
    accel_status first = ACCEL_OK;
    char msg[1024] = ""; /* a block's whole message (the error buffer's size) */
#pragma omp parallel for num_threads(nt) schedule(dynamic)
    for (int64_t b = 0; b < nb; b++) {
        int64_t lo = b * blk, n = M - lo < blk ? M - lo : blk;
        /* rows [lo, lo+n) of op(A): columns of a transposed A */
        const char *a = (const char *)A + (size_t)(trans_a ? lo : lo * lda) * es;
        accel_status st = accel__dnnl_gemm(dt, trans_a, trans_b, n, N, K, alpha, a, lda, B, ldb, beta, C + lo * ldc,
                                           ACCEL_F32, ldc);
        if (st != ACCEL_OK) {
#pragma omp critical(accel_gemm_rows_error)
            if (first == ACCEL_OK) {
                first = st;
                snprintf(msg, sizeof msg, "%s", accel_last_error());
            }
        }
    }
    return first == ACCEL_OK ? ACCEL_OK : accel_set_error(first, "%s", msg);
}
#endif

accel_status accel__gemm_on(int provider, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                            const void *A, accel_dtype a_dt, int64_t lda, const void *B, accel_dtype b_dt,
                            int64_t ldb, float beta, float *C, int64_t ldc) {
    accel_dtype dt = compute_dtype(a_dt, b_dt);
    /* Stored shapes of the operands. */
    int64_t ar = trans_a ? K : M, ac = trans_a ? M : K;
    int64_t br = trans_b ? N : K, bc = trans_b ? K : N;
    /* OpenBLAS multiplies f32, and so does dnnl_f32; so does oneDNN on a
     * CPU where it has no matmul of dt (ACCEL_GEMM=dnnl only); for K = 0
     * oneDNN computes nothing, and the reference loop scales C by beta. */
    const char *impl;
    if (!accel__gemm_is_dnnl(provider) || provider == ACCEL__GEMM_PROVIDER_DNNL_F32 || K <= 0 || !dnnl_probe(dt, &impl))
        dt = ACCEL_F32;
    /* The widened panels live for this call only: rewound at its end, so a
     * step's arena holds one call's panels at a time, whichever provider
     * and CPU kind (docs/cpu.md "Operand copies"). */
    accel_arena *arena = accel_step_arena();
    accel_arena_mark mark = accel_arena_mark_now(arena);
    accel_status st = ACCEL_OK;
    if (bf16_weight_path(provider, trans_a, trans_b, M, K, b_dt)) {
        /* Only the few rows of A are widened; the weight is read as bf16. */
        const float *a = as_dtype(A, a_dt, ACCEL_F32, M, K, lda);
        if (a)
            small_m_gemm(&(small_gemm){false, true, M, K, alpha, beta, a, a_dt == ACCEL_F32 ? lda : K, B,
                                       ACCEL_BF16, ldb, C, ldc},
                         N);
        else st = accel_last_status();
        accel_arena_rewind(arena, mark);
        return st;
    }
    const void *a = as_dtype(A, a_dt, dt, ar, ac, lda);
    const void *b = a ? as_dtype(B, b_dt, dt, br, bc, ldb) : NULL;
    lda = a_dt == dt ? lda : (ac ? ac : 1);
    ldb = b_dt == dt ? ldb : (bc ? bc : 1);
    if (!a || !b) st = accel_last_status();
#ifdef ACCEL_HAVE_DNNL
    else if ((provider == ACCEL__GEMM_PROVIDER_DNNL || provider == ACCEL__GEMM_PROVIDER_DNNL_F32) && K > 0)
        st = accel__dnnl_gemm(dt, trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb, beta, C, ACCEL_F32, ldc);
    else if (provider == ACCEL__GEMM_PROVIDER_DNNL_ROWS && K > 0)
        st = dnnl_rows_gemm(dt, trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc);
#endif
    else accel__sgemm(trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc);
    accel_arena_rewind(arena, mark);
    return st;
}

/* ---- a layer's weight in oneDNN's layout (gemm.h: accel__gemm_weight) */

/* accel__gemm_test_scratchpad's bytes. */
static _Atomic size_t g_test_scratch;

void accel__gemm_test_scratchpad(size_t extra) { g_test_scratch = extra; }

size_t accel__gemm_test_scratchpad_bytes(void) { return g_test_scratch; }

/* accel__gemm_test_padded_layouts: every layout taken for a padded one. */
static _Atomic bool g_pretend_padded;

void accel__gemm_test_padded_layouts(bool on) { g_pretend_padded = on; }

/* ---- in auto mode, an f32 weight's form only where it measured faster
 *
 * oneDNN's brgemm (AVX-512) copies a plain weight's panels into its blocks
 * inside every call, so there the form saves that copy; where the matmul
 * reads the plain weight about as fast (gemm:jit on AVX2 packs its panels
 * whatever the source layout) the form only costs a reorder per optimizer
 * step and a copy of the weight. So in auto mode an f32 weight GEMM of at
 * least FORM_MIN_MACS multiply-adds times, at its first use, oneDNN on the
 * plain weight against the form (scratch operands of its signature, the two
 * interleaved: one warm-up, then the medians of FORM_REPS) and reads the
 * form only where it was faster. The verdict is kept for the process (the
 * two give the same bits: only where the weight's panels come from
 * differs). A full table, ACCEL_GEMM_MEASURE=0, the ranks of a job (which
 * time nothing, as gemm_choice.c says) and a first use inside a parallel
 * region keep the rule: the form. Smaller GEMMs read the plain weight:
 * oneDNN runs them in auto only where OpenBLAS gives way (the rule, not a
 * measurement), and a copy of every weight (two in training) is not paid for
 * untimed (decode's M = 1 against a weight gains nothing from it). */
#define FORM_MIN_MACS (1ll << 26)
enum { FORM_REPS = 3, FORM_MAX = 128 };

static pthread_mutex_t g_form_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_n_forms; /* verdicts in g_forms (below) */
static accel__gemm_form_timer g_form_timer;
static void *g_form_timer_ctx;

void accel__gemm_form_set_timer(accel__gemm_form_timer fn, void *ctx) {
    pthread_mutex_lock(&g_form_lock);
    g_form_timer = fn, g_form_timer_ctx = ctx, g_n_forms = 0;
    pthread_mutex_unlock(&g_form_lock);
}

#ifdef ACCEL_HAVE_DNNL
/* The form of src, a dense weight [rows, cols] of the form's dtype:
 * reordered into oneDNN's layout of op(B) = src^T (ACCEL__FORM_DNNL_NT:
 * N = rows, K = cols) or op(B) = src (ACCEL__FORM_DNNL_NN: K = rows,
 * N = cols). */
static accel_status fill_dnnl_form(accel_tensor *dst, accel_tensor *src, const accel__form_key *key) {
    bool nt = key->kind == ACCEL__FORM_DNNL_NT;
    int64_t rows = src->shape[0], cols = src->shape[1], N = nt ? rows : cols, K = nt ? cols : rows;
    size_t bytes;
    accel__pair_layout pairs;
    accel_status st = accel__dnnl_weight_layout(key->dt, nt, N, K, &bytes, &pairs);
    if (st == ACCEL_OK && pairs.k_block && accel__pair_pack_enabled())
        accel__pair_pack(&pairs, nt, N, K, src->data, dst->data);
    else if (st == ACCEL_OK)
        st = accel__dnnl_weight_pack(key->dt, nt, N, K, src->data, dst->data);
    accel__tensor_written(dst);
    return st;
}

/* Whether B (W's data from w_off, leading dim ldw) is all of a dense 2-D W:
 * op(B) [K, N], W [N, K] when trans_b, else [K, N]. */
static bool whole_weight(const accel_tensor *W, bool trans_b, int64_t N, int64_t K, int64_t w_off, int64_t ldw) {
    int64_t rows = trans_b ? N : K, cols = trans_b ? K : N;
    return W->ndim == 2 && W->shape[0] == rows && W->shape[1] == cols && w_off == 0 && ldw == cols &&
           accel_is_contiguous(W);
}

typedef struct form_verdict {
    bool ta, tb;
    int64_t M, N, K;
    int threads;
    bool form; /* the form is read */
} form_verdict;

static form_verdict g_forms[FORM_MAX];

static int cmp_seconds(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Seconds of oneDNN on the plain weight and on its form (t[0], t[1]:
 * medians), on zeroed scratch operands; false where the form cannot run
 * (no layout, or a matmul that reads it only with the reference loop). */
static bool form_time(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double t[2]) {
    size_t bytes;
    if (accel__dnnl_weight_layout(ACCEL_F32, tb, N, K, &bytes, NULL) != ACCEL_OK || !bytes) return false;
    float *A = calloc((size_t)(M * K), sizeof(float)), *B = calloc((size_t)(K * N), sizeof(float));
    float *C = calloc((size_t)(M * N), sizeof(float));
    void *P = calloc(bytes, 1);
    double s[2][FORM_REPS];
    bool ok = A && B && C && P && accel__dnnl_weight_pack(ACCEL_F32, tb, N, K, B, P) == ACCEL_OK, ran = true;
    for (int r = -1; ok && ran && r < FORM_REPS; r++)
        for (int v = 0; v < 2 && ok && ran; v++) {
            double t0 = accel_now_seconds();
            ok = v ? accel__dnnl_gemm_packed(ACCEL_F32, ta, tb, M, N, K, 1.0f, A, ta ? M : K, P, 0.0f, C, ACCEL_F32, N,
                                             &ran) == ACCEL_OK
                   : accel__dnnl_gemm(ACCEL_F32, ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.0f, C,
                                      ACCEL_F32, N) == ACCEL_OK;
            if (r >= 0) s[v][r] = accel_now_seconds() - t0;
        }
    free(A), free(B), free(C), free(P);
    if (!ok || !ran) {
        accel_clear_error();
        return false;
    }
    for (int v = 0; v < 2; v++) {
        qsort(s[v], FORM_REPS, sizeof(double), cmp_seconds);
        t[v] = s[v][FORM_REPS / 2];
    }
    return true;
}

/* Whether this f32 GEMM, which oneDNN runs, reads its weight's form in
 * auto mode (above). */
static bool form_faster(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
    if ((double)M * (double)N * (double)K < (double)FORM_MIN_MACS) return false;
    if (accel__gemm_measure_off()) return true;
    int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    pthread_mutex_lock(&g_form_lock);
    bool form = true;
    int i = 0;
    for (; i < g_n_forms; i++) {
        const form_verdict *v = &g_forms[i];
        if (v->ta == ta && v->tb == tb && v->M == M && v->N == N && v->K == K && v->threads == threads) break;
    }
    if (i < g_n_forms) form = g_forms[i].form;
    else if (i < FORM_MAX && !omp_in_parallel()) {
        /* the lock is held while timing: two threads must not time at once */
        double t[2] = {0, 0};
        bool timed = g_form_timer ? (t[0] = g_form_timer(g_form_timer_ctx, false, M, N, K),
                                     t[1] = g_form_timer(g_form_timer_ctx, true, M, N, K), true)
                                  : form_time(ta, tb, M, N, K, t);
        form = timed && t[1] < t[0];
        g_forms[g_n_forms++] = (form_verdict){ta, tb, M, N, K, threads, form};
    }
    pthread_mutex_unlock(&g_form_lock);
    return form;
}

/* Whether oneDNN's layout of a dense op(B) [K, N] of dtype dt (which it
 * multiplies) is one a form of W's size holds; *st the layout query's
 * error (false then), else ACCEL_OK. */
static bool form_fits(accel_dtype dt, bool trans_b, int64_t N, int64_t K, accel_status *st) {
    size_t bytes;
    *st = accel__dnnl_weight_layout(dt, trans_b, N, K, &bytes, NULL);
    /* none (oneDNN reads W as it is stored: gemm:jit's plain [K, N] on
     * AVX2), or one with padding (brgemm's blocks of 16-64 columns on
     * AVX-512 past an N or K that is no multiple of them), which would not
     * fit a form of W's size */
    return *st == ACCEL_OK && bytes == (size_t)(N * K) * accel_dtype_size(dt) && !g_pretend_padded;
}

/* Whether a dense weight of dtype dt as op(B) [K, N] of this GEMM, A of
 * dtype dt too, is read from a form in oneDNN's layout (gemm.h:
 * accel__gemm_weight_has_form); *st is the error where the layout query
 * failed (false then), else ACCEL_OK. */
static bool dnnl_form_applies(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                              accel_status *st) {
    *st = ACCEL_OK;
    const char *impl;
    if (!gemm_dtype_ok(dt) || M <= 0 || N <= 0 || K <= 0) return false;
    /* oneDNN multiplying dt itself: not the reference loop, OpenBLAS, or
     * operands widened per call (ACCEL_GEMM=dnnl without bf16 units) */
    if (accel__gemm_weight_provider_for(dt, trans_a, trans_b, M, N, K) != ACCEL__GEMM_PROVIDER_DNNL ||
        !dnnl_probe(dt, &impl))
        return false;
    if (!form_fits(dt, trans_b, N, K, st)) return false;
    return dt != ACCEL_F32 || mode_now() != ACCEL__GEMM_AUTO || form_faster(trans_a, trans_b, M, N, K);
}

/* Whether this GEMM's op(B), W's data from w_off (leading dim ldw), could
 * be read from a form of W: all of a dense W of A's dtype, of which
 * prepared forms can be kept. Where not, oneDNN reads the plain weight and
 * the GEMM takes the plain class's provider (auto_provider). */
static bool may_hold_form(const accel_tensor *W, accel_dtype a_dt, bool trans_b, int64_t N, int64_t K, int64_t w_off,
                          int64_t ldw) {
    return a_dt == W->dtype && whole_weight(W, trans_b, N, K, w_off, ldw) && accel__prepared_can_hold(W);
}

/* accel__gemm_weight on W's form in oneDNN's layout, C of dtype c_dt (f32,
 * or W's); *ran false (ACCEL_OK) where that does not apply. */
static accel_status dnnl_weight_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                                     const void *A, accel_dtype a_dt, int64_t lda, accel_tensor *W, int64_t w_off,
                                     int64_t ldw, float beta, void *C, accel_dtype c_dt, int64_t ldc, bool *ran) {
    *ran = false;
    accel_dtype dt = W->dtype;
    if (!sizes_fit(M, N, K, lda, ldw, ldc) || !may_hold_form(W, a_dt, trans_b, N, K, w_off, ldw)) return ACCEL_OK;
    accel_status st;
    if (!dnnl_form_applies(dt, trans_a, trans_b, M, N, K, &st)) return st;
    accel__form_key key = {.kind = trans_b ? ACCEL__FORM_DNNL_NT : ACCEL__FORM_DNNL_NN, .dt = dt};
    accel_tensor *form;
    st = accel__prepared_get(W, &key, dt, fill_dnnl_form, &form, NULL);
    if (st != ACCEL_OK || !form) return st;
    return accel__dnnl_gemm_packed(dt, trans_a, trans_b, M, N, K, alpha, A, lda, form->data, beta, C, c_dt, ldc, ran);
}
#endif

accel_status accel__gemm_scratch_form(accel_dtype dt, bool trans_b, int64_t N, int64_t K, const void *B, void **form,
                                      size_t *bytes) {
    *form = NULL, *bytes = 0;
#ifdef ACCEL_HAVE_DNNL
    const char *impl;
    accel_status st = ACCEL_OK;
    if (!gemm_dtype_ok(dt) || N <= 0 || K <= 0 || !sizes_fit(1, N, K, 1, 1, 1) || !dnnl_probe(dt, &impl) ||
        !form_fits(dt, trans_b, N, K, &st))
        return st;
    size_t n = (size_t)(N * K) * accel_dtype_size(dt);
    void *f = accel_malloc(n); /* the user's allocator (accel_set_allocator), as the weight's own form */
    if (!f)
        return accel_set_error(ACCEL_ERR_OOM, "out of memory for the form of a %lld x %lld weight (%zu bytes)",
                               (long long)N, (long long)K, n);
    st = accel__dnnl_weight_pack(dt, trans_b, N, K, B, f);
    if (st != ACCEL_OK) {
        accel_free(f);
        return st;
    }
    *form = f, *bytes = n;
#else
    (void)dt, (void)trans_b, (void)N, (void)K, (void)B;
#endif
    return ACCEL_OK;
}

static _Atomic size_t g_form_runs; /* accel__gemm_form_runs */

size_t accel__gemm_form_runs(void) { return g_form_runs; }

accel_status accel__gemm_on_form(int provider, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                 float alpha, const void *A, accel_dtype dt, int64_t lda, const void *B,
                                 const void *form, int64_t ldb, float beta, float *C, int64_t ldc) {
#ifdef ACCEL_HAVE_DNNL
    if (form && provider == ACCEL__GEMM_PROVIDER_DNNL) {
        bool ran;
        accel_status st = accel__dnnl_gemm_packed(dt, trans_a, trans_b, M, N, K, alpha, A, lda, form, beta, C,
                                                  ACCEL_F32, ldc, &ran);
        g_form_runs += st == ACCEL_OK && ran;
        if (st != ACCEL_OK || ran) return st;
    }
#else
    (void)form;
#endif
    return accel__gemm_on(provider, trans_a, trans_b, M, N, K, alpha, A, dt, lda, B, dt, ldb, beta, C, ldc);
}

bool accel__gemm_weight_has_form(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K) {
#ifdef ACCEL_HAVE_DNNL
    accel_status st;
    return sizes_fit(M, N, K, 1, 1, 1) && dnnl_form_applies(dt, trans_a, trans_b, M, N, K, &st);
#else
    (void)dt, (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K;
    return false;
#endif
}

accel_status accel__gemm_weight(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                                const void *A, accel_dtype a_dt, int64_t lda, accel_tensor *W, int64_t w_off,
                                int64_t ldw, float beta, float *C, int64_t ldc) {
    bool weight = false; /* the weight class: where the GEMM may read a form, as its oneDNN was timed */
#ifdef ACCEL_HAVE_DNNL
    bool ran;
    accel_status st =
        dnnl_weight_gemm(trans_a, trans_b, M, N, K, alpha, A, a_dt, lda, W, w_off, ldw, beta, C, ACCEL_F32, ldc, &ran);
    if (st != ACCEL_OK || ran) return st;
    weight = may_hold_form(W, a_dt, trans_b, N, K, w_off, ldw);
#endif
    const char *B = (const char *)W->data + (size_t)w_off * accel_dtype_size(W->dtype);
    return gemm_of(trans_a, trans_b, M, N, K, alpha, A, a_dt, lda, B, W->dtype, ldw, beta, C, ldc, weight);
}

/* ---- the table's matrix kernels */

/* C [M, N] (leading dim ldc) = beta C + bias in every row; beta 0 writes the
 * bias alone (NaNs in C ignored). */
static void bias_into_rows(float *c, int64_t ldc, int64_t M, int64_t N, const float *bias, float beta) {
#pragma omp parallel for if (M * N > 65536) schedule(static)
    for (int64_t r = 0; r < M; r++) {
        float *cr = c + r * ldc;
        if (beta == 0.0f) memcpy(cr, bias, (size_t)N * sizeof(float));
        else
            for (int64_t j = 0; j < N; j++) cr[j] = beta * cr[j] + bias[j];
    }
}

static accel_status bias_check(const accel_tensor *bias, int64_t N) {
    if (bias->dtype != ACCEL_F32)
        return accel_set_error(ACCEL_ERR_DTYPE, "gemm: bias must be f32 (got %s)", accel_dtype_name(bias->dtype));
    if (accel_numel(bias) != N || !accel_is_contiguous(bias))
        return accel_set_error(ACCEL_ERR_SHAPE, "gemm: bias must be %lld contiguous elements (N; got %lld%s)",
                               (long long)N, (long long)accel_numel(bias), accel_is_contiguous(bias) ? "" : ", strided");
    return ACCEL_OK;
}

/* The kernel with an f32 C at c (leading dim ldc; k->c's own is ignored).
 * The bias epilogue runs first: C = beta C + bias, then the GEMM with beta 1
 * adds alpha op(A) op(B) onto it, so no provider needs an epilogue of its
 * own and C is read and written once more at most (docs/cpu.md). */
static accel_status gemm_f32_c(const accel_k_gemm *k, float *c, int64_t ldc) {
    const char *a = (const char *)k->a->data + (size_t)k->a_off * accel_dtype_size(k->a->dtype);
    float beta = k->beta;
    if (k->bias) {
        accel_status st = bias_check(k->bias, k->N);
        if (st != ACCEL_OK) return st;
        bias_into_rows(c, ldc, k->M, k->N, k->bias->data, beta);
        beta = 1.0f;
    }
    if (k->b_weight)
        return accel__gemm_weight(k->trans_a, k->trans_b, k->M, k->N, k->K, k->alpha, a, k->a->dtype, k->lda, k->b,
                                  k->b_off, k->ldb, beta, c, ldc);
    const char *b = (const char *)k->b->data + (size_t)k->b_off * accel_dtype_size(k->b->dtype);
    return accel__gemm(k->trans_a, k->trans_b, k->M, k->N, k->K, k->alpha, a, k->a->dtype, k->lda, b, k->b->dtype,
                       k->ldb, beta, c, ldc);
}

/* Whether oneDNN writes k's C, of dtype dt (bf16/f16), itself: A and B
 * are dt too, oneDNN multiplies dt on this CPU for the shape (no operands
 * widened per call), beta is 0 and there is no bias. */
#ifdef ACCEL_HAVE_DNNL
static bool dnnl_writes_lowp(const accel_k_gemm *k, accel_dtype dt) {
    const char *impl;
    return !k->bias && k->beta == 0.0f && k->a->dtype == dt && k->b->dtype == dt && k->K > 0 &&
           sizes_fit(k->M, k->N, k->K, k->lda, k->ldb, k->ldc) &&
           accel__gemm_provider_for(dt, k->trans_a, k->trans_b, k->M, k->N, k->K) == ACCEL__GEMM_PROVIDER_DNNL &&
           dnnl_probe(dt, &impl);
}
#endif

/* k with a bf16/f16 C (a linear's output under autocast, a fresh input
 * gradient: kernels.h). Where oneDNN multiplies that dtype it writes C
 * itself, which saves writing an f32 C, reading it back and converting it
 * (~10% of a forward GEMM's CPU time at N >= K on Zen 5); elsewhere the
 * GEMM runs on an f32 C in the step arena (C widened into it when beta is
 * not 0), rounded into C after, as the op converting its f32 result did. */
static accel_status gemm_lowp_c(const accel_k_gemm *k) {
    accel_dtype dt = k->c->dtype;
    size_t cs = accel_dtype_size(dt);
    char *c = (char *)k->c->data + (size_t)k->c_off * cs;
    if (k->M <= 0 || k->N <= 0) return ACCEL_OK;
#ifdef ACCEL_HAVE_DNNL
    if (dnnl_writes_lowp(k, dt)) {
        const char *a = (const char *)k->a->data + (size_t)k->a_off * cs;
        bool ran = false;
        accel_status st = k->b_weight ? dnnl_weight_gemm(k->trans_a, k->trans_b, k->M, k->N, k->K, k->alpha, a, dt,
                                                         k->lda, k->b, k->b_off, k->ldb, 0.0f, c, dt, k->ldc, &ran)
                                      : ACCEL_OK;
        if (st != ACCEL_OK || ran) return st;
        const char *b = (const char *)k->b->data + (size_t)k->b_off * cs;
        return accel__dnnl_gemm(dt, k->trans_a, k->trans_b, k->M, k->N, k->K, k->alpha, a, k->lda, b, k->ldb, 0.0f, c,
                                dt, k->ldc);
    }
#endif
    accel_arena *arena = accel_step_arena();
    accel_arena_mark mark = accel_arena_mark_now(arena);
    float *f = accel_arena_alloc(arena, (size_t)(k->M * k->N) * sizeof(float), 64);
    accel_status st = f ? ACCEL_OK : accel_last_status();
    bool dense = k->ldc == k->N;
    if (st == ACCEL_OK && k->beta != 0.0f) {
        if (dense) accel__cpu_convert(f, ACCEL_F32, c, dt, k->M * k->N);
        else
            for (int64_t r = 0; r < k->M; r++)
                accel__cpu_convert(f + r * k->N, ACCEL_F32, c + (size_t)(r * k->ldc) * cs, dt, k->N);
    }
    if (st == ACCEL_OK) st = gemm_f32_c(k, f, k->N);
    if (st == ACCEL_OK) {
        if (dense) accel__cpu_convert(c, dt, f, ACCEL_F32, k->M * k->N);
        else
            for (int64_t r = 0; r < k->M; r++)
                accel__cpu_convert(c + (size_t)(r * k->ldc) * cs, dt, f + r * k->N, ACCEL_F32, k->N);
    }
    accel_arena_rewind(arena, mark);
    return st;
}

accel_status accel__cpuk_gemm(accel_k_gemm *k) {
    if (k->c->dtype == ACCEL_BF16 || k->c->dtype == ACCEL_F16) return gemm_lowp_c(k);
    return gemm_f32_c(k, (float *)k->c->data + k->c_off, k->ldc);
}

accel_status accel__cpuk_bias_rows(accel_k_bias_rows *k) {
    bias_into_rows(k->out->data, k->O, k->R, k->O, k->bias->data, 0.0f);
    return ACCEL_OK;
}

accel_status accel__cpuk_col_sum(accel_k_col_sum *k) {
    const float *g = k->g->data;
    float *db = k->out->data, beta = k->beta;
    int64_t R = k->R, O = k->O;
    int nt = accel_num_threads();
    int64_t chunk = (O + nt - 1) / nt;
    chunk = chunk < 64 ? 64 : (chunk + 15) / 16 * 16;
#pragma omp parallel for if (R * O > 65536) schedule(static)
    for (int64_t c0 = 0; c0 < O; c0 += chunk) {
        int64_t c1 = c0 + chunk < O ? c0 + chunk : O;
        for (int64_t j = c0; j < c1; j++) db[j] = beta == 0.0f ? 0.0f : db[j];
        for (int64_t r = 0; r < R; r++) {
            const float *gr = g + r * O;
            for (int64_t j = c0; j < c1; j++) db[j] += gr[j];
        }
    }
    return ACCEL_OK;
}
