/* tests/tp_fixture.h — comparing a tensor-parallel model with the same
 * model on one process (test_tp, test_tp_llama, test_accelerator_tp,
 * test_accelerator_cp_tp). */
#ifndef ACCEL_TESTS_TP_FIXTURE_H
#define ACCEL_TESTS_TP_FIXTURE_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "accel/accel.h"
#include "accel/parallel.h"
#include "check.h"

/* |a - b| <= 1e-5 max(1, |b|) over n floats; one CHECK naming what. */
static inline void close_all(const char *what, const float *a, const float *b, int64_t n) {
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (!(fabs((double)a[i] - b[i]) <= 1e-5 * fmax(1.0, fabs((double)b[i])))) bad = i;
    CHECK_MSG(bad < 0, "%s: element %lld is %.9g, want %.9g", what, (long long)bad, bad < 0 ? 0 : a[bad],
              bad < 0 ? 0 : b[bad]);
}

/* Persistent tensors (they outlive accel_step_reset) from host values. */
static inline accel_tensor *pf32(int ndim, const int64_t *shape, const float *v) {
    accel_tensor *t = accel_tensor_new(ACCEL_F32, ndim, shape, ACCEL_CPU_DEVICE);
    accel_tensor_from_host(t, v);
    return t;
}

static inline accel_tensor *pi64(int ndim, const int64_t *shape, const int64_t *v) {
    accel_tensor *t = accel_tensor_new(ACCEL_I64, ndim, shape, ACCEL_CPU_DEVICE);
    accel_tensor_from_host(t, v);
    return t;
}

static inline float *floats_of(const accel_tensor *t) {
    float *f = malloc((size_t)accel_numel(t) * sizeof *f);
    accel_to_floats(t, f);
    return f;
}

/* What of the reference's whole tensor b (a parameter or its gradient) the
 * parallel model's parameter a (of module owner) holds on this rank: its tp
 * slice or slices (a step tensor), or b itself when a is whole. */
static inline accel_tensor *tp_part(const accel_module *owner, const accel_tensor *a, accel_tensor *b) {
    accel_tp_slice s;
    return accel_module_tp_slice(owner, a, &s) ? accel_tp_slice_of(b, &s) : b;
}

/* Every parameter (grads: its gradient) of the parallel model against the
 * slice of the reference's. */
static inline void tp_match(accel_module *tp, accel_module *ref, bool grads) {
    accel_state_dict *sd = accel_module_state_dict(tp);
    for (int i = 0; sd && i < sd->n; i++) {
        if (sd->entries[i].is_buffer) continue;
        accel_tensor *a = sd->entries[i].t, *b = accel_module_get_tensor(ref, sd->entries[i].name);
        CHECK_MSG(b != NULL, "%s is not the reference's", sd->entries[i].name);
        if (!b) continue;
        if (grads && (!a->grad || !b->grad)) { /* an expert no token chose: none, or zeros (zero_grad's) */
            const accel_tensor *g = a->grad ? a->grad : b->grad;
            float *x = g ? floats_of(g) : NULL;
            int64_t nonzero = 0;
            for (int64_t k = 0; g && k < accel_numel(g); k++) nonzero += x[k] != 0;
            CHECK_MSG(nonzero == 0, "%s: no gradient in the %s model, %lld nonzero elements in the other's",
                      sd->entries[i].name, a->grad ? "reference" : "parallel", (long long)nonzero);
            free(x);
            continue;
        }
        if (grads) a = a->grad, b = b->grad;
        accel_tensor *want = tp_part(sd->entries[i].owner, sd->entries[i].t, b);
        CHECK(accel_same_shape(a, want));
        float *x = floats_of(a), *y = floats_of(want);
        close_all(sd->entries[i].name, x, y, accel_numel(want));
        free(x), free(y);
    }
    accel_state_dict_free(sd);
}

static inline void grads_match(accel_module *tp, accel_module *ref) { tp_match(tp, ref, true); }

/* save_model of the parallel model m (prepared by acc) into dir writes whole
 * tensors equal to ref's, the one-process model after the same steps
 * (gathered over the tp group; under ZeRO-3 over the shard group first), and
 * save_state into dir/state succeeds (its files: test_accelerator_tp_checkpoint). */
static inline void saves_whole(accel_accelerator *acc, accel_module *m, accel_module *ref, const char *dir) {
    accel_status st = accel_accelerator_save_model(acc, m, dir, NULL);
    CHECK_MSG(st == ACCEL_OK, "%s", accel_last_error());
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    accel_safetensors *f = accel_safetensors_open(path);
    CHECK_MSG(f != NULL, "%s", accel_last_error());
    accel_state_dict *sd = accel_module_state_dict(ref);
    for (int i = 0; f && i < sd->n; i++) {
        if (sd->entries[i].is_tied_alias) continue;
        accel_tensor *got = accel_safetensors_tensor(f, sd->entries[i].name, ACCEL_F32);
        CHECK_MSG(got && accel_same_shape(got, sd->entries[i].t), "%s", sd->entries[i].name);
        if (got && accel_same_shape(got, sd->entries[i].t))
            close_all(sd->entries[i].name, got->data, sd->entries[i].t->data, accel_numel(got));
        accel_tensor_free(got);
    }
    accel_state_dict_free(sd);
    accel_safetensors_close(f);
    char state[128];
    snprintf(state, sizeof state, "%s/state", dir);
    st = accel_accelerator_save_state(acc, state, NULL, 0);
    CHECK_MSG(st == ACCEL_OK, "%s", accel_last_error());
}

#endif
