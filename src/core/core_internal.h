/* Internals shared by the core files and the layers above (not public API). */
#ifndef ACCEL_CORE_INTERNAL_H
#define ACCEL_CORE_INTERNAL_H

#include <stdarg.h>

#include "accel/core.h"

/* Whether the user chose the kernels' thread count: OMP_NUM_THREADS is set
 * (even to a value OpenMP ignores) or accel_set_num_threads was called. */
bool accel__num_threads_chosen(void);
/* Caps accel_num_threads() at n in every thread (the kernels' pools) and sets
 * every thread's OpenMP default to n (oneDNN and plain `omp parallel`
 * regions; each thread at its accel__threads_follow), without counting as
 * the user's choice. */
void accel__cap_num_threads(int n);
/* Applies to the calling thread the count last chosen for every thread
 * (accel_set_num_threads, the cap), once per choice: called where a thread
 * begins library work (its step arena, accel_num_threads). Not inside a
 * parallel region. */
void accel__threads_follow(void);

/* accel_set_error with a va_list (status.c): the entry the plug-ins' host
 * table carries (backends/plugin.h). */
accel_status accel__set_errorv(accel_status st, const char *fmt, va_list ap);

/* The failure st of a user's callback (a registered object's save, a
 * tracker's log), said by the library: "<what> failed: <its message>" when
 * the callback set one during the call (errors were set on this thread since
 * `mark`, accel__error_mark() taken just before it), else "<what> failed
 * (<status name>) and gave no reason". A callback may return its status
 * without a message (a C habit): the slot then still held an earlier, handled
 * failure, which the caller read as this one's cause. printf-style `what`;
 * returns st. */
unsigned long accel__error_mark(void);
accel_status accel__callback_failed(accel_status st, unsigned long mark, const char *what, ...)
    __attribute__((format(printf, 3, 4)));

/* The device s names, read from its spelling alone: cpu, meta, or an indexed
 * type's name with an optional ":N" (N in 0..1023), whether or not a backend
 * serves that type (none is loaded). ACCEL_ERR_INVALID_ARG naming s otherwise.
 * accel_device_parse accepts a name only when its type can be served. */
accel_status accel__device_name(const char *s, accel_device *out);

/* realloc through the library's allocator (which has no realloc of its own):
 * new memory of `bytes` holding the first min(old_bytes, bytes) bytes of p,
 * which is freed. NULL + error on out of memory, p left as it was. */
void *accel__realloc(void *p, size_t old_bytes, size_t bytes);

/* The unsigned little-endian number in p's first `bytes` (1 to 8) bytes:
 * the file formats' fields (zip, pickle, safetensors), whatever the host's
 * byte order or the field's alignment. */
