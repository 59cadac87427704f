/* oneDNN matmul as a GEMM provider (compiled when CMake found oneDNN:
 * ACCEL_HAVE_DNNL; gemm.h describes the choice of provider). Its functions
 * are accel__onednn_* (dnnl_hooks.h), the contracts of gemm.h's
 * accel__dnnl_*, which are the core's forwarders to them (dnnl_client.c).
 *
 * One primitive per GEMM signature (dtype, transposes, M/N/K, leading dims,
 * alpha, beta, threads), created at its first use and kept for the process
 * in a static table under a mutex (creation costs ~0.1-1 ms: JIT code
 * generation; a step runs the same few signatures every time, and a
 * signature first seen in a later step, such as a gradient GEMM with beta 1
 * once the gradients exist, allocates nothing of accel's). Execution runs outside
 * the lock: a oneDNN primitive may execute on several threads at once, and
 * each call has its own scratchpad (from the caller's step arena, so no
 * call shares one with another thread) and its thread's stream and memory
 * objects (below, "a thread's stream and memory objects").
 *
 * The operands are plain row-major memory described by strides, so a
 * transposed operand is read in place as in cblas_sgemm; oneDNN packs the
 * panels it needs inside the primitive. A layer's weight may instead come
 * packed (accel__dnnl_weight_pack, once per version of the weight: gemm.c):
 * the table then also holds, per weight shape, the layout oneDNN's matmul
 * picks for it (weights "format any"), the reorder into it, and per
 * signature a matmul primitive that reads its weights in that layout.
 *
 * The table (dnnl_internal.h) also holds conv_dnnl.c's convolution
 * primitives and reorders, made by its own create functions. */
#include "backends/cpu/dnnl_internal.h"

#include <dnnl_debug.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpuinfo.h"

/* Rows of op(A) of the matmul whose choice of weight layout a weight shape
 * keeps for every M: a fixed number (a training batch's tokens, in the
 * range where oneDNN runs its blocked kernels), so that the layout depends
 * on the weight alone and a run repeats it. */
enum { LAYOUT_M = 1024 };

/* Open addressing over a fixed table of CACHE_SLOTS slots pointing into a
 * static pool of CACHE_SLOTS / 2 entries: a training step has a few dozen
 * signatures; past the pool a signature runs on a primitive made for the
 * call and destroyed after it (slower, still correct). */
enum { CACHE_SLOTS = 1024, CACHE_ENTRIES = CACHE_SLOTS / 2 };

static dnnl_entry *cache[CACHE_SLOTS];
static dnnl_entry pool[CACHE_ENTRIES];
static int pool_used;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

static dnnl_engine_t engine;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static dnnl_status_t engine_status;

/* oneDNN's ISA ceiling for accel's cap (core/cpuinfo.h: ACCEL_CPU_ISA), so
 * its kernels and weight layouts are those of a CPU of that level. */
static void isa_cap_apply(void) {
    static const dnnl_cpu_isa_t CEILING[] = {
        [ACCEL__CPU_ISA_BASELINE] = dnnl_cpu_isa_sse41,
        [ACCEL__CPU_ISA_AVX2] = dnnl_cpu_isa_avx2,
        [ACCEL__CPU_ISA_AVX512] = dnnl_cpu_isa_avx512_core_bf16,
    };
    accel__cpu_isa_level cap = accel__cpu_isa_cap();
    /* only before oneDNN's first JIT; DNNL_MAX_CPU_ISA set by hand wins */
    if (cap != ACCEL__CPU_ISA_NONE && !getenv("DNNL_MAX_CPU_ISA") && !getenv("ONEDNN_MAX_CPU_ISA"))
        dnnl_set_max_cpu_isa(CEILING[cap]);
}

static void engine_create(void) {
    isa_cap_apply();
    engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0);
}

dnnl_engine_t accel__onednn_engine(const char *op) {
    pthread_once(&engine_once, engine_create);
    if (engine_status == dnnl_success) return engine;
    accel__onednn_error(op, "engine creation", engine_status);
    return NULL;
}

