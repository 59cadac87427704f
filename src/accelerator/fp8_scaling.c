/* fp8 in the Accelerator (fp8_scaling.h): the recipe, and the scales of a
 * data-parallel model kept equal on every rank. */
#include "fp8_scaling.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "accelerator_internal.h"
#include "core/str_to_bool.h"
#include "nn/fp8_modules.h"

/* ---------------------------------------------------------------- recipe */

static const char FN[] = "accel_accelerator_new";

/* One recipe option's text: the field's when set (*who = its name), else
 * ACCEL_FP8_<env> or ACCELERATE_FP8_<env> (*who = the variable set); NULL
 * when neither. who: 48 bytes. */
static const char *fp8_text(const char *field, const char *field_name, const char *env, char *who) {
    snprintf(who, 48, "%s", field_name);
    if (field) return field;
    static const char *const PREFIX[] = {"ACCEL_FP8_", "ACCELERATE_FP8_"};
    for (int i = 0; i < 2; i++) {
        snprintf(who, 48, "%s%s", PREFIX[i], env);
        const char *v = getenv(who);
        if (v && *v) return v;
    }
    return NULL;
}

enum { FP8_INT_MAX = 1 << 20 };

/* An integer option in [lo, FP8_INT_MAX]: the field when nonzero, else the
 * variable; *out keeps its default when neither is set. */
static accel_status fp8_int(int field, const char *field_name, const char *env, int lo, int *out) {
    char who[48];
    if (field) {
        if (field < lo || field > FP8_INT_MAX)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s=%d must be an integer in [%d, %d]", FN, field_name,
                                   field, lo, FP8_INT_MAX);
        *out = field;
        return ACCEL_OK;
    }
    const char *v = fp8_text(NULL, field_name, env, who);
    if (!v) return ACCEL_OK;
    char *end;
    long n = strtol(v, &end, 10);
    if (end == v || *end || n < lo || n > FP8_INT_MAX)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s=%s must be an integer in [%d, %d]", FN, who, v, lo,
                               FP8_INT_MAX);
    *out = (int)n;
    return ACCEL_OK;
}

/* A boolean option: the field's tri-state when set, else the variable read as
 * Accelerate's str_to_bool does (y/yes/t/true/on/1, n/no/f/false/off/0). */
static accel_status fp8_bool(int field, const char *field_name, const char *env, bool *out) {
    char who[48];
    if (field == ACCEL_TRUE || field == ACCEL_FALSE) {
        *out = field == ACCEL_TRUE;
        return ACCEL_OK;
    }
    if (field)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s=%d is not ACCEL_TRUE (1), ACCEL_FALSE (-1) or 0 (unset)",
                               FN, field_name, field);
    *out = false;
    return accel__parse_bool(FN, who, fp8_text(NULL, field_name, env, who), out);
}

static accel_status fp8_strings(const accel_accelerator_opts *o, accel__fp8_recipe *r) {
    char who[48];
    const char *backend = fp8_text(o->fp8_backend, "fp8_backend", "BACKEND", who);
    if (backend && strcasecmp(backend, "te"))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s=%s is not supported: accel runs TransformerEngine's "
                               "recipe (TE)", FN, who, backend);
    const char *fmt = fp8_text(o->fp8_format, "fp8_format", "FORMAT", who);
    if (fmt && !strcasecmp(fmt, "E5M2"))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s=%s: pure E5M2 training is not supported (use HYBRID "
                               "or E4M3, as TransformerEngine)", FN, who, fmt);
    if (fmt && strcasecmp(fmt, "HYBRID") && strcasecmp(fmt, "E4M3"))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s=%s: choose HYBRID or E4M3", FN, who, fmt);
    r->hybrid = !fmt || !strcasecmp(fmt, "HYBRID");
    const char *algo = fp8_text(o->fp8_amax_compute_algo, "fp8_amax_compute_algo", "AMAX_COMPUTE_ALGO", who);
    if (algo && strcasecmp(algo, "max") && strcasecmp(algo, "most_recent"))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s=%s: choose 'max' or 'most_recent'", FN, who, algo);
    r->use_max = algo && !strcasecmp(algo, "max");
    return ACCEL_OK;
}

