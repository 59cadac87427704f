/* CPU GEMM used by every op that multiplies matrices (not public API).
 *
 * All matrices are row-major. C [M, N] = alpha * op(A) op(B) + beta * C where
 * op(A) is [M, K] (A stored [K, M] when trans_a) and op(B) is [K, N] (B stored
 * [N, K] when trans_b). With beta == 0, C is overwritten (NaNs in it ignored).
 *
 * The f32 path calls OpenBLAS cblas_sgemm on the buffers as they are (a
 * transposed operand is never copied); with M <= 4 rows (decoding one token)
 * it calls one cblas_sgemv per row instead, which packs nothing. BLAS runs
 * single-threaded; a large
 * GEMM is split into row or column blocks (one per thread, or up to 4 per
 * thread of 1024+ rows: each block packs the other operand again) computed
 * by the OpenMP threads
 * (one thread pool: OpenBLAS's pthread pool and the OpenMP pool of the other
 * ops otherwise spin against each other on the cores). Called inside an
 * OpenMP parallel region, it computes on the calling thread alone. Under accel_reference_kernels() a plain
 * triple loop (double accumulation) runs instead; tests compare the two.
 */
#ifndef ACCEL_BACKENDS_CPU_GEMM_H
#define ACCEL_BACKENDS_CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "accel/core.h"
#include "core/kernels.h"

/* f32 GEMM; dispatches to OpenBLAS or to the reference loop. Sizes must fit
 * in an int (checked by accel__gemm; internal callers guarantee it). */
void accel__sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                  int64_t ldc);

/* Makes OpenBLAS run on the calling thread (openblas_set_num_threads(1)),
 * once, outside parallel regions. accel__sgemm does it itself; an op that
 * calls accel__sgemm from inside its own OpenMP region calls it before the
 * region. (A program that also calls BLAS directly and wants it threaded
 * must set the BLAS thread count again before its own calls.) */
void accel__blas_single_thread(void);

/* The plain reference loop (always; no dispatch). */
void accel__sgemm_ref(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                      float *C, int64_t ldc);

/* GEMM with operands of dtype f32, bf16 or f16 and an f32 result (f32
 * accumulation), on the provider chosen for its dtype and shape (below).
 * The compute dtype is bf16 (f16) when both operands are bf16 (f16), f32
 * otherwise: a low-precision operand beside an f32 one is widened exactly
 * (an f32 panel in the step arena), never the f32 one rounded. OpenBLAS gets
 * every low-precision operand as such a panel. Returns ACCEL_OK or an error
 * (OOM, a size that does not fit the BLAS int, a non-float dtype, a bad
 * ACCEL_GEMM). */
accel_status accel__gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const void *A, accel_dtype a_dt, int64_t lda, const void *B,
                         accel_dtype b_dt, int64_t ldb, float beta, float *C, int64_t ldc);

/* accel__gemm with op(B) a layer's weight W (accel_k_gemm.b_weight): B is
 * W's data from element w_off, leading dim ldw. Where the provider of the
 * shape is oneDNN multiplying W's dtype itself, and B is all of a dense
 * 2-D W ([N, K] when trans_b: forward Y = X W^T; [K, N]: dX = dY W) of
 * the same dtype as A, W's prepared form (core/prepared.h) in the layout
 * oneDNN's matmul wants for this op(B) is made once per version of W (a
 * reorder: ACCEL__FORM_DNNL_NT or _NN) and the matmul reads that, instead
 * of packing W's panels inside every call. Everywhere else (OpenBLAS, the
 * reference loop, operands widened per call, a layout equal to W's own, or
 * one with padding, ACCEL_WEIGHT_CACHE=0, a W that holds no forms) it is
 * accel__gemm on B, with the same results. */
accel_status accel__gemm_weight(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                                const void *A, accel_dtype a_dt, int64_t lda, accel_tensor *W, int64_t w_off,
                                int64_t ldw, float beta, float *C, int64_t ldc);