accel_status accel__onednn_error(const char *op, const char *what, dnnl_status_t s) {
    return accel_set_error(s == dnnl_out_of_memory ? ACCEL_ERR_OOM : ACCEL_ERR_UNSUPPORTED, "%s: oneDNN %s failed (%s)",
                           op, what, dnnl_status2str(s));
}

const char *accel__onednn_op(const dnnl_key *k) {
    return k->kind == KIND_CONV || k->kind == KIND_CONV_REORDER ? "accel_conv2d" : "accel_gemm";
}

dnnl_data_type_t accel__onednn_dtype(accel_dtype dt) {
    return dt == ACCEL_BF16 ? dnnl_bf16 : dt == ACCEL_F16 ? dnnl_f16 : dnnl_f32;
}

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static uint64_t key_hash(const dnnl_key *k) {
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* op(A) [M, K], op(B) [K, N] and C [M, N] as strided plain memory. */
static dnnl_status_t describe(const dnnl_key *k, dnnl_entry *e) {
    dnnl_data_type_t dt = (dnnl_data_type_t)k->dtype;
    dnnl_dims_t a_dims = {k->M, k->K}, b_dims = {k->K, k->N}, c_dims = {k->M, k->N};
    dnnl_dims_t a_str = {k->trans_a ? 1 : k->lda, k->trans_a ? k->lda : 1};
    dnnl_dims_t b_str = {k->trans_b ? 1 : k->ldb, k->trans_b ? k->ldb : 1};
    dnnl_dims_t c_str = {k->ldc, 1};
    dnnl_status_t s = dnnl_memory_desc_init_by_strides(&e->a_md, 2, a_dims, dt, a_str);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_strides(&e->b_md, 2, b_dims, dt, b_str);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_strides(&e->c_md, 2, c_dims, (dnnl_data_type_t)k->c_dtype, c_str);
    return s;
}

/* The matmul description of e with weights w (e->b_md, e->w_md, or "any"). */
static dnnl_status_t matmul_desc(const dnnl_entry *e, const dnnl_memory_desc_t *w, dnnl_matmul_desc_t *md) {
    return dnnl_matmul_desc_init(md, &e->a_md, w, NULL, &e->c_md);
}

/* alpha as the output scale, beta as a sum post-op (C = alpha AB + beta C),
 * and a scratchpad the caller passes in. */
dnnl_status_t accel__onednn_attributes(float alpha, float beta, dnnl_primitive_attr_t *out) {
    dnnl_primitive_attr_t attr;
    dnnl_status_t s = dnnl_primitive_attr_create(&attr);
    if (s != dnnl_success) return s;
    s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (s == dnnl_success && alpha != 1.0f) s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha);
    if (s == dnnl_success && beta != 0.0f) {
        dnnl_post_ops_t po;
        s = dnnl_post_ops_create(&po);
        if (s == dnnl_success) {
            s = dnnl_post_ops_append_sum(po, beta);
            if (s == dnnl_success) s = dnnl_primitive_attr_set_post_ops(attr, po);
            dnnl_post_ops_destroy(po);
        }
    }
    if (s != dnnl_success) {
        dnnl_primitive_attr_destroy(attr);
        return s;
    }
    *out = attr;
    return dnnl_success;
}

/* "f32 NT GEMM 64 x 32 x 16"; for a layout or a reorder "f32 NT weight
 * op(B) 16 x 32" (K x N). */
static void signature_name(const dnnl_key *k, char *out, size_t n) {
    accel_dtype dt = k->dtype == dnnl_bf16 ? ACCEL_BF16 : k->dtype == dnnl_f16 ? ACCEL_F16 : ACCEL_F32;
    char ta = k->trans_a ? 'T' : 'N', tb = k->trans_b ? 'T' : 'N';
    if (k->kind == KIND_LAYOUT || k->kind == KIND_PACK)
        snprintf(out, n, "%s %c%c weight op(B) %lld x %lld", accel_dtype_name(dt), ta, tb, (long long)k->K,
                 (long long)k->N);
    else
        snprintf(out, n, "%s %c%c GEMM %lld x %lld x %lld", accel_dtype_name(dt), ta, tb, (long long)k->M,
                 (long long)k->N, (long long)k->K);
}

