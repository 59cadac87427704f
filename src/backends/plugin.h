/* Backend plug-ins (internal): the contract between libaccel and a device
 * backend built as a shared object of its own, libaccel-<name>.so, loaded
 * with dlopen the first time a device of its type is asked for, listed or
 * described (`accel env`), as ggml's dynamically loaded backends.
 *
 * Why: an accelerator's runtime (CUDA's cudart + cuBLASLt + NCCL, ~210 MB of
 * resident memory and ~80 ms of start-up; CANN's ACL + HCCL) is never a
 * link-time dependency of the core, so a CPU-only process maps none of it
 * and a program built where the toolkit is installed starts where it is not.
 * The MPI process group and oneDNN's GEMM are plug-ins too (their libraries
 * take ~20 and ~15 ms to load): only a process that uses them pays for them.
 *
 * A plug-in exports two symbols and nothing else (NAME is its device type's
 * name, "cuda", "hostless", "npu", or for a plug-in that brings a process
 * group only, that group's: "mpi"):
 *
 *   const accel__plugin_abi accel_backend_NAME_abi;   the version check
 *   accel_status accel_backend_NAME_init(const accel__plugin_host *host,
 *                                        accel__plugin_info *info);
 *
 * The loader (backends/plugin.c) reads the abi symbol first and refuses a
 * plug-in built for another ABI or another layout of the shared tables;
 * then it calls init once, which registers the plug-in's device backend
 * (accel__backend_register) and process-group backends
 * (accel__pg_backend_register) through `host` and fills `info`.
 *
 * A plug-in links no part of accel: every core function it calls reaches the
 * core through `host` (backends/plugin_shims.c defines them by those names
 * inside a plug-in), so it works the same with libaccel.so, with a program
 * linking libaccel.a, and under RTLD_LOCAL. Built with -DACCEL_BACKENDS_STATIC
 * (the static library with its backends linked in), the same sources are
 * compiled into the core and init is called directly. */
#ifndef ACCEL_CORE_PLUGIN_H
#define ACCEL_CORE_PLUGIN_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "core/backend.h"
#include "backends/cpu/cpu_kernels.h" /* accel__cpu_mem_info */
#include "backends/cpu/dnnl_hooks.h"  /* the tables in ACCEL__PLUGIN_LAYOUT */
#include "backends/cpu/gemm.h"        /* accel__gemm_test_scratchpad_bytes */
#include "backends/cuda/cuda_hooks.h"
#include "backends/fp8.h"
#include "backends/hostless/hostless.h"
#include "core/cpuinfo.h"
#include "core/env.h"
#include "backends/vm_pool.h"
#include "dist/backend.h"

/* Bumped on any change of the meaning of the host table or the entry
 * points; layout changes are caught by ACCEL__PLUGIN_LAYOUT as well. */
#define ACCEL__PLUGIN_ABI_VERSION 1u

/* The layout fingerprint a plug-in must share with the core: the hash of the
 * text of the headers they share (ACCEL__PLUGIN_HEADERS_HASH, computed by
 * CMake from ACCEL_PLUGIN_SHARED_HEADERS in cmake/AccelPlugins.cmake, so a
 * reordered or retyped field differs too), folded with the sizes of every
 * structure passed between them (which also catches a build whose compiler
 * lays them out otherwise). Only the loader and the plug-ins' abi symbols
 * use it, and their targets get the define. */
#define ACCEL__PLUGIN_LAYOUT                        \
    ((uint32_t)(ACCEL__PLUGIN_HEADERS_HASH) ^       \
     (uint32_t)(                                    \
         sizeof(accel_backend) * 1000003u +         \
         sizeof(accel_kernel_table) * 1000033u +    \
         sizeof(accel__backend) * 1000037u +        \
         sizeof(struct accel_pg) * 1000039u +       \
         sizeof(accel_tensor) * 1000081u +          \
         sizeof(accel__plugin_host) * 1000099u +    \
         sizeof(accel__plugin_info) * 1000117u +    \
         sizeof(accel__dnnl_hooks) * 1000121u +     \
         sizeof(accel__hostless_hooks) * 1000133u + \
         sizeof(accel__cuda_hooks) * 1000151u +     \
         sizeof(accel__vm_ops) * 1000159u +         \
         sizeof(accel__stream_ops) * 1000171u +     \
         sizeof(accel__fp8_ops) * 1000183u))

typedef struct accel__plugin_abi {
    uint32_t version; /* ACCEL__PLUGIN_ABI_VERSION */
    uint32_t layout;  /* ACCEL__PLUGIN_LAYOUT */
    const char *accel_version; /* the accel release it was built from, for messages */
} accel__plugin_abi;