/* Whether accel__gemm_weight with A of dtype dt and all of a dense 2-D
 * weight W of dtype dt as op(B) [K, N] (W [N, K] when trans_b) reads a form
 * of W in oneDNN's layout in the current mode, given the prepared-weight
 * cache is on: oneDNN multiplies dt for this shape and the layout it picks
 * is neither W's own nor padded. Which it is depends on the CPU kind (gemm:jit
 * on AVX2 reads a plain [K, N]; brgemm on AVX-512 wants blocks), and for
 * f32 in auto mode on what the form measured (accel__gemm_form_set_timer;
 * no form under 2^26 multiply-adds):
 * tests derive their expected form counts from it. */
bool accel__gemm_weight_has_form(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K);

/* Tests: takes every oneDNN weight layout for one with padding (brgemm's
 * blocks past a dim that is no multiple of them, on AVX-512), so that no
 * weight gets a form: the decision an AVX-512 CPU makes on such shapes,
 * made on any CPU. Nothing else changes (the results are the plain path's). */
void accel__gemm_test_padded_layouts(bool on);

/* Tests: every oneDNN primitive call takes `extra` bytes more scratchpad
 * from the step arena than it asks for (brgemm's are tens of KB a call on
 * AVX-512; gemm:jit's on AVX2 none), so that any CPU runs with what an
 * AVX-512 one allocates per call. 0 turns it off. */
void accel__gemm_test_scratchpad(size_t extra);
size_t accel__gemm_test_scratchpad_bytes(void);

/* Tests: seconds oneDNN takes on an f32 weight GEMM of this shape with the
 * weight plain (form false) and in its form (true), instead of timing it
 * (NULL: time for real). In auto mode an f32 GEMM of 2^26 multiply-adds or
 * more that oneDNN runs reads its weight's form only where the form was
 * faster (timed at the signature's first use, kept for the process; docs/cpu.md
 * "Prepared weights"), a smaller one never; setting the timer forgets the
 * verdicts. */
typedef double (*accel__gemm_form_timer)(void *ctx, bool form, int64_t M, int64_t N, int64_t K);
void accel__gemm_form_set_timer(accel__gemm_form_timer fn, void *ctx);

/* At most how many forms in oneDNN's layout (above) a weight of a linear
 * layer of compute dtype dt gets in the current mode, each as large as the
 * weight in dt: 2 (forward's and dX's) where dt's GEMMs run on oneDNN
 * multiplying dt, 0 elsewhere, and 0 for f32 in auto (the weights whose
 * shape the table or the measured choice sends to oneDNN are not counted) (for
 * accel_rank_memory_estimate). */
int accel__gemm_weight_forms(accel_dtype dt);

/* What a GEMM of compute dtype dt (C [M, N] of dtype c_dt, beta as given:
 * accel__gemm's call on dense operands) takes from the step arena for
 * oneDNN's scratchpad, given back at the call's end: accel__dnnl_scratchpad
 * (and accel__gemm_test_scratchpad's extra) where the GEMM goes to oneDNN on
 * a path known without measuring (ACCEL_GEMM=dnnl; in auto, bf16/f16 where
 * the CPU has units for them), 0 elsewhere (OpenBLAS; f32 in auto, whose
 * large shapes are chosen by timing them; sizes past the BLAS int). Creates
 * at most a primitive description: for accel_llama_activation_bytes, cheap
 * at any model size. */
size_t accel__gemm_dnnl_scratchpad(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                   float beta, accel_dtype c_dt);

