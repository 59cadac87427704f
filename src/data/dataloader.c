/* The data loader: epoch of global batches -> this rank's shard -> collated
 * batches, with accelerate's one-batch lookahead (end_of_dataloader), remainder,
 * skip_first_batches and a resumable position. */
#include <stdio.h>
#include <string.h>

#include "accel/data.h"
#include "accel/ops.h"
#include "core/core_internal.h"
#include "data_internal.h"

struct accel_dataloader {
    accel_dataset *ds;      /* borrowed, linked: NULL once the dataset was freed (dataset_freed) */
    accel_dataloader_opts o;
    int64_t epoch;          /* epoch of the running / next epoch */
    bool active;
    int64_t pos;            /* batches of the running epoch already returned */
    int64_t skip;           /* batches to skip when the next epoch starts */
    int64_t *order;         /* [len] permutation (shuffle) */
    accel_batches global, shard;
    accel__link *links;     /* the accelerator that prepared it */
    uint32_t magic;         /* ACCEL__MAGIC_DATALOADER while alive (core/handle.h) */
    accel_device place;     /* where batches go (accel__dataloader_place); cpu: host memory */
};

accel_dataloader_opts accel_dataloader_opts_default(void) {
    accel_dataloader_opts o;
    memset(&o, 0, sizeof o); /* every zero field means its default */
    return o;
}

static accel_dataloader_opts resolve(const accel_dataloader_opts *given) {
    accel_dataloader_opts o = *given;
    if (o.batch_size == 0 && !o.batch_sampler) o.batch_size = 1;
    if (o.seed == 0) o.seed = accel__rng_get(accel_default_rng()).seed;
    if (o.num_processes == 0) o.num_processes = 1;
    return o;
}

static accel_status validate(const accel_dataloader_opts *o, const char *fn) {
    if (o->batch_size <= 0 && !o->batch_sampler)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: batch_size must be > 0 (got %lld)", fn,
                               (long long)o->batch_size);
    if (o->num_processes < 1 || o->process_index < 0 || o->process_index >= o->num_processes)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: process_index %d out of range for %d processes",
                               fn, o->process_index, o->num_processes);
    /* prepare_data_loader exempts batch size 1 from its own check, but then wraps
     * the sampler in BatchSamplerShard, which raises for any batch size that the
     * number of processes does not divide: 1 included. One process: no wrapping. */
    if (o->split_batches && o->batch_size <= 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "%s: in order to use split_batches, the batch sampler needs a batch size "
                               "that is a natural number (got %lld)",
                               fn, (long long)o->batch_size);
    if (o->split_batches && o->batch_size % o->num_processes)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "%s: to use a data loader in split_batches mode, the batch size (%lld) "
                               "needs to be a round multiple of the number of processes (%d)",
                               fn, (long long)o->batch_size, o->num_processes);
    return ACCEL_OK;
}

/* The loader's link on its dataset (core/link.h): the dataset is being freed
 * first, so the loader refuses every call that would read it (ds_alive). */
static void dataset_freed(void *owner, void *obj) {
    (void)obj;
    accel_dataloader *dl = owner;
    dl->ds = NULL; /* its link went with it */
    dl->active = false;
}

/* False (and ACCEL_ERR_STATE naming fn) once dl's dataset was freed. */
static bool ds_alive(const accel_dataloader *dl, const char *fn) {
    if (dl->ds) return true;
    accel_set_error(ACCEL_ERR_STATE, "%s: the data loader's dataset was freed before it (accel_dataset_free): it "
                    "has no samples, so it can only be freed (free the dataset after its data loaders)", fn);
    return false;
}