/* The primitive of pd into e (its implementation's name and scratchpad
 * size too). */
dnnl_status_t accel__onednn_primitive_from(dnnl_primitive_desc_t pd, dnnl_entry *e) {
    const char *impl = "unknown";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    snprintf(e->impl, sizeof e->impl, "%s", impl);
    e->scratch_bytes = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
    return dnnl_primitive_create(&e->prim, pd);
}

bool accel__onednn_reference_impl(const char *impl) { return strncmp(impl, "ref", 3) == 0; }

/* A matmul primitive with weights w into e; *what names the step that failed. */
static dnnl_status_t matmul_create(dnnl_entry *e, const dnnl_memory_desc_t *w, float alpha, float beta,
                                   const char **what) {
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t md;
    dnnl_status_t s;
    *what = "matmul description", s = matmul_desc(e, w, &md);
    if (s == dnnl_success) *what = "attributes", s = accel__onednn_attributes(alpha, beta, &attr);
    if (s == dnnl_success) *what = "matmul primitive description", s = dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL);
    if (s == dnnl_success) *what = "matmul primitive creation", s = accel__onednn_primitive_from(pd, e);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return s;
}

/* The blocked 16-bit layout md of op(B) [K, N] as a pair layout (gemm.h):
 * innermost blocks (k / 2, n, 2 k), no padding, nothing extra (oneDNN's
 * compensation buffers of int8 weights); else k_block 0. */
static accel__pair_layout pair_layout_of(const dnnl_memory_desc_t *md, int64_t K, int64_t N) {
    const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
    accel__pair_layout none = {0, 0, 0, 0};
    if (md->format_kind != dnnl_blocked || md->ndims != 2 || md->offset0 != 0 || md->extra.flags != 0 ||
        (md->data_type != dnnl_bf16 && md->data_type != dnnl_f16))
        return none;
    if (b->inner_nblks != 3 || b->inner_idxs[0] != 0 || b->inner_idxs[1] != 1 || b->inner_idxs[2] != 0 ||
        b->inner_blks[2] != 2)
        return none;
    accel__pair_layout l = {b->inner_blks[0] * 2, b->inner_blks[1], b->strides[0], b->strides[1]};
    if (md->padded_dims[0] != K || md->padded_dims[1] != N || l.k_block <= 0 || l.n_block <= 0 || K % l.k_block ||
        N % l.n_block)
        return none;
    return l;
}

/* The weight layout of e's (dtype, trans_b, N, K): the weights descriptor
 * of a LAYOUT_M-row matmul created with weights "any". None (layout_bytes
 * 0, success) when oneDNN has no such matmul but its reference loop, or
 * picks the plain layout B is stored in. */
static dnnl_status_t layout_create(dnnl_entry *e) {
    dnnl_memory_desc_t any;
    dnnl_dims_t b_dims = {e->key.K, e->key.N};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t s = dnnl_memory_desc_init_by_tag(&any, 2, b_dims, (dnnl_data_type_t)e->key.dtype, dnnl_format_tag_any);
    if (s == dnnl_success) s = matmul_desc(e, &any, &md);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &md, NULL, engine, NULL);
    if (s == dnnl_unimplemented) return dnnl_success;
    if (s != dnnl_success) return s;
    const char *impl = "unknown";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    snprintf(e->impl, sizeof e->impl, "%s", impl);
    e->w_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    if (!accel__onednn_reference_impl(impl) && !dnnl_memory_desc_equal(&e->w_md, &e->b_md)) {
        e->layout_bytes = dnnl_memory_desc_get_size(&e->w_md);
        e->pairs = pair_layout_of(&e->w_md, e->key.K, e->key.N);
    }
    dnnl_primitive_desc_destroy(pd);
    return dnnl_success;
}

