/* Liveness stamps of the handles other than tensors (internal). A module,
 * optimizer, scheduler, accelerator, data loader and dataset each keep a
 * uint32_t magic: their kind's stamp below from creation to their free,
 * which clears it first, as a tensor keeps ACCEL_TENSOR_MAGIC. Their public
 * entry points check it (ACCEL__DEAD), so a handle freed twice or used after
 * its free is an error naming the call (ACCEL_ERR_STATE), not glibc's abort
 * or a read of freed memory. Best effort, as the tensor's: memory that a
 * new allocation reused may hold anything, a stamp too. */
#ifndef ACCEL_CORE_HANDLE_H
#define ACCEL_CORE_HANDLE_H

#include "accel/core.h"

enum {
    ACCEL__MAGIC_MODULE = 0x6d6f646cu,      /* "modl" */
    ACCEL__MAGIC_OPTIMIZER = 0x6f707469u,   /* "opti" */
    ACCEL__MAGIC_SCHEDULER = 0x73636864u,   /* "schd" */
    ACCEL__MAGIC_ACCELERATOR = 0x6163636cu, /* "accl" */
    ACCEL__MAGIC_DATALOADER = 0x646c6472u,  /* "dldr" */
    ACCEL__MAGIC_DATASET = 0x64736574u,     /* "dset" */
};

/* Whether a handle h (not NULL) of the kind `what` (e.g. "module") is not
 * live, its stamp magic not being want: then ACCEL_ERR_STATE, naming fn.
 * ACCEL__DEAD(h, ...) is false for a NULL h: its caller's NULL check says that. */
bool accel__handle_dead(uint32_t magic, uint32_t want, const char *fn, const char *what);
#define ACCEL__DEAD(h, want, fn, what) ((h) && accel__handle_dead((h)->magic, (want), (fn), (what)))

#endif