/* ---- GEMM providers (docs/cpu.md)
 *
 * accel__gemm sends each GEMM to one provider, chosen per compute dtype and
 * shape from the mode (ACCEL_GEMM in the environment, read at the first
 * GEMM: auto, the default, | openblas | dnnl; or accel__gemm_set_mode) and
 * the CPU (accel/cpu.h):
 *   f32        OpenBLAS (accel__sgemm); in auto, oneDNN on the shapes that
 *              the table in gemm.c lists as measured faster on this CPU kind,
 *              and on all shapes where OpenBLAS runs a core below the CPU
 *              (openblas_core.h) but M <= 4 rows, which take the faster of
 *              oneDNN and the sgemv per row as measured (gemm_choice.c);
 *   bf16, f16  oneDNN matmul with f32 accumulation where the CPU has units
 *              for the dtype (AMX-BF16 or AVX512-BF16; AMX-FP16 or
 *              AVX512-FP16); without them, OpenBLAS on f32 panels (oneDNN
 *              on f32 panels, widened per call as under ACCEL_GEMM=dnnl,
 *              where OpenBLAS runs a core below the CPU and oneDNN has no
 *              matmul of the dtype), and the
 *              ops hand over operands already widened once per op
 *              (accel__gemm_native, accel__mm_operand).
 * ACCEL_GEMM=openblas sends everything to OpenBLAS; ACCEL_GEMM=dnnl sends
 * everything to oneDNN, a dtype it has no matmul for on this CPU (bf16 and
 * f16 on AVX2-only CPUs, in oneDNN 2.6) as f32 operands: tests use it to
 * run the oneDNN path, and the ops' low-precision operand path, on CPUs
 * whose auto choice is OpenBLAS. Under accel_reference_kernels() the
 * reference loop runs, whatever the mode. In auto mode a large GEMM's
 * provider is chosen by measurement where its dtype has two candidates
 * (gemm_choice.c, below), the above being the rule it starts from; the
 * rest depends only on the mode, the CPU and the shape.
 * Attention's tile GEMMs take a provider of their own per tile class
 * (accel__gemm_tiles_provider, below). */
typedef enum accel__gemm_mode {
    ACCEL__GEMM_AUTO,
    ACCEL__GEMM_OPENBLAS,
    ACCEL__GEMM_DNNL,
} accel__gemm_mode;

typedef enum accel__gemm_provider {
    ACCEL__GEMM_PROVIDER_REFERENCE,
    ACCEL__GEMM_PROVIDER_OPENBLAS,
    ACCEL__GEMM_PROVIDER_DNNL,
    /* oneDNN on row blocks of C, one single-threaded matmul per block on
     * each OpenMP thread (the split accel__sgemm makes for OpenBLAS): on a
     * transposed A (a weight gradient dW = dY^T X) oneDNN then runs its
     * BLAS-like gemm:jit, which packs op(A) as any panel, where its
     * threaded brgemm reorders the transposed A (bf16 10-22% slower on
     * the Llama step's dW shapes on Zen 5). Only a candidate of the
     * measured choice, for trans_a GEMMs (gemm_choice.c; docs/cpu.md) */
    ACCEL__GEMM_PROVIDER_DNNL_ROWS,
    /* oneDNN's f32 matmul on bf16/f16 operands widened exactly to f32
     * panels in the step arena for the call (as for OpenBLAS; products of
     * two bf16 or f16 are exact in f32, accumulation f32 as oneDNN's
     * bf16 path): on a CPU whose bf16 unit has half the f32 FMA rate (Intel
     * AVX512-BF16 without AMX: oneDNN f32 ~1.6x its bf16), or whose
     * OpenBLAS runs a slow fallback core, faster than OpenBLAS and oneDNN's
     * own bf16/f16 matmul (which the measurement tells). Only a
     * candidate of the measured choice, for bf16/f16 GEMMs and attention's
     * bf16/f16 tiles (gemm_choice.c; docs/cpu.md) */
    ACCEL__GEMM_PROVIDER_DNNL_F32,
    ACCEL__GEMM_N_PROVIDERS,
} accel__gemm_provider;

/* Sets the mode for the process (overriding ACCEL_GEMM). ACCEL__GEMM_DNNL
 * in a build without oneDNN is ACCEL_ERR_UNSUPPORTED. Thread-safe; a GEMM
 * already running keeps the provider it started on. */
