/* Storage versions and the prepared-weight cache (internal).
 *
 * Version. Every write that the library makes to a tensor's storage (kernels
 * into a caller's tensor, byte copies, collectives' receive buffers, host
 * pointers handed out for writing, optimizer updates) reports the bytes it
 * wrote with accel__storage_written. The counter lives with the storage, not
 * the header: a write through any view, or through a flat buffer that a
 * parameter was rebound into, bumps the version of every tensor whose bytes
 * it overlaps (as torch's _version, shared by a tensor and its views). Only
 * tensors that hold prepared forms (or whose version was asked for) are
 * tracked, in a registry of byte ranges sorted by address; a write outside
 * the registry's envelope (lowest to highest tracked byte) or into the
 * calling thread's step arena costs a few comparisons and no lock, one
 * elsewhere inside it takes the registry's lock to read (threads at once)
 * and a binary search for the ranges it overlaps. A tensor whose storage
 * lies in a step arena is not tracked (as a step tensor).
 *
 * Tracked tensors are persistent ones with heap headers (accel_tensor_new,
 * parameters, buffers, mappings); a header copied from one (a stack view)
 * shares nothing and prepares nothing.
 *
 * Prepared forms. A persistent f32 tensor (a weight) may own up to
 * ACCEL__PREPARED_FORMS prepared forms: its autocast copy, or that copy
 * widened back to f32 for a CPU without bf16 units. A form is rebuilt only
 * when the owner's version moved since it was built, so forward, backward and
 * every micro-batch of gradient accumulation share one conversion per
 * optimizer step. Memory: one copy per weight per form, persistent, on the
 * weight's device (accel__prepared_stats_get().bytes). The forms are freed with their
 * owner (accel_tensor_free), or when its storage is replaced (rebind, move,
 * materialise); a form that the current step's tape may still read is freed
 * at that thread's next accel_step_reset instead. */
#ifndef ACCEL_CORE_PREPARED_H
#define ACCEL_CORE_PREPARED_H

#include <stdint.h>

#include "accel/core.h"

#define ACCEL__PREPARED_FORMS 4

/* A tracked storage: its version and the forms prepared from it (prepared.c). */
typedef struct accel__prepared accel__prepared;

/* What a form is: its kind (ACCEL__FORM_*) and the dtype it was rounded to. */
enum { ACCEL__FORM_CAST = 1, ACCEL__FORM_ROUNDED_F32 = 2,
       /* the fp8 Linear's E4M3 weight (u8 of the weight's shape) and its
        * transpose (the same bytes viewed [in, out]): ops/fp8_linear.c */
       ACCEL__FORM_FP8 = 3, ACCEL__FORM_FP8_T = 4,
       /* the owner (a GEMM operand of dtype dt, itself a weight or a
        * weight's autocast copy) reordered into the layout oneDNN's matmul
        * wants for op(B) = owner^T (forward Y = X W^T) or owner (dX = dY W):
        * the same bytes as the owner, laid out differently
        * (src/backends/cpu/gemm.c) */
       ACCEL__FORM_DNNL_NT = 5, ACCEL__FORM_DNNL_NN = 6 };
/* tag: whose form it is, NULL for anyone's (an fp8 cache row's casts are
 * its own: each row's cast is made with its own scale). Compared, never
 * dereferenced. When every slot holds another key, a form of the same kind
 * and dtype but another tag that the current step cannot read is taken over
 * (rebuilt for the new tag): tags of freed owners never pin a slot. */
typedef struct accel__form_key {
    int kind;
    accel_dtype dt;
    const void *tag;
} accel__form_key;

/* Reports that bytes [p, p + n) of some device's memory were written. */
void accel__storage_written(const void *p, size_t n);
/* The bytes [*lo, *hi) that t's elements occupy (any strides); false when t
 * has none. */
bool accel__tensor_span(const accel_tensor *t, uintptr_t *lo, uintptr_t *hi);
/* accel__storage_written over every byte t's elements occupy (any strides). */
void accel__tensor_written(const accel_tensor *t);

