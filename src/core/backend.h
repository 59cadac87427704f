/* The device backend interface (internal; the one header a new backend
 * implements). Core defines it and keeps the registry; src/backends
 * implements it and registers itself (registry.c, plugin.c): no file of
 * src/core includes a header of src/backends.
 *
 * A backend is one folder of src/backends/ (cpu/, hostless/, later cuda/, npu/)
 * that fills one `accel_backend` table and registers it. Everything above
 * src/backends/ reaches device memory and device compute only through these
 * tables: core allocates tensor storage with `mem.alloc`/`mem.step_alloc`,
 * moves bytes with `mem.copy_*`, and ops call `kernels.<name>`.
 *
 * Devices. A device is (type, index) (`accel_device` in core.h), named as
 * PyTorch and Accelerate name them: "cpu", "cuda:0", "npu:1", "meta". A
 * backend serves one device type and `device_count()` devices of it. `cpu` is
 * always registered; every other backend is a plug-in (backends/plugin.h),
 * loaded the first time its device type is asked for, which registers
 * itself when its devices are present. `meta` has no backend: it has no memory and runs no kernel (ops compute shapes only).
 *
 * Pointers. `accel_tensor.data` of a tensor on device d is a *device pointer*
 * of d's backend: an opaque address that only that backend can read. Code
 * above src/backends/ may do pointer arithmetic on it (views add byte
 * offsets) but never dereferences it. Tensor headers (shape, strides, dtype)
 * always live in host memory.
 *
 * Errors. Every entry that can fail returns accel_status and sets the
 * thread's error (accel_set_error) with a message naming the operation and
 * the device. A NULL entry in `kernels` means the backend lacks that kernel:
 * accel__kernel_missing() reports "<op>: kernel <name> is not implemented on
 * <device>", never a crash.
 *
 * Threading. Memory entries may be called from any thread. `step_alloc` and
 * `step_reset` act on the calling thread's step pool (one per thread and
 * device, like the step arena). Kernels run on the calling thread (the CPU
 * backend uses OpenMP inside); on an asynchronous device a kernel is enqueued
 * on the thread's current stream and returns.
 *
 * Writing a backend: docs/architecture.md, "Writing a backend plug-in".
 */
#ifndef ACCEL_CORE_BACKEND_H
#define ACCEL_CORE_BACKEND_H

#include "accel/core.h"
#include "core/kernels.h"

/* ---------------------------------------------------------------- memory */

typedef struct accel_stream accel_stream; /* backend-defined queue of work */
typedef struct accel_event accel_event;   /* backend-defined point in a stream */