dnnl_status_t accel__onednn_reorder_create(dnnl_entry *e, float beta, const char **what) {
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t s;
    *what = "attributes", s = accel__onednn_attributes(1.0f, beta, &attr);
    if (s == dnnl_success)
        *what = "reorder primitive description",
        s = dnnl_reorder_primitive_desc_create(&pd, &e->b_md, engine, &e->w_md, engine, attr);
    if (s == dnnl_success) *what = "reorder primitive creation", s = accel__onednn_primitive_from(pd, e);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return s;
}

/* A GEMM entry's parameters besides its key (for a packed matmul or a
 * reorder, layout is the weight layout). */
typedef struct gemm_ctx {
    float alpha, beta;
    const dnnl_memory_desc_t *layout;
} gemm_ctx;

/* Fills e with what its GEMM key names (accel__onednn_create_fn). */
static accel_status gemm_create(const void *ctx, dnnl_entry *e) {
    const gemm_ctx *g = ctx;
    const dnnl_key *k = &e->key;
    if (g->layout) e->w_md = *g->layout;
    const char *what = "memory description";
    dnnl_status_t s = describe(k, e);
    if (s == dnnl_success) switch ((entry_kind)k->kind) {
        case KIND_MATMUL: s = matmul_create(e, &e->b_md, g->alpha, g->beta, &what); break;
        case KIND_MATMUL_PACKED:
            s = matmul_create(e, &e->w_md, g->alpha, g->beta, &what);
            if (s == dnnl_unimplemented) s = dnnl_success; /* no matmul reads that layout at this M */
            if (e->prim && accel__onednn_reference_impl(e->impl)) {
                dnnl_primitive_destroy(e->prim);
                e->prim = NULL;
            }
            break;
        case KIND_LAYOUT: what = "weight layout query", s = layout_create(e); break;
        case KIND_PACK: s = accel__onednn_reorder_create(e, 0.0f, &what); break;
        default: s = dnnl_invalid_arguments; break; /* conv_dnnl.c's kinds come with their own create */
        }
    if (s == dnnl_success) return ACCEL_OK;
    if (e->prim) dnnl_primitive_destroy(e->prim);
    e->prim = NULL;
    char sig[96], why[160];
    signature_name(k, sig, sizeof sig);
    snprintf(why, sizeof why, "%s (%s)", what, sig);
    return accel__onednn_error("accel_gemm", why, s);
}

/* The slot of k: its entry, or the empty slot where it goes. Under the lock. */
static int slot_of(const dnnl_key *k) {
    int i = (int)(key_hash(k) % CACHE_SLOTS);
    while (cache[i] && memcmp(&cache[i]->key, k, sizeof *k)) i = (i + 1) % CACHE_SLOTS;
    return i;
}

static const dnnl_entry *cache_find(const dnnl_key *k) {
    pthread_mutex_lock(&cache_lock);
    const dnnl_entry *e = cache[slot_of(k)];
    pthread_mutex_unlock(&cache_lock);
    return e;
}

/* Moves the new entry *made into the table and returns it there; returns
 * the entry another thread inserted first (made's primitive destroyed); or
 * NULL when the pool is full (made stays the caller's). */
static const dnnl_entry *cache_insert(dnnl_entry *made) {
    pthread_mutex_lock(&cache_lock);
    int i = slot_of(&made->key);
    dnnl_entry *r = cache[i];
    if (!r && pool_used < CACHE_ENTRIES) {
        r = &pool[pool_used++];
        *r = *made;
        cache[i] = r;
        made->prim = NULL;
    }
    pthread_mutex_unlock(&cache_lock);
    if (made->prim && r) {
        dnnl_primitive_destroy(made->prim);
        made->prim = NULL;
    }
    return r;
}

const dnnl_entry *accel__onednn_entry_get(const dnnl_key *k, accel__onednn_create_fn create, const void *ctx,
                                          dnnl_entry *local) {
    local->prim = NULL;
    const dnnl_entry *e = cache_find(k);
    if (e) return e;
    if (!accel__onednn_engine(accel__onednn_op(k))) return NULL;
    memset(local, 0, sizeof *local);
    local->key = *k;
    if (create(ctx, local) != ACCEL_OK) return NULL;
    e = cache_insert(local);
    return e ? e : local;
}