accel_dataloader *accel_dataloader_new(accel_dataset *ds, const accel_dataloader_opts *o) {
    if (!ds) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dataloader_new: dataset is NULL");
        return NULL;
    }
    if (accel__dataset_dead(ds, "accel_dataloader_new")) return NULL;
    accel_dataloader_opts defaults = accel_dataloader_opts_default(); /* NULL options: every default */
    accel_dataloader_opts r = resolve(o ? o : &defaults);
    if (validate(&r, "accel_dataloader_new")) return NULL;
    int64_t n = accel_dataset_len(ds);
    if ((uint64_t)n > SIZE_MAX / sizeof(int64_t)) {
        /* Its index list's size would wrap around: a few bytes, which a
         * shuffled epoch then writes n indices into. */
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "accel_dataloader_new: a dataset of %lld samples is too long to index (its epoch's "
                        "list of sample indices would not fit in memory)", (long long)n);
        return NULL;
    }
    accel_dataloader *dl = accel_calloc(1, sizeof *dl);
    if (!dl) return NULL;
    dl->ds = ds;
    dl->magic = ACCEL__MAGIC_DATALOADER;
    dl->o = r;
    accel_batches_init(&dl->global);
    accel_batches_init(&dl->shard);
    /* the shuffle's permutation (only then: in order, the epoch's list is its own) */
    if (r.shuffle && n > 0 && !(dl->order = accel_malloc((size_t)n * sizeof(int64_t)))) {
        char why[256];
        snprintf(why, sizeof why, "%s", accel_last_error());
        accel_set_error(ACCEL_ERR_OOM, "accel_dataloader_new: the shuffle order of a dataset of %lld samples (%llu "
                        "bytes) does not fit in memory: %s", (long long)n, (unsigned long long)n * 8, why);
        accel_free(dl);
        return NULL;
    }
    if (accel__link_observe(accel__dataset_links(ds), dataset_freed, dl)) {
        accel_free(dl->order);
        accel_free(dl);
        return NULL;
    }
    return dl;
}

accel__link **accel__dataloader_links(accel_dataloader *dl) { return &dl->links; }

void accel__dataloader_place(accel_dataloader *dl, accel_device dev) { dl->place = dev; }

void accel_dataloader_free(accel_dataloader *dl) {
    if (!dl || ACCEL__DEAD(dl, ACCEL__MAGIC_DATALOADER, "accel_dataloader_free", "data loader")) return;
    accel__link_detach_all(&dl->links, dl);
    if (dl->ds) accel__link_remove(accel__dataset_links(dl->ds), dl);
    accel_batches_free(&dl->global);
    accel_batches_free(&dl->shard);
    accel_free(dl->order);
    dl->magic = 0;
    accel_free(dl);
}

/* True (and the error set, naming fn) when a public entry point got dl ==
 * NULL, or a data loader that is not live (freed: ACCEL_ERR_STATE). */
static bool null_dl(const accel_dataloader *dl, const char *fn) {
    if (dl) return ACCEL__DEAD(dl, ACCEL__MAGIC_DATALOADER, fn, "data loader");
    accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: dataloader is NULL", fn);
    return true;
}

const accel_dataloader_opts *accel_dataloader_get_opts(const accel_dataloader *dl) {
    return null_dl(dl, __func__) ? NULL : &dl->o;
}
accel_dataset *accel_dataloader_dataset(const accel_dataloader *dl) {
    return null_dl(dl, __func__) || !ds_alive(dl, __func__) ? NULL : dl->ds;
}

accel_status accel_dataloader_shard(accel_dataloader *dl, int num_processes, int process_index,
                                    bool split_batches, bool even_batches) {
    if (null_dl(dl, __func__)) return accel_last_status();
    accel_dataloader_opts o = dl->o;
    o.num_processes = num_processes;
    o.process_index = process_index;
    o.split_batches = split_batches;
    o.no_even_batches = !even_batches;
    accel_status st = validate(&o, "accel_dataloader_shard");
    if (st) return st;
    dl->o = o;
    dl->active = false;
    dl->pos = 0;
    return ACCEL_OK;
}

accel_status accel_dataloader_set_seed(accel_dataloader *dl, uint64_t seed) {
    if (null_dl(dl, __func__)) return accel_last_status();
    dl->o.seed = seed;
    return ACCEL_OK;
}

static accel_shard_opts shard_opts(const accel_dataloader *dl) {
    accel_shard_opts s = {
        .num_processes = dl->o.num_processes,
        .process_index = dl->o.process_index,
        .split_batches = dl->o.split_batches,
        .no_even_batches = dl->o.no_even_batches,
        .batch_size = dl->o.batch_sampler ? (dl->o.batch_size > 0 ? dl->o.batch_size : 0)
                                          : dl->o.batch_size,
        .drop_last = dl->o.drop_last,
    };
    return s;
}

