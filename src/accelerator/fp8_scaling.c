/* fp8 in the Accelerator (fp8_scaling.h): the recipe, and the scales of a
 * data-parallel model kept equal on every rank. */
#include "fp8_scaling.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "accelerator_internal.h"
#include "core/env.h"
#include "core/str_to_bool.h"
#include "nn/fp8_modules.h"

/* ---------------------------------------------------------------- recipe */

static const char FN[] = "accel_accelerator_new";

/* One recipe option's text: the field's when set (*who = its name), else
 * ACCEL_FP8_<env> or ACCELERATE_FP8_<env> (*who = the variable set); NULL
 * when neither or env is NULL (the fields alone checked). who: 48 bytes. */
static const char *fp8_text(const char *field, const char *field_name, const char *env, char *who) {
    snprintf(who, 48, "%s", field_name);
    if (field || !env) return field;
    static const char *const PREFIX[] = {"ACCEL_FP8_", "ACCELERATE_FP8_"};
    for (int i = 0; i < 2; i++) {
        snprintf(who, 48, "%s%s", PREFIX[i], env);
        const char *v = getenv(who);
        if (v) return v; /* empty too: refused below (core/env.h) */
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
    long n;
    if (accel__parse_long(who, v, lo, FP8_INT_MAX, &n) != ACCEL_OK)
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

/* ENV(name): the variable's suffix, or NULL when the variables are not read. */
#define ENV(name) (read_env ? (name) : NULL)

static accel_status fp8_strings(const accel_accelerator_opts *o, bool read_env, accel__fp8_recipe *r) {
    char who[48];
    const char *backend = fp8_text(o->fp8_backend, "fp8_backend", ENV("BACKEND"), who);
    if (backend && strcasecmp(backend, "te"))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s=%s is not supported: accel runs TransformerEngine's "
                               "recipe (TE)", FN, who, backend);
    const char *fmt = fp8_text(o->fp8_format, "fp8_format", ENV("FORMAT"), who);
    if (fmt && !strcasecmp(fmt, "E5M2"))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s=%s: pure E5M2 training is not supported (use HYBRID "
                               "or E4M3, as TransformerEngine)", FN, who, fmt);
    if (fmt && strcasecmp(fmt, "HYBRID") && strcasecmp(fmt, "E4M3"))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s=%s: choose HYBRID or E4M3", FN, who, fmt);
    r->hybrid = !fmt || !strcasecmp(fmt, "HYBRID");
    const char *algo = fp8_text(o->fp8_amax_compute_algo, "fp8_amax_compute_algo", ENV("AMAX_COMPUTE_ALGO"), who);
    if (algo && strcasecmp(algo, "max") && strcasecmp(algo, "most_recent"))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s=%s: choose 'max' or 'most_recent'", FN, who, algo);
    r->use_max = algo && !strcasecmp(algo, "max");
    return ACCEL_OK;
}

/* override_linear_precision (fprop, dgrad, wgrad): each true runs that GEMM
 * of the fp8 Linear in higher precision (ops/fp8_linear.h). */
static accel_status fp8_overrides(const accel_accelerator_opts *o, bool read_env, accel__fp8_recipe *r) {
    static const char *const GEMM[ACCEL__FP8_GEMMS] = {"FPROP", "DGRAD", "WGRAD"};
    for (int i = 0; i < ACCEL__FP8_GEMMS; i++) {
        char field[48], env[16];
        snprintf(field, sizeof field, "fp8_override_linear_precision[%d]", i);
        snprintf(env, sizeof env, "OVERRIDE_%s", GEMM[i]);
        if (fp8_bool(o->fp8_override_linear_precision[i], field, ENV(env), &r->high_precision[i]))
            return accel_last_status();
    }
    return ACCEL_OK;
}

accel_status accel__fp8_recipe_resolve(const accel_accelerator_opts *o, bool read_env, accel__fp8_recipe *r) {
    *r = accel__fp8_recipe_default();
    int interval = 1;
    if (fp8_strings(o, read_env, r) || fp8_overrides(o, read_env, r) ||
        fp8_bool(o->fp8_use_autocast_during_eval, "fp8_use_autocast_during_eval", ENV("USE_AUTOCAST_DURING_EVAL"),
                 &r->during_eval) ||
        fp8_int(o->fp8_interval, "fp8_interval", ENV("INTERVAL"), 1, &interval) ||
        fp8_int(o->fp8_amax_history_len, "fp8_amax_history_len", ENV("AMAX_HISTORY_LEN"), 1, &r->history_len))
        return accel_last_status();
    if (o->fp8_margin == -1) return ACCEL_OK; /* margin 0 whatever the variable says */
    return fp8_int(o->fp8_margin, "fp8_margin", ENV("MARGIN"), 0, &r->margin);
}

#undef ENV

/* ---------------------------------------------------------------- a model's state
 *
 * TransformerEngine gathers the current amaxes of its fp8 tensors into one
 * buffer, all-reduces it with MAX and scatters it back before the scale
 * update; so does this, on the metas' device, with the list of metas and the
 * buffer made once per prepared model. */

accel_status accel__fp8_log_reserve(accel__fp8_log *log, int cap) {
    if (cap <= log->cap) return ACCEL_OK;
    accel_tensor **m = accel_malloc(sizeof *m * (size_t)cap);
    if (!m) return accel_last_status();
    accel_free(log->metas);
    *log = (accel__fp8_log){.metas = m, .cap = cap};
    return ACCEL_OK;
}

void accel__fp8_log_free(accel__fp8_log *log) {
    accel_free(log->metas);
    *log = (accel__fp8_log){0};
}

/* The weight cache of s (ops/fp8_linear.h): a row per meta, found by the
 * meta's address in a table at most half full. */
static accel_status cache_new(accel__fp8_state *s) {
    accel__fp8_cache *c = &s->cache;
    c->n = s->n, c->metas = s->metas;
    int cap = 2;
    while (cap < 2 * s->n) cap *= 2;
    c->mask = cap - 1;
    c->state = accel__fp8_cache_state_new(s->n, s->metas[0]->device);
    c->use = c->state ? accel_calloc((size_t)s->n, sizeof *c->use) : NULL;
    c->rows = c->use ? accel_malloc(sizeof *c->rows * (size_t)cap) : NULL;
    if (!c->rows) return accel_last_status();
    for (int k = 0; k < cap; k++) c->rows[k] = -1;
    for (int i = 0; i < s->n; i++) {
        int at = accel__fp8_cache_slot(c, s->metas[i]);
        if (c->rows[at] < 0) c->rows[at] = i; /* a meta met twice keeps its first row */
    }
    return ACCEL_OK;
}

accel_status accel__fp8_state_new(accel_module *root, accel__fp8_state **out) {
    *out = NULL;
    accel__fp8_state *s = accel_calloc(1, sizeof *s);
    if (!s) return accel_last_status();
    accel_status st = accel__fp8_model_metas(root, &s->metas, NULL, &s->n);
    if (!st && s->n) {
        s->buf = accel_tensor_new(ACCEL_F32, 1, (int64_t[]){(int64_t)s->n * ACCEL__FP8_SLOTS}, s->metas[0]->device);
        st = s->buf ? accel__fp8_log_reserve(&s->forward, s->n) : accel_last_status();
        if (!st) st = cache_new(s);
    }
    if (st) accel__fp8_state_free(s);
    else *out = s;
    return st;
}

void accel__fp8_state_free(accel__fp8_state *s) {
    if (!s) return;
    accel_free(s->metas);
    accel_tensor_free(s->buf);
    accel__fp8_log_free(&s->forward);
    accel_tensor_free(s->cache.state);
    accel_free(s->cache.use);
    accel_free(s->cache.rows);
    accel_free(s);
}

accel_status accel__fp8_prepare(accel_accelerator *acc, accel__model *pm) {
    if (accel__fp8_convert_model(pm->m, acc->fp8) || accel__fp8_state_new(pm->m, &pm->fp8)) return accel_last_status();
    int total = pm->fp8->n;
    for (int i = 0; i < acc->n_models; i++) total += acc->models[i].fp8 ? acc->models[i].fp8->n : 0;
    if (accel__fp8_log_reserve(&acc->fp8_backward, total) == ACCEL_OK) return ACCEL_OK;
    accel__fp8_state_free(pm->fp8); /* the caller forgets pm on failure */
    pm->fp8 = NULL;
    return accel_last_status();
}

/* n floats of t from element off, as a 1-d step view. */
static accel_tensor *span(accel_tensor *t, int64_t off, int n) {
    return accel_view_raw(t, 1, (int64_t[]){n}, (int64_t[]){1}, off);
}

/* The current amax row's slots [first, first + n) of a meta (row 2). */
static accel_tensor *amax_span(accel_tensor *meta, int first, int n) {
    return span(meta, 2 * ACCEL__FP8_SLOTS + first, n);
}

/* One all_reduce(MAX) over the current amaxes of every meta of s (those that
 * did not run add their zeros): s->buf [count, n] gathers them, is reduced,
 * and is copied back. */
static accel_status reduce_amaxes(accel_pg *pg, accel__fp8_state *s, int first, int n) {
    accel_tensor *buf = span(s->buf, 0, s->n * n);
    accel_status st = buf ? ACCEL_OK : accel_last_status();
    for (int i = 0; i < s->n && !st; i++)
        st = accel_copy_(span(s->buf, (int64_t)i * n, n), amax_span(s->metas[i], first, n));
    if (!st) st = accel__staged_all_reduce(pg, buf, ACCEL_REDUCE_MAX);
    for (int i = 0; i < s->n && !st; i++)
        st = accel_copy_(amax_span(s->metas[i], first, n), span(s->buf, (int64_t)i * n, n));
    return st;
}

static bool ran_any(const accel__fp8_state *s, const accel__fp8_log *ran) {
    for (int i = 0; i < s->n; i++)
        if (!ran || accel__fp8_log_has(ran, s->metas[i])) return true;
    return false;
}

accel_status accel__fp8_reduce_and_update(accel_pg *pg, accel__fp8_state *s, int first, int n, accel__fp8_recipe r,
                                          const accel__fp8_log *ran) {
    if (!s || first < 0 || n < 1 || first + n > ACCEL__FP8_SLOTS)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel__fp8_reduce_and_update: a model's state and slots within 0..2");
    if (!ran_any(s, ran)) return ACCEL_OK;
    accel_status st = pg && accel_pg_size(pg) > 1 ? reduce_amaxes(pg, s, first, n) : ACCEL_OK;
    for (int i = 0; i < s->n && !st; i++)
        if (!ran || accel__fp8_log_has(ran, s->metas[i])) st = accel__fp8_meta_update(s->metas[i], first, n, r);
    return st;
}
