/* Whether a save_state checkpoint of a sharded run (tensor- or pipeline-
 * parallel, or both: tests/test_accelerator_tp_checkpoint.c,
 * tests/test_pipeline_checkpoint.c, tests/test_pipeline_tp_checkpoint.c)
 * is a one-process one, and how far two checkpoints' files differ. */
#ifndef ACCEL_TESTS_CHECKPOINT_WHOLE_H
#define ACCEL_TESTS_CHECKPOINT_WHOLE_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/io.h"
#include "check.h"

/* dir/model.safetensors holds every weight of `whole` (the model as one
 * process builds it) with its whole shape, and dir/optimizer.safetensors the
 * Adam(W) state of each parameter once, in one process's numbering (the
 * parameters in state-dict order): its step, and exp_avg and exp_avg_sq as
 * long as the whole parameter. */
static inline void check_whole_checkpoint(const char *dir, accel_module *whole) {
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    accel_safetensors *f = accel_safetensors_open(path);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    accel_safetensors *o = accel_safetensors_open(path);
    CHECK_MSG(f && o, "%s", accel_last_error());
    accel_state_dict *sd = accel_module_state_dict(whole);
    int seg = 0, states = 0;
    for (int i = 0; f && o && i < sd->n; i++) {
        const accel_state_entry *e = &sd->entries[i];
        if (e->is_tied_alias) continue;
        const accel_st_info *w = accel_safetensors_find(f, e->name);
        bool shape = w && w->ndim == e->t->ndim;
        for (int d = 0; shape && d < w->ndim; d++) shape = w->shape[d] == e->t->shape[d];
        CHECK_MSG(shape, "%s is not the whole tensor", e->name);
        if (e->is_buffer) continue;
        static const char *const KINDS[] = {"exp_avg", "exp_avg_sq"};
        for (int k = 0; k < 2; k++) {
            char name[96];
            snprintf(name, sizeof name, "state.%d.%s", seg, KINDS[k]);
            const accel_st_info *m = accel_safetensors_find(o, name);
            CHECK_MSG(m && m->ndim == 1 && m->shape[0] == accel_numel(e->t), "%s (%s)", name, e->name);
        }
        seg++;
    }
    for (int i = 0; o && i < accel_safetensors_count(o); i++)
        states += !strncmp(accel_safetensors_at(o, i)->name, "state.", 6);
    CHECK_MSG(states == 3 * seg, "%d state entries for %d parameters (step, exp_avg, exp_avg_sq each)", states, seg);
    accel_state_dict_free(sd);
    if (f) accel_safetensors_close(f);
    if (o) accel_safetensors_close(o);
}

/* How far file b (a checkpoint's model or optimizer file) is from file a:
 * the largest |b - a| / max(1, |a|) over the elements of every tensor,
 * read as f64 (INFINITY, and a failed CHECK, when a tensor of b is not in a
 * with its shape or the counts differ); *same whether every tensor's dtype
 * and bytes are a's too (a resume bit for bit). */
static inline double checkpoint_file_diff(const char *a, const char *b, bool *same) {
    accel_safetensors *fa = accel_safetensors_open(a), *fb = accel_safetensors_open(b);
    CHECK_MSG(fa && fb, "%s", accel_last_error());
    double worst = fa && fb && accel_safetensors_count(fa) == accel_safetensors_count(fb) ? 0 : INFINITY;
    *same = worst == 0;
    for (int i = 0; fa && fb && i < accel_safetensors_count(fb); i++) {
        const char *name = accel_safetensors_at(fb, i)->name;
        accel_tensor *x = accel_safetensors_tensor(fa, name, -1), *y = accel_safetensors_tensor(fb, name, -1);
        accel_tensor *dx = x ? accel_safetensors_tensor(fa, name, ACCEL_F64) : NULL;
        accel_tensor *dy = y ? accel_safetensors_tensor(fb, name, ACCEL_F64) : NULL;
        bool shaped = dx && dy && accel_same_shape(x, y);
        CHECK_MSG(shaped, "%s: %s and %s differ in shape (or it is missing)", name, a, b);
        *same = *same && shaped && x->dtype == y->dtype && memcmp(x->data, y->data, accel_nbytes(x)) == 0;
        const double *u = shaped ? dx->data : NULL, *v = shaped ? dy->data : NULL;
        for (int64_t k = 0; shaped && k < accel_numel(dx); k++) {
            double d = fabs(v[k] - u[k]) / fmax(1.0, fabs(u[k]));
            worst = d > worst || isnan(d) ? d : worst;
        }
        if (!shaped) worst = INFINITY;
        accel_tensor_free(x), accel_tensor_free(y), accel_tensor_free(dx), accel_tensor_free(dy);
    }
    if (fa) accel_safetensors_close(fa);
    if (fb) accel_safetensors_close(fb);
    return worst;
}

#endif