/* Builds the epoch's global batches and this rank's shard. */
static accel_status start_epoch(accel_dataloader *dl) {
    int64_t n = accel_dataset_len(dl->ds);
    accel_status st;
    if (dl->o.batch_sampler) {
        /* An empty list, as accel_dataloader_len's: a sampler that only pushes
         * appended this epoch to the last one's batches. */
        dl->global.n = 0;
        st = dl->o.batch_sampler(dl->o.batch_sampler_ctx, dl->epoch, n, &dl->global);
    } else {
        const int64_t *order = NULL;
        if (dl->o.shuffle && n > 0) {
            /* SeedableRandomSampler: the generator is seeded with seed + epoch. */
            accel_rng r;
            accel_rng_init(&r, dl->o.seed + (uint64_t)dl->epoch);
            accel_rng_randperm(&r, n, dl->order);
            order = dl->order;
        }
        st = accel_batches_from_order(&dl->global, n, order, dl->o.batch_size, dl->o.drop_last);
    }
    if (st) return st;
    if (dl->o.num_processes == 1) { /* prepare_data_loader leaves the batch sampler alone */
        dl->shard.n = 0; /* keep the arrays: no allocation after the first epoch */
        for (int64_t i = 0; i < dl->global.n; i++)
            if ((st = accel_batches_push(&dl->shard, accel_batches_size(&dl->global, i),
                                         accel_batches_at(&dl->global, i))))
                return st;
    } else {
        accel_shard_opts s = shard_opts(dl);
        if ((st = accel_batch_sampler_shard(&dl->global, &s, &dl->shard))) return st;
    }
    dl->active = true;
    dl->pos = dl->skip < dl->shard.n ? dl->skip : dl->shard.n;
    dl->skip = 0;
    return ACCEL_OK;
}

int64_t accel_dataloader_len(const accel_dataloader *dl) {
    if (null_dl(dl, __func__) || !ds_alive(dl, __func__)) return -1;
    int64_t n = accel_dataset_len(dl->ds);
    if (dl->o.batch_sampler) {
        /* A custom sampler's length is the number of batches it produces; its
         * failure is -1 (it was 0: an empty epoch, for a sampler that failed). */
        accel_batches tmp;
        accel_batches_init(&tmp);
        accel_status st = dl->o.batch_sampler(dl->o.batch_sampler_ctx, dl->epoch, n, &tmp);
        int64_t L = tmp.n;
        accel_batches_free(&tmp);
        if (st) {
            char why[512];
            snprintf(why, sizeof why, "%s", accel_last_error());
            accel_set_error(st, "accel_dataloader_len: the batch sampler failed: %s", why);
            return -1;
        }
        if (dl->o.num_processes == 1) return L;
        accel_shard_opts s = shard_opts(dl);
        return accel_batch_sampler_shard_len(L, &s);
    }
    int64_t bs = dl->o.batch_size;
    int64_t L = n / bs + (!dl->o.drop_last && n % bs != 0); /* not (n + bs - 1) / bs: it wraps for a huge bs */
    if (dl->o.num_processes == 1) return L;
    accel_shard_opts s = shard_opts(dl);
    return accel_batch_sampler_shard_len(L, &s);
}

/* The failed move of field f of batch i (of n fields) to the loader's
 * device, named (the backend's error alone, an allocation's size, says
 * nothing of the loader). */
static accel_status not_moved(const accel_dataloader *dl, int64_t i, int f, int n) {
    char why[512], dev[32];
    accel_status st = accel_last_status();
    snprintf(why, sizeof why, "%s", accel_last_error());
    return accel_set_error(st, "accel_dataloader_next: batch %lld of epoch %lld could not be moved to %s (field %d "
                           "of %d: %s); the loader stays at it, and the next call makes it again",
                           (long long)i, (long long)dl->epoch, accel_device_str(dl->place, dev, sizeof dev), f, n,
                           why);
}

/* The epoch's batches could not be made (its batch sampler failed, or they
 * do not fit in memory: even_batches completes the last round to processes x
 * batch size indices): said with what the loader was making. Returns false. */
static bool not_started(const accel_dataloader *dl, accel_status st) {
    /* st is start_epoch's: a batch sampler may fail without setting an error
     * (data.h asks only for its status), and then the last status is OK */
    char why[512], bs[32];
    snprintf(why, sizeof why, "%s", accel_last_status() ? accel_last_error() : "the batch sampler gave no reason");
    if (dl->o.batch_sampler) snprintf(bs, sizeof bs, "its batch sampler's");
    else snprintf(bs, sizeof bs, "%lld", (long long)dl->o.batch_size);
    accel_set_error(st, "accel_dataloader_next: epoch %lld's batches for process %d of %d (batch size %s, a "
                    "dataset of %lld) could not be made: %s",
                    (long long)dl->epoch, dl->o.process_index, dl->o.num_processes, bs,
                    (long long)accel_dataset_len(dl->ds), why);
    return false;
}