static inline uint64_t accel__read_le(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* The values of the integer dtype dt, as doubles: trunc(v) in [*lo, *hi);
 * false (nothing set) for a floating dtype or bool. */
bool accel__int_dtype_range(accel_dtype dt, double *lo, double *hi);
/* Element i of a contiguous buffer of dtype dt, as double / stored from double. */
double accel__load_elem(const void *p, accel_dtype dt, size_t i);
void accel__store_elem(void *p, accel_dtype dt, size_t i, double v);

/* Contiguous strides for shape into stride[]. */
void accel__contiguous_strides(int ndim, const int64_t *shape, int64_t *stride);
/* Byte address of element with linear (row-major) index i of t (any strides). */
void *accel__elem_ptr(const accel_tensor *t, int64_t i);
/* Copies n bytes from src on device `from` to dst on device `to` (any two
 * registered devices; contiguous bytes), through their backends. */
accel_status accel__copy_bytes(accel_device to, void *dst, accel_device from, const void *src, size_t n);
/* accel_zero_ of t, whose zeros are next read long after (the gradients
 * between an optimizer step and the next backward): through its backend's
 * memset_cold where t is contiguous and the backend has one. */
accel_status accel__zero_cold_(accel_tensor *t);
/* A tensor header over caller memory `data` on dev, initialised in place (a
 * stack header for a kernel call on a raw buffer: nothing is allocated). */
void accel__tensor_header(accel_tensor *t, void *data, accel_dtype dt, int ndim, const int64_t *shape,
                          accel_device dev);
/* Whether a tensor of ndim sizes may exist: ndim in [0, ACCEL_MAX_DIMS],
 * sizes >= 0, its bytes (the product of the sizes, empty ones counted as 1,
 * times 8) within int64 (so numel, nbytes and strides never overflow: over
 * 2^60 elements is refused). false with an error naming op. */
bool accel__check_shape(const char *op, int ndim, const int64_t *shape);
/* The lowest and highest element offsets that a layout of ndim sizes and
 * strides reaches, its first element at `offset`; false when one passes
 * int64. Only for a layout with elements. */
bool accel__element_span(int ndim, const int64_t *shape, const int64_t *stride, int64_t offset, int64_t *lo,
                         int64_t *hi);
/* Frees a module's parameter or buffer, which accel_tensor_free refuses (the
 * module owns it): for the module code that drops or replaces its members.
 * taped: forget it on the tape first (accel__tape_forget); false where the
 * caller forgot a whole module's at once. */
void accel__tensor_free_member(accel_tensor *t, bool taped);
/* Frees a tensor's gradient g (ACCEL_TF_GRAD), which accel_tensor_free
 * refuses: for the code that replaces or drops a .grad (the caller clears or
 * resets the holder's pointer). taped: as accel__tensor_free_member. */
void accel__tensor_free_grad(accel_tensor *g, bool taped);
/* t's gradient dropped whatever it is (a flat-buffer view too, which the
 * public accel_tensor_drop_grad refuses): for the library moving or
 * unsharding a prepared model's tensors, which rebinds the views itself. */
void accel__tensor_drop_grad(accel_tensor *t);
/* The persistent tensors ts[0..n) are about to be freed: every node of this
 * thread's tape that reads one (an input, a saved tensor, its output) drops
 * it and, if the backward reaches it, fails naming it instead of reading
 * freed memory (PyTorch's graph holds a reference; here the owner decides). */
void accel__tape_forget(accel_tensor *const *ts, int n);
/* The persistent tensors ts[0..n) are about to lose their data (moved to
 * meta) and keep their headers: the same for the nodes that read one, whose
 * backward fails saying its data went after the forward. One pass over the
 * tape for all n (a dispatch hook drops a block's offloaded weights at once). */
void accel__tape_forget_data(accel_tensor *const *ts, int n);
/* Moves persistent t to meta (its data freed or unmapped, its header kept)
 * without looking at the tape: for a caller that did accel__tape_forget_data
 * on t first (accel_tensor_to_meta does both). */
void accel__tensor_drop_data(accel_tensor *t);
/* Whether this thread's tape holds nodes (false without a step arena: it
 * makes none). */
bool accel__tape_live(void);
/* Empties this thread's tape, whose arena accel_thread_cleanup destroys: a
 * later arena restarts its generations, which the tape's would match. */
void accel__tape_drop(void);
/* The host address of a tensor's first element when its device's memory is
 * host memory (the cpu: file mappings, batch collation, writing files read
 * and fill CPU tensors in place); NULL with an error naming `op` otherwise. */
void *accel__host_ptr(const accel_tensor *t, const char *op);
/* The device pointer of t's first element (NULL on meta), for code that hands
 * t's memory on without reading it: a header viewing it (accel__tensor_header
 * at an element offset), a backend or process-group call, an identity test.
 * Above src/backends/ it is an opaque address of t's device: never
 * dereferenced (docs/architecture.md, "The device layer"). */
void *accel__device_ptr(const accel_tensor *t);
/* n bytes between host memory and contiguous t's storage, starting byte_off
 * bytes after t's first element, through t's backend (chunked loads, staged
 * writes of device tensors). The range must lie inside t. */
accel_status accel__tensor_write_bytes(accel_tensor *t, size_t byte_off, const void *src, size_t n);
accel_status accel__tensor_read_bytes(const accel_tensor *t, size_t byte_off, void *dst, size_t n);
/* Gives persistent tensor t fresh, uninitialised, owned, contiguous storage
 * of dtype dt on dev (for a load that writes every byte next); frees what it
 * owned before. */
accel_status accel__tensor_alloc_uninit(accel_tensor *t, accel_device dev, accel_dtype dt);
/* Persistent memory of `bytes` on dev from its backend (flat parameter
 * buffers), zero-filled when `zeroed`; NULL + error naming op. Freed with
 * accel__device_free. */
void *accel__device_alloc(accel_device dev, size_t bytes, bool zeroed, const char *op);
void accel__device_free(accel_device dev, void *p);
/* Rewinds the step arena to m, keeping y (which may lie in the memory freed):
 * returns a new contiguous step tensor with y's values, allocated after the
 * rewind. The copy goes through a per-thread persistent buffer that grows to
 * the largest y, so alike steps allocate nothing; accel__bounce_free releases
 * it (accel_thread_cleanup). NULL + error on failure (the arena is rewound). */
accel_tensor *accel__rewind_keeping(accel_arena_mark m, const accel_tensor *y);
void accel__bounce_free(void);
/* Watching an arena for what a rewind frees: accel__arena_watch starts a
 * watch in one of the arena's slots (ending that slot's watch before) and
 * returns its id; accel__arena_kept is true while that watch is the slot's
 * current one and no rewind or reset since has gone below position pos (an
 * accel_arena_used value): the memory below pos holds what it held. One
 * watch at a time per slot, each slot a cache of the step tensors last made:
 * tp_modules.c's shared region entry, step_casts.c's conversions. */
enum { ACCEL__WATCH_TP_REGION = 0, ACCEL__WATCH_STEP_CASTS = 1, ACCEL__ARENA_WATCHES = 2 };
uint64_t accel__arena_watch(accel_arena *a, int slot);
bool accel__arena_kept(const accel_arena *a, int slot, uint64_t watch, size_t pos);
/* Whether [p, p + n) lies inside the calling thread's step arena (false when
 * it has none yet): lock-free, for the registry of storage versions, whose
 * tracked storages never lie in step memory (accel__step_arena_overlaps). */
bool accel__in_own_step_arena(const void *p, size_t n);
/* The calling thread's step arena, or NULL while it has none (never makes one). */
const accel_arena *accel__step_arena_if_made(void);
/* Whether [p, p + n) overlaps any thread's step arena (takes the arenas' lock). */
bool accel__step_arena_overlaps(const void *p, size_t n);
/* Whether t is to get its first gradient and that gradient may be step
 * memory (written directly or taken over, not copied into a persistent
 * buffer): t requires grad, has no gradient yet, and is either a non-leaf
 * (an op's output: a step tensor, whose gradient only its node's backward
 * reads, in this pass) or an arena leaf (requires_grad set by hand on a step
 * tensor: its header is step memory too, gone at the next accel_step_reset,
 * and its gradient with it). Never a persistent leaf (a parameter): its
 * gradient must outlive the step, as the optimizer reads it after the
 * backward and gradient accumulation adds into it across step resets, and
 * it is freed with the parameter (accel_tensor_free). The tape's one rule
 * (accel_grad_accumulate, accel__grad_move, checkpoint recomputes) and that
 * of the backwards that write a first gradient themselves. */
bool accel__grad_first_is_step(const accel_tensor *t);
/* Whether t's gradient in the running backward is accel_backward's implicit
 * seed, ones: known on the host, so a backward that would read a 0-dim
 * gradient to see whether it is 1 (a read that waits for a device's stream)
 * need not. */
bool accel__grad_is_implicit_one(const accel_tensor *t);
/* A pointer of the calling thread's that activation checkpointing replays as
 * it replays the RNG state and autocast: captured when a checkpointed
 * function first runs and set again around its recompute in the backward,
 * so what a forward reads from it (the load-balancing statistics its sparse
 * blocks add to, src/nn/moe.c: the one user) the recompute reads too. The
 * set returns the previous value. */
void *accel__replayed(void);
void *accel__set_replayed(void *p);
/* Called by the outermost backward walk of this thread (the one that fires
 * the grad-ready hook), once it knows which leaves it will reach, before any
 * node runs: there accel__leaf_in_pass tells them apart. NULL: none. */
void accel__set_pass_begin_hook(void (*fn)(void *ctx), void *ctx);
/* This thread's grad-ready hook (accel_set_grad_ready_hook, an
 * accel_grad_ready_fn) and its ctx: the accelerator's backward keeps a
 * user's and calls it beside its own. */
void accel__grad_ready_hook(void (**fn)(accel_tensor *leaf, void *ctx), void **ctx);
/* A generator's state read and restored as the draws move it (atomically,
 * field by field): another thread may draw from the default generator
 * meanwhile (a checkpoint records where it was; a recompute puts back the
 * forward's state). Not atomic as a pair, as seeding is not (core.h). */
accel_rng accel__rng_get(const accel_rng *r);
void accel__rng_set(accel_rng *r, accel_rng v);
/* Whether leaf t gets a gradient in the backward walk now beginning (read
 * from the pass-begin hook): a leaf no recorded node uses (an expert no
 * token chose) gets none, and its grad-ready hook never fires. */
bool accel__leaf_in_pass(const accel_tensor *t);
/* Whether device d's memory is the host's (the cpu: reading it waits for
 * nothing); false for a device no backend serves. */
bool accel__device_host_addressable(accel_device d);
/* accel_grad_accumulate(t, g) for a g that is the caller's to give away: a
 * step tensor whose elements no other tensor's gradient holds and that
 * nothing reads afterwards but through t->grad (a copy the backward made, or
 * the gradient of its node's output, which it then drops:
 * accel__grad_move_out). t's first gradient takes g over (t->grad = g)
 * instead of copying it, where it may be step memory
 * (accel__grad_first_is_step) and g is dense step memory of t's shape, dtype
 * and device; otherwise g is accumulated as accel_grad_accumulate does. */
accel_status accel__grad_move(accel_tensor *t, accel_tensor *g);
/* accel__grad_move(x, gx) from the backward of node n, gx being n's output
 * gradient itself, a view of its elements or a copy the backward made: where
 * x took the output gradient's elements, n->out->grad is dropped (NULL); it
 * is complete, no later node reads it, and later additions into x's gradient
 * must not show through it. The helper sees the node, accel__grad_move does
 * not. */
accel_status accel__grad_move_out(struct accel_node *n, accel_tensor *x, accel_tensor *gx);
/* accel_grad_accumulate(t, g) for g = holder->grad, a step tensor's first
 * gradient (taken over by accel__grad_move) that t may hold too instead of a
 * copy: add's second input beside its first (a residual stream and its
 * branch). Where t is the output of a node of the running tape (never a
 * leaf: no node of its would end the share), holder too or a leaf whose
 * gradient no grad-ready hook sees early, and t may take g (as
 * accel__grad_move), both hold it, flagged ACCEL_TF_GRAD_SHARED: it is
 * read-only then, an accumulation into either holder's gradient writes
 * fresh memory (accel_grad_accumulate; the backwards' direct writes,
 * accel__gbuf, stage theirs), and nothing takes its elements over. Once the
 * node of one holder has run its backward, that holder's gradient is dropped
 * (NULL) and the flag cleared: the other holds g alone. A backward that fails
 * first drops the unrun node's (accel_backward_with): no buffer is held twice
 * after a pass. Otherwise g is accumulated as accel_grad_accumulate does. */
accel_status accel__grad_share(accel_tensor *t, accel_tensor *holder);
/* Whether t's gradient is shared (accel__grad_share): not to be written. */
bool accel__grad_is_shared(const accel_tensor *t);
/* Whether a and b start at the same element of the same memory (a view
 * returned as it was, not a copy): the ops' backwards ask it before giving a
 * gradient away, without reading tensor data themselves. */
bool accel__same_data(const accel_tensor *a, const accel_tensor *b);
/* Allocates a step-arena tensor header (data not set). */
accel_tensor *accel__arena_header(accel_dtype dt, int ndim, const int64_t *shape,
                                  accel_device dev);

#include "core/philox.h"   /* accel__philox, accel__u32_to_unit */
#include "core/prepared.h" /* storage versions (accel__storage_written), prepared weights */

/* The fewest significant digits (1..17) of the finite v that read back as
 * v (a NUL-terminated string, no sign), their count, and the decimal
 * exponent of the first one: 0.003 gives "3", 1 and -3. */
int accel__shortest_digits(double v, char digits[18], int *exponent);
/* Python's repr of a float: the fewest digits that read back as v, "1.0"
 * for a whole number, an exponent below 1e-4 and from 1e16 ("1e-05",
 * "1.5e+16"), "nan", "inf", "-inf". buf of 32 bytes holds every value. */
const char *accel__float_repr(char *buf, size_t n, double v);
/* Whether s is strict UTF-8 (no overlong forms, surrogates or code points
 * past U+10FFFF): what JSON, YAML and protobuf strings hold, and the set
 * jansson's json_string takes (whose NULL is also its out of memory). */
bool accel__is_utf8(const char *s);
/* The same of the n bytes at s (NUL bytes among them are U+0000, valid). */
bool accel__is_utf8_n(const char *s, size_t n);

#endif
