/* Trackers: the generic object, the built-in registry, and the "jsonl" and
 * "csv" trackers. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/afile.h"
#include "core/core_internal.h"
#include "tracking/tb_internal.h"
#include "tracking/tracking_internal.h"

struct accel_tracker {
    const accel_tracker_ops *ops;
    void *ctx;
    bool builtin;
    bool added; /* an accelerator owns it (accel__tracker_take) */
};

static const struct builtin {
    const accel_tracker_ops *ops;
    void *(*open)(const char *run_dir);
} builtins[] = {
    {&accel__tb_ops, accel__tb_open},
    {&accel__jsonl_ops, accel__jsonl_open},
    {&accel__csv_ops, accel__csv_open},
};
#define N_BUILTINS ((int)(sizeof builtins / sizeof *builtins))

const char *accel_tracker_builtin(int i) { return i >= 0 && i < N_BUILTINS ? builtins[i].ops->name : NULL; }

accel_tracker *accel_tracker_new(const accel_tracker_ops *ops, void *ctx) {
    if (!ops || !ops->name || !*ops->name) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_tracker_new: ops or ops->name is NULL or empty");
        return NULL;
    }
    accel_tracker *t = accel_calloc(1, sizeof *t);
    if (t) t->ops = ops, t->ctx = ctx;
    return t;
}

accel_tracker *accel_tracker_open(const char *name, const char *project, const char *logging_dir) {
    if (!name || !project || !*project) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_tracker_open: tracker name or project name is NULL or empty");
        return NULL;
    }
    int k = 0;
    while (k < N_BUILTINS && strcmp(name, builtins[k].ops->name)) k++;
    if (k == N_BUILTINS) {
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "accel_tracker_open: unknown tracker '%s' (built in: tensorboard, jsonl, csv; add your "
                        "own with accel_tracker_new)", name);
        return NULL;
    }
    char dir[4096];
    if (snprintf(dir, sizeof dir, "%s/%s", logging_dir && *logging_dir ? logging_dir : ".", project) >=
        (int)sizeof dir) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_tracker_open: logging directory too long");
        return NULL;
    }
    if (accel__mkdirs(dir)) return NULL;
    void *ctx = builtins[k].open(dir);
    if (!ctx) return NULL;
    accel_tracker *t = accel_tracker_new(builtins[k].ops, ctx);
    if (!t) {
        builtins[k].ops->finish(ctx);
        return NULL;
    }
    t->builtin = true;
    return t;
}

const char *accel_tracker_name(const accel_tracker *t) {
    if (!t) accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_tracker_name: tracker is NULL");
    return t ? t->ops->name : NULL;
}
void *accel_tracker_context(const accel_tracker *t) { return t && !t->builtin ? t->ctx : NULL; }

/* Keys and strings are text, as Python's str in Accelerate: a tag that is
 * not UTF-8 made tensorboard's reader fail on the whole event file ("String
 * field had bad UTF-8"), and only the jsonl tracker refused it. */
accel_status accel__values_check(const char *fn, int n, const accel_value *v) {
    if (n < 0) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %d values (a count, >= 0)", fn, n);
    if (n > 0 && !v) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %d values at NULL", fn, n);
    for (int i = 0; i < n; i++) {
        if (!v[i].key || !*v[i].key)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: value %d has no key", fn, i);
        if ((unsigned)v[i].kind > ACCEL_VALUE_STRING)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: '%s' has an unknown kind %d", fn, v[i].key,
                                   (int)v[i].kind);
        if (!accel__is_utf8(v[i].key))
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: key '%s' (value %d) is not valid UTF-8", fn, v[i].key,
                                   i);
        if (v[i].kind == ACCEL_VALUE_STRING && !v[i].s)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: string '%s' is NULL", fn, v[i].key);
        if (v[i].kind == ACCEL_VALUE_STRING && !accel__is_utf8(v[i].s))
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: string '%s' is not valid UTF-8", fn, v[i].key);
    }
    return ACCEL_OK;
}