bool accel_dataloader_next(accel_dataloader *dl, accel_batch *out) {
    /* false means the end or a failure: accel_last_status() tells which, for this call alone. */
    accel_clear_error();
    if (!dl || !out) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dataloader_next: NULL argument");
        return false;
    }
    if (null_dl(dl, "accel_dataloader_next") || !ds_alive(dl, "accel_dataloader_next")) return false;
    memset(out, 0, sizeof *out); /* no batch on every failure, the epoch's start's too */
    accel_status started = dl->active ? ACCEL_OK : start_epoch(dl);
    if (started) return not_started(dl, started);
    if (dl->pos >= dl->shard.n) {
        dl->active = false;
        dl->pos = 0;
        dl->epoch++;
        return false;
    }
    int64_t i = dl->pos;
    accel_status st = accel__dataset_collate(dl->ds, accel_batches_size(&dl->shard, i),
                                             accel_batches_at(&dl->shard, i), out);
    /* collated in host memory, then moved whole to the device the loader is placed on */
    for (int f = 0; !st && f < out->n_fields && dl->place.type != ACCEL_DEV_CPU; f++)
        if (!(out->fields[f] = accel_to_device(out->fields[f], dl->place))) st = not_moved(dl, i, f, out->n_fields);
    if (st) {
        /* no half batch (fields already moved, one missing): the caller gets none, and the position
         * stays, so the next call makes this batch again; what was made is step memory */
        memset(out, 0, sizeof *out);
        return false;
    }
    out->indices = accel_batches_at(&dl->shard, i);
    out->index = i;
    dl->pos++;
    return true;
}

int64_t accel_dataloader_epoch(const accel_dataloader *dl) { return null_dl(dl, __func__) ? 0 : dl->epoch; }

accel_status accel_dataloader_set_epoch(accel_dataloader *dl, int64_t epoch) {
    if (null_dl(dl, __func__)) return accel_last_status();
    /* INT64_MAX has no next epoch: the epoch's end incremented it past int64 (undefined) */
    if (epoch < 0 || epoch == INT64_MAX)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_dataloader_set_epoch: epoch must be >= 0 and below INT64_MAX (got %lld)",
                               (long long)epoch);
    dl->epoch = epoch;
    dl->active = false;
    dl->pos = 0;
    return ACCEL_OK;
}

bool accel_dataloader_active(const accel_dataloader *dl) { return !null_dl(dl, __func__) && dl->active; }

bool accel_dataloader_end_of_dataloader(const accel_dataloader *dl) {
    return !null_dl(dl, __func__) && dl->active && dl->pos >= dl->shard.n;
}

int64_t accel_dataloader_remainder(const accel_dataloader *dl) {
    if (null_dl(dl, __func__) || !ds_alive(dl, __func__)) return -1;
    if (dl->o.drop_last) return -1;
    int64_t total, n = accel_dataset_len(dl->ds);
    if (dl->o.split_batches) total = dl->o.batch_size;
    else if (__builtin_mul_overflow(dl->o.batch_size, (int64_t)dl->o.num_processes, &total)) return n; /* > n */
    if (total <= 0) return -1;
    return n % total;
}

int64_t accel_dataloader_position(const accel_dataloader *dl) {
    return !null_dl(dl, __func__) && dl->active ? dl->pos : 0;
}

accel_status accel_dataloader_skip_first_batches(accel_dataloader *dl, int64_t n) {
    if (null_dl(dl, __func__)) return accel_last_status();
    if (n < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_dataloader_skip_first_batches: n must be >= 0 (got %lld)", (long long)n);
    dl->skip = n;
    return ACCEL_OK;
}

accel_dataloader_state accel_dataloader_get_state(const accel_dataloader *dl) {
    if (null_dl(dl, __func__)) return (accel_dataloader_state){0, 0, 0};
    /* Not running: a pending skip (restored state) is the position. */
    accel_dataloader_state st = {dl->epoch, dl->active ? dl->pos : dl->skip, dl->o.seed};
    return st;
}

accel_status accel_dataloader_set_state(accel_dataloader *dl, const accel_dataloader_state *st) {
    if (null_dl(dl, __func__)) return accel_last_status();
    if (!st) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dataloader_set_state: state is NULL");
    if (st->epoch < 0 || st->epoch == INT64_MAX || st->position < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_dataloader_set_state: epoch %lld and position %lld must be >= 0 (the epoch "
                               "below INT64_MAX)",
                               (long long)st->epoch, (long long)st->position);
    dl->epoch = st->epoch;
    dl->o.seed = st->seed;
    dl->active = false;
    dl->pos = 0;
    dl->skip = st->position;
    return ACCEL_OK;
}