typedef struct accel_backend_mem {
    /* Persistent memory (parameters, optimizer state, anything outliving a
     * step): `bytes` > 0, align a power of two <= 2 MiB. Contents undefined.
     * NULL (error set) on OOM. Required. */
    void *(*alloc)(int index, size_t bytes, size_t align);
    void (*free)(int index, void *p); /* NULL is a no-op. Required. */
    /* Step memory: valid until the calling thread's accel_step_reset(), which
     * calls step_reset for every registered device. A loop whose steps are
     * alike must not allocate from the system after its first step. Required. */
    void *(*step_alloc)(int index, size_t bytes, size_t align);
    void (*step_reset)(int index);
    /* n bytes of device memory at p set to `byte`. Required. */
    accel_status (*memset)(int index, void *p, int byte, size_t n);
    /* n bytes at p set to zero that are next read long after (the
     * gradients between steps: accel__zero_cold_), in a way that leaves
     * them out of the caches (the cpu: streaming stores, where a store that
     * allocates its line first reads it from memory). Optional: NULL means
     * memset. */
    accel_status (*memset_cold)(int index, void *p, size_t n);
    /* Synchronous copies: host -> device, device -> host, and device -> device
     * within this backend (src on device src_index, dst on dst_index). On an
     * asynchronous device they wait for the thread's current stream. Required. */
    accel_status (*copy_to_device)(int index, void *dst, const void *host_src, size_t n);
    accel_status (*copy_to_host)(int index, void *host_dst, const void *src, size_t n);
    accel_status (*copy_device)(int dst_index, void *dst, int src_index, const void *src, size_t n);
    /* Total and free bytes of the device (device maps, estimate-memory).
     * Required. */
    accel_status (*mem_info)(int index, size_t *free_bytes, size_t *total_bytes);
    /* Host memory that the device can copy from/to at full speed (pinned),
     * for staging; usable with every device of the backend, from any thread.
     * The staging pool (core/host_stage.h) is its one caller: it allocates
     * a few buffers once and reuses them, and on NULL (error set, e.g.
     * pinned memory exhausted) warns once and uses accel_malloc'd memory
     * instead. Optional: NULL means plain accel_malloc'd memory is fine. */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
    /* Virtual memory: memory that comes and goes behind fixed addresses, as
     * CUDA's cuMemAddressReserve/cuMemMap do (the cpu: mmap'd pages).
     * ZeRO-3 keeps its full parameters and gradients there, on every
     * device: a released unit's range holds no memory, while the tensors
     * (and the views autograd saved) keep their addresses for the next
     * gather. Optional as a set: a backend fills all five or none (ZeRO-3
     * then refuses models on its devices).
     * vm_granularity: a power of two; every size and address below is a
     * multiple of it.
     * vm_reserve: an address range of `bytes` with no memory behind it;
     * NULL (error set) when there is no address space.
     * vm_release: gives a reserved range back; none of it may be mapped.
     * vm_map: memory behind [p, p + bytes), a part of a reserved range that
     * is not mapped; contents undefined. Error (ACCEL_ERR_OOM) when the
     * device is full.
     * vm_unmap: [p, p + bytes), exactly a range one vm_map mapped, gives its
     * memory back once the work enqueued before it on the calling thread's
     * stream is done; touching it afterwards is an illegal access (a fault
     * on a device; the cpu's unmapped pages read as zeros and take memory
     * again when written). A range that breaks these rules (misaligned,
     * not reserved, mapped twice, not exactly mapped) is an error naming
     * it. cpu, cuda and hostless pool the physical memory and check the
     * rules in backends/vm_pool.h. */
    size_t (*vm_granularity)(int index);
    void *(*vm_reserve)(int index, size_t bytes);
    void (*vm_release)(int index, void *p, size_t bytes);
    accel_status (*vm_map)(int index, void *p, size_t bytes);
    accel_status (*vm_unmap)(int index, void *p, size_t bytes);
} accel_backend_mem;

/* Asynchronous work. Optional as a whole: a synchronous backend (cpu) leaves
 * every slot NULL, and accel__device_synchronize() is then a no-op. A backend
 * that fills one slot fills them all. */
typedef struct accel_backend_async {
    accel_stream *(*stream_new)(int index);
    void (*stream_free)(int index, accel_stream *s);
    /* The stream kernels and copies of the calling thread are enqueued on
     * (NULL: the device's default stream). */
    void (*set_stream)(int index, accel_stream *s);
    accel_status (*copy_to_device_async)(int index, void *dst, const void *host_src, size_t n,
                                         accel_stream *s);
    accel_status (*copy_to_host_async)(int index, void *host_dst, const void *src, size_t n,
                                       accel_stream *s);
    accel_event *(*event_record)(int index, accel_stream *s);
    accel_status (*event_wait)(int index, accel_stream *s, accel_event *e); /* s waits for e */
    accel_status (*event_synchronize)(int index, accel_event *e);          /* host waits */
    void (*event_free)(int index, accel_event *e);
    accel_status (*synchronize)(int index); /* host waits for all work of the device */
} accel_backend_async;

/* ---------------------------------------------------------------- backend */

/* The bf16/f16 C a backend's gemm kernel writes itself (kernels.h:
 * accel_k_gemm), the f32 result rounded once into it; the ops give the
 * others an f32 C and convert it. */
typedef enum accel_gemm_c16 {
    ACCEL_GEMM_C16_NONE, /* an f32 C only */
    ACCEL_GEMM_C16_SAME, /* also a bf16/f16 C when A and B are of its dtype (cuBLASLt's) */
    ACCEL_GEMM_C16_ANY,  /* also a bf16/f16 C from operands of any dtype (the CPU's) */
} accel_gemm_c16;