/* The core functions a plug-in may call, as X(ret, name, params, args);
 * void ones in ACCEL__PLUGIN_HOST_VOIDS. A backend needing another adds it
 * here (and bumps nothing: the table is in the layout fingerprint). */
#define ACCEL__PLUGIN_HOST_FUNCS(X)                                                                   \
    X(accel_status, accel__set_errorv, (accel_status st, const char *fmt, va_list ap), (st, fmt, ap)) \
    X(accel_status, accel_last_status, (void), ())                                                   \
    X(void *, accel_malloc, (size_t bytes), (bytes))                                                 \
    X(void *, accel_malloc_aligned, (size_t bytes, size_t align), (bytes, align))                    \
    X(void *, accel_calloc, (size_t n, size_t size), (n, size))                                      \
    X(size_t, accel_dtype_size, (accel_dtype dt), (dt))                                              \
    X(const char *, accel_dtype_name, (accel_dtype dt), (dt))                                        \
    X(bool, accel_dtype_is_float, (accel_dtype dt), (dt))                                            \
    X(const char *, accel_device_str, (accel_device d, char *buf, size_t n), (d, buf, n))            \
    X(int, accel_device_count, (accel_device_type t), (t))                                           \
    X(int64_t, accel_numel, (const accel_tensor *t), (t))                                            \
    X(bool, accel_is_contiguous, (const accel_tensor *t), (t))                                       \
    X(double, accel_now_seconds, (void), ())                                                         \
    X(accel_arena *, accel_arena_create, (size_t initial_bytes), (initial_bytes))                    \
    X(accel_arena *, accel_step_arena, (void), ())                                                   \
    X(void *, accel_arena_alloc, (accel_arena *a, size_t bytes, size_t align), (a, bytes, align))    \
    X(accel_status, accel__backend_register, (const accel_backend *b), (b))                          \
    X(accel_status, accel__pg_backend_register, (const accel__backend *b), (b))                      \
    X(const accel_kernel_table *, accel__kernel_table_of, (accel_device dev, const char *op), (dev, op)) \
    X(accel_status, accel__cpu_mem_info, (size_t *free_bytes, size_t *total_bytes), (free_bytes, total_bytes)) \
    X(void *, accel__vm_reserve, (const accel__vm_ops *ops, accel_device_type type, int index, size_t bytes), \
      (ops, type, index, bytes))                                                                     \
    X(accel_status, accel__vm_map, (const accel__vm_ops *ops, accel_device_type type, int index, void *p, \
                                    size_t bytes), (ops, type, index, p, bytes))                     \
    X(accel_status, accel__vm_unmap, (const accel__vm_ops *ops, accel_device_type type, int index, void *p, \
                                      size_t bytes), (ops, type, index, p, bytes))                   \
    X(accel_status, accel__store_set, (accel__store *s, const char *key, const void *val, size_t len), \
      (s, key, val, len))                                                                            \
    X(accel_status, accel__store_get, (accel__store *s, const char *key, void **val, size_t *len),   \
      (s, key, val, len))                                                                            \
    X(uint16_t, accel__op_tag, (accel__slot slot, uint64_t a, uint64_t b), (slot, a, b))               \
    X(uint16_t, accel__gatherv_tag, (const size_t *bytes, int world, int root), (bytes, world, root)) \
    X(uint16_t, accel__call_digest, (const accel__site *site), (site))                                 \
    X(accel_status, accel__env_long, (const char *name, long dflt, long lo, long hi, long *out),         \
      (name, dflt, lo, hi, out))                                                                       \
    X(accel_status, accel__env_bool, (const char *name, bool dflt, bool *out), (name, dflt, out))        \
    X(accel__cpu_isa_level, accel__cpu_isa_cap, (void), ())                                             \
    X(size_t, accel__gemm_test_scratchpad_bytes, (void), ())                                            \
    X(accel_arena_mark, accel_arena_mark_now, (const accel_arena *a), (a))                             \
    X(accel_status, accel_arena_rewind, (accel_arena *a, accel_arena_mark m), (a, m))                \
    X(bool, accel__p2p_matches, (const accel__site *sent, const accel__site *expected), (sent, expected)) \
    X(accel_status, accel__p2p_mismatch, (const accel_pg *pg, const accel__site *sent,                  \
                                          const accel__site *expected), (pg, sent, expected))

