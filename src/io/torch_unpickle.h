/* src/io/torch_unpickle.h — the restricted unpickler of torch.save's data.pkl
 * (torch_unpickle.c). Internal: prefix accel__, not installed. */
#ifndef ACCEL_TORCH_UNPICKLE_H
#define ACCEL_TORCH_UNPICKLE_H

#include <stddef.h>
#include <stdint.h>

#include "accel/core.h"

/* One entry of the state dict: tensor `name` over storage `key`. The
 * strings point into the pickle's bytes (not NUL-terminated). */
typedef struct accel__torch_tensor {
    const char *name, *key;
    size_t name_len, key_len;
    accel_dtype dtype;      /* the storage's */
    int64_t storage_numel;  /* elements of the storage, as the persistent id says */
    int64_t offset;         /* storage offset, in elements */
    int ndim;
    int64_t shape[ACCEL_MAX_DIMS], stride[ACCEL_MAX_DIMS];
} accel__torch_tensor;

/* Limits on what a data.pkl may make the unpickler hold (each a named
 * ACCEL_ERR_FORMAT when passed): the stack, nested MARKs. The memo is bounded
 * by the pickle's size (an index past it is refused), every other count by
 * the bytes that encode it. */
#define ACCEL__PICKLE_MAX_STACK (1 << 24)
#define ACCEL__PICKLE_MAX_MARKS 4096

/* Runs the len bytes of data.pkl (of file `path`, for messages) through an
 * unpickler that executes nothing: the opcodes of protocols 2-4 a state dict
 * pickles with, and only the globals torch.load(weights_only=True) allows for
 * one (collections.OrderedDict, torch._utils._rebuild_tensor_v2 and
 * _rebuild_parameter, the torch.<Type>Storage classes as persistent ids).
 * The result must be a dict of str -> tensor. *out (accel_malloc'd, n of
 * them) in the dict's order. Another global or opcode: ACCEL_ERR_UNSUPPORTED
 * naming it; a malformed pickle: ACCEL_ERR_FORMAT naming the byte. */
accel_status accel__torch_unpickle(const char *path, const unsigned char *pkl, size_t len,
                                   accel__torch_tensor **out, int *n);

#endif
