/* oneDNN matmul as a GEMM provider (compiled when CMake found oneDNN:
 * ACCEL_HAVE_DNNL; gemm.h describes the choice of provider).
 *
 * One primitive per GEMM signature (dtype, transposes, M/N/K, leading dims,
 * alpha, beta, threads), created at its first use and kept for the process
 * in a static table under a mutex (creation costs ~0.1-1 ms: JIT code
 * generation; a step runs the same few signatures every time, and a
 * signature first seen in a later step, such as a gradient GEMM with beta 1
 * once the gradients exist, allocates nothing of accel's). Execution runs outside
 * the lock: a oneDNN primitive may execute on several threads at once, and
 * each call has its own stream, memory objects and scratchpad (from the
 * caller's step arena, so no call shares one with another thread).
 *
 * The operands are plain row-major memory described by strides, so a
 * transposed operand is read in place as in cblas_sgemm; oneDNN packs the
 * panels it needs inside the primitive. */
#include "backends/cpu/gemm.h"

#include <dnnl.h>
#include <dnnl_debug.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* Everything a primitive depends on. Compared with memcmp: always built
 * from a zeroed struct. */
typedef struct dnnl_key {
    int64_t M, N, K, lda, ldb, ldc;
    uint32_t alpha_bits, beta_bits;
    int32_t threads;
    int32_t dtype;
    int32_t trans_a, trans_b;
} dnnl_key;

typedef struct dnnl_entry {
    dnnl_key key;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t a_md, b_md, c_md;
    size_t scratch_bytes;
    char impl[64]; /* oneDNN's implementation name, e.g. "brg:avx512_core_amx" */
} dnnl_entry;

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

static void engine_create(void) { engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0); }

static accel_status dnnl_error(const char *what, dnnl_status_t s) {
    return accel_set_error(s == dnnl_out_of_memory ? ACCEL_ERR_OOM : ACCEL_ERR_UNSUPPORTED,
                           "accel_gemm: oneDNN %s failed (%s)", what, dnnl_status2str(s));
}

static dnnl_data_type_t dnnl_dtype(accel_dtype dt) {
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
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_strides(&e->c_md, 2, c_dims, dnnl_f32, c_str);
    return s;
}

/* alpha as the output scale, beta as a sum post-op (C = alpha AB + beta C),
 * and a scratchpad the caller passes in. */
static dnnl_status_t attributes(float alpha, float beta, dnnl_primitive_attr_t *out) {
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

/* "f32 NT GEMM 64 x 32 x 16" */
static void signature_name(const dnnl_key *k, char *out, size_t n) {
    accel_dtype dt = k->dtype == dnnl_bf16 ? ACCEL_BF16 : k->dtype == dnnl_f16 ? ACCEL_F16 : ACCEL_F32;
    snprintf(out, n, "%s %c%c GEMM %lld x %lld x %lld", accel_dtype_name(dt), k->trans_a ? 'T' : 'N',
             k->trans_b ? 'T' : 'N', (long long)k->M, (long long)k->N, (long long)k->K);
}

/* Fills e with the primitive of k; ACCEL_OK or the error set. */
static accel_status entry_create(const dnnl_key *k, float alpha, float beta, dnnl_entry *e) {
    pthread_once(&engine_once, engine_create);
    if (engine_status != dnnl_success) return dnnl_error("engine creation", engine_status);
    memset(e, 0, sizeof *e);
    e->key = *k;
    const char *what = "memory description";
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t md;
    dnnl_status_t s = describe(k, e);
    if (s == dnnl_success) what = "matmul description", s = dnnl_matmul_desc_init(&md, &e->a_md, &e->b_md, NULL, &e->c_md);
    if (s == dnnl_success) what = "attributes", s = attributes(alpha, beta, &attr);
    if (s == dnnl_success) what = "matmul primitive description", s = dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL);
    if (s == dnnl_success) {
        const char *impl = "unknown";
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
        snprintf(e->impl, sizeof e->impl, "%s", impl);
        e->scratch_bytes = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
        what = "matmul primitive creation", s = dnnl_primitive_create(&e->prim, pd);
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (s == dnnl_success) return ACCEL_OK;
    char sig[96], why[160];
    signature_name(k, sig, sizeof sig);
    snprintf(why, sizeof why, "%s (%s)", what, sig);
    return dnnl_error(why, s);
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

/* The entry of the signature: the cached one (made at the first use), or
 * *local with a primitive of its own when the pool is full (the caller
 * destroys local->prim after the call). NULL with the error set. */
static const dnnl_entry *entry_get(const dnnl_key *k, float alpha, float beta, dnnl_entry *local) {
    local->prim = NULL;
    const dnnl_entry *e = cache_find(k);
    if (e) return e;
    if (entry_create(k, alpha, beta, local) != ACCEL_OK) return NULL;
    e = cache_insert(local);
    return e ? e : local;
}

static dnnl_status_t memory(dnnl_memory_t *m, const dnnl_memory_desc_t *md, const void *p) {
    return dnnl_memory_create(m, md, engine, (void *)p);
}

static accel_status execute(const dnnl_entry *e, const void *A, const void *B, float *C) {
    void *scratch = NULL;
    if (e->scratch_bytes) {
        scratch = accel_arena_alloc(accel_step_arena(), e->scratch_bytes, 64);
        if (!scratch) return accel_last_status();
    }
    dnnl_memory_desc_t scratch_md;
    dnnl_dims_t sd = {(int64_t)e->scratch_bytes};
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL, ms = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_status_t s = memory(&ma, &e->a_md, A);
    if (s == dnnl_success) s = memory(&mb, &e->b_md, B);
    if (s == dnnl_success) s = memory(&mc, &e->c_md, C);
    if (s == dnnl_success && scratch) s = dnnl_memory_desc_init_by_tag(&scratch_md, 1, sd, dnnl_u8, dnnl_a);
    if (s == dnnl_success && scratch) s = memory(&ms, &scratch_md, scratch);
    if (s == dnnl_success) s = dnnl_stream_create(&stream, engine, dnnl_stream_default_flags);
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc},
                                   {DNNL_ARG_SCRATCHPAD, ms}};
        s = dnnl_primitive_execute(e->prim, stream, scratch ? 4 : 3, args);
        if (s == dnnl_success) s = dnnl_stream_wait(stream);
    }
    if (stream) dnnl_stream_destroy(stream);
    dnnl_memory_t all[4] = {ma, mb, mc, ms};
    for (int i = 0; i < 4; i++)
        if (all[i]) dnnl_memory_destroy(all[i]);
    return s == dnnl_success ? ACCEL_OK : dnnl_error("matmul execution", s);
}