accel_status accel__gemm_set_mode(accel__gemm_mode mode);

/* True when the library was built with oneDNN. */
bool accel__gemm_have_dnnl(void);
/* True when provider p is oneDNN (whole, on row blocks, or on f32 panels). */
bool accel__gemm_is_dnnl(int p);

/* The provider accel__gemm uses for compute dtype dt on this shape, or -1
 * (error set) when ACCEL_GEMM holds no valid mode. */
int accel__gemm_provider_for(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K);
/* The provider accel__gemm_weight uses where op(B) is a layer's weight: in
 * auto mode an f32 weight GEMM's class is a weight class
 * (accel__gemm_choose_weight), else as accel__gemm_provider_for. */
int accel__gemm_weight_provider_for(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K);

/* The provider's name: "reference", "openblas", "dnnl", "dnnl_rows",
 * "dnnl_f32". */
const char *accel__gemm_provider_name(accel__gemm_provider p);

/* True when operands of dtype dt reach a GEMM provider that multiplies dt
 * itself (oneDNN for bf16/f16); false when they would be widened to f32 at
 * every call, so an op had better widen them once (accel__mm_operand). */
bool accel__gemm_native(accel_dtype dt);
/* True when operands of dtype dt reach oneDNN (accel__gemm_native) on a CPU
 * where it has no matmul of dt (ACCEL_GEMM=dnnl without the units): each
 * GEMM then widens them to f32 panels in the step arena. */
bool accel__gemm_widens_per_call(accel_dtype dt);

/* One line per dtype, "GEMM f32: openblas ...\nGEMM bf16: ...\nGEMM f16:
 * ...\n", naming the provider of each dtype in the current mode (and
 * "oneDNN not built in" when it is not), into buf (truncated to size).
 * Returns buf. */
const char *accel__gemm_describe(char *buf, size_t size);

/* accel__gemm on the given provider (not the reference loop unless
 * accel_reference_kernels()), for the measurement below; the operands must
 * be of float dtypes and sizes that accel__gemm accepts. */
accel_status accel__gemm_on(int provider, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                            const void *A, accel_dtype a_dt, int64_t lda, const void *B, accel_dtype b_dt,
                            int64_t ldb, float beta, float *C, int64_t ldc);

/* "openblas=<config>;dnnl=<version>" (dnnl=none without it): what the
 * measured choices depend on besides the CPU and the threads. */
void accel__gemm_library_versions(char *out, size_t n);

/* ---- the provider chosen by measurement (gemm_choice.c; docs/cpu.md)
 *
 * In auto mode a GEMM of at least 2^26 multiply-adds whose dtype has more
 * than one candidate (OpenBLAS, and oneDNN where it has a matmul of the
 * dtype that is no reference loop: f32 everywhere, bf16/f16 where the CPU
 * or oneDNN's emulation runs it; OpenBLAS multiplies a bf16/f16 GEMM on f32
 * panels; with a transposed A also oneDNN on row blocks, dnnl_rows; for
 * bf16/f16 also oneDNN's f32 matmul on f32 panels, dnnl_f32) takes
 * the provider its shape class (accel__gemm_class) chose:
 * timed the first time the class is seen, kept in memory and in a cache
 * file per CPU model and features, library versions, the providers this
 * build knows and thread count (ACCEL_GEMM_CACHE=DIR, or off; default
 * ~/.cache/accel). A measurement
 * replaces the incumbent only when another candidate is faster by more than
 * 10% against a cached (or received) choice, 5% against the rule's (the f32
 * table, oneDNN for bf16/f16 where the CPU has units for them). ACCEL_GEMM_MEASURE=0 never measures
 * (the cache, else the rule), =1 measures the cached classes again at their
 * first use. Smaller GEMMs keep the rule, and so does the question whether
 * the ops hand a bf16/f16 GEMM its operands as they are or widened once
 * (accel__gemm_native): a large class measured onto OpenBLAS or dnnl_f32 widens
 * its operands per call, as ACCEL_GEMM=openblas does. The ranks of a job
 * multiply on rank 0's table, a resumed run on its checkpoint's
 * (accel__gemm_choices_bundle / _install). */