accel_status accel_tracker_store_init_configuration(accel_tracker *t, int n, const accel_value *config) {
    if (!t) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_tracker_store_init_configuration: tracker is NULL");
    accel_status st = accel__values_check("accel_tracker_store_init_configuration", n, config);
    return st || !t->ops->store_init_configuration ? st : t->ops->store_init_configuration(t->ctx, n, config);
}

accel_status accel_tracker_log(accel_tracker *t, int n, const accel_value *values, int64_t step) {
    if (!t) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_tracker_log: tracker is NULL");
    accel_status st = accel__values_check("accel_tracker_log", n, values);
    return st || !t->ops->log ? st : t->ops->log(t->ctx, n, values, step);
}

bool accel__tracker_take(accel_tracker *t) {
    if (t->added) return false;
    t->added = true;
    return true;
}

accel_status accel__tracker_finish(accel_tracker *t) {
    if (!t) return ACCEL_OK;
    accel_status st = t->ops->finish ? t->ops->finish(t->ctx) : ACCEL_OK;
    accel_free(t);
    return st;
}

accel_status accel_tracker_finish(accel_tracker *t) {
    if (t && t->added)
        return accel_set_error(ACCEL_ERR_STATE, "accel_tracker_finish: tracker \"%s\" was added to an accelerator, "
                               "which finishes and frees it (accel_accelerator_end_training or its free): finishing "
                               "it here too freed it twice", t->ops->name);
    return accel__tracker_finish(t);
}

/* ---------------------------------------------------------------- JSON */

/* A JSON value; non-finite floats become null (JSON has no NaN). */
static json_t *json_of(const accel_value *v) {
    switch (v->kind) {
    case ACCEL_VALUE_FLOAT: return isfinite(v->f) ? json_real(v->f) : json_null();
    case ACCEL_VALUE_INT: return json_integer(v->i);
    case ACCEL_VALUE_BOOL: return json_boolean(v->i);
    case ACCEL_VALUE_STRING: return json_string(v->s);
    }
    return json_null();
}

static json_t *json_object_of(int n, const accel_value *v) {
    json_t *o = json_object();
    for (int i = 0; o && i < n; i++)
        if (json_object_set_new(o, v[i].key, json_of(&v[i]))) {
            json_decref(o);
            return NULL;
        }
    return o;
}

accel_status accel__config_json(const char *path, int n, const accel_value *config) {
    json_t *o = json_object_of(n, config);
    char *text = o ? json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(o);
    if (!text) return accel_set_error(ACCEL_ERR_INVALID_ARG, "tracker: config is not valid UTF-8 JSON");
    size_t len = strlen(text);
    char *withnl = realloc(text, len + 2);
    if (!withnl) {
        free(text);
        return accel_set_error(ACCEL_ERR_OOM, "tracker: out of memory");
    }
    withnl[len] = '\n';
    withnl[len + 1] = '\0';
    accel_status st = accel__afile_write_all(path, withnl, len + 1);
    free(withnl);
    return st;
}

typedef struct run_file {
    char *dir;
    char path[4200];
    int fd; /* O_APPEND */
} run_file;

/* readable: opened for reading too (the csv tracker reads its own file back to widen it). */
static run_file *run_file_open(const char *dir, const char *name, bool readable) {
    run_file *r = accel_calloc(1, sizeof *r);
    if (!r) return NULL;
    snprintf(r->path, sizeof r->path, "%s/%s", dir, name);
    r->fd = -1;
    if (!(r->dir = accel_strdup(dir)) ||
        (r->fd = open(r->path, (readable ? O_RDWR : O_WRONLY) | O_CREAT | O_APPEND | O_CLOEXEC, 0666)) < 0) {
        if (r->dir) accel_set_error(ACCEL_ERR_IO, "tracker: cannot open %s: %s", r->path, strerror(errno));
        accel_free(r->dir);
        accel_free(r);
        return NULL;
    }
    return r;
}

static accel_status run_file_close(run_file *r) {
    accel_status st = r->fd >= 0 && close(r->fd)
                          ? accel_set_error(ACCEL_ERR_IO, "tracker: cannot close %s: %s", r->path, strerror(errno))
                          : ACCEL_OK;
    accel_free(r->dir);
    accel_free(r);
    return st;
}