/* accel__onednn_entry_get of a GEMM's key. */
static const dnnl_entry *entry_get(const dnnl_key *k, float alpha, float beta, const dnnl_memory_desc_t *layout,
                                   dnnl_entry *local) {
    gemm_ctx g = {alpha, beta, layout};
    return accel__onednn_entry_get(k, gemm_create, &g, local);
}

static dnnl_status_t memory(dnnl_memory_t *m, const dnnl_memory_desc_t *md, const void *p) {
    return dnnl_memory_create(m, md, engine, (void *)p);
}

/* ---- a thread's stream and memory objects
 *
 * oneDNN allocates for every stream and memory object it makes: made and
 * destroyed per call, they cost ~0.7 us a call (malloc and free), which
 * showed beside attention's 1-5 us tile GEMMs (~12% of the op's samples).
 * So a thread keeps one stream and, per pooled entry (the pool's entries
 * live for the process), the memory objects of its last call on it; the
 * next call sets their data handles. An entry made for one call (a full
 * pool) makes and destroys its own. A thread's state is freed when the
 * thread ends; the states are listed so that a leak checker at exit finds
 * them reachable. */
enum { MAX_ARGS = 4 };

typedef struct entry_mems {
    const dnnl_memory_desc_t *md[MAX_ARGS]; /* what m[i] was made for */
    dnnl_memory_t m[MAX_ARGS + 1];          /* the arguments', then the scratchpad's */
} entry_mems;

typedef struct thread_dnnl {
    dnnl_stream_t stream;
    entry_mems mems[CACHE_ENTRIES]; /* by pool index */
    struct thread_dnnl *prev, *next;
} thread_dnnl;

static pthread_key_t thread_key;
static pthread_once_t thread_key_once = PTHREAD_ONCE_INIT;
static bool thread_key_made;
static thread_dnnl *threads_list;
static pthread_mutex_t threads_lock = PTHREAD_MUTEX_INITIALIZER;

static void entry_mems_free(entry_mems *em) {
    for (int j = 0; j <= MAX_ARGS; j++)
        if (em->m[j]) dnnl_memory_destroy(em->m[j]);
}

static void thread_dnnl_free(void *v) {
    thread_dnnl *t = v;
    pthread_mutex_lock(&threads_lock);
    if (t->prev) t->prev->next = t->next;
    else threads_list = t->next;
    if (t->next) t->next->prev = t->prev;
    pthread_mutex_unlock(&threads_lock);
    for (int i = 0; i < CACHE_ENTRIES; i++) entry_mems_free(&t->mems[i]);
    dnnl_stream_destroy(t->stream);
    free(t);
}

static void thread_key_create(void) { thread_key_made = pthread_key_create(&thread_key, thread_dnnl_free) == 0; }

/* The calling thread's state, made at its first call; NULL where it cannot
 * be (no memory, no key): the call then makes its own objects. */
static thread_dnnl *thread_dnnl_get(void) {
    pthread_once(&thread_key_once, thread_key_create);
    if (!thread_key_made) return NULL;
    thread_dnnl *t = pthread_getspecific(thread_key);
    if (t) return t;
    t = calloc(1, sizeof *t);
    if (!t) return NULL;
    if (dnnl_stream_create(&t->stream, engine, dnnl_stream_default_flags) != dnnl_success) {
        free(t);
        return NULL;
    }
    if (pthread_setspecific(thread_key, t) != 0) {
        dnnl_stream_destroy(t->stream);
        free(t);
        return NULL;
    }
    pthread_mutex_lock(&threads_lock);
    t->next = threads_list;
    if (threads_list) threads_list->prev = t;
    threads_list = t;
    pthread_mutex_unlock(&threads_lock);
    return t;
}

/* *m for descriptor md and data p: kept (its handle set) when *kept says it
 * was made for md, else made (an old one destroyed). */
