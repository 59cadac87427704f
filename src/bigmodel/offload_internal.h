/* src/bigmodel/offload_internal.h — the weights map of a dispatched model,
 * shared by load.c (fills it), offload.c (brings weights in and out) and
 * dispatch.c (hooks). Internal: prefix accel__. */
#ifndef ACCEL_OFFLOAD_INTERNAL_H
#define ACCEL_OFFLOAD_INTERNAL_H

#include "accel/bigmodel.h"
#include "accel/io.h"
#include "core/link.h"

typedef enum accel__off_kind {
    ACCEL__OFF_DISK = 1, /* src points into the mapped checkpoint (borrowed) */
    ACCEL__OFF_HOST = 2, /* src is a host copy in the param dtype (owned) */
} accel__off_kind;

/* One offloaded tensor: the model's parameter (on meta between forwards) and
 * where its bytes are. */
typedef struct accel__off_entry {
    accel_tensor *t;
    char *name;             /* first full name, owned */
    accel__off_kind kind;
    const void *src;
    accel_dtype src_dtype;
    size_t src_bytes;
    bool src_file_pages;    /* DISK: src is pages of the file's mapping, released after each use (else a copy
                               the checkpoint made and keeps: a torch file's strided tensor) */
    void *scratch;          /* converted host copy while brought in onto the cpu (dtype differs) */
    int refs;               /* active hooks using it */
    bool dropping;          /* inside accel__off_drop: its last use ended, it goes to meta */
} accel__off_entry;

/* Where each state-dict name was placed (for accel_dispatched_placement). */
typedef struct accel__placed {
    char *name;             /* owned */
    char where[24];
} accel__placed;

struct accel_dispatched {
    accel_module *root;     /* the model whose tensors it placed; NULL once that was freed */
    accel_checkpoint *ck;
    accel_device_map *map;  /* owned copy (or built from a strategy) */
    accel_device main;
    int n_off, cap_off;
    accel__off_entry *off;
    accel_tensor **dropping; /* cap_off long: accel__off_drop's list of the tensors it sends to meta */
    int n_placed;
    accel__placed *placed;
    int n_preload;
    char **preload;         /* owned copies */
    int n_hooked, cap_hooked;
    accel_module **hooked;  /* modules carrying one of our hooks */
    accel_dispatch_stats stats;
    int64_t onload_now;     /* offloaded bytes currently brought in */
};

/* ---- dispatch.c */
/* Ties d to root: freeing root first makes d let go of root's hooks and tensors. */
accel_status accel__dispatched_attach(accel_dispatched *d, accel_module *root);

/* ---- offload.c */
/* Appends an entry (kind HOST: src owned by the entry). Index or -1. */
int accel__off_add(accel_dispatched *d, accel_tensor *t, const char *name, accel__off_kind kind,
                   const void *src, accel_dtype src_dtype, size_t src_bytes);
/* Index of the entry for tensor t, -1 when t is not offloaded. */
int accel__off_find(const accel_dispatched *d, const accel_tensor *t);
/* Brings entry i's tensor onto dev: on the cpu it views the host bytes in
 * place (a converted copy in scratch when the dtype differs), on any other
 * device it gets memory there and the bytes go in through the pinned staging
 * chunks (core/host_stage.h), converted chunk by chunk with no host copy of
 * the tensor; nested uses are counted. */
accel_status accel__off_bring_in(accel_dispatched *d, int i, accel_device dev);
/* Drops one use of each of the n entries idx[0..n); at zero a tensor goes
 * back to meta and its pages leave this process. The tape forgets those
 * tensors in one pass (accel__tape_forget_data), not one pass each. */
void accel__off_drop(accel_dispatched *d, const int *idx, int n);
/* Frees every entry (tensors back on meta, host copies freed). */
void accel__off_free_all(accel_dispatched *d);
/* Releases the pages of [p, p+n) of a read-only file mapping from this
 * process (they stay in the page cache). */
void accel__release_pages(const void *p, size_t n);

#endif
