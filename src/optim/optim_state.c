/* Optimizer state as named tensors and scalars (for checkpoints). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim_internal.h"

static const char *state_name(const accel_optimizer *opt, int k) {
    if (opt->kind == ACCEL_OPTIM_SGD) return "momentum_buffer";
    return k == 0 ? "exp_avg" : "exp_avg_sq";
}

void accel_named_state_free(accel_named_state *st, int n) {
    if (!st) return;
    for (int i = 0; i < n; i++) {
        accel_free(st[i].name);
        accel_tensor_free(st[i].t);
    }
    accel_free(st);
}

typedef struct list {
    accel_named_state *e;
    int n, cap;
    bool failed;
} list;

static accel_named_state *push(list *l, const char *name) {
    if (l->failed) return NULL;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        accel_named_state *e = accel_malloc((size_t)cap * sizeof *e);
        if (!e) {
            l->failed = true;
            return NULL;
        }
        if (l->n) memcpy(e, l->e, (size_t)l->n * sizeof *e);
        accel_free(l->e);
        l->e = e;
        l->cap = cap;
    }
    accel_named_state *s = &l->e[l->n];
    memset(s, 0, sizeof *s);
    s->name = accel_strdup(name);
    if (!s->name) {
        l->failed = true;
        return NULL;
    }
    l->n++;
    return s;
}

static void push_scalar(list *l, const char *name, double v) {
    accel_named_state *s = push(l, name);
    if (s) s->value = v;
}

static int finish(list *l, accel_named_state **out) {
    if (l->failed) {
        accel_named_state_free(l->e, l->n);
        *out = NULL;
        return -1;
    }
    *out = l->e;
    return l->n;
}

/* Each segment's param group (malloc'd), or NULL + error. */
static int *seg_groups(const accel_optimizer *opt) {
    int *group_of = accel_malloc((size_t)opt->n_segs * sizeof *group_of + 1);
    for (int i = 0; group_of && i < opt->n_segs; i++) group_of[i] = opt->segs[i].group;
    return group_of;
}

/* Each param group's segment count (calloc'd), or NULL + error. */
static int *seg_group_sizes(const accel_optimizer *opt) {
    int *sizes = accel_calloc((size_t)opt->n_groups + 1, sizeof *sizes);
    for (int i = 0; sizes && i < opt->n_segs; i++) sizes[opt->segs[i].group]++;
    return sizes;
}

int accel_optimizer_state(accel_optimizer *opt, accel_named_state **out) {
    if (!opt || !out) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_optimizer_state: NULL argument");
        return -1;
    }
    if (!accel__optimizer_usable(opt, "accel_optimizer_state")) return -1;
    list l = {0};
    char name[96];
    int *sizes = seg_group_sizes(opt);
    l.failed = !sizes;
    push_scalar(&l, "step", (double)opt->steps);
    for (int i = 0; i < opt->n_segs; i++) {
        accel__segment *s = &opt->segs[i];
        if (s->step == 0) continue;
        snprintf(name, sizeof name, "state.%d.step", i);
        push_scalar(&l, name, (double)s->step);
        int ns = accel__n_state(opt, s->group);
        for (int k = 0; k < ns; k++) {
            snprintf(name, sizeof name, "state.%d.%s", i, state_name(opt, k));
            accel_named_state *e = push(&l, name);
            if (!e) break;
            e->t = accel__seg_state_tensor(opt, s, k);
            if (!e->t) l.failed = true;
        }
    }
    for (int g = 0; g < opt->n_groups; g++) {
        const accel_optim_hparams *h = &opt->groups[g].h;
        const struct { const char *key; double v; bool sgd, adam; } fields[] = {
            {"lr", h->lr, true, true},
            {"weight_decay", h->weight_decay, true, true},
            {"momentum", h->momentum, true, false},
            {"dampening", h->dampening, true, false},
            {"nesterov", h->nesterov ? 1.0 : 0.0, true, false},
            {"beta1", h->beta1, false, true},
            {"beta2", h->beta2, false, true},
            {"eps", h->eps, false, true},
        };
        for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
            if (opt->kind == ACCEL_OPTIM_SGD ? !fields[f].sgd : !fields[f].adam) continue;
            snprintf(name, sizeof name, "param_groups.%d.%s", g, fields[f].key);
            push_scalar(&l, name, fields[f].v);
        }
        /* which parameters the group holds, as torch's param_groups[g]["params"]
         * says: segments are numbered group after group, so its count does */
        snprintf(name, sizeof name, "param_groups.%d." ACCEL__GROUP_SIZE, g);
        if (sizes) push_scalar(&l, name, sizes[g]);
    }
    accel_free(sizes);
    return finish(&l, out);
}