static accel_status store_config_json(void *ctx, int n, const accel_value *config) {
    run_file *r = ctx;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", r->dir);
    return accel__config_json(path, n, config);
}

/* ---------------------------------------------------------------- a record's step */

/* The step a jsonl/csv record is written with: `step`, or a value named
 * "step" (Hugging Face's no_trainer examples log {"step": completed_steps}
 * with step=completed_steps). A value equal to the step is that step,
 * written once; one that differs, or no whole number, is refused naming
 * both (jsonl wrote the value in place of the step, csv dropped it). With no
 * step given the value is the record's step. */
static accel_status record_step(const char *who, int n, const accel_value *values, int64_t *step) {
    for (int i = 0; i < n; i++) {
        const accel_value *v = &values[i];
        if (strcmp(v->key, "step")) continue;
        bool whole = v->kind == ACCEL_VALUE_INT ||
                     (v->kind == ACCEL_VALUE_FLOAT && v->f == floor(v->f) && fabs(v->f) < 9.2e18);
        int64_t s = v->kind == ACCEL_VALUE_INT ? v->i : whole ? (int64_t)v->f : 0;
        if (!whole || s < 0)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: a value named \"step\" is the record's step: it must "
                                   "be a whole number >= 0", who);
        if (*step >= 0 && s != *step)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: a value named \"step\" (%lld) differs from the step "
                                   "(%lld): a record has one step", who, (long long)s, (long long)*step);
        *step = s;
    }
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- jsonl */

void *accel__jsonl_open(const char *run_dir) { return run_file_open(run_dir, "log.jsonl", false); }

static accel_status jsonl_log(void *ctx, int n, const accel_value *values, int64_t step) {
    run_file *r = ctx;
    if (record_step("jsonl tracker", n, values, &step)) return accel_last_status();
    json_t *o = json_object();
    if (o && step >= 0) json_object_set_new(o, "step", json_integer(step));
    for (int i = 0; o && i < n; i++)
        if (strcmp(values[i].key, "step") && json_object_set_new(o, values[i].key, json_of(&values[i])))
            json_decref(o), o = NULL;
    char *line = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    if (!line) return accel_set_error(ACCEL_ERR_INVALID_ARG, "jsonl tracker: values are not valid UTF-8 JSON");
    size_t len = strlen(line);
    char *withnl = realloc(line, len + 1); /* the newline in the same write: one whole line */
    if (!withnl) {
        free(line);
        return accel_set_error(ACCEL_ERR_OOM, "jsonl tracker: out of memory");
    }
    withnl[len] = '\n';
    accel_status st = accel__append_whole(r->fd, true, "jsonl tracker", "", r->path, withnl, len + 1);
    free(withnl);
    return st;
}

static accel_status jsonl_finish(void *ctx) { return run_file_close(ctx); }

const accel_tracker_ops accel__jsonl_ops = {
    .name = "jsonl",
    .store_init_configuration = store_config_json,
    .log = jsonl_log,
    .finish = jsonl_finish,
};

/* ---------------------------------------------------------------- csv */

/* Columns: "step", then every key in the order first logged. A row leaves
 * the keys it does not have empty. */
typedef struct csv {
    run_file *r;
    int n_cols;
    char **cols;
    bool has_header; /* the file starts with its header line, naming every column */
} csv;

/* A log.csv already in run_dir (an earlier run's, or another tracker's
 * running now) moved aside to log.<n>.csv, the first n free, said in a
 * warning: it was deleted, an earlier run's log lost with it. The name is
 * taken first (O_EXCL) and renamed over: no hard links or renameat2 flags,
 * which vfat, FUSE and NFS mounts may not have. A log.csv that is no file
 * (a directory) is left for the open to refuse. */
