/* The Accelerator's trackers (log_with, init_trackers, log, end_training) and
 * its hook-up with the logger. */
#include <stdlib.h>
#include <string.h>

#include "accelerator/accelerator_internal.h"
#include "accelerator/tracking_internal.h"
#include "tracking/tracking_internal.h"

const char *accel__default_project_dir(void) {
    const char *v = getenv("ACCEL_PROJECT_DIR");
    return v && *v ? v : ".";
}

/* log_with ("tensorboard,csv", "all", "") into a mask of the wanted built-ins. */
static accel_status parse_log_with(const char *s, unsigned *want) {
    *want = 0;
    while (s && *s) {
        size_t n = strcspn(s, ",");
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), s);
        char *a = name, *b = name + strlen(name);
        while (*a == ' ') a++;
        while (b > a && b[-1] == ' ') *--b = '\0';
        bool known = !*a;
        for (int i = 0; accel_tracker_builtin(i); i++)
            if (!strcmp(a, "all") || !strcmp(a, accel_tracker_builtin(i))) *want |= 1u << i, known = true;
        if (!known)
            return accel_set_error(ACCEL_ERR_INVALID_ARG,
                                   "accel_accelerator_new: unknown tracker '%s' in log_with (choose from "
                                   "tensorboard, jsonl, csv, all; add your own with accel_accelerator_add_tracker)",
                                   a);
        s += n + (s[n] == ',');
    }
    return ACCEL_OK;
}

accel_status accel__tracking_attach(accel_accelerator *acc) {
    const char *lw = acc->o.log_with;
    if (!lw) lw = getenv("ACCEL_LOG_WITH");
    if (!lw) lw = getenv("ACCELERATE_LOG_WITH");
    acc->o.log_with = NULL; /* borrowed: not kept */
    acc->tracking = accel_calloc(1, sizeof *acc->tracking);
    if (!acc->tracking) return accel_last_status();
    accel_status st = parse_log_with(lw, &acc->tracking->want);
    if (st) return st;
    accel__log_attach(acc->rank, acc->world, acc->pg);
    return ACCEL_OK;
}

static void drop_registrations(accel__tracking *tk) {
    accel_free(tk->objs);
    tk->objs = NULL;
    tk->n_objs = 0;
}

void accel__tracking_detach(accel_accelerator *acc) {
    if (!acc->tracking) return;
    accel_accelerator_end_training(acc);
    accel__log_detach(acc->pg);
    drop_registrations(acc->tracking);
    accel_free(acc->tracking->resumed_from);
    accel_free(acc->tracking);
    acc->tracking = NULL;
}

static accel_status add(accel__tracking *tk, accel_tracker *t) {
    accel_tracker **grown = accel_calloc((size_t)tk->n + 1, sizeof *grown);
    if (!grown) {
        accel__tracker_finish(t);
        return accel_last_status();
    }
    if (tk->n) memcpy(grown, tk->trackers, (size_t)tk->n * sizeof *grown);
    accel_free(tk->trackers);
    tk->trackers = grown;
    tk->trackers[tk->n++] = t;
    return ACCEL_OK;
}

/* A failed add finishes and frees t, as add does out of memory, but for a
 * tracker already added: that one stays its accelerator's. */
accel_status accel_accelerator_add_tracker(accel_accelerator *acc, accel_tracker *t) {
    if (!t) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_add_tracker: tracker is NULL");
    if (!accel__tracker_take(t))
        return accel_set_error(ACCEL_ERR_STATE,
                               "accel_accelerator_add_tracker: tracker \"%s\" was already added to an accelerator, "
                               "which owns it (finishes and frees it at end_training or its free): add a tracker "
                               "once", accel_tracker_name(t));
    if (accel__acc_null(acc, "accel_accelerator_add_tracker")) {
        accel_status st = accel_last_status();
        char why[256];
        snprintf(why, sizeof why, "%s", accel_last_error());
        (void)accel__tracker_finish(t); /* its own finish's error is not the cause */
        return accel_set_error(st, "%s", why);
    }
    return add(acc->tracking, t);
}

/* The resume line of the jsonl trackers (the others have no place for it: csv
 * starts a new file each run, TensorBoard a new event file), once they are open. */
static void mark_resume(accel_accelerator *acc) {
    accel__tracking *tk = acc->tracking;
    if (!tk->resumed_from || !tk->initialized || acc->rank != 0) return;
    const accel_value v[4] = {ACCEL_VALUE_S("resumed_from", tk->resumed_from),
                              ACCEL_VALUE_I("epoch", tk->resumed.epoch), ACCEL_VALUE_I("batch", tk->resumed.batch),
                              ACCEL_VALUE_I("optimizer_steps", tk->resumed.optimizer_steps)};
    for (int i = 0; i < tk->n; i++)
        if (!strcmp(accel_tracker_name(tk->trackers[i]), "jsonl") && accel_tracker_log(tk->trackers[i], 4, v, -1))
            accel__warn("load_state: the jsonl log does not say that the run resumed: %s", accel_last_error());
    accel_free(tk->resumed_from);
    tk->resumed_from = NULL;
}

void accel__tracking_resumed(accel_accelerator *acc, const char *dir, const accel_resume_point *at) {
    accel__tracking *tk = acc->tracking;
    accel_free(tk->resumed_from);
    tk->resumed_from = accel_strdup(dir); /* OOM: no line, the resume itself stands */
    tk->resumed = *at;
    mark_resume(acc);
}

/* The trackers init_trackers opened (those after the first `had`) closed:
 * its failure keeps none of them, so the call made again opens each once. */
static void close_opened(accel__tracking *tk, int had) {
    while (tk->n > had) accel__tracker_finish(tk->trackers[--tk->n]);
}