/* The scalar of an entry (a one-element tensor counts); NAN + error otherwise. */
static bool entry_scalar(const accel_named_state *e, double *v) {
    if (!e->t) {
        *v = e->value;
        return true;
    }
    if (!accel_tensor_check(e->t, "accel_optimizer_load_state", e->name)) return false;
    if (accel_numel(e->t) != 1) {
        accel_set_error(ACCEL_ERR_FORMAT, "optimizer state: \"%s\" should be a scalar, has %lld elements",
                        e->name, (long long)accel_numel(e->t));
        return false;
    }
    *v = accel_item(e->t);
    return true;
}

long accel__parse_indexed(const char *name, const char *prefix, const char **rest) {
    size_t pl = strlen(prefix);
    if (strncmp(name, prefix, pl) != 0) return -1;
    char *end;
    long i = strtol(name + pl, &end, 10);
    if (end == name + pl || *end != '.' || i < 0) return -1;
    *rest = end + 1;
    return i;
}

static accel_status bad_entry(const char *name, const char *why) {
    return accel_set_error(ACCEL_ERR_FORMAT, "accel_optimizer_load_state: entry \"%s\": %s", name, why);
}

/* A step count from a file: a whole number >= 0 (a NaN or a fraction was
 * cast to int64 as it came, a negative optimizer-wide count kept). */
static bool is_count(double v) { return v >= 0 && v <= 4e18 && v == floor(v); }

/* Why a saved param group value of field is out of the range the
 * optimizer's constructor takes (resolve_hparams; lr may be 0: a schedule can
 * end there), NULL when it is in it: a file's beta1 of 7 or lr of -1 was
 * kept, and the next steps diverged silently. */
static const char *out_of_range(const char *field, double v, bool sgd) {
    if (!sgd && (strcmp(field, "beta1") == 0 || strcmp(field, "beta2") == 0))
        return v >= 0 && v < 1 ? NULL : "a beta must be in [0, 1)";
    if (strcmp(field, "dampening") == 0) return isfinite(v) ? NULL : "dampening must be a finite number";
    return v >= 0 && isfinite(v) ? NULL : "must be a finite number >= 0";
}

/* The entry e of segment s: checked, and written where `apply`; when
 * checking, a tensor entry that is a view of s's own state (the state
 * accel_optimizer_state handed out, loaded back) sets own[s]. */
static accel_status load_segment_entry(accel_optimizer *opt, accel__segment *s, const accel_named_state *e,
                                       const char *field, bool apply, bool *own) {
    if (strcmp(field, "step") == 0) {
        double v;
        if (!entry_scalar(e, &v)) return accel_last_status();
        if (!is_count(v)) return bad_entry(e->name, "the step must be a whole number >= 0");
        if (apply) s->step = (int64_t)v;
        return ACCEL_OK;
    }
    int ns = accel__n_state(opt, s->group);
    for (int k = 0; k < ns; k++) {
        if (strcmp(field, state_name(opt, k)) != 0) continue;
        if (!e->t) return bad_entry(e->name, "is a scalar, expected a tensor");
        if (!accel_tensor_check(e->t, "accel_optimizer_load_state", e->name)) return accel_last_status();
        if (accel_numel(e->t) != s->numel) {
            char msg[96];
            snprintf(msg, sizeof msg, "has %lld elements, the parameter has %lld",
                     (long long)accel_numel(e->t), (long long)s->numel);
            return bad_entry(e->name, msg);
        }
        if (e->t->device.type == ACCEL_DEV_META) return bad_entry(e->name, "is on meta (it has no data)");
        if (!apply && s->state[k] && accel__device_ptr(e->t) == accel__device_ptr(s->state[k])) own[s - opt->segs] = true;
        return apply ? accel__seg_state_load(opt, s, k, e->t) : ACCEL_OK;
    }
    return bad_entry(e->name, "unknown state for this optimizer");
}

/* The entry e of param group `group`: checked, and written into h (the
 * group's live hparams, or the check's copy of them). */