typedef struct accel__gemm_class {
    int32_t dt;      /* 0 f32, 1 bf16, 2 f16 */
    int32_t ta, tb;  /* transposes */
    int32_t m, n, k; /* floor(log2) of M, N, K */
    int32_t threads;
    int32_t rows;    /* a skinny class's M exactly (1..4; the cache file's "rows"), else 0 */
    int32_t op;      /* ACCEL__GEMM_OP_*: what the class times */
} accel__gemm_class;

/* What a class of the table stands for: one GEMM of its shape, the tile
 * GEMMs of attention (accel__gemm_tiles_provider: m, n, k the floor log2
 * of the query block, the keys and the head dim; ta, tb 0), or one f32 GEMM
 * whose op(B) is a layer's weight (accel__gemm_weight: oneDNN timed reading
 * the weight's form, as it runs there). */
enum { ACCEL__GEMM_OP_GEMM, ACCEL__GEMM_OP_SDPA_TILES, ACCEL__GEMM_OP_WEIGHT };

/* The class of a GEMM (op ACCEL__GEMM_OP_GEMM) of compute dtype dt and
 * shape M x N x K, or of other work op keyed alike, on the calling thread's
 * threads (1 inside a parallel region). */
accel__gemm_class accel__gemm_class_of(accel_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int op);

/* The provider of this GEMM: its class's choice, measured now where the
 * class is new (or `force`: measured again whatever its size); `rule` where
 * it is too small to time, or not measured. candidates: bits (1 << provider).
 * `skinny` with M <= 4: a class of M's rows exactly, timed whatever its size
 * (decode's rows where OpenBLAS runs a fallback core: gemm.c). */
int accel__gemm_choose(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int rule,
                       uint32_t candidates, bool force, bool skinny);

/* accel__gemm_choose for a GEMM whose op(B) is a layer's weight: a class
 * of its own (ACCEL__GEMM_OP_WEIGHT), on which oneDNN is timed reading the
 * scratch weight's form in its layout (accel__gemm_scratch_form), made once
 * and untimed, as a weight's form is made once per optimizer step: the
 * form's saving decides the provider, not the plain weight's panels. */
int accel__gemm_choose_weight(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int rule,
                              uint32_t candidates, bool force);

/* For that timing: the form of the dense op(B) [K, N] of dtype dt at B in
 * oneDNN's layout into *form (accel_malloc'd, *bytes long; the caller
 * accel_frees it),
 * or NULL (0) where oneDNN would read no form of it (a build without
 * oneDNN, no matmul of dt, a layout equal to B's own or one that pads).
 * ACCEL_OK or the error (OOM, oneDNN's). */
accel_status accel__gemm_scratch_form(accel_dtype dt, bool trans_b, int64_t N, int64_t K, const void *B, void **form,
                                      size_t *bytes);

/* accel__gemm_on, with oneDNN (the provider ACCEL__GEMM_PROVIDER_DNNL)
 * reading op(B) from form (accel__gemm_scratch_form's of B) where form is
 * not NULL and its matmul reads that layout at this M; A and B of dtype dt. */
accel_status accel__gemm_on_form(int provider, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                 float alpha, const void *A, accel_dtype dt, int64_t lda, const void *B,
                                 const void *form, int64_t ldb, float beta, float *C, int64_t ldc);
/* How many of its calls in this process read the form (for the tests: a
 * weight class's timing reads it). */
size_t accel__gemm_form_runs(void);

/* Runs a class's representative work once on provider p (ctx: the
 * caller's); false with the error set when it failed (no memory for its
 * operands, a provider's error): the class's timing then fails as a whole,
 * the error named in a warning on stderr and cleared, and the class runs
 * on its incumbent (the cached choice, else the rule), untimed for the rest
 * of the process unless timed on demand, and not cached. */