typedef struct accel_backend {
    const char *name;         /* the device type's name: "cpu", "cuda", "hostless" */
    accel_device_type type;   /* the accel_device.type it serves */
    int (*device_count)(void); /* devices present; index is 0..count-1 */
    /* True when device pointers of this backend are host addresses (the CPU
     * backend): callers may then skip staging copies. */
    bool host_addressable;
    accel_backend_mem mem;
    accel_backend_async async;
    accel_kernel_table kernels;
    /* True when the sdpa kernels honour every tensor's strides (dims' qs, ks,
     * vs, os and the backward's gs, dqs, dks, dvs); false: q, o, g, dq, dk,
     * dv and the backward's k, v must be dense, only the forward's k and v
     * strided (accel_sdpa then hands it dense tensors). */
    bool sdpa_strided;
    /* True when the sdpa kernels honour dims' key_range (a padded batch's
     * valid keys); false: accel__sdpa_padded refuses, and the decoders take
     * the explicit scores for a padded batch. */
    bool sdpa_key_range;
    /* True when the sdpa kernels honour dims' key_start (packed sequences'
     * first key per query); false: accel__sdpa_packed refuses, and the
     * decoders take the explicit scores for packed sequences. */
    bool sdpa_key_start;
    accel_gemm_c16 gemm_c16; /* the bf16/f16 C its gemm writes (0: none, f32 only) */
    /* mixed_precision='fp8' (backends/fp8.h); NULL: the device has none. */
    const struct accel__fp8_ops *fp8;
} accel_backend;

/* Registers a backend for its device type (replacing none: a second backend
 * for a registered type is an error). Tables are not copied: `b` must outlive
 * the process. Thread-safe; normally called once at start-up. */
accel_status accel__backend_register(const accel_backend *b);
/* The backend of device d, or NULL (meta, or a type nothing registered). */
const accel_backend *accel__backend_of(accel_device d);
/* The backend of d when d is a registered device with memory; otherwise NULL
 * and an error "<op>: device <d> ..." naming why. */
const accel_backend *accel__backend_for(accel_device d, const char *op);
/* Every registered backend, in registration order; returns the count. */
int accel__backends(const accel_backend **out, int max);

/* The error of an absent kernel: "<op>: kernel <name> is not implemented on <device>". */
accel_status accel__kernel_missing(const char *op, const char *kernel, accel_device d);

/* Calls kernel `name` of device `dev`'s backend with `args` (a pointer to the
 * kernel's argument struct); evaluates to its accel_status, or to the
 * missing-kernel error (naming `op`) when the backend has none. */
#define ACCEL_KERNEL(op, dev, name, args)                                               \
    (accel__kernel_table_of(dev, op) == NULL                                            \
         ? accel_last_status()                                                          \
     : accel__kernel_table_of(dev, op)->name == NULL                                    \
         ? accel__kernel_missing(op, #name, dev)                                        \
         : accel__kernel_table_of(dev, op)->name(args))

/* The kernel table of dev (NULL and error set when dev has no backend). */
const accel_kernel_table *accel__kernel_table_of(accel_device dev, const char *op);

/* ---- defined by the backends layer, called by the registry (device.c)
 *
 * Core defines the interface and keeps the registry but names no backend: as
 * SQLite's core calls sqlite3_os_init, which each OS layer defines, the
 * registry calls these, which src/backends defines (registry.c, plugin.c). */

/* Registers the built-in backends (the CPU's; the hostless test devices when
 * ACCEL_TEST_DEVICES=n). Called once, at the registry's first use. */
void accel__backends_init(void);
/* Loads the plug-in serving device type t, once (later calls return what the
 * first found); ACCEL_OK when it loaded and initialised, whether or not it
 * found a device. Never sets the thread's error: the reason is kept. */
accel_status accel__plugin_load_type(accel_device_type t);
/* Why device type t has no device ("" when it has one): the plug-in's reason,
 * or why the plug-in did not load ("libaccel-cuda.so: not found in ...").
 * Loads it (accel__plugin_load_type) first. */
const char *accel__plugin_unavailable_reason(accel_device_type t);

#endif
