/* Host staging buffers: the host memory that bytes pass through on their way
 * between host memory (a mapped file, a host process group's buffer) and a
 * device whose memory the host cannot address (cuda, hostless).
 *
 * Where the backend offers pinned memory (accel_backend_mem.host_alloc: CUDA's
 * cudaMallocHost) staging buffers are pinned, so the device copies from them
 * at full speed and asynchronously; otherwise, or when pinning fails (the
 * failure is warned about once, with the backend's message), they are plain
 * accel_malloc memory and everything works the same, slower.
 *
 * Buffers are cached per device type in a pool of ACCEL__STAGE_SLOTS slots
 * and reused: a slot is allocated when first needed and grown when a lease
 * needs more than any free slot holds, so a loop whose steps are alike
 * allocates nothing after its first step (a lease does not take a free slot
 * over twice its size when a slot of its own size can be made: host_stage.c,
 * pick_slot). The pool of a device type keeps at most its cap in idle slots
 * (cached, not leased; ACCEL_STAGE_CACHE_MB, default 256 MiB): a lease given
 * back over it frees the biggest other idle slots, and itself only when it
 * alone is over the cap, so one huge staging (a GB all-gather) does not stay
 * pinned, and a big lease held across steps does not push the chunk leases
 * given back meanwhile out. Cached buffers live until process exit (freed
 * then) or accel__stage_trim().
 *
 * Threading: every entry may be called from any thread. A lease is exclusive
 * to its holder until released; leases beyond the slots in use at once are
 * plain memory allocated and freed per lease (correct, not cached). */
#ifndef ACCEL_CORE_HOST_STAGE_H
#define ACCEL_CORE_HOST_STAGE_H

#include "accel/core.h"

enum { ACCEL__STAGE_SLOTS = 8 };

/* Bytes per chunk of the chunked copies below (default 4 MiB). A chunked copy
 * of a device with asynchronous copies holds two chunks (one filled while the
 * other is copied), otherwise one. Setting 0 restores the default; the value
 * is rounded down to a multiple of 64 (at least 64). For tests and tuning. */
size_t accel__stage_chunk_bytes(void);
void accel__stage_set_chunk_bytes(size_t bytes);

/* Bytes the pool of a device type keeps cached at most. Setting 0 restores
 * the environment's ACCEL_STAGE_CACHE_MB (MiB; unset: 256; not a count:
 * warned about, 256). For tests and tuning. */
size_t accel__stage_cache_bytes(void);
void accel__stage_set_cache_bytes(size_t bytes);

/* A host buffer of at least `bytes` for staging to/from device dev, held by
 * the caller alone until accel__stage_release(dev, p). NULL + error (naming
 * op, the user's call) when dev has no backend or host memory is exhausted. */
void *accel__stage_acquire(accel_device dev, size_t bytes, const char *op);
void accel__stage_release(accel_device dev, void *p);

/* A long-lived host buffer for staging to/from dev (an offloaded optimizer's
 * blocks): pinned when the backend can, not pooled. Freed with
 * accel__stage_free(dev, p). NULL + error on OOM. */
void *accel__stage_alloc(accel_device dev, size_t bytes, const char *op);
void accel__stage_free(accel_device dev, void *p);

/* Frees every cached buffer that no lease holds (also run at process exit). */
void accel__stage_trim(void);

/* n elements of dtype src_dt at host address src, converted to dst_dt, into
 * contiguous device memory dst of dev: one chunk at a time through a staging
 * lease, so no host copy of the whole range is made (src may be a file
 * mapping, any alignment). On a device with asynchronous copies the chunks
 * are double-buffered on the thread's current stream; the call returns when
 * every byte has reached the device. Errors name op (the user's call). */
accel_status accel__stage_to_device(accel_device dev, void *dst, const void *src, accel_dtype src_dt,
                                    accel_dtype dst_dt, size_t n, const char *op);

/* n bytes of contiguous device memory src of dev, one chunk at a time through
 * a staging lease, each chunk handed to sink(ctx, host, bytes) in order (a
 * file being written). The sink's pointer is valid during its call only.
 * Errors name op (the user's call). */
typedef accel_status (*accel__stage_sink)(void *ctx, const void *p, size_t n);
accel_status accel__stage_from_device(accel_device dev, const void *src, size_t n, accel__stage_sink sink,
                                      void *ctx, const char *op);

/* n elements at src (dtype src_dt, any alignment) converted into host memory
 * dst (dtype dst_dt, aligned to its element size). */
void accel__convert_unaligned(void *dst, accel_dtype dst_dt, const void *src, accel_dtype src_dt, size_t n);

#endif
