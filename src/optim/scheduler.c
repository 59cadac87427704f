/* LR schedulers: LambdaLR with transformers' warmup schedules. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "optim_internal.h"

struct accel_lr_scheduler {
    accel_optimizer *opt;        /* borrowed, linked: NULL once the optimizer was freed (opt_freed) */
    accel_sched_kind kind;
    int64_t warmup, total;
    accel_lr_lambda_fn fn;       /* ACCEL_SCHED_LAMBDA */
    void *ctx;
    int64_t last_epoch;
    int n_groups;
    double *base_lrs;            /* [n_groups] */
    accel__link *links;          /* the accelerator that prepared it */
    uint32_t magic;              /* ACCEL__MAGIC_SCHEDULER while alive (core/handle.h) */
};

static const char *SCHED_NAMES[] = {"constant", "constant_with_warmup", "linear", "cosine", "lambda"};

int accel_sched_kind_parse(const char *s) {
    for (int k = 0; s && k < ACCEL_SCHED_LAMBDA; k++)
        if (strcmp(s, SCHED_NAMES[k]) == 0) return k;
    return -1;
}

const char *accel_sched_kind_name(accel_sched_kind kind) {
    return (unsigned)kind <= ACCEL_SCHED_LAMBDA ? SCHED_NAMES[kind] : "?";
}

static double max1(int64_t x) { return x > 1 ? (double)x : 1.0; }

static double factor(const accel_lr_scheduler *s, int64_t step) {
    if (s->kind == ACCEL_SCHED_LAMBDA) return s->fn(step, s->ctx);
    if (s->kind == ACCEL_SCHED_CONSTANT) return 1.0;
    if (step < s->warmup) return (double)step / max1(s->warmup);
    double progress = (double)(step - s->warmup) / max1(s->total - s->warmup);
    switch (s->kind) {
    case ACCEL_SCHED_LINEAR:
        return fmax(0.0, (double)(s->total - step) / max1(s->total - s->warmup));
    case ACCEL_SCHED_COSINE:
        return fmax(0.0, 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * progress)));
    default:
        return 1.0;
    }
}

/* Sets every group's lr = base * factor(last_epoch); a factor (a lambda's)
 * that makes an lr NaN, infinite or negative is refused before any is set. */
static accel_status apply(accel_lr_scheduler *s) {
    double f = factor(s, s->last_epoch);
    for (int g = 0; g < s->n_groups; g++)
        if (!(s->base_lrs[g] * f >= 0 && isfinite(s->base_lrs[g] * f)))
            return accel_set_error(ACCEL_ERR_INVALID_ARG,
                                   "accel_lr_scheduler: the factor %g at step %lld gives group %d an lr of %g (an lr "
                                   "must be a finite number >= 0)",
                                   f, (long long)s->last_epoch, g, s->base_lrs[g] * f);
    for (int g = 0; g < s->n_groups; g++) accel_optimizer_set_lr(s->opt, g, s->base_lrs[g] * f);
    return ACCEL_OK;
}

/* The scheduler's link on its optimizer (core/link.h): the optimizer is
 * being freed, so the scheduler refuses every call that would set or read
 * its lrs (accel__scheduler_alive). */
static void opt_freed(void *owner, void *obj) {
    (void)obj;
    ((accel_lr_scheduler *)owner)->opt = NULL; /* its link went with it */
}

accel_optimizer *accel__scheduler_optimizer(const accel_lr_scheduler *s) { return s->opt; }

bool accel__scheduler_alive(const accel_lr_scheduler *s, const char *fn) {
    if (ACCEL__DEAD(s, ACCEL__MAGIC_SCHEDULER, fn, "scheduler")) return false;
    if (s->opt) return true;
    accel_set_error(ACCEL_ERR_STATE, "%s: the scheduler's optimizer was freed before it (accel_optimizer_free): "
                    "it has no lr to set, so it can only be freed (free the optimizer after its scheduler)", fn);
    return false;
}

static accel_lr_scheduler *make(accel_optimizer *opt, accel_sched_kind kind, int64_t warmup,
                                int64_t total, accel_lr_lambda_fn fn, void *ctx) {
    if (!opt || opt->n_groups == 0) {
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "accel_lr_scheduler_new: optimizer is NULL or has no param groups");
        return NULL;
    }
    if ((unsigned)kind > ACCEL_SCHED_LAMBDA || warmup < 0 || total < 0) {
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "accel_lr_scheduler_new: bad kind %d or negative steps (warmup %lld, total %lld)",
                        (int)kind, (long long)warmup, (long long)total);
        return NULL;
    }
    accel_lr_scheduler *s = accel_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->base_lrs = accel_malloc((size_t)opt->n_groups * sizeof *s->base_lrs);
    if (!s->base_lrs || accel__link_observe(&opt->links, opt_freed, s)) {
        accel_free(s->base_lrs);
        accel_free(s);
        return NULL;
    }
    s->opt = opt;
    s->magic = ACCEL__MAGIC_SCHEDULER;
    s->kind = kind;
    s->warmup = warmup;
    s->total = total;
    s->fn = fn;
    s->ctx = ctx;
    s->n_groups = opt->n_groups;
    for (int g = 0; g < s->n_groups; g++) s->base_lrs[g] = opt->groups[g].h.lr;
    if (apply(s) != ACCEL_OK) {
        accel_lr_scheduler_free(s);
        return NULL;
    }
    return s;
}

accel_lr_scheduler *accel_lr_scheduler_new(accel_optimizer *opt, accel_sched_kind kind,
                                           int64_t warmup_steps, int64_t total_steps) {
    if (kind == ACCEL_SCHED_LAMBDA) {
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "accel_lr_scheduler_new: use accel_lr_scheduler_lambda for a custom function");
        return NULL;
    }
    return make(opt, kind, warmup_steps, total_steps, NULL, NULL);
}

