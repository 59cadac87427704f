/* The model families as data: what generic code (module.c's gradient
 * checkpointing, the strategies' wrap class, big-model dispatch's no_split
 * class, save_model's config.json) may know of a model, one row per family.
 * No generic file names a model: it asks accel__family_of(m) and calls the
 * row. A family's file defines its row (arch.c: every decoder-only family
 * of the architecture table; bert.c: BERT); family.c lists the rows.
 * Internal to src/nn, src/io and src/accelerator. */
#ifndef ACCEL_NN_FAMILY_H
#define ACCEL_NN_FAMILY_H

#include "accel/nn.h"

typedef struct accel__family {
    const char *name; /* for messages: "decoder", "bert" */
    /* The class of the family's repeated block (transformers'
     * _no_split_modules, FSDP's transformer layer class) when m is one of the
     * family's modules, else NULL: also how a module's family is found. */
    const char *(*layer_class)(const accel_module *m);
    /* When m is the family's root or its base model: sets gradient
     * checkpointing on every block and returns true; else false, m untouched. */
    bool (*checkpoint_layers)(accel_module *m, bool enable);
    /* When m is a root that has a config.json: its configured torch_dtype in
     * *dt and true; else false (a question: no error). The file itself is
     * written by io, above nn (io/io_internal.h: accel__family_config_save). */
    bool (*config_dtype)(const accel_module *m, accel_dtype *dt);
} accel__family;

extern const accel__family accel__decoder_family; /* arch.c */
extern const accel__family accel__bert_family;    /* bert.c */

/* The row of the family m's own module belongs to (not its ancestors'); NULL
 * for a module of no family (a Linear built alone, a user's module). */
const accel__family *accel__family_of(const accel_module *m);

#endif