#define ACCEL__PLUGIN_HOST_VOIDS(X)                                                                   \
    X(accel_clear_error, (void), ())                                                                  \
    X(accel_free, (void *ptr), (ptr))                                                                 \
    X(accel_arena_reset, (accel_arena *a), (a))                                                       \
    X(accel__vm_release, (const accel__vm_ops *ops, accel_device_type type, int index, void *p, size_t bytes), \
      (ops, type, index, p, bytes))                                                                  \
    X(accel__vm_step, (accel_device_type type, int index), (type, index))                             \
    X(accel__vm_trim, (accel_device_type type, int index), (type, index))                             \
    X(accel__poll_pause, (unsigned spins, double elapsed_s), (spins, elapsed_s))                      \
    X(accel__reduce, (accel_dtype dt, accel_reduce_op op, int world, int nsrc, const void *const *srcs, int ndst, \
                      void *const *dsts, size_t n), (dt, op, world, nsrc, srcs, ndst, dsts, n))       \
    X(accel__site_describe, (const accel__site *s, char *out, size_t n), (s, out, n))

typedef struct accel__plugin_host {
#define ACCEL__HOST_FIELD(ret, name, params, args) ret(*name) params;
#define ACCEL__HOST_VOID_FIELD(name, params, args) void(*name) params;
    ACCEL__PLUGIN_HOST_FUNCS(ACCEL__HOST_FIELD)
    ACCEL__PLUGIN_HOST_VOIDS(ACCEL__HOST_VOID_FIELD)
#undef ACCEL__HOST_FIELD
#undef ACCEL__HOST_VOID_FIELD
} accel__plugin_host;

/* What init tells the loader. Pointers stay valid while the process runs
 * (a plug-in is never unloaded once init ran). */
typedef struct accel__plugin_info {
    /* Why the plug-in registered no device ("" or NULL when it did), e.g.
     * "no NVIDIA driver is loaded": accel env and the failing call show it.
     * A function: the reason may be found only when first asked. */
    const char *(*unavailable)(void);
    /* accel env's lines for this backend ("- CUDA available: ...");
     * optional. */
    void (*describe)(FILE *out);
    /* The backend's own test hooks (hostless: accel__hostless_hooks;
     * cuda: accel__cuda_hooks); optional. */
    const void *hooks;
} accel__plugin_info;

/* A plug-in's two entry symbols are declared with ACCEL__PLUGIN_EXPORT, and
 * its init starts with ACCEL__PLUGIN_SHIMS_INIT(host). Built into the static
 * library (ACCEL_BACKENDS_STATIC) there are no shims: the core is linked. */
#define ACCEL__PLUGIN_EXPORT __attribute__((visibility("default")))
#ifdef ACCEL__PLUGIN_SHIMS
void accel__plugin_shims_init(const accel__plugin_host *host);
#define ACCEL__PLUGIN_SHIMS_INIT(host) accel__plugin_shims_init(host)
#else
#define ACCEL__PLUGIN_SHIMS_INIT(host) ((void)(host))
#endif

typedef accel_status (*accel__plugin_init_fn)(const accel__plugin_host *host, accel__plugin_info *info);

/* ---- the loader (backends/plugin.c) */

/* accel__plugin_load_type, accel__plugin_unavailable_reason: core/backend.h
 * (the registry calls them). */
/* Loads the plug-in that provides process-group backend `pg_name` ("nccl");
 * false when no plug-in provides it or it did not load. */
bool accel__plugin_load_pg(const char *pg_name);
/* Whether a plug-in the loader knows provides pg backend `pg_name` (loaded or not). */
bool accel__plugin_knows_pg(const char *pg_name);
/* The hooks of the plug-in called `name` ("dnnl", a provider with no device
 * type), loading it; NULL when it did not load (accel__plugin_reason_named). */
const void *accel__plugin_hooks_named(const char *name);
const char *accel__plugin_reason_named(const char *name);
/* Why the plug-in providing pg backend `pg_name` is missing ("" if loaded). */
const char *accel__plugin_pg_reason(const char *pg_name);
/* The hooks the plug-in serving t gave (NULL if none or not loaded). */
const void *accel__plugin_hooks(accel_device_type t);
/* accel env's lines for every accelerator plug-in the loader knows (not the
 * test devices): its own, or "- CUDA available: False (<reason>)". */
void accel__plugins_describe(FILE *out);
/* Opens the plug-in file at `path` serving type t and initialises it, as
 * the search does; for tests of the checks. *why gets the reason on error. */
accel_status accel__plugin_open(const char *path, accel_device_type t, char *why, size_t why_len);

#endif
