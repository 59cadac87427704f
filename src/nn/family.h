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

/* A family's model cut into pipeline stages (accelerator/pipeline.c): stage
 * s of p runs layers [first_layer[s], first_layer[s + 1]) of the repeated
 * stack, stage 0 the input embeddings before them, the last stage the head
 * and the loss after them. Every function takes the family's root. */
typedef struct accel__family_stages {
    /* The stack's layer count; -1 with an error naming who when this root
     * cannot be cut (a tree the family does not cut yet). */
    int (*n_layers)(accel_module *root, const char *who);
    /* first_layer[0..stages]: each stage's count from explicit_layers (NULL:
     * balanced by parameters). Refuses a bad split, naming who. */
    accel_status (*split)(accel_module *root, int stages, const int *explicit_layers, int *first_layer,
                          const char *who);
    /* One stage's training forward: first: x is ids [B, T], else the hidden
     * state [B, T, C]; last: the logits come out, else the hidden state. */
    accel_tensor *(*forward)(accel_module *root, accel_tensor *x, int lo, int hi, bool first, bool last);
    /* The causal-LM loss of the last stage's logits for ids [B, T]. */
    accel_tensor *(*loss)(accel_module *root, accel_tensor *logits, accel_tensor *ids);
    /* The hidden state's width C and dtype (what travels between stages). */
    void (*hidden)(accel_module *root, int64_t *C, accel_dtype *dt);
    /* The stage whose part of the model holds state-dict entry name. */
    int (*owner)(const char *name, const int *first_layer, int stages);
    /* The input embedding's weight when the head reuses it (used on the
     * first and the last stage), else NULL (no error). */
    accel_tensor *(*tied_embedding)(accel_module *root);
    /* ACCEL_OK when a stage's forward, run again to recompute a micro-batch
     * in its backward, computes what it did: refused, naming who and why,
     * while the root trains with dropout (the recompute replays no
     * generator, so it would draw other masks). */
    accel_status (*recomputable)(accel_module *root, const char *who);
    /* The root keeps only stage `stage` of `stages` (the others' parameters
     * moved to meta): its own forward refuses from then on. */
    void (*released)(accel_module *root, int stage, int stages);
} accel__family_stages;

typedef struct accel__family {
    const char *name; /* for messages: "decoder", "bert" */
    /* The class of the family's repeated block (transformers'
     * _no_split_modules, FSDP's transformer layer class) when m is one of the
     * family's modules, else NULL: also how a module's family is found. */
    const char *(*layer_class)(const accel_module *m);
    /* The other class transformers' _no_split_modules names for m's model
     * (BERT's embeddings: BertEmbeddings, ...), else NULL; NULL: none. */
    const char *(*unsplit_class)(const accel_module *m);
    /* When m is the family's root or its base model: sets gradient
     * checkpointing on every block and returns true; else false, m untouched. */
    bool (*checkpoint_layers)(accel_module *m, bool enable);
    /* When m is a root that has a config.json: its configured torch_dtype in
     * *dt and true; else false (a question: no error). The file itself is
     * written by io, above nn (io/io_internal.h: accel__family_config_save). */
    bool (*config_dtype)(const accel_module *m, accel_dtype *dt);
    /* Pipeline stages of the family's root; NULL: its models are not cut. */
    const accel__family_stages *stages;
} accel__family;

extern const accel__family accel__decoder_family; /* arch.c */
extern const accel__family accel__bert_family;    /* bert.c */

/* The row of the family m's own module belongs to (not its ancestors'); NULL
 * for a module of no family (a Linear built alone, a user's module). */
const accel__family *accel__family_of(const accel_module *m);

/* module_memory.c: accel_module_flatten over the parameters not on meta (a
 * pipeline stage's own, the other stages' released to meta at prepare). */
accel_flat_params *accel__module_flatten_present(accel_module *root, int64_t align_elems, int64_t pad_multiple);

#endif
