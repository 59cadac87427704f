/* tests/nn_fixture.h — helpers for the nn tests that compare against the
 * safetensors fixtures of tools/gen_llama_fixtures.py. */
#ifndef ACCEL_TESTS_NN_FIXTURE_H
#define ACCEL_TESTS_NN_FIXTURE_H

#include <string.h>

#include "accel/accel.h"
#include "accel/io.h"
#include "check.h"

/* A [rows, cols] int64 tensor of v's values. */
static inline accel_tensor *i64_matrix(int64_t rows, int64_t cols, const int64_t *v) {
    return accel_from_data(ACCEL_I64, 2, (int64_t[]){rows, cols}, v);
}

/* Equal bytes of two float tensors of one size (read as f32). */
static inline bool same_bits(accel_tensor *a, accel_tensor *b) {
    if (!a || !b || accel_numel(a) != accel_numel(b)) return false;
    int64_t n = accel_numel(a);
    float *x = accel_malloc(sizeof(float) * (size_t)n * 2);
    accel_to_floats(a, x);
    accel_to_floats(b, x + n);
    bool same = !memcmp(x, x + n, sizeof(float) * (size_t)n);
    accel_free(x);
    return same;
}

/* Every element of `got` within atol + rtol * |want| of the fixture tensor
 * `name`; one CHECK per tensor, naming it and the worst element. */
static inline void check_tensor_close(accel_safetensors *st, const char *name, accel_tensor *got,
                                      double rtol, double atol) {
    accel_tensor *want = accel_safetensors_tensor(st, name, ACCEL_F32);
    check_count_++;
    if (!want || !got || accel_numel(want) != accel_numel(got)) {
        check_failures_++;
        fprintf(stderr, "%s: missing or size mismatch (%s)\n", name, accel_last_error());
        accel_tensor_free(want);
        return;
    }
    int64_t n = accel_numel(got);
    float *g = accel_malloc((size_t)n * sizeof(float));
    accel_to_floats(got, g);
    const float *w = want->data;
    int64_t worst = -1;
    double worst_excess = 0;
    for (int64_t i = 0; i < n; i++) {
        double excess = fabs((double)g[i] - w[i]) - (atol + rtol * fabs((double)w[i]));
        if (excess > worst_excess || isnan(g[i])) {
            worst_excess = isnan(g[i]) ? INFINITY : excess;
            worst = i;
        }
    }
    if (worst >= 0) {
        check_failures_++;
        fprintf(stderr, "%s: element %lld is %.9g, expected %.9g (rtol %g, atol %g)\n", name,
                (long long)worst, g[worst], w[worst], rtol, atol);
    }
    accel_free(g);
    accel_tensor_free(want);
}

/* Every parameter's gradient of m after a backward, in parameter order, as
 * one accel_malloc'd array of *n floats (the caller frees it); the gradients
 * are zeroed for the next backward. */
static inline float *take_grads(accel_module *m, int64_t *n) {
    accel_tensor **ps = NULL;
    int np = accel_module_parameters(m, &ps);
    int64_t total = 0;
    for (int i = 0; i < np; i++) total += accel_numel(ps[i]);
    float *g = accel_malloc((size_t)total * sizeof *g);
    for (int64_t i = 0, off = 0; i < np && g; off += accel_numel(ps[i]), i++) {
        CHECK(ps[i]->grad != NULL);
        if (ps[i]->grad) accel_to_floats(ps[i]->grad, g + off);
        accel_zero_(ps[i]->grad);
    }
    accel_free(ps);
    *n = total;
    return g;
}

/* m's state_dict keys, in order, are the fixture's state_dict_names (u8:
 * transformers' keys joined by newlines); what names the fixture in a
 * failure. */
static inline void check_state_dict_names(accel_module *m, accel_safetensors *st, const char *what) {
    const accel_st_info *names = accel_safetensors_find(st, "state_dict_names");
    accel_state_dict *sd = accel_module_state_dict(m);
    CHECK(names && sd);
    size_t at = 0;
    for (int i = 0; names && sd && i < sd->n; i++) { /* names: "a\nb\n...z" */
        size_t len = strlen(sd->entries[i].name);
        bool same = at + len <= names->nbytes && !memcmp((const char *)names->bytes + at, sd->entries[i].name, len) &&
                    (at + len == names->nbytes || ((const char *)names->bytes)[at + len] == '\n');
        CHECK_MSG(same, "%s: state_dict entry %d is %s, not transformers' %.*s", what, i, sd->entries[i].name,
                  (int)(names->nbytes - at < 60 ? names->nbytes - at : 60), (const char *)names->bytes + at);
        if (!same) break;
        at += len + 1;
    }
    CHECK_MSG(!names || at == names->nbytes + 1, "%s: transformers' state_dict has more entries", what);
    accel_state_dict_free(sd);
}

/* accel_llama_loss_ex of in (with gradient checkpointing or without) and
 * every gradient of m against the fixture's <prefix>loss and
 * <prefix>g.<param> (transformers' names), within 1e-5 relative; the
 * gradients zeroed after. */
static inline void check_llama_loss(accel_module *m, accel_safetensors *st, accel_llama_inputs *in, const char *name,
                                    bool checkpointing, const char *prefix) {
    char key[200];
    CHECK(accel_module_set_gradient_checkpointing(m, checkpointing) == ACCEL_OK);
    snprintf(key, sizeof key, "%sloss", prefix);
    accel_tensor *want = accel_safetensors_tensor(st, key, -1);
    accel_tensor *loss = accel_llama_loss_ex(m, in);
    CHECK_MSG(want && loss != NULL, "%s: %s", name, accel_last_error());
    check_tensor_close(st, key, loss, 1e-5, 0);
    CHECK_MSG(loss && accel_backward(loss) == ACCEL_OK, "%s: %s", name, accel_last_error());
    accel_state_dict *sd = accel_module_state_dict(m);
    for (int i = 0; loss && i < sd->n; i++) {
        if (sd->entries[i].is_tied_alias) continue;
        snprintf(key, sizeof key, "%sg.%s", prefix, sd->entries[i].name);
        check_tensor_close(st, key, sd->entries[i].t->grad, 1e-5, 1e-6);
        accel_zero_(sd->entries[i].t->grad);
    }
    accel_state_dict_free(sd);
    accel_tensor_free(want);
    accel_step_reset();
    CHECK(accel_module_set_gradient_checkpointing(m, false) == ACCEL_OK);
}

#endif