typedef bool (*accel__gemm_run)(void *ctx, int provider);

/* accel__gemm_choose for the class c (accel__gemm_class_of) whose
 * candidates are timed on what run does (a warm-up, then the median
 * of a few runs each), whatever its size: for work that is no single GEMM
 * (attention's tiles). */
int accel__gemm_choose_run(const accel__gemm_class *c, int rule, uint32_t candidates, bool force, accel__gemm_run run,
                           void *ctx);

/* ---- attention's tile GEMMs (attention_kernels.c; docs/cpu.md "The tile GEMMs")
 *
 * The provider of the tile GEMMs of attention on operands of dtype dt
 * (bf16/f16 when q, k, v and dO all share it, else f32), in blocks of qb
 * queries against up to `keys` keys of head dim d:
 *   openblas  f32 tiles (a bf16/f16 tensor widened tile by tile) on
 *             accel__sgemm;
 *   dnnl      dt itself on oneDNN: f32 tiles for f32, the operands as stored
 *             for bf16/f16 (P and dS rounded to dt);
 *   dnnl_f32  bf16/f16 widened into f32 tiles, on oneDNN's f32 matmul.
 * ACCEL_GEMM=openblas: openblas; =dnnl: dnnl, or dnnl_f32 for a dtype
 * oneDNN has no matmul of here. In auto the rule (dnnl for bf16/f16 where
 * the CPU has units for them, else openblas) is the prior of a measured
 * choice among the candidates this build and CPU have, per class
 * (ACCEL__GEMM_OP_SDPA_TILES: dt, qb, keys, d, threads): run(ctx, p) runs
 * a batch of the class's tiles on p (always measured, small as each tile
 * is; `force`: again, whatever the mode). Under accel_reference_kernels():
 * openblas (whose accel__sgemm is the reference loop then). -1 (error set) when ACCEL_GEMM
 * or ACCEL_CPU_ISA holds no valid setting. Outside parallel regions. */
int accel__gemm_tiles_provider(accel_dtype dt, int64_t qb, int64_t keys, int64_t d, bool force, accel__gemm_run run,
                               void *ctx);
/* The candidates of that choice for operands of dt in auto mode (bits
 * 1 << provider): openblas, and where oneDNN is loaded dnnl (f32) or
 * dnnl_f32 (bf16/f16), and dnnl for bf16/f16 where its matmul of the dtype
 * is no reference loop. */
uint32_t accel__gemm_tiles_candidates(accel_dtype dt);

/* Times a GEMM of compute dtype dt of this shape's class now on every
 * candidate (whatever its size; the mode aside) and returns the provider it
 * keeps (`accel env --measure-gemm`); `weight`: op(B) is a layer's weight
 * (accel__gemm_weight_provider_for's class). */
int accel__gemm_measure(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, bool weight);

/* Whether nothing may be timed in this process: ACCEL_GEMM_MEASURE=0, or a
 * rank of a job (the ranks take rank 0's choices). Read once. */
bool accel__gemm_measure_off(void);
/* Up to max classes of the table into out (those of `threads` threads);
 * returns how many. */
int accel__gemm_choice_classes(int threads, accel__gemm_class *out, int max);

/* The table, every thread count's choices ({"tables": [<a cache file's
 * JSON>, ...]}, this process's count's first, its cache file read), for a
 * checkpoint or the job's other ranks (src/accelerator/gemm_choices.h);
 * pin: from now on no cache file is read (rank 0 multiplies on what it
 * sent, as the others do). NULL when out of memory; json_decref it. */
struct json_t;
struct json_t *accel__gemm_choices_bundle(bool pin);
/* A bundle as this process's whole table: the sender's own thread count's
 * choices as this process's count's, never timed again nor added to from
 * the cache (also a single table, as checkpoints held before bundles: this
 * thread count's). NULL, or why j is no bundle this process can multiply
 * on (e.g. a provider its build lacks). */