static accel_status load_group_entry(accel_optimizer *opt, int group, const accel_named_state *e, const char *field,
                                     accel_optim_hparams *h) {
    double v;
    if (!entry_scalar(e, &v)) return accel_last_status();
    bool sgd = opt->kind == ACCEL_OPTIM_SGD;
    const char *why = out_of_range(field, v, sgd);
    if (why) return bad_entry(e->name, why);
    if (strcmp(field, "lr") == 0) h->lr = v;
    else if (strcmp(field, "weight_decay") == 0) h->weight_decay = v;
    else if (sgd && strcmp(field, "momentum") == 0) {
        /* against the group's state, not its live momentum (a write through
         * accel_optimizer_hparams may have switched that) */
        if ((v != 0.0) != (accel__n_state(opt, group) != 0))
            return bad_entry(e->name, "momentum on/off differs from this optimizer's");
        h->momentum = v;
    } else if (sgd && strcmp(field, "dampening") == 0) h->dampening = v;
    else if (sgd && strcmp(field, "nesterov") == 0) h->nesterov = v != 0.0;
    else if (!sgd && strcmp(field, "beta1") == 0) h->beta1 = v;
    else if (!sgd && strcmp(field, "beta2") == 0) h->beta2 = v;
    else if (!sgd && strcmp(field, "eps") == 0) h->eps = v;
    else if (strcmp(field, ACCEL__GROUP_SIZE) == 0) (void)0; /* nothing to write: accel__check_group_sizes */
    else return bad_entry(e->name, "unknown param group field");
    return ACCEL_OK;
}

/* Every entry of st checked (own: load_segment_entry's), and written where
 * `apply`; else the groups' values go to hs (a copy of each group's hparams). */
static accel_status load_entries(accel_optimizer *opt, int n, const accel_named_state *st, bool apply, bool *own,
                                 accel_optim_hparams *hs) {
    for (int i = 0; i < n; i++) {
        const accel_named_state *e = &st[i];
        if (!e->name) return accel_set_error(ACCEL_ERR_FORMAT, "accel_optimizer_load_state: entry %d has no name", i);
        const char *rest;
        long idx;
        accel_status rc;
        if (strcmp(e->name, "step") == 0) {
            double v;
            if (!entry_scalar(e, &v)) return accel_last_status();
            if (!is_count(v)) return bad_entry(e->name, "the step must be a whole number >= 0");
            if (apply) opt->steps = (int64_t)v;
            continue;
        }
        if ((idx = accel__parse_indexed(e->name, "state.", &rest)) >= 0) {
            if (idx >= opt->n_segs) return bad_entry(e->name, "no such parameter in this optimizer");
            rc = load_segment_entry(opt, &opt->segs[idx], e, rest, apply, own);
        } else if ((idx = accel__parse_indexed(e->name, "param_groups.", &rest)) >= 0) {
            if (idx >= opt->n_groups) return bad_entry(e->name, "no such param group in this optimizer");
            rc = load_group_entry(opt, (int)idx, e, rest, apply ? &opt->groups[idx].h : &hs[idx]);
        } else {
            rc = bad_entry(e->name, "unknown name");
        }
        if (rc != ACCEL_OK) return rc;
    }
    return ACCEL_OK;
}

bool accel__group_size_entry(const char *name, int *group) {
    const char *rest;
    long g = accel__parse_indexed(name, "param_groups.", &rest);
    if (g < 0 || g > INT_MAX || strcmp(rest, ACCEL__GROUP_SIZE) != 0) return false;
    if (group) *group = (int)g;
    return true;
}

int *accel__group_sizes(const int *group_of, int members, int ng) {
    int *sizes = accel_calloc((size_t)ng + 1, sizeof *sizes);
    for (int u = 0; sizes && u < members; u++) sizes[group_of[u]]++;
    return sizes;
}

