/* Map-style datasets: a TensorDataset (rows of owned tensors) or a callback. */
#include <string.h>

#include "accel/data.h"
#include "core/core_internal.h"
#include "data_internal.h"

struct accel_dataset {
    int64_t len;
    int n_fields;
    accel_field_spec specs[ACCEL_BATCH_MAX_FIELDS];
    size_t sample_bytes[ACCEL_BATCH_MAX_FIELDS];
    accel_tensor *tensors[ACCEL_BATCH_MAX_FIELDS]; /* TensorDataset: owned contiguous copies */
    accel_dataset_get_fn get;
    void *ctx;
    accel__link *links; /* its data loaders */
    uint32_t magic;     /* ACCEL__MAGIC_DATASET while alive (core/handle.h) */
};

static size_t spec_bytes(const accel_field_spec *s) {
    size_t n = accel_dtype_size(s->dtype);
    for (int d = 0; d < s->ndim; d++) n *= (size_t)s->shape[d];
    return n;
}

/* A sample's dims are >= 0 and its bytes fit in int64 (a negative dim made a
 * huge size_t, products wrapped: found only at the first batch, or never). */
static bool spec_sizes_ok(const accel_field_spec *s) {
    int64_t n = (int64_t)accel_dtype_size(s->dtype);
    for (int d = 0; d < s->ndim; d++)
        if (s->shape[d] < 0 || __builtin_mul_overflow(n, s->shape[d], &n)) return false;
    return true;
}

static accel_dataset *dataset_alloc(int64_t len, int n_fields, const char *fn) {
    if (n_fields < 1 || n_fields > ACCEL_BATCH_MAX_FIELDS || len < 0) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: need 1..%d fields and len >= 0 (got %d, %lld)",
                        fn, ACCEL_BATCH_MAX_FIELDS, n_fields, (long long)len);
        return NULL;
    }
    accel_dataset *ds = accel_calloc(1, sizeof *ds);
    if (!ds) return NULL;
    ds->len = len;
    ds->n_fields = n_fields;
    ds->magic = ACCEL__MAGIC_DATASET;
    return ds;
}

accel_dataset *accel_tensor_dataset_new(int n_fields, accel_tensor *const *tensors) {
    if (!tensors || n_fields < 1) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_tensor_dataset_new: no tensors given");
        return NULL;
    }
    for (int f = 0; f < n_fields; f++) {
        char arg[32]; /* the message names which tensor: "tensors[1]" */
        snprintf(arg, sizeof arg, "tensors[%d]", f);
        if (!accel_tensor_check(tensors[f], "accel_tensor_dataset_new", arg)) return NULL;
        if (tensors[f]->ndim < 1 || tensors[f]->shape[0] != tensors[0]->shape[0] ||
            tensors[f]->device.type == ACCEL_DEV_META) {
            char a[64], b[64];
            accel_set_error(ACCEL_ERR_SHAPE,
                            "accel_tensor_dataset_new: every tensor needs data and the same first dim "
                            "(tensor 0 %s, tensor %d %s)",
                            accel_shape_str(tensors[0], a, sizeof a), f,
                            accel_shape_str(tensors[f], b, sizeof b));
            return NULL;
        }
    }
    accel_dataset *ds = dataset_alloc(tensors[0]->shape[0], n_fields, "accel_tensor_dataset_new");
    if (!ds) return NULL;
    for (int f = 0; f < n_fields; f++) {
        accel_field_spec *s = &ds->specs[f];
        s->dtype = tensors[f]->dtype;
        s->ndim = tensors[f]->ndim - 1;
        for (int d = 0; d < s->ndim; d++) s->shape[d] = tensors[f]->shape[d + 1];
        ds->sample_bytes[f] = spec_bytes(s);
        ds->tensors[f] = accel_tensor_clone_persistent(tensors[f], ACCEL_CPU_DEVICE);
        if (!ds->tensors[f]) {
            accel_dataset_free(ds);
            return NULL;
        }
    }
    return ds;
}