const char *accel__gemm_choices_install(struct json_t *j);

/* Tests: seconds a candidate takes for a class, instead of timing it
 * (NULL: time for real). */
typedef double (*accel__gemm_timer)(void *ctx, accel__gemm_provider p, const accel__gemm_class *c);
void accel__gemm_choice_set_timer(accel__gemm_timer fn, void *ctx);
/* Defined where a GEMM class's timing puts its operands out of the caches
 * (SSE2's clflush): accel__gemm_choose times a class on cold operands, as a
 * training step's large GEMMs find theirs; elsewhere warm. */
#ifdef __SSE2__
#define ACCEL__GEMM_CHOICE_EVICTS 1
#endif
/* Tests: the bytes of the 64-byte lines put out of the caches before a
 * GEMM class's timed runs, counted since the process started. */
size_t accel__gemm_choice_evicted_bytes(void);
/* Tests: forgets the table (rank 0's too), the classes whose timing
 * failed and the files read, reads the environment again. */
void accel__gemm_choice_reset(void);
/* "GEMM choices: N measured, cached in PATH\n" and a line per class
 * (its provider and each candidate's time), into buf. Returns buf. */
const char *accel__gemm_choices_describe(char *buf, size_t size);

/* ---- the oneDNN provider (gemm_dnnl.c; only in a build with ACCEL_HAVE_DNNL) */

/* oneDNN's "major.minor.patch+hash" into out ("none" where its plug-in does not load). */
void accel__dnnl_version(char *out, size_t n);

/* C [M, N] = alpha op(A) op(B) + beta C with A and B of dtype dt (f32,
 * bf16 or f16), f32 accumulation, on a cached oneDNN matmul primitive. C is
 * of dtype c_dt: f32, or dt itself (the f32 accumulators rounded once by
 * oneDNN: round to nearest even, as accel__cpu_convert; on AVX512-BF16 and
 * AMX with vcvtneps2bf16, which also flushes bf16 denormals to zero).
 * ACCEL_OK, or an error naming the shape and oneDNN's status (a dtype the
 * CPU has no implementation for: ACCEL_ERR_UNSUPPORTED). Thread-safe. */
accel_status accel__dnnl_gemm(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                              float alpha, const void *A, int64_t lda, const void *B, int64_t ldb, float beta,
                              void *C, accel_dtype c_dt, int64_t ldc);

/* A weight layout of oneDNN's for 16-bit op(B) [K, N] whose innermost
 * block holds pairs of consecutive rows k (the layouts of its AVX512-BF16
 * and AMX kernels, e.g. BA16a64b2a): blocks of k_block x n_block elements,
 * each laid out [k_block / 2][n_block][2], block (kb, nb) starting at
 * element kb * k_stride + nb * n_stride. k_block 0: the layout is not of
 * that kind, or pads K or N (not multiples of the blocks). accel packs
 * these itself (pair_pack.h). */
typedef struct accel__pair_layout {
    int64_t k_block, n_block, k_stride, n_stride;
} accel__pair_layout;

/* Weights in oneDNN's layout. The layout of op(B) [K, N] of dtype dt (B
 * stored dense, [N, K] when trans_b) is the one oneDNN's matmul picks for
 * its weights ("format any") on a 1024-row matmul, chosen at its first use
 * and kept for the process, so it depends on the weight's shape alone.
 *
 * Its size in bytes into *bytes; 0 where there is none to pack into: the
 * plain layout B is stored in is the one oneDNN wants (f32 NN on AVX2:
 * gemm:jit reads plain matrices), oneDNN has only its reference loop, or the
 * table of primitives is full. *pairs (when not NULL): the layout where it is
 * a pair layout accel packs itself, else k_block 0. ACCEL_OK or an error
 * (OOM, the engine). */
accel_status accel__dnnl_weight_layout(accel_dtype dt, bool trans_b, int64_t N, int64_t K, size_t *bytes,
                                       accel__pair_layout *pairs);