/* override_linear_precision: each GEMM of the fp8 Linear runs in fp8. */
static accel_status fp8_no_override(const accel_accelerator_opts *o) {
    static const char *const GEMM[3] = {"FPROP", "DGRAD", "WGRAD"};
    for (int i = 0; i < 3; i++) {
        char field[48], env[16];
        bool on;
        snprintf(field, sizeof field, "fp8_override_linear_precision[%d]", i);
        snprintf(env, sizeof env, "OVERRIDE_%s", GEMM[i]);
        if (fp8_bool(o->fp8_override_linear_precision[i], field, env, &on)) return accel_last_status();
        if (on)
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: override_linear_precision %s (%s or ACCELERATE_FP8_%s "
                                   "true) is not supported: accel runs the fp8 Linear's three GEMMs in fp8",
                                   FN, GEMM[i], field, env);
    }
    return ACCEL_OK;
}

accel_status accel__fp8_recipe_resolve(const accel_accelerator_opts *o, accel__fp8_recipe *r) {
    *r = accel__fp8_recipe_default();
    int interval = 1;
    if (fp8_strings(o, r) || fp8_no_override(o) ||
        fp8_bool(o->fp8_use_autocast_during_eval, "fp8_use_autocast_during_eval", "USE_AUTOCAST_DURING_EVAL",
                 &r->during_eval) ||
        fp8_int(o->fp8_interval, "fp8_interval", "INTERVAL", 1, &interval) ||
        fp8_int(o->fp8_amax_history_len, "fp8_amax_history_len", "AMAX_HISTORY_LEN", 1, &r->history_len))
        return accel_last_status();
    if (o->fp8_margin == -1) return ACCEL_OK; /* margin 0 whatever the variable says */
    return fp8_int(o->fp8_margin, "fp8_margin", "MARGIN", 0, &r->margin);
}

/* ---------------------------------------------------------------- amax reduction
 *
 * TransformerEngine gathers the current amaxes of its fp8 tensors into one
 * buffer, all-reduces it with MAX and scatters it back before the scale
 * update; so does this, on the metas' device. */

/* n floats of t from element off, as a 1-d step view. */
static accel_tensor *span(accel_tensor *t, int64_t off, int n) {
    return accel_view_raw(t, 1, (int64_t[]){n}, (int64_t[]){1}, off);
}

/* The current amax row's slots [first, first + n) of a meta (row 2). */
static accel_tensor *amax_span(accel_tensor *meta, int first, int n) {
    return span(meta, 2 * ACCEL__FP8_SLOTS + first, n);
}

/* One all_reduce(MAX) over the current amaxes of every meta: buf [count, n]
 * gathers them, is reduced, and is copied back. */
static accel_status reduce_amaxes(accel_pg *pg, accel_tensor **metas, int count, int first, int n) {
    accel_tensor *buf = accel_empty_on(ACCEL_F32, 1, (int64_t[]){(int64_t)count * n}, metas[0]->device);
    if (!buf) return accel_last_status();
    accel_status st = ACCEL_OK;
    for (int i = 0; i < count && !st; i++)
        st = accel_copy_(span(buf, (int64_t)i * n, n), amax_span(metas[i], first, n));
    if (!st) st = accel__staged_all_reduce(pg, buf, ACCEL_REDUCE_MAX);
    for (int i = 0; i < count && !st; i++)
        st = accel_copy_(amax_span(metas[i], first, n), span(buf, (int64_t)i * n, n));
    return st;
}

accel_status accel__fp8_reduce_and_update(accel_pg *pg, accel_module *root, int first, int n, accel__fp8_recipe r) {
    if (!root || first < 0 || n < 1 || first + n > ACCEL__FP8_SLOTS)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel__fp8_reduce_and_update: a module and slots within 0..2");
    accel_tensor **metas;
    int count;
    accel_status st = accel__fp8_model_metas(root, &metas, &count);
    if (!st && count && pg && accel_pg_size(pg) > 1) st = reduce_amaxes(pg, metas, count, first, n);
    for (int i = 0; i < count && !st; i++) st = accel__fp8_meta_update(metas[i], first, n, r);
    accel_free(metas);
    return st;
}