accel_lr_scheduler *accel_lr_scheduler_lambda(accel_optimizer *opt, accel_lr_lambda_fn fn,
                                              void *ctx) {
    if (!fn) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_lr_scheduler_lambda: fn is NULL");
        return NULL;
    }
    return make(opt, ACCEL_SCHED_LAMBDA, 0, 0, fn, ctx);
}

accel__link **accel__scheduler_links(accel_lr_scheduler *s) { return &s->links; }

void accel_lr_scheduler_free(accel_lr_scheduler *s) {
    if (!s || ACCEL__DEAD(s, ACCEL__MAGIC_SCHEDULER, "accel_lr_scheduler_free", "scheduler")) return;
    accel__link_detach_all(&s->links, s);
    if (s->opt) accel__link_remove(&s->opt->links, s);
    accel_free(s->base_lrs);
    s->magic = 0;
    accel_free(s);
}

accel_status accel_lr_scheduler_step(accel_lr_scheduler *s) {
    if (!s) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_lr_scheduler_step: scheduler is NULL");
    if (!accel__scheduler_alive(s, "accel_lr_scheduler_step")) return accel_last_status();
    s->last_epoch++;
    if (apply(s) == ACCEL_OK) return ACCEL_OK;
    s->last_epoch--; /* refused: the step did not happen */
    return accel_last_status();
}

double accel_lr_scheduler_get_lr(const accel_lr_scheduler *s, int group) {
    if (!s) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_lr_scheduler_get_lr: scheduler is NULL");
        return NAN;
    }
    if (!accel__scheduler_alive(s, "accel_lr_scheduler_get_lr")) return NAN;
    return accel_optimizer_get_lr(s->opt, group);
}

int64_t accel_lr_scheduler_last_epoch(const accel_lr_scheduler *s) {
    if (!s) accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_lr_scheduler_last_epoch: scheduler is NULL");
    return s && !ACCEL__DEAD(s, ACCEL__MAGIC_SCHEDULER, "accel_lr_scheduler_last_epoch", "scheduler") ? s->last_epoch : 0;
}

int accel_lr_scheduler_state(accel_lr_scheduler *s, accel_named_state **out) {
    if (!s || !out) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_lr_scheduler_state: NULL argument");
        return -1;
    }
    if (ACCEL__DEAD(s, ACCEL__MAGIC_SCHEDULER, "accel_lr_scheduler_state", "scheduler")) return -1;
    int n = 1 + s->n_groups;
    accel_named_state *e = accel_calloc((size_t)n, sizeof *e);
    if (!e) return -1;
    char name[48];
    for (int i = 0; i < n; i++) {
        if (i == 0)
            snprintf(name, sizeof name, "last_epoch");
        else
            snprintf(name, sizeof name, "base_lrs.%d", i - 1);
        e[i].name = accel_strdup(name);
        e[i].value = i == 0 ? (double)s->last_epoch : s->base_lrs[i - 1];
        if (!e[i].name) {
            accel_named_state_free(e, n);
            return -1;
        }
    }
    *out = e;
    return n;
}

/* g of "base_lrs.<g>" (decimal digits only, g < n_groups), or -1. sscanf's
 * %d wrapped "base_lrs.4294967296" to group 0, whose base lr a file could so
 * overwrite under another name. */
static int base_lr_index(const char *name, int n_groups) {
    static const char PREFIX[] = "base_lrs.";
    if (strncmp(name, PREFIX, sizeof PREFIX - 1) != 0 || !name[sizeof PREFIX - 1]) return -1;
    long g = 0;
    for (const char *p = name + sizeof PREFIX - 1; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        if ((g = g * 10 + (*p - '0')) >= n_groups) return -1; /* also before it could overflow */
    }
    return (int)g;
}

accel_status accel_lr_scheduler_load_state(accel_lr_scheduler *s, int n,
                                           const accel_named_state *st) {
    if (!s || n < 0 || (n > 0 && !st))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_lr_scheduler_load_state: NULL argument");
    if (!accel__scheduler_alive(s, "accel_lr_scheduler_load_state")) return accel_last_status();
    /* Every entry is checked before any is kept: a bad one left the entries
     * before it loaded. The ranges are the optimizer's (accel_optimizer_load_state):
     * a last_epoch of 1e300 was cast to int64 (undefined), -3 or 2.5 kept, and
     * a base lr of -1 or inf scheduled every later lr from it, silently. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            double v = st[i].t ? accel_item(st[i].t) : st[i].value;
            bool epoch = st[i].name && strcmp(st[i].name, "last_epoch") == 0;
            int g = epoch || !st[i].name ? -1 : base_lr_index(st[i].name, s->n_groups);
            bool base = g >= 0;
            if (!st[i].name || isnan(v))
                return accel_set_error(ACCEL_ERR_FORMAT,
                                       "accel_lr_scheduler_load_state: entry %d has no name or no scalar", i);
            if (!epoch && !base)
                return accel_set_error(ACCEL_ERR_FORMAT, "accel_lr_scheduler_load_state: unknown entry \"%s\"",
                                       st[i].name);
            if (epoch ? !(v >= 0 && v <= 4e18 && v == floor(v)) : !(v >= 0 && isfinite(v)))
                return accel_set_error(ACCEL_ERR_FORMAT, "accel_lr_scheduler_load_state: entry \"%s\" is %g: %s",
                                       st[i].name, v,
                                       epoch ? "last_epoch must be a whole number >= 0"
                                             : "a base lr must be a finite number >= 0");
            if (pass == 1 && epoch) s->last_epoch = (int64_t)v;
            else if (pass == 1) s->base_lrs[g] = v;
        }
    return apply(s);
}