/* Reorders the dense B into dst (accel__dnnl_weight_layout's bytes, which
 * must be non-zero). */
accel_status accel__dnnl_weight_pack(accel_dtype dt, bool trans_b, int64_t N, int64_t K, const void *B, void *dst);

/* accel__dnnl_gemm with op(B) given packed (accel__dnnl_weight_pack of the
 * same dt, trans_b, N, K), on a cached matmul primitive that reads that
 * layout. *ran false (ACCEL_OK, C untouched) where oneDNN has no matmul but
 * its reference loop for that layout at this M: the caller then runs the
 * plain B. */
accel_status accel__dnnl_gemm_packed(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                     float alpha, const void *A, int64_t lda, const void *packed, float beta, void *C,
                                     accel_dtype c_dt, int64_t ldc, bool *ran);

/* oneDNN's implementation name for a dense GEMM of that signature (e.g.
 * "brg:avx512_core_amx", "ref:any"), creating its primitive; NULL (error
 * set) when oneDNN has none. The string is the calling thread's until its
 * next call. */
const char *accel__dnnl_impl(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K);

/* The scratchpad bytes oneDNN's matmul of accel__dnnl_gemm on dense
 * operands of that signature (alpha 1, beta, C of dtype c_dt) takes for
 * each call, into *bytes: from a primitive description (or the primitive
 * already made for it), never running anything. ACCEL_OK or an error
 * naming the shape (a dtype oneDNN has no matmul for). */
accel_status accel__dnnl_scratchpad(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                    float beta, accel_dtype c_dt, size_t *bytes);

/* True when oneDNN implements a dt GEMM on this CPU, with the name of the
 * implementation it picks for a 256 x 256 x 256 NT product into impl.
 * Sets no error (a missing implementation is an answer); gemm.c probes
 * once per dtype. */
bool accel__dnnl_supports(accel_dtype dt, char *impl, size_t size);

/* ---- oneDNN's convolution (conv_dnnl.c, in the same plug-in)
 *
 * accel_conv2d's forward or backward over a whole batch, x [N, C, H, W] and
 * w [O, C / G, kh, kw] (G groups) plain contiguous NCHW / OIHW memory:
 *   FORWARD   y [N, O, Ho, Wo] (dtype y_dt: dt, or f32) = conv(x, w) + b
 *             (b [O] of dt, or NULL)
 *   BACKWARD  from dy [N, O, Ho, Wo], where not NULL (dx or dw):
 *             dx [N, C, H, W] (f32) (dx_beta: 0 =, 1 +=) conv^T(dy, w);
 *             dw [O, C / G, kh, kw] (f32, dw_beta) from x and dy, with
 *             db [O] (f32, db_beta) = the sums of dy over N, Ho, Wo where
 *             not NULL (the blocked copy of dy made once for both)
 * x, w, b and dy are of dt (f32 or bf16): f32 accumulation. */
typedef struct accel__conv_call {
    accel_k_conv_pass pass; /* core/kernels.h */
    accel_dtype dt, y_dt;
    int64_t N, C, O, G;
    accel_k_window2d win;
    const void *x, *w, *b, *dy;
    void *y, *dx, *dw, *db;
    float dx_beta, dw_beta, db_beta;
} accel__conv_call;

/* Runs the call on oneDNN's convolution primitives for its passes (cached
 * by shape, dtypes and thread count; tensors reordered into the layouts
 * they pick and back). *ran false (ACCEL_OK, nothing written) where oneDNN
 * has only its reference loop or no implementation for one of them: the
 * caller computes it all itself. An error names the failed step. */
accel_status accel__dnnl_conv(const accel__conv_call *c, bool *ran);

/* NULL when the oneDNN plug-in (libaccel-dnnl.so) is loaded, else why it did
 * not load (a static string of the plug-in loader): `accel env` names it
 * rather than blaming the CPU. */
const char *accel__dnnl_unavailable(void);

#endif