accel_dataset *accel_map_dataset_new(int64_t len, int n_fields, const accel_field_spec *specs,
                                     accel_dataset_get_fn get, void *ctx) {
    if (!specs || !get) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_map_dataset_new: specs and get are required");
        return NULL;
    }
    accel_dataset *ds = dataset_alloc(len, n_fields, "accel_map_dataset_new");
    if (!ds) return NULL;
    for (int f = 0; f < n_fields; f++) {
        if (specs[f].ndim < 0 || specs[f].ndim >= ACCEL_MAX_DIMS || specs[f].dtype >= ACCEL_DTYPE_COUNT ||
            !spec_sizes_ok(&specs[f])) {
            char sh[160];
            accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_map_dataset_new: bad spec for field %d (ndim %d, shape %s: "
                            "dims must be >= 0 and a sample's bytes fit in int64)", f, specs[f].ndim,
                            specs[f].ndim >= 0 && specs[f].ndim < ACCEL_MAX_DIMS
                                ? accel_shape_str_n(specs[f].ndim, specs[f].shape, sh, sizeof sh) : "?");
            accel_free(ds);
            return NULL;
        }
        ds->specs[f] = specs[f];
        ds->sample_bytes[f] = spec_bytes(&specs[f]);
    }
    ds->get = get;
    ds->ctx = ctx;
    return ds;
}

accel__link **accel__dataset_links(accel_dataset *ds) { return &ds->links; }

void accel_dataset_free(accel_dataset *ds) {
    if (!ds || accel__dataset_dead(ds, "accel_dataset_free")) return;
    accel__link_detach_all(&ds->links, ds);
    for (int f = 0; f < ds->n_fields; f++) accel_tensor_free(ds->tensors[f]);
    ds->magic = 0;
    accel_free(ds);
}

bool accel__dataset_dead(const accel_dataset *ds, const char *fn) {
    return ACCEL__DEAD(ds, ACCEL__MAGIC_DATASET, fn, "dataset");
}

/* A dataset a query cannot read: NULL or freed (the error set, naming fn). */
static bool unusable(const accel_dataset *ds, const char *fn) {
    if (!ds) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: dataset is NULL", fn);
        return true;
    }
    return accel__dataset_dead(ds, fn);
}

int64_t accel_dataset_len(const accel_dataset *ds) { return unusable(ds, __func__) ? 0 : ds->len; }
int accel_dataset_num_fields(const accel_dataset *ds) { return unusable(ds, __func__) ? 0 : ds->n_fields; }
const accel_field_spec *accel_dataset_field(const accel_dataset *ds, int f) {
    if (unusable(ds, __func__)) return NULL;
    if (f >= 0 && f < ds->n_fields) return &ds->specs[f];
    accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dataset_field: no field %d (the dataset has %d)", f, ds->n_fields);
    return NULL;
}

accel_status accel__dataset_collate(accel_dataset *ds, int64_t n, const int64_t *idx,
                                    accel_batch *out) {
    out->n_fields = ds->n_fields;
    out->size = n;
    for (int f = 0; f < ds->n_fields; f++) {
        const accel_field_spec *s = &ds->specs[f];
        int64_t shape[ACCEL_MAX_DIMS];
        shape[0] = n;
        memcpy(shape + 1, s->shape, (size_t)s->ndim * sizeof(int64_t));
        /* batches are built in host memory, on the cpu, whatever the default
         * device: the model's device gets them by an explicit accel_to_device */
        out->fields[f] = accel_empty_on(s->dtype, s->ndim + 1, shape, ACCEL_CPU_DEVICE);
        if (!out->fields[f]) return accel_last_status();
    }
    char *rows[ACCEL_BATCH_MAX_FIELDS], *samples[ACCEL_BATCH_MAX_FIELDS];
    for (int f = 0; f < ds->n_fields; f++) {
        rows[f] = accel__host_ptr(out->fields[f], "accel_dataloader");
        samples[f] = ds->get ? NULL : accel__host_ptr(ds->tensors[f], "accel_dataloader");
    }
    for (int64_t i = 0; i < n; i++) {
        if (idx[i] < 0 || idx[i] >= ds->len)
            return accel_set_error(ACCEL_ERR_INVALID_ARG,
                                   "accel_dataloader: sample index %lld out of range for a dataset of %lld",
                                   (long long)idx[i], (long long)ds->len);
        void *dst[ACCEL_BATCH_MAX_FIELDS];
        for (int f = 0; f < ds->n_fields; f++) dst[f] = rows[f] + (size_t)i * ds->sample_bytes[f];
        if (ds->get) {
            accel_status st = ds->get(ds->ctx, idx[i], dst);
            if (st) return st;
        } else {
            for (int f = 0; f < ds->n_fields; f++)
                memcpy(dst[f], samples[f] + (size_t)idx[i] * ds->sample_bytes[f], ds->sample_bytes[f]);
        }
    }
    return ACCEL_OK;
}