accel_status accel__check_group_sizes(const char *fn, int n, const accel_named_state *st, int ng, const int *group_of,
                                      int members) {
    int recorded = 0, first_missing = -1;
    unsigned char *seen = accel_calloc((size_t)ng + 1, 1);
    int *sizes = accel__group_sizes(group_of, members, ng);
    if (!seen || !sizes) {
        accel_free(seen);
        accel_free(sizes);
        return accel_last_status();
    }
    accel_status rc = ACCEL_OK;
    for (int i = 0; i < n && !rc; i++) {
        int g;
        double v;
        if (!st[i].name || !accel__group_size_entry(st[i].name, &g)) continue;
        if (!entry_scalar(&st[i], &v)) rc = accel_last_status();
        else if (g >= ng)
            rc = accel_set_error(ACCEL_ERR_FORMAT, "%s: entry \"%s\": no such param group in this optimizer (%d)", fn,
                                 st[i].name, ng);
        else if (!is_count(v))
            rc = accel_set_error(ACCEL_ERR_FORMAT, "%s: entry \"%s\": a parameter count must be a whole number >= 0",
                                 fn, st[i].name);
        else if (v != sizes[g]) /* torch: "loaded state dict contains a parameter group that doesn't match the size
                                 * of optimizer's group" */
            rc = accel_set_error(ACCEL_ERR_FORMAT, "%s: param group %d holds %.0f parameter%s in the saved state, "
                                 "%d in this optimizer (it was saved from an optimizer whose parameters were "
                                 "grouped otherwise)", fn, g, v, v == 1 ? "" : "s", sizes[g]);
        else if (!seen[g]) {
            seen[g] = 1;
            recorded++;
        }
    }
    for (int g = 0; g < ng && first_missing < 0; g++)
        if (!seen[g]) first_missing = g;
    accel_free(seen);
    accel_free(sizes);
    /* a state that records the groups records them all: one without param group g
     * was saved from an optimizer with fewer groups (torch: "loaded state dict has a
     * different number of parameter groups"); one that records none predates the
     * record, and cannot be checked */
    if (!rc && recorded > 0 && first_missing >= 0)
        rc = accel_set_error(ACCEL_ERR_FORMAT, "%s: the saved state records %d param group%s, this optimizer has %d "
                             "(no \"param_groups.%d." ACCEL__GROUP_SIZE "\")", fn, recorded, recorded == 1 ? "" : "s",
                             ng, first_missing);
    return rc;
}

/* Each group's hparams as the loaded entries leave them, in range together:
 * each entry is checked alone as it is read, but a combination (nesterov with
 * a dampening) was taken and refused by the next step, naming the wrong
 * culprit (the live hparams). */
static accel_status check_loaded_groups(const accel_optimizer *opt, const accel_optim_hparams *hs) {
    for (int g = 0; g < opt->n_groups; g++) {
        const char *bad = accel__hparams_bad(opt->kind, &hs[g], true);
        if (bad)
            return accel_set_error(ACCEL_ERR_FORMAT, "accel_optimizer_load_state: param group %d as loaded: %s", g,
                                   bad);
    }
    return ACCEL_OK;
}

/* load_entries' check of every entry, writing nothing; *own (the caller
 * frees it; NULL when the arguments or the allocation failed): which
 * segments have entries that are views of their own state. */
static accel_status check_entries(accel_optimizer *opt, int n, const accel_named_state *st, bool **own) {
    *own = NULL;
    if (!opt || n < 0 || (n > 0 && !st))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_optimizer_load_state: NULL argument");
    if (!accel__optimizer_usable(opt, "accel_optimizer_load_state")) return accel_last_status();
    if (!(*own = accel_calloc((size_t)opt->n_segs + 1, sizeof **own))) return accel_last_status();
    accel_optim_hparams *hs = accel_malloc(((size_t)opt->n_groups + 1) * sizeof *hs);
    if (!hs) return accel_last_status();
    for (int g = 0; g < opt->n_groups; g++) hs[g] = opt->groups[g].h;
    accel_status rc = load_entries(opt, n, st, false, *own, hs);
    if (!rc) rc = check_loaded_groups(opt, hs);
    accel_free(hs);
    if (rc) return rc;
    int *group_of = seg_groups(opt);
    if (!group_of) return accel_last_status();
    rc = accel__check_group_sizes("accel_optimizer_load_state", n, st, opt->n_groups, group_of, opt->n_segs);
    accel_free(group_of);
    return rc;
}

accel_status accel__optimizer_check_state(accel_optimizer *opt, int n, const accel_named_state *st) {
    bool *own;
    accel_status rc = check_entries(opt, n, st, &own);
    accel_free(own);
    return rc;
}

accel_status accel_optimizer_load_state(accel_optimizer *opt, int n, const accel_named_state *st) {
    /* Every entry checked before anything is written: a bad one (a beta out
     * of range, a wrong size, an unknown name) leaves the optimizer's state
     * as it was, where it once found the moments already zeroed. */
    bool *own;
    accel_status rc = check_entries(opt, n, st, &own);
    if (!own) return rc;
    /* Segments without entries have not stepped: start them from zero. A
     * segment whose entries are views of its own state (the optimizer's
     * state loaded back into it) is not: zeroed first, it read its zeros. */
    for (int i = 0; i < opt->n_segs && !rc; i++) {
        accel__segment *s = &opt->segs[i];
        s->step = 0;
        if (!own[i] && accel__seg_state_zero(opt, s) != ACCEL_OK) rc = accel_last_status();
    }
    accel_free(own);
    return rc ? rc : load_entries(opt, n, st, true, NULL, NULL);
}