static accel_status csv_move_aside(const char *run_dir) {
    char path[4200], aside[4240];
    snprintf(path, sizeof path, "%s/log.csv", run_dir);
    struct stat sb;
    if (lstat(path, &sb) || S_ISDIR(sb.st_mode)) return ACCEL_OK;
    int fd = -1;
    for (int n = 1; fd < 0; n++) {
        snprintf(aside, sizeof aside, "%s/log.%d.csv", run_dir, n);
        fd = open(aside, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && (errno != EEXIST || n == 1000000))
            return accel_set_error(ACCEL_ERR_IO, "csv tracker: cannot keep the existing %s as %s: %s", path, aside,
                                   strerror(errno));
    }
    close(fd);
    if (rename(path, aside)) {
        int e = errno;
        unlink(aside);
        if (e == ENOENT) return ACCEL_OK; /* another tracker starting here moved it aside first */
        return accel_set_error(ACCEL_ERR_IO, "csv tracker: cannot keep the existing %s as %s: %s", path, aside,
                               strerror(e));
    }
    accel__warn("csv tracker: %s was there already: kept as %s, this run logs to a new %s", path, aside, path);
    return ACCEL_OK;
}

/* The run directory locked against the other csv trackers in it (an flock
 * on it, accel__tracker_lock: ACCEL_ERR_TIMEOUT behind a stopped holder):
 * each holds it while it renames a log there, moving one aside
 * (csv_move_aside and the new log.csv's creation) or replacing its own
 * widened (csv_widen), so that one never renames the file another is about
 * to replace. *fd to close after; -1 where the directory cannot be opened
 * (mode -wx: unlocked, as a file system without flock). */
static accel_status dir_lock(const char *dir, int *fd) {
    *fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    accel_status st = *fd >= 0 ? accel__tracker_lock(*fd, "csv tracker", dir) : ACCEL_OK;
    if (st) {
        close(*fd);
        *fd = -1;
    }
    return st;
}

static void dir_unlock(int fd) {
    if (fd >= 0) close(fd);
}

void *accel__csv_open(const char *run_dir) {
    csv *c = accel_calloc(1, sizeof *c);
    if (!c) return NULL;
    /* A new file each run: columns are known only for what this run wrote. */
    int lock;
    if (dir_lock(run_dir, &lock) || csv_move_aside(run_dir) || !(c->r = run_file_open(run_dir, "log.csv", true))) {
        dir_unlock(lock);
        accel_free(c);
        return NULL;
    }
    dir_unlock(lock);
    return c;
}