static dnnl_key make_key(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                         float alpha, int64_t lda, int64_t ldb, float beta, int64_t ldc) {
    dnnl_key k;
    memset(&k, 0, sizeof k);
    k.M = M, k.N = N, k.K = K, k.lda = lda, k.ldb = ldb, k.ldc = ldc;
    k.alpha_bits = float_bits(alpha);
    k.beta_bits = float_bits(beta);
    /* oneDNN plans its blocking for the threads it will have. */
    k.threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    k.dtype = (int32_t)dnnl_dtype(dt);
    k.trans_a = trans_a, k.trans_b = trans_b;
    return k;
}

accel_status accel__dnnl_gemm(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                              float alpha, const void *A, int64_t lda, const void *B, int64_t ldb, float beta,
                              float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return ACCEL_OK;
    dnnl_key k = make_key(dt, trans_a, trans_b, M, N, K, alpha, lda, ldb, beta, ldc);
    dnnl_entry local;
    const dnnl_entry *e = entry_get(&k, alpha, beta, &local);
    if (!e) return accel_last_status();
    accel_status st = execute(e, A, B, C);
    if (local.prim) dnnl_primitive_destroy(local.prim);
    return st;
}

const char *accel__dnnl_impl(accel_dtype dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K) {
    dnnl_key k = make_key(dt, trans_a, trans_b, M, N, K, 1.0f, trans_a ? M : K, trans_b ? K : N, 0.0f, N);
    dnnl_entry local;
    const dnnl_entry *e = entry_get(&k, 1.0f, 0.0f, &local);
    if (!e) return NULL;
    static _Thread_local char name[64];
    snprintf(name, sizeof name, "%s", e->impl);
    if (local.prim) dnnl_primitive_destroy(local.prim);
    return name;
}

bool accel__dnnl_supports(accel_dtype dt, char *impl, size_t size) {
    /* A primitive description only: it names the implementation. */
    pthread_once(&engine_once, engine_create);
    if (engine_status != dnnl_success) return false;
    dnnl_key k = make_key(dt, false, true, 256, 256, 256, 1.0f, 256, 256, 0.0f, 256);
    dnnl_entry e;
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t s = describe(&k, &e);
    if (s == dnnl_success) s = dnnl_matmul_desc_init(&md, &e.a_md, &e.b_md, NULL, &e.c_md);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &md, NULL, engine, NULL);
    if (s == dnnl_success) {
        const char *name = "unknown";
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
        snprintf(impl, size, "%s", name);
        dnnl_primitive_desc_destroy(pd);
    }
    return s == dnnl_success;
}