static dnnl_status_t kept_memory(dnnl_memory_t *m, const dnnl_memory_desc_t **kept, const dnnl_memory_desc_t *md,
                                 const void *p) {
    if (*m && *kept == md) return dnnl_memory_set_data_handle(*m, (void *)p);
    if (*m) dnnl_memory_destroy(*m);
    *m = NULL;
    *kept = md;
    return memory(m, md, p);
}

/* The scratchpad's memory of e at p (the same size at every call of e). */
static dnnl_status_t scratch_memory(dnnl_memory_t *m, const dnnl_entry *e, void *p) {
    if (*m) return dnnl_memory_set_data_handle(*m, p);
    dnnl_memory_desc_t md;
    dnnl_dims_t sd = {(int64_t)e->scratch_bytes};
    dnnl_status_t s = dnnl_memory_desc_init_by_tag(&md, 1, sd, dnnl_u8, dnnl_a);
    return s == dnnl_success ? memory(m, &md, p) : s;
}

accel_status accel__onednn_execute(const dnnl_entry *e, int n, const accel__onednn_arg *in, const char *what) {
    /* The scratchpad lives for this call only (rewound below): kept until
     * the step's end, brgemm's per-call buffers (tens of KB a GEMM on
     * AVX-512) would pile up over a step's hundreds of GEMMs. */
    accel_arena *arena = accel_step_arena();
    accel_arena_mark mark = accel_arena_mark_now(arena);
    void *scratch = NULL;
    size_t taken = e->scratch_bytes + accel__gemm_test_scratchpad_bytes();
    if (taken) {
        scratch = accel_arena_alloc(arena, taken, 64);
        if (!scratch) return accel_last_status();
    }
    thread_dnnl *td = e >= pool && e < pool + CACHE_ENTRIES ? thread_dnnl_get() : NULL;
    entry_mems own = {{0}, {0}}, *em = td ? &td->mems[e - pool] : &own;
    dnnl_exec_arg_t args[MAX_ARGS + 1] = {{0}};
    dnnl_stream_t stream = td ? td->stream : NULL;
    dnnl_status_t s = dnnl_success;
    int made = 0;
    for (; made < n && s == dnnl_success; made++) {
        s = kept_memory(&em->m[made], &em->md[made], in[made].md, in[made].p);
        args[made] = (dnnl_exec_arg_t){in[made].arg, em->m[made]};
    }
    if (s == dnnl_success && e->scratch_bytes) {
        s = scratch_memory(&em->m[made], e, scratch);
        args[made] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, em->m[made]};
        made++;
    }
    if (s == dnnl_success && !stream) s = dnnl_stream_create(&stream, engine, dnnl_stream_default_flags);
    if (s == dnnl_success) {
        s = dnnl_primitive_execute(e->prim, stream, made, args);
        if (s == dnnl_success) s = dnnl_stream_wait(stream);
    }
    if (!td) {
        if (stream) dnnl_stream_destroy(stream);
        entry_mems_free(&own);
    }
    accel_arena_rewind(arena, mark);
    return s == dnnl_success ? ACCEL_OK : accel__onednn_error(accel__onednn_op(&e->key), what, s);
}

/* C = alpha op(A) op(B) + beta C on the matmul entry e, op(B) in the
 * layout b. */
static accel_status execute_matmul(const dnnl_entry *e, const dnnl_memory_desc_t *b, const void *A, const void *B,
                                   void *C) {
    accel__onednn_arg args[3] = {{DNNL_ARG_SRC, &e->a_md, A}, {DNNL_ARG_WEIGHTS, b, B}, {DNNL_ARG_DST, &e->c_md, C}};
    return accel__onednn_execute(e, 3, args, "matmul execution");
}

int32_t accel__onednn_threads(void) { return omp_in_parallel() ? 1 : omp_get_max_threads(); }

static dnnl_key make_key(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                         float alpha, int64_t lda, int64_t ldb, float beta, int64_t ldc, accel_dtype c_dt) {
    dnnl_key k;
    memset(&k, 0, sizeof k);
    k.M = M, k.N = N, k.K = K, k.lda = lda, k.ldb = ldb, k.ldc = ldc;
    k.alpha_bits = float_bits(alpha);
    k.beta_bits = float_bits(beta);
    /* oneDNN plans its blocking for the threads it will have. */
    k.threads = accel__onednn_threads();
    k.dtype = (int32_t)accel__onednn_dtype(dt);
    k.c_dtype = (int32_t)accel__onednn_dtype(c_dt);
    k.trans_a = trans_a, k.trans_b = trans_b;
    k.kind = KIND_MATMUL;
    return k;
}