/* RFC 4180: quote a field holding a comma, quote or line break. */
static void csv_field(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void csv_header(FILE *f, const csv *c) {
    fputs("step", f);
    for (int i = 0; i < c->n_cols; i++) {
        fputc(',', f);
        csv_field(f, c->cols[i]);
    }
    fputc('\n', f);
}

/* Why a widening failed (its status and words: the atomic writer's error,
 * which names the file it writes, the directory's lock timing out,
 * csv_own_path's) under the csv tracker's words, which name the log. */
static accel_status csv_widen_failed(const run_file *r, accel_status st) {
    char why[1024];
    snprintf(why, sizeof why, "%s", accel_last_error());
    return accel_set_error(st, "csv tracker: cannot rewrite %s with the new columns: %s", r->path, why);
}

/* The header, then every record of in with `added` empty fields at its end
 * (records may hold quoted line breaks), to out. False on a read or write
 * error (errno). */
static bool csv_copy_widened(const csv *c, FILE *in, FILE *out, int added) {
    csv_header(out, c);
    bool in_header = true, quoted = false;
    for (int ch; (ch = fgetc(in)) != EOF;) {
        if (ch == '"') quoted = !quoted;
        bool record_end = ch == '\n' && !quoted;
        if (in_header) {
            in_header = !record_end;
            continue;
        }
        if (record_end)
            for (int i = 0; i < added; i++) fputc(',', out);
        fputc(ch, out);
    }
    return !ferror(in) && !fflush(out) && !ferror(out);
}

/* The name this run's log goes by now (under the directory's lock):
 * r->path, or, where another run starting in the same directory moved it
 * aside (csv_move_aside), the name it has there now (the log.<n>.csv it
 * became), r->path set to that.
 * An error where no name in the directory is it any more (removed, or moved
 * elsewhere): rewritten under log.csv, it replaced the other run's live log,
 * and the rows it logged went to a file no longer in the directory. Its
 * errors are the reason under csv_widen_failed's words, which name r->path. */
static accel_status csv_own_path(run_file *r) {
    struct stat mine, sb;
    if (fstat(r->fd, &mine) != 0)
        return accel_set_error(ACCEL_ERR_IO, "cannot stat it: %s", strerror(errno));
    if (stat(r->path, &sb) == 0 && sb.st_dev == mine.st_dev && sb.st_ino == mine.st_ino) return ACCEL_OK;
    DIR *d = opendir(r->dir);
    char path[sizeof r->path];
    bool found = false;
    for (struct dirent *e; d && !found && (e = readdir(d));)
        found = snprintf(path, sizeof path, "%s/%s", r->dir, e->d_name) < (int)sizeof path && lstat(path, &sb) == 0 &&
                sb.st_dev == mine.st_dev && sb.st_ino == mine.st_ino;
    if (d) closedir(d);
    if (!found)
        return accel_set_error(ACCEL_ERR_IO, "it is no longer this run's log and no name in %s is (it was "
                               "removed or moved elsewhere); the row is not logged", r->dir);
    memcpy(r->path, path, sizeof path);
    return ACCEL_OK;
}

/* New keys widen the header: the file is replaced by a wider copy, written
 * through the atomic writer (core/afile.h: a user's own log.csv.tmp is never
 * taken), read from the tracker's own descriptor and written over the name
 * that file goes by now (csv_own_path), under the directory's lock. The old
 * file stays open until the new one has replaced it whole: a failure (disk
 * full, the tmp name taken) leaves the tracker logging to the old one, not
 * to a closed stream, and no half-written tmp file behind. The new file's
 * descriptor, kept across the rename, is the one appended to. */
static accel_status csv_widen_locked(csv *c, int added) {
    run_file *r = c->r;
    accel_status st = csv_own_path(r);
    if (st) return csv_widen_failed(r, st);
    int in_fd = dup(r->fd);
    FILE *in = in_fd >= 0 && lseek(in_fd, 0, SEEK_SET) == 0 ? fdopen(in_fd, "r") : NULL;
    if (!in) {
        int e = errno;
        if (in_fd >= 0) close(in_fd);
        return accel_set_error(ACCEL_ERR_IO, "csv tracker: cannot rewrite %s with the new columns: %s", r->path,
                               strerror(e));
    }
    accel__afile f;
    st = accel__afile_open(&f, r->path);
    if (st) {
        fclose(in);
        return csv_widen_failed(r, st);
    }
    int out_fd = dup(f.fd), keep = -1;
    FILE *out = out_fd >= 0 ? fdopen(out_fd, "w") : NULL;
    if (!out && out_fd >= 0) close(out_fd);
    bool ok = out && csv_copy_widened(c, in, out, added);
    int e = errno;
    fclose(in);
    if (out) ok = fclose(out) == 0 && ok; /* its own descriptor; f.fd stays */
    if (ok && (keep = dup(f.fd)) < 0) ok = false, e = errno;
    if (!ok) {
        accel__afile_abort(&f);
        return accel_set_error(ACCEL_ERR_IO, "csv tracker: cannot rewrite %s with the new columns: %s", r->path,
                               strerror(e));
    }
    if ((st = accel__afile_commit(&f)) != ACCEL_OK) {
        close(keep);
        return csv_widen_failed(r, st);
    }
    /* appended to (accel__append_whole also seeks to the end first) and read back by the next widening */
    (void)fcntl(keep, F_SETFL, O_APPEND);
    close(r->fd); /* the old file, now replaced: everything it held was written */
    r->fd = keep;
    return ACCEL_OK;
}

static accel_status csv_widen(csv *c, int added) {
    run_file *r = c->r;
    int lock;
    accel_status st = dir_lock(r->dir, &lock);
    if (st) return csv_widen_failed(r, st);
    st = csv_widen_locked(c, added);
    dir_unlock(lock);
    return st;
}

static int csv_col(const csv *c, const char *key) {
    for (int i = 0; i < c->n_cols; i++)
        if (!strcmp(c->cols[i], key)) return i;
    return -1;
}

/* Adds the keys not yet columns to the column list (the file is not touched). */
static accel_status csv_add_columns(csv *c, int n, const accel_value *values) {
    for (int i = 0; i < n; i++) {
        if (csv_col(c, values[i].key) >= 0 || !strcmp(values[i].key, "step")) continue;
        char **grown = accel_calloc((size_t)c->n_cols + 1, sizeof *grown);
        char *key = accel_strdup(values[i].key);
        if (!grown || !key) {
            accel_free(grown);
            accel_free(key);
            return accel_last_status();
        }
        if (c->n_cols) memcpy(grown, c->cols, (size_t)c->n_cols * sizeof *grown);
        accel_free(c->cols);
        c->cols = grown;
        c->cols[c->n_cols++] = key;
    }
    return ACCEL_OK;
}

static void csv_row(FILE *f, const csv *c, int n, const accel_value *values, int64_t step) {
    if (step >= 0) fprintf(f, "%lld", (long long)step);
    for (int col = 0; col < c->n_cols; col++) {
        fputc(',', f);
        const accel_value *v = NULL;
        for (int i = n - 1; i >= 0 && !v; i--)
            if (!strcmp(values[i].key, c->cols[col])) v = &values[i];
        if (!v) continue;
        switch (v->kind) {
        case ACCEL_VALUE_FLOAT: {
            char num[40];
            fputs(accel__float_repr(num, sizeof num, v->f), f);
            break;
        }
        case ACCEL_VALUE_INT: fprintf(f, "%lld", (long long)v->i); break;
        case ACCEL_VALUE_BOOL: fputs(v->i ? "True" : "False", f); break;
        case ACCEL_VALUE_STRING: csv_field(f, v->s); break;
        }
    }
    fputc('\n', f);
}

/* The row (after the header, in a file that has none yet), built in memory
 * and appended whole. */
static accel_status csv_append(csv *c, int n, const accel_value *values, int64_t step) {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) return accel_set_error(ACCEL_ERR_OOM, "csv tracker: out of memory");
    if (!c->has_header) csv_header(m, c);
    csv_row(m, c, n, values, step);
    accel_status st = fclose(m) ? accel_set_error(ACCEL_ERR_OOM, "csv tracker: out of memory")
                                : accel__append_whole(c->r->fd, false, "csv tracker", "", c->r->path, buf, len);
    free(buf);
    if (!st) c->has_header = true;
    return st;
}