/* Opens the log_with trackers. One that cannot be (an unwritable or missing
 * directory) closes those this call opened. */
static accel_status open_log_with(accel_accelerator *acc, const char *project_name) {
    accel__tracking *tk = acc->tracking;
    int had = tk->n, failed = -1;
    accel_status st = ACCEL_OK;
    for (int i = 0; accel_tracker_builtin(i) && !st; i++) {
        if (!(tk->want & 1u << i)) continue;
        accel_tracker *t = accel_tracker_open(accel_tracker_builtin(i), project_name, acc->project_dir);
        if (t) (void)accel__tracker_take(t); /* the accelerator's: added elsewhere again, refused */
        st = t ? add(tk, t) : accel_last_status();
        failed = i;
    }
    if (!st) return ACCEL_OK;
    char why[1024];
    snprintf(why, sizeof why, "%s", accel_last_error());
    close_opened(tk, had);
    return accel_set_error(st, "accel_accelerator_init_trackers: the %s tracker could not be opened (%s); none of "
                           "log_with's trackers were kept: fix it and call init_trackers again",
                           accel_tracker_builtin(failed), why);
}

/* Tracker t's store_init_configuration, its failure named. */
static accel_status store_config(accel_tracker *t, int n, const accel_value *config) {
    unsigned long mark = accel__error_mark();
    accel_status st = accel_tracker_store_init_configuration(t, n, config);
    if (!st) return ACCEL_OK;
    accel__callback_failed(st, mark, "accel_accelerator_init_trackers: the store_init_configuration of tracker '%s'",
                           accel_tracker_name(t));
    return accel_set_error(st, "%s (the call does not count: fix it and call init_trackers again)",
                           accel_last_error());
}

accel_status accel_accelerator_init_trackers(accel_accelerator *acc, const char *project_name, int n,
                                             const accel_value *config) {
    if (accel__acc_null(acc, "accel_accelerator_init_trackers")) return accel_last_status();
    accel__tracking *tk = acc->tracking;
    if (!project_name || !*project_name)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_init_trackers: project_name is empty");
    /* on every rank, before the call counts: a bad config (n < 0 was taken
     * as none) is the caller's to fix and retry */
    if (accel__values_check("accel_accelerator_init_trackers", n, config)) return accel_last_status();
    /* the call counts on the main process only, which opens the trackers:
     * after its failure to open one, the call made again on every rank (as
     * the error says) must not be refused on the others */
    if (acc->rank != 0) return ACCEL_OK;
    if (tk->initialized)
        return accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_init_trackers: trackers were already initialized");
    /* a failure (a tracker not opened, a config not stored) does not count
     * the call and keeps none of the trackers it opened: made again, it opens
     * them afresh (it was refused as already initialized) and stores the
     * config into every tracker but the user's that took it already */
    int had = tk->n, i = tk->stored; /* (<= had: the trackers only grow, the opened ones closed on failure) */
    accel_status st = open_log_with(acc, project_name);
    while (!st && n > 0 && i < tk->n && !(st = store_config(tk->trackers[i], n, config))) i++;
    if (st) {
        tk->stored = i < had ? i : had; /* trackers[i] failed (or none was reached); the opened ones are closed */
        close_opened(tk, had);
        return st;
    }
    tk->initialized = true;
    mark_resume(acc); /* load_state came first */
    return ACCEL_OK;
}

accel_status accel_accelerator_log(accel_accelerator *acc, int n, const accel_value *values, int64_t step) {
    if (accel__acc_null(acc, "accel_accelerator_log")) return accel_last_status();
    /* on every rank and with no tracker open, as init_trackers checks its
     * config: a bad key refused on the main process only would part the
     * ranks (one returns an error, the others go on to the next collective) */
    if (accel__values_check("accel_accelerator_log", n, values)) return accel_last_status();
    if (acc->rank != 0) return ACCEL_OK;
    for (int i = 0; i < acc->tracking->n; i++) {
        accel_tracker *t = acc->tracking->trackers[i];
        unsigned long mark = accel__error_mark();
        accel_status st = accel_tracker_log(t, n, values, step);
        if (st)
            return accel__callback_failed(st, mark, "accel_accelerator_log: the log of tracker '%s'",
                                          accel_tracker_name(t));
    }
    return ACCEL_OK;
}

accel_tracker *accel_accelerator_get_tracker(accel_accelerator *acc, const char *name) {
    if (accel__acc_null(acc, __func__)) return NULL;
    if (!name) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_get_tracker: name is NULL");
        return NULL;
    }
    if (acc->rank != 0) return NULL;
    for (int i = 0; i < acc->tracking->n; i++)
        if (!strcmp(accel_tracker_name(acc->tracking->trackers[i]), name)) return acc->tracking->trackers[i];
    return NULL;
}

accel_status accel_accelerator_end_training(accel_accelerator *acc) {
    if (accel__acc_null(acc, "accel_accelerator_end_training")) return accel_last_status();
    accel__tracking *tk = acc->tracking;
    accel__first_error first = {0};
    for (int i = 0; i < tk->n; i++) {
        char name[128];
        snprintf(name, sizeof name, "%s", accel_tracker_name(tk->trackers[i])); /* finish frees the tracker */
        unsigned long mark = accel__error_mark();
        accel_status s = accel__tracker_finish(tk->trackers[i]);
        if (s) s = accel__callback_failed(s, mark, "accel_accelerator_end_training: the finish of tracker '%s'", name);
        accel__first_error_note(&first, s);
    }
    accel_free(tk->trackers);
    tk->trackers = NULL;
    tk->n = 0;
    return accel__first_error_return(&first);
}
