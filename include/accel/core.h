/*
 * accel/core.h — status codes, dtypes, devices, tensors, arenas, RNG.
 *
 * The bottom layer. Everything else in accel is built from what is here.
 *
 * Errors. Public functions return an accel_status (or NULL, NAN, -1: see
 * docs/contract.md "Errors"). A failure records a message for its thread;
 * the most recent failure owns it, so one the caller handled never shows up
 * later. Ops given a NULL input return NULL and keep the message of the
 * failure that produced it, so a whole step can be written without checks
 * and tested once at its end:
 *
 *     accel_tensor *loss = accel_mse_loss(accel_linear(x, w, b), y);
 *     if (!loss) { fprintf(stderr, "%s\n", accel_last_error()); ... }
 *
 * Memory. Two kinds of tensors:
 *   - persistent tensors (parameters, optimizer state, anything that outlives
 *     a step) come from accel_tensor_new() and are freed by accel_tensor_free();
 *   - step tensors (every op result, accel_empty/zeros/...) live in the
 *     thread's step arena and die together at accel_step_reset(). Using one after that is reported
 *     (a generation counter), not a crash, until a next step's tensor reuses its memory (then it names that one).
 * Views never own data. accel_tensor_free(NULL) is a no-op.
 *
 * Threading: every thread has its own step arena, tape, error and autocast
 * state. Tensors may be read from any thread; ops run on the calling thread
 * (kernels use OpenMP inside).
 */
#ifndef ACCEL_CORE_H
#define ACCEL_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ACCEL_VERSION_STRING "0.1.0"

/* ------------------------------------------------------------------ status */

typedef enum accel_status {
    ACCEL_OK = 0,
    ACCEL_ERR_INVALID_ARG,  /* NULL, out of range, bad option */
    ACCEL_ERR_SHAPE,        /* shapes do not fit */
    ACCEL_ERR_DTYPE,        /* dtype not supported / mismatched */
    ACCEL_ERR_DEVICE,       /* device mismatch or device not available */
    ACCEL_ERR_OOM,          /* allocation failed */
    ACCEL_ERR_IO,           /* open/read/write/rename failed */
    ACCEL_ERR_FORMAT,       /* malformed file (safetensors, json, yaml, checkpoint) */
    ACCEL_ERR_DIST,         /* collective failed, peer died, mismatched collectives */
    ACCEL_ERR_TIMEOUT,      /* a wait ran out of time */
    ACCEL_ERR_UNSUPPORTED,  /* not available in this build / on this machine */
    ACCEL_ERR_STATE,        /* API misuse: wrong order, freed/expired object */
} accel_status;

/* The message of the pending error of this thread ("" when none). */
const char *accel_last_error(void);
/* The status of the pending error of this thread (ACCEL_OK when none). */
accel_status accel_last_status(void);
void accel_clear_error(void);
/* Records a failure that originates here: replaces any pending error (the
 * most recent failure owns the message). Returns `st`. printf-style. */