/* t's storage version (starts tracking t). 0 for a tensor that cannot be
 * tracked (a step tensor, meta). */
uint64_t accel__tensor_version(accel_tensor *t);

/* Fills dst (owner's shape, the form's dtype) with the form of src. */
typedef accel_status (*accel__form_fill)(accel_tensor *dst, accel_tensor *src, const accel__form_key *key);

/* The form `key` of owner (dtype form_dt), built with fill when absent or
 * older than owner's storage: into *out, a persistent tensor owned by owner,
 * valid until owner's storage is written; *built (when not NULL) true when
 * this call ran fill (the form's bytes are new: a fill that leaves them to
 * its caller, as fp8's cached cast, learns it here). *out is NULL (ACCEL_OK) when
 * owner cannot hold forms (not a contiguous persistent tensor with storage)
 * or when the stale form may still be read by the current step's tape and
 * no other slot is free: the caller then converts into the step arena. */
accel_status accel__prepared_get(accel_tensor *owner, const accel__form_key *key, accel_dtype form_dt,
                                 accel__form_fill fill, accel_tensor **out, bool *built);

/* Frees t's forms and stops tracking t (its storage is being replaced or
 * freed). Called by core/tensor.c. */
void accel__prepared_release(accel_tensor *t);
/* Frees the forms released during the calling thread's step that is ending
 * (accel_step_reset, accel_thread_cleanup). */
void accel__prepared_sweep(void);

/* Whether accel__prepared_get prepares forms, and core/step_casts.h
 * remembers step tensors' conversions (default: on, unless the environment
 * has ACCEL_WEIGHT_CACHE=0). Off, every call converts into the step arena as
 * before (A/B benchmarks, and the tests' uncached reference).
 * Returns the previous setting. */
bool accel__prepared_set_enabled(bool on);
bool accel__prepared_enabled(void);
/* Whether accel__prepared_get would keep forms of owner: prepared forms
 * are on and owner is memory of its own (heap, parameter, buffer or mapped;
 * not the step arena, not meta), dense and not empty. */
bool accel__prepared_can_hold(const accel_tensor *owner);

/* Writes owner's new values and, when form is not NULL, the same values
 * rounded to round_dt into form (owner's shape; dtype round_dt, or f32
 * holding the rounded values), reporting its writes to owner. */
typedef accel_status (*accel__form_rewrite)(accel_tensor *form, accel_dtype round_dt, void *ctx);

/* Whether the calling thread's tape is empty (its backward ran): asked of
 * the caller, which knows the tape (core does not). */
typedef bool (*accel__tape_done)(void);

/* For a writer that replaces owner's values and can round them into its
 * autocast form in the same pass (the optimizer's update: kernels.h,
 * accel_k_adam's cast), so the next forward finds the form current instead
 * of converting the weight again: runs write with owner's untagged CAST or
 * ROUNDED_F32 form when owner holds one that may be overwritten now, else
 * with NULL (nothing else changes then: the forms rebuild at their next get
 * as after any write). A form may be overwritten when no tape can read its
 * old values: it has been handed out to the calling thread alone since it
 * was built, last by an earlier step of that thread, or by its current step
 * when tape_done() (asked only then). After write the form counts as built
 * from owner's new version, and its own bytes are reported written: the
 * forms made from it (oneDNN's layouts) that were current before the write
 * are built again from the new bytes right away where no tape can read them
 * (by the same rule), while those bytes are still in cache, the others at
 * their next get; a refresh that fails drops its form (rebuilt at its next
 * get) and fails nothing. After a failed write the form is rebuilt at its
 * next get. Returns write's status. */
accel_status accel__prepared_rewrite(accel_tensor *owner, accel__tape_done tape_done, accel__form_rewrite write,
                                     void *ctx);

/* Process-wide: bytes held in forms, and how many builds, hits and
 * rewrites (accel__prepared_rewrite with a form) so far. */
typedef struct accel__prepared_stats {
    int64_t bytes;
    uint64_t builds;
    uint64_t hits;
    uint64_t rewrites;
} accel__prepared_stats;
accel__prepared_stats accel__prepared_stats_get(void);

#endif