static accel_status csv_log(void *ctx, int n, const accel_value *values, int64_t step) {
    csv *c = ctx;
    if (record_step("csv tracker", n, values, &step)) return accel_last_status();
    int before = c->n_cols;
    bool widened = false;
    accel_status st = csv_add_columns(c, n, values);
    if (!st && c->has_header && c->n_cols > before) widened = !(st = csv_widen(c, c->n_cols - before));
    if (!st) st = csv_append(c, n, values, step);
    /* Columns the file's header does not name (a failed widen, a failed first
     * write) are dropped again: rows keep the header's width, and the next
     * log with those keys tries again. */
    if (st && !widened)
        while (c->n_cols > before) accel_free(c->cols[--c->n_cols]);
    return st;
}

static accel_status csv_store_config(void *ctx, int n, const accel_value *config) {
    return store_config_json(((csv *)ctx)->r, n, config);
}

static accel_status csv_finish(void *ctx) {
    csv *c = ctx;
    accel_status st = run_file_close(c->r);
    for (int i = 0; i < c->n_cols; i++) accel_free(c->cols[i]);
    accel_free(c->cols);
    accel_free(c);
    return st;
}

const accel_tracker_ops accel__csv_ops = {
    .name = "csv",
    .store_init_configuration = csv_store_config,
    .log = csv_log,
    .finish = csv_finish,
};