accel_status accel_set_error(accel_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* For an input that an earlier failure made NULL (or a callee that already
 * said why it failed): keeps the pending error and returns its status; sets
 * this one only when none is pending. */
accel_status accel_propagate_error(accel_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
const char *accel_status_name(accel_status st);

/* Invariant checks inside the library: always on, routed through a handler
 * (default: print file:line and abort). */
typedef void (*accel_abort_fn)(const char *file, int line, const char *msg);
void accel_set_abort_handler(accel_abort_fn fn);
void accel_abort_at(const char *file, int line, const char *msg) __attribute__((noreturn));
#define ACCEL_ASSERT(cond) \
    do { if (!(cond)) accel_abort_at(__FILE__, __LINE__, "assertion failed: " #cond); } while (0)

/* ------------------------------------------------------------------ memory */

/* The library's host allocations go through this allocator (tensors, arenas,
 * modules, optimizer state, process groups and their stores, ...), so a test
 * can count them (the "no malloc after the first step" promise). Not through
 * it: the tokenizer's results (malloc'd: free() them), the CLI, the loggers'
 * and trackers' own structs, a few scratch buffers, and what outside libraries
 * allocate (docs/architecture.md, "Decisions" 2). Set it before creating
 * anything; memory must be freed by the allocator that made it. */
typedef struct accel_allocator {
    void *(*alloc)(void *ctx, size_t bytes, size_t align); /* zero not required */
    void (*free)(void *ctx, void *ptr);
    void *ctx;
} accel_allocator;
void accel_set_allocator(const accel_allocator *a); /* NULL restores the default */
void *accel_malloc(size_t bytes);                    /* 64-byte aligned; NULL + error on OOM */
void *accel_malloc_aligned(size_t bytes, size_t align);
void *accel_calloc(size_t n, size_t size);
void accel_free(void *ptr);
char *accel_strdup(const char *s);

/* ------------------------------------------------------------------ dtypes */

typedef enum accel_dtype {
    ACCEL_F32 = 0,
    ACCEL_BF16,
    ACCEL_F16,
    ACCEL_F64,
    ACCEL_I64,
    ACCEL_I32,
    ACCEL_U8,
    ACCEL_BOOL,
    ACCEL_I8,
    ACCEL_I16,
    ACCEL_DTYPE_COUNT
} accel_dtype;

size_t accel_dtype_size(accel_dtype dt);
const char *accel_dtype_name(accel_dtype dt);        /* "float32", "bfloat16", ... (torch names) */
const char *accel_dtype_st_name(accel_dtype dt);     /* safetensors: "F32", "BF16", ... */
/* Parses "float32"/"torch.float32"/"fp32"/"F32"/"bfloat16"/"bf16"/... ; -1 if unknown. */
int accel_dtype_parse(const char *s);
bool accel_dtype_is_float(accel_dtype dt);

/* Scalar conversions, round-to-nearest-even, NaN preserved. */
uint16_t accel_f32_to_bf16(float f);
float accel_bf16_to_f32(uint16_t h);
uint16_t accel_f32_to_f16(float f);
float accel_f16_to_f32(uint16_t h);
/* Bulk conversion between any two dtypes (n elements, contiguous). */
void accel_convert(void *dst, accel_dtype dst_dt, const void *src, accel_dtype src_dt, size_t n);

/* ------------------------------------------------------------------ devices */

/* A device is (type, index), named as PyTorch/Accelerate name them: "cpu",
 * "cuda:0", "npu:1", "meta". Each type with memory is served by a backend
 * (src/backends/): cpu always; others when built in and present. "hostless:N"
 * is the test backend (registered only under ACCEL_TEST_DEVICES=N): its
 * memory cannot be read by the host, as a GPU's, so a host access above the
 * backends faults there. */
typedef enum accel_device_type {
    ACCEL_DEV_CPU = 0,
    ACCEL_DEV_META,     /* shape and dtype only; no memory */
    ACCEL_DEV_CUDA,
    ACCEL_DEV_NPU,
    ACCEL_DEV_HOSTLESS, /* the test backend (non-host pointers) */
    ACCEL_DEV_TYPE_COUNT
} accel_device_type;

typedef struct accel_device {
    accel_device_type type;
    int index;
} accel_device;

#define ACCEL_CPU_DEVICE  ((accel_device){ACCEL_DEV_CPU, 0})
#define ACCEL_META_DEVICE ((accel_device){ACCEL_DEV_META, 0})

/* "cpu", "meta", "cuda", "cuda:1", and "<type>:N" of every registered backend
 * ("hostless:0" under ACCEL_TEST_DEVICES). Anything else (npu:0 in a build
 * without NPU, ...) is an error naming the device and what this build supports;
 * N is 0..1023 in digits alone ("cuda: 1", "cuda:+1" are refused). */
accel_status accel_device_parse(const char *s, accel_device *out);
/* "cpu", "meta", "cuda:0" into buf (returns buf). */
const char *accel_device_str(accel_device d, char *buf, size_t n);
const char *accel_device_type_name(accel_device_type t); /* "cpu", "meta", "cuda", ... */
bool accel_device_eq(accel_device a, accel_device b);
/* Is this device usable in this build and on this machine (a registered
 * backend with a device of that index, or meta)? */
bool accel_device_available(accel_device d);
/* Devices of a type present (cpu: 1; meta: 1; others: what their backend counts). */
int accel_device_count(accel_device_type t);
/* Total and free memory of a device in bytes (cpu: the machine's RAM). */
accel_status accel_device_mem_info(accel_device d, size_t *free_bytes, size_t *total_bytes);
/* Waits until all queued work of the device is done (no-op on cpu). */
accel_status accel_device_synchronize(accel_device d);

/* The device that creators without a device argument (accel_empty, accel_zeros,
 * accel_from_data, ...) allocate on, for the calling thread: cpu unless set,
 * or what ACCEL_DEFAULT_DEVICE names in the environment (as
 * torch.set_default_device). Returns the previous one. */
accel_device accel_set_default_device(accel_device d);
accel_device accel_default_device(void);

/* ------------------------------------------------------------------ tensors */

#define ACCEL_MAX_DIMS 8

struct accel_node;
typedef struct accel_tensor accel_tensor;

/* Flags of accel_tensor.flags */
enum {
    ACCEL_TF_OWNS_DATA = 1u << 0, /* data was allocated for this tensor (persistent) */
    ACCEL_TF_ARENA     = 1u << 1, /* header lives in a step arena */
    ACCEL_TF_PARAM     = 1u << 2, /* a module parameter */
    ACCEL_TF_BUFFER    = 1u << 3, /* a module buffer (state, not trained) */
    ACCEL_TF_MMAP      = 1u << 4, /* data points into a mapped file (read-only) */
    ACCEL_TF_GRAD_SHARED = 1u << 5, /* a step gradient two tensors hold (autograd: read-only) */
    ACCEL_TF_GRAD      = 1u << 6, /* a leaf's persistent gradient: its tensor frees it */
};

/* Read the fields; write none of them. dtype, device, ndim, shape, stride,
 * data (the elements may be written through it: then call
 * accel_tensor_increment_version before the next op reads them), requires_grad (set it on a
 * leaf before the forward) and grad are the user's to read; name is the one
 * field a user may set. magic, gen, flags, grad_fn, ag_first_use, ag_gen and prepared
 * are the library's bookkeeping (liveness checks, step expiry, autograd):
 * changing them breaks those checks. Change shape/stride/data only through
 * the API (views, accel_tensor_rebind). */
struct accel_tensor {
    uint32_t magic;                  /* internal: ACCEL_TENSOR_MAGIC while alive */
    uint32_t gen;                    /* internal: arena generation (arena tensors only) */
    accel_dtype dtype;
    accel_device device;
    int ndim;
    int64_t shape[ACCEL_MAX_DIMS];
    int64_t stride[ACCEL_MAX_DIMS];  /* in elements */
    void *data;                      /* first element; NULL on meta */
    uint32_t flags;                  /* internal: ACCEL_TF_* */

    /* autograd */
    bool requires_grad;
    accel_tensor *grad;              /* leaves: persistent (or a view into a flat buffer) */
    struct accel_node *grad_fn;      /* internal: node that produced this tensor (step tensors) */
    int32_t ag_first_use;            /* internal: scratch of the backward pass */
    uint32_t ag_gen;                 /* internal */

    const char *name;                /* optional, not owned */
    struct accel__prepared *prepared; /* internal: its storage version and prepared forms (core/prepared.h) */
};

#define ACCEL_TENSOR_MAGIC 0x7e45042au

/* Shape helper: accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 3)) */
#define ACCEL_SHAPE(...) \
    (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]){__VA_ARGS__}

int64_t accel_numel(const accel_tensor *t);
size_t accel_nbytes(const accel_tensor *t);
/* Row-major with no gaps (dims of size 1 take any stride); a tensor of no
 * element always is, as torch's is_contiguous. */
bool accel_is_contiguous(const accel_tensor *t);
bool accel_same_shape(const accel_tensor *a, const accel_tensor *b);
/* "[2, 3, 4]" into buf. */
const char *accel_shape_str(const accel_tensor *t, char *buf, size_t n);
const char *accel_shape_str_n(int ndim, const int64_t *shape, char *buf, size_t n);
/* Checks a tensor argument: non-NULL, alive, not expired. Sets an error naming
 * `op` and `arg` and returns false otherwise. */
bool accel_tensor_check(const accel_tensor *t, const char *op, const char *arg);

/* Persistent tensors (owned memory, zero-filled). Freed with accel_tensor_free. */
accel_tensor *accel_tensor_new(accel_dtype dt, int ndim, const int64_t *shape, accel_device dev);
/* A persistent header over memory the caller owns (no copy, not freed). */
accel_tensor *accel_tensor_wrap(void *data, accel_dtype dt, int ndim, const int64_t *shape,
                                accel_device dev);
/* Tells the library that t's elements were written through t->data (or any
 * pointer into its memory) rather than through an accel_ call, as
 * torch.autograd.graph.increment_version: every library write bumps a
 * version counter of the storage, and what is prepared from a weight (its
 * autocast copy, reused until the weight changes) is rebuilt after a bump.
 * Any view of the storage will do. */
accel_status accel_tensor_increment_version(accel_tensor *t);
/* Persistent deep copy (contiguous) of any tensor, on `dev`. */
accel_tensor *accel_tensor_clone_persistent(const accel_tensor *src, accel_device dev);
/* Frees a persistent tensor (and its data if owned, and its .grad if owned).
 * A module's parameter or buffer is refused (ACCEL_ERR_STATE): its module
 * frees it; so is a gradient the library gave a tensor (its .grad): the
 * tensor frees it, and accel_tensor_drop_grad drops it. */
void accel_tensor_free(accel_tensor *t);
/* torch's `t.grad = None`: frees t's gradient (a step one dies with its
 * step) and leaves t without one; the next backward makes a new one. A
 * prepared model's parameter is refused (ACCEL_ERR_STATE): its gradient is a
 * view into the model's gradient buffer, which the data-parallel reduction
 * reads; accel_accelerator_zero_grad clears it. */
accel_status accel_tensor_drop_grad(accel_tensor *t);
/* Re-point a persistent tensor at other memory (used to flatten parameters into
 * one buffer). Copies the current contents when copy is true. Frees the old
 * data if it was owned. Fails (t unchanged) on a dead, step or non-contiguous
 * tensor, or when the copy fails. */
accel_status accel_tensor_rebind(accel_tensor *t, void *data, bool copy);
/* Materialise a meta tensor on dev (allocated, zero-filled); the dtype may
 * change. For to_empty on modules. */
accel_status accel_tensor_materialize(accel_tensor *t, accel_device dev, accel_dtype dt);
/* Moves a persistent tensor's data to dev (any two registered devices; a copy
 * through the backends), in place: every holder of t sees the move. The
 * tensor owns the new memory (contiguous); the old is freed if it was owned. */
accel_status accel_tensor_to_device_(accel_tensor *t, accel_device dev);
/* Move a persistent tensor's data to meta (frees owned data). A recorded
 * graph that read t can no longer backpropagate through it: its backward
 * fails there with ACCEL_ERR_STATE naming t. Fails, t unchanged, on a step
 * tensor (ACCEL_ERR_INVALID_ARG: its data is the step pool's) and on a NULL
 * or dead one. */
accel_status accel_tensor_to_meta(accel_tensor *t);

/* Step tensors: headers in the calling thread's step arena, data in the step
 * pool of their device. The creators without a device argument allocate on
 * accel_default_device() (cpu unless set). */
accel_tensor *accel_empty(accel_dtype dt, int ndim, const int64_t *shape);
accel_tensor *accel_zeros(accel_dtype dt, int ndim, const int64_t *shape);
accel_tensor *accel_ones(accel_dtype dt, int ndim, const int64_t *shape);
accel_tensor *accel_full(accel_dtype dt, int ndim, const int64_t *shape, double value);
accel_tensor *accel_empty_on(accel_dtype dt, int ndim, const int64_t *shape, accel_device dev);
accel_tensor *accel_arange(accel_dtype dt, int64_t start, int64_t end);
/* Copies host `data` (contiguous, of dtype dt) into a new step tensor. */
accel_tensor *accel_from_data(accel_dtype dt, int ndim, const int64_t *shape, const void *data);
accel_tensor *accel_from_floats(int ndim, const int64_t *shape, const float *data);
/* A step-arena header viewing `t`'s memory with a new shape/stride/offset
 * (elements). Every element of the view must be one t reaches (between its
 * lowest and highest element): else NULL + ACCEL_ERR_INVALID_ARG. */
accel_tensor *accel_view_raw(const accel_tensor *t, int ndim, const int64_t *shape,
                             const int64_t *stride, int64_t offset);
/* Same tensor header in the arena with the same data (for returning aliases). */
accel_tensor *accel_alias(const accel_tensor *t);

/* Host access. These work on every device: a tensor that is not on the cpu is
 * read or written through its backend's copies (one transfer per call).
 * The contiguous row-major bytes of t, in t's dtype (accel_nbytes(t) of them),
 * to/from host memory. */
accel_status accel_tensor_to_host(const accel_tensor *t, void *dst);
accel_status accel_tensor_from_host(accel_tensor *t, const void *src);
/* Value access (any device; any dtype; any strides). */
double accel_item(const accel_tensor *t);                 /* one-element tensor */
double accel_get(const accel_tensor *t, const int64_t *idx);
/* Fails on a dead or meta tensor, an index out of range, a value an integer
 * dtype cannot hold (NaN, inf, out of its range: ACCEL_ERR_INVALID_ARG, as
 * PyTorch; a value in range is truncated toward zero), or a failed device copy. */
accel_status accel_set(accel_tensor *t, const int64_t *idx, double v);
/* Copy all elements, converted, to a contiguous float/int64 array of numel elements. */
accel_status accel_to_floats(const accel_tensor *t, float *out);
accel_status accel_to_int64s(const accel_tensor *t, int64_t *out);
/* Elementwise copy with dtype conversion and broadcasting-free shape equality,
 * between any two devices. No autograd. dst may be persistent. */
accel_status accel_copy_(accel_tensor *dst, const accel_tensor *src);
/* v as accel_set takes it (accel_full too): an integer dtype refuses what it cannot hold. */
accel_status accel_fill_(accel_tensor *t, double v);
accel_status accel_zero_(accel_tensor *t);

/* Readable print: "tensor([[1.0000, 2.0000], ...], dtype=float32, shape=[2, 2])".
 * Large tensors are summarised with "..." like PyTorch. */
void accel_print_tensor(FILE *f, const accel_tensor *t);
/* Same, into a string in the step arena. */
const char *accel_tensor_str(const accel_tensor *t);

/* ------------------------------------------------------------------ arenas */

typedef struct accel_arena accel_arena;

accel_arena *accel_arena_create(size_t initial_bytes);
void accel_arena_destroy(accel_arena *a);
/* bytes at a multiple of align (a power of two; at least 16). NULL + error
 * for a NULL arena, another align, or more bytes than memory holds. */
void *accel_arena_alloc(accel_arena *a, size_t bytes, size_t align);
/* Frees everything allocated since creation. If it grew past its first chunk,
 * it re-allocates one chunk of the high-water size, so a loop whose steps are
 * alike allocates nothing from the second step on. */
void accel_arena_reset(accel_arena *a);
size_t accel_arena_used(const accel_arena *a);
/* The high-water mark of accel_arena_used since creation or the last reset. */
size_t accel_arena_peak(const accel_arena *a);
size_t accel_arena_capacity(const accel_arena *a);
uint32_t accel_arena_generation(const accel_arena *a);

/* A position in an arena. accel_arena_rewind(a, m) frees everything allocated
 * since accel_arena_mark_now(a) returned m (marks nest like a stack; m and
 * every later mark must be of the current generation, not yet rewound past).
 * Memory from after the mark is invalid afterwards: step tensors too. The
 * peak keeps counting what was freed. A mark of another arena or generation,
 * or one already rewound past, is refused (ACCEL_ERR_STATE, a unchanged); a
 * NULL a or the empty mark of a NULL arena is a no-op. */
typedef struct accel_arena_mark {
    void *chunk;
    size_t used, below;
    uint32_t gen;
} accel_arena_mark;
accel_arena_mark accel_arena_mark_now(const accel_arena *a);
accel_status accel_arena_rewind(accel_arena *a, accel_arena_mark m);

/* The calling thread's step arena (created on first use). */
accel_arena *accel_step_arena(void);
/* End of a training/eval step: clears the tape and resets the step arena.
 * Every step tensor of this thread becomes invalid. */
void accel_step_reset(void);
/* Release the thread's step arena and tape entirely (at exit; for leak checks). */
void accel_thread_cleanup(void);

/* ------------------------------------------------------------------ RNG */

/* Counter-based (Philox-4x32-10): a value depends only on (seed, offset), never on
 * the thread count. Each draw advances the offset by what it consumed, in one
 * atomic step: threads may draw from one generator (the default one) at once
 * and get disjoint values (which thread gets which depends on timing). Seeding
 * (accel_rng_init, accel_manual_seed) is not atomic with drawing: seed before
 * other threads draw. Fields: read-only, except to restore a saved state. */
typedef struct accel_rng {
    uint64_t seed;
    uint64_t offset;
} accel_rng;

accel_status accel_rng_init(accel_rng *r, uint64_t seed);
/* The process default generator, seeded by accel_manual_seed (default seed 0). */
accel_rng *accel_default_rng(void);
void accel_manual_seed(uint64_t seed);
/* Draws into a tensor (f32/bf16/f16/f64), in place. A NULL generator means the
 * default one (as PyTorch's generator=None), in every accel_rng_* call. */
accel_status accel_rng_normal_(accel_rng *r, accel_tensor *t, double mean, double std);
accel_status accel_rng_uniform_(accel_rng *r, accel_tensor *t, double lo, double hi);
/* Bernoulli keep-mask with probability 1-p into u8 tensor. */
accel_status accel_rng_bernoulli_(accel_rng *r, accel_tensor *mask, double keep_prob);
/* A random permutation of 0..n-1 into out[n]. */
accel_status accel_rng_randperm(accel_rng *r, int64_t n, int64_t *out);
uint64_t accel_rng_next_u64(accel_rng *r);
double accel_rng_next_double(accel_rng *r); /* [0, 1) */

/* ------------------------------------------------------------------ misc */

/* When on, every kernel runs its plain reference C version (tests compare the
 * fast paths against it), and the ops take no fast path of their own.
 * Thread-local. Returns the previous value. */
bool accel_set_reference_kernels(bool on);
bool accel_reference_kernels(void);

double accel_now_seconds(void); /* monotonic */
/* Number of threads kernels use (OpenMP). */
int accel_num_threads(void);
/* n >= 1; anything else is refused (the count is unchanged). For every
 * thread of the process (as torch.set_num_threads), not only the caller:
 * another thread takes it at its next library call. */
accel_status accel_set_num_threads(int n);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_CORE_H */