accel_status accel__onednn_gemm(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                              float alpha, const void *A, int64_t lda, const void *B, int64_t ldb, float beta,
                              void *C, accel_dtype c_dt, int64_t ldc) {
    if (M <= 0 || N <= 0) return ACCEL_OK;
    dnnl_key k = make_key(dt, trans_a, trans_b, M, N, K, alpha, lda, ldb, beta, ldc, c_dt);
    dnnl_entry local;
    const dnnl_entry *e = entry_get(&k, alpha, beta, NULL, &local);
    if (!e) return accel_last_status();
    accel_status st = execute_matmul(e, &e->b_md, A, B, C);
    if (local.prim) dnnl_primitive_destroy(local.prim);
    return st;
}

/* ---- weights in oneDNN's layout */

/* The key of the weight layout of (dt, trans_b, N, K): a LAYOUT_M-row NN
 * or NT matmul of a dense B, on no particular thread count. */
static dnnl_key layout_key(accel_dtype dt, bool trans_b, int64_t N, int64_t K) {
    dnnl_key k = make_key(dt, false, trans_b, LAYOUT_M, N, K, 1.0f, K, trans_b ? K : N, 0.0f, N, ACCEL_F32);
    k.threads = 0;
    k.kind = KIND_LAYOUT;
    return k;
}

/* The cached layout entry of the weight shape into *out; NULL when it
 * could not be cached (a full table: the plain B then serves, so that a
 * form and the matmuls reading it always agree on one layout). */
static accel_status layout_get(accel_dtype dt, bool trans_b, int64_t N, int64_t K, const dnnl_entry **out) {
    dnnl_key k = layout_key(dt, trans_b, N, K);
    dnnl_entry local;
    const dnnl_entry *e = entry_get(&k, 1.0f, 0.0f, NULL, &local);
    if (!e) return accel_last_status();
    *out = e == &local ? NULL : e;
    return ACCEL_OK;
}

accel_status accel__onednn_weight_layout(accel_dtype dt, bool trans_b, int64_t N, int64_t K, size_t *bytes,
                                         accel__pair_layout *pairs) {
    const dnnl_entry *lay;
    *bytes = 0;
    if (pairs) *pairs = (accel__pair_layout){0, 0, 0, 0};
    accel_status st = layout_get(dt, trans_b, N, K, &lay);
    if (st == ACCEL_OK && lay) *bytes = lay->layout_bytes;
    if (st == ACCEL_OK && lay && pairs) *pairs = lay->pairs;
    return st;
}

accel_status accel__onednn_weight_pack(accel_dtype dt, bool trans_b, int64_t N, int64_t K, const void *B, void *dst) {
    const dnnl_entry *lay;
    accel_status st = layout_get(dt, trans_b, N, K, &lay);
    if (st != ACCEL_OK) return st;
    if (!lay || !lay->layout_bytes)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_gemm: no oneDNN weight layout to pack a %lld x %lld weight into",
                               (long long)N, (long long)K);
    dnnl_key k = layout_key(dt, trans_b, N, K);
    k.threads = accel__onednn_threads();
    k.kind = KIND_PACK;
    dnnl_entry local;
    const dnnl_entry *e = entry_get(&k, 1.0f, 0.0f, &lay->w_md, &local);
    if (!e) return accel_last_status();
    accel__onednn_arg args[2] = {{DNNL_ARG_FROM, &e->b_md, B}, {DNNL_ARG_TO, &e->w_md, dst}};
    st = accel__onednn_execute(e, 2, args, "weight reorder");
    if (local.prim) dnnl_primitive_destroy(local.prim);
    return st;
}

accel_status accel__onednn_gemm_packed(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                     float alpha, const void *A, int64_t lda, const void *packed, float beta, void *C,
                                     accel_dtype c_dt, int64_t ldc, bool *ran) {
    *ran = false;
    const dnnl_entry *lay;
    accel_status st = layout_get(dt, trans_b, N, K, &lay);
    if (st != ACCEL_OK || !lay || !lay->layout_bytes || M <= 0 || N <= 0) return st;
    dnnl_key k = make_key(dt, trans_a, trans_b, M, N, K, alpha, lda, trans_b ? K : N, beta, ldc, c_dt);
    k.kind = KIND_MATMUL_PACKED;
    dnnl_entry local;
    const dnnl_entry *e = entry_get(&k, alpha, beta, &lay->w_md, &local);
    if (!e) return accel_last_status();
    if (e->prim) {
        st = execute_matmul(e, &e->w_md, A, packed, C);
        *ran = true;
    }
    if (local.prim) dnnl_primitive_destroy(local.prim);
    return st;
}

const char *accel__onednn_impl(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K) {
    dnnl_key k = make_key(dt, trans_a, trans_b, M, N, K, 1.0f, trans_a ? M : K, trans_b ? K : N, 0.0f, N, ACCEL_F32);
    dnnl_entry local;
    const dnnl_entry *e = entry_get(&k, 1.0f, 0.0f, NULL, &local);
    if (!e) return NULL;
    static _Thread_local char name[64];
    snprintf(name, sizeof name, "%s", e->impl);
    if (local.prim) dnnl_primitive_destroy(local.prim);
    return name;
}

accel_status accel__onednn_scratchpad(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                      float beta, accel_dtype c_dt, size_t *bytes) {
    *bytes = 0;
    if (M <= 0 || N <= 0) return ACCEL_OK;
    pthread_once(&engine_once, engine_create);
    if (engine_status != dnnl_success) return accel__onednn_error("accel_gemm", "engine creation", engine_status);
    /* the key of accel__gemm's call on dense operands: a primitive already
     * made for it answers; else a primitive description only (no JIT code,
     * nothing run, nothing kept) */
    dnnl_key k = make_key(dt, trans_a, trans_b, M, N, K, 1.0f, trans_a ? M : K, trans_b ? K : N, beta, N, c_dt);
    const dnnl_entry *e = cache_find(&k);
    if (e) {
        *bytes = e->scratch_bytes;
        return ACCEL_OK;
    }
    dnnl_entry d;
    memset(&d, 0, sizeof d);
    d.key = k;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t md;
    dnnl_status_t s = describe(&k, &d);
    if (s == dnnl_success) s = matmul_desc(&d, &d.b_md, &md);
    if (s == dnnl_success) s = accel__onednn_attributes(1.0f, beta, &attr);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL);
    if (s == dnnl_success)
        *bytes = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (s == dnnl_success) return ACCEL_OK;
    char sig[96], why[160];
    signature_name(&k, sig, sizeof sig);
    snprintf(why, sizeof why, "scratchpad query (%s)", sig);
    return accel__onednn_error("accel_gemm", why, s);
}

bool accel__onednn_supports(accel_dtype dt, char *impl, size_t size) {
    /* A primitive description only: it names the implementation. */
    pthread_once(&engine_once, engine_create);
    if (engine_status != dnnl_success) return false;
    dnnl_key k = make_key(dt, false, true, 256, 256, 256, 1.0f, 256, 256, 0.0f, 256, ACCEL_F32);
    dnnl_entry e;
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t s = describe(&k, &e);
    if (s == dnnl_success) s = matmul_desc(&e, &e.b_md, &md);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &md, NULL, engine, NULL);
    if (s == dnnl_success) {
        const char *name = "unknown";
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
        snprintf(impl, size, "%s", name);
        dnnl_primitive_desc_destroy(pd);
    }
    return s == dnnl_success;
}

void accel__onednn_version(char *out, size_t n) {
    const dnnl_version_t *v = dnnl_version();
    snprintf(out, n, "%d.%d.%d+%s", v->major, v->minor, v->patch, v->hash);
}
