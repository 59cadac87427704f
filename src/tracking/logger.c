/* Loggers: Python logging's levels and default format, Accelerate's rank
 * prefix, main_process_only and in_order. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "accel/dist.h"
#include "core/env.h"
#include "tracking/tracking_internal.h"

struct accel_logger {
    struct accel_logger *next;
    char *name;
    accel_log_level level;
    FILE *stream; /* NULL: stderr */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static accel_logger *loggers;

/* Who this process is: the Accelerator's process group once attached. */
static struct {
    bool attached;
    int rank, world;
    accel_pg *pg;
} who;

void accel__log_attach(int rank, int world, accel_pg *pg) {
    pthread_mutex_lock(&lock);
    who.attached = true;
    who.rank = rank;
    who.world = world;
    who.pg = pg;
    pthread_mutex_unlock(&lock);
}

void accel__log_detach(accel_pg *pg) {
    pthread_mutex_lock(&lock);
    if (who.attached && who.pg == pg) who.attached = false, who.pg = NULL;
    pthread_mutex_unlock(&lock);
}

/* Before the group exists: the launcher's variable, read strictly (a bad
 * one is the group's error to report: accel_dist_init refuses it). */
static int env_int(const char *name, int fallback) {
    long v;
    if (accel__env_long(name, fallback, 0, 1000000, &v) == ACCEL_OK) return (int)v;
    accel_clear_error();
    return fallback;
}

/* who as attached (its lock: an accelerator made or freed on another thread
 * meanwhile), or the launcher's variable name's value. */
static int who_or_env(bool rank, const char *name, int fallback) {
    pthread_mutex_lock(&lock);
    bool attached = who.attached;
    int v = rank ? who.rank : who.world;
    pthread_mutex_unlock(&lock);
    return attached ? v : env_int(name, fallback);
}

int accel_process_index(void) { return who_or_env(true, "RANK", 0); }
int accel_process_count(void) { return who_or_env(false, "WORLD_SIZE", 1); }

static const char *level_name(accel_log_level level) {
    switch (level) {
    case ACCEL_LOG_DEBUG: return "DEBUG";
    case ACCEL_LOG_INFO: return "INFO";
    case ACCEL_LOG_WARNING: return "WARNING";
    case ACCEL_LOG_ERROR: return "ERROR";
    case ACCEL_LOG_CRITICAL: return "CRITICAL";
    }
    return "Level";
}

int accel_log_level_parse(const char *s) {
    if (!s || !*s) return -1;
    static const accel_log_level all[] = {ACCEL_LOG_DEBUG, ACCEL_LOG_INFO, ACCEL_LOG_WARNING, ACCEL_LOG_ERROR,
                                          ACCEL_LOG_CRITICAL};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (!strcasecmp(s, level_name(all[i]))) return all[i];
    if (!strcasecmp(s, "WARN")) return ACCEL_LOG_WARNING;
    if (!strcasecmp(s, "FATAL")) return ACCEL_LOG_CRITICAL;
    char *end;
    long v = strtol(s, &end, 10);
    return *end || v < 0 || v > 100 ? -1 : (int)v;
}

static accel_log_level env_level(void) {
    const char *name = getenv("ACCEL_LOG_LEVEL") ? "ACCEL_LOG_LEVEL" : "ACCELERATE_LOG_LEVEL", *v = getenv(name);
    int l = accel_log_level_parse(v);
    static bool said; /* under `lock` (logger_new's callers) */
    if (v && l < 0 && !said) /* a logger cannot fail: said once */
        said = true, fprintf(stderr, "accel: warning: %s='%s' is not a log level (DEBUG, INFO, WARNING, ERROR, CRITICAL or "
                        "0-100); using WARNING\n", name, v);
    return l < 0 ? ACCEL_LOG_WARNING : (accel_log_level)l;
}

/* Loggers use libc's allocator, not accel's: they live until exit, past any
 * allocator a test installs and restores. */
static accel_logger *logger_new(const char *name) {
    accel_logger *lg = calloc(1, sizeof *lg);
    if (lg && !(lg->name = strdup(name))) {
        free(lg);
        return NULL;
    }
    if (lg) lg->level = env_level();
    return lg;
}

accel_logger *accel_get_logger(const char *name) {
    if (!name) name = "accel";
    pthread_mutex_lock(&lock);
    accel_logger *lg = loggers;
    while (lg && strcmp(lg->name, name)) lg = lg->next;
    if (!lg && (lg = logger_new(name))) {
        lg->next = loggers;
        loggers = lg;
    }
    pthread_mutex_unlock(&lock);
    if (!lg) accel_set_error(ACCEL_ERR_OOM, "accel_get_logger: out of memory");
    return lg;
}

__attribute__((destructor)) static void free_loggers(void) {
    while (loggers) {
        accel_logger *n = loggers->next;
        free(loggers->name);
        free(loggers);
        loggers = n;
    }
}

void accel_logger_set_level(accel_logger *lg, accel_log_level level) {
    if (lg) lg->level = level;
}
accel_log_level accel_logger_level(const accel_logger *lg) { return lg ? lg->level : ACCEL_LOG_WARNING; }
void accel_logger_set_stream(accel_logger *lg, FILE *f) {
    if (lg) lg->stream = f;
}

/* One whole line in one write, so lines of several ranks never interleave. */
static void emit(const accel_logger *lg, accel_log_level level, int rank, const char *fmt, va_list ap) {
    char line[4096];
    int k = snprintf(line, sizeof line, "%s:%s:[RANK %d] ", level_name(level), lg->name, rank);
    if (k < 0 || (size_t)k >= sizeof line) k = 0;
    int m = vsnprintf(line + k, sizeof line - (size_t)k - 1, fmt, ap);
    size_t len = m < 0 ? (size_t)k : (size_t)k + (size_t)m;
    if (len > sizeof line - 2) len = sizeof line - 2;
    line[len++] = '\n';
    FILE *f = lg->stream ? lg->stream : stderr;
    fwrite(line, 1, len, f);
    fflush(f);
}

accel_status accel_logger_logv(accel_logger *lg, accel_log_level level, unsigned flags, const char *fmt, va_list ap) {
    if (!lg || !fmt) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_logger_log: logger or format is NULL");
    bool all = flags & (ACCEL_LOG_ALL_PROCESSES | ACCEL_LOG_IN_ORDER);
    int rank = accel_process_index(), world = accel_process_count();
    bool enabled = level >= lg->level;
    if (!(flags & ACCEL_LOG_IN_ORDER) || world == 1) {
        if (enabled && (all || rank == 0)) emit(lg, level, rank, fmt, ap);
        return ACCEL_OK;
    }
    if (!who.pg)
        return accel_set_error(ACCEL_ERR_STATE, "You must initialize the accelerate state by calling either "
                                                "`PartialState()` or `Accelerator()` before using the logging "
                                                "utility.");
    /* Every rank joins every barrier, also when the level filters the line. */
    for (int i = 0; i < world; i++) {
        if (i == rank && enabled) {
            va_list copy;
            va_copy(copy, ap);
            emit(lg, level, rank, fmt, copy);
            va_end(copy);
        }
        accel_status st = accel_pg_barrier(who.pg);
        if (st) return st;
    }
    return ACCEL_OK;
}

accel_status accel_logger_log(accel_logger *lg, accel_log_level level, unsigned flags, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    accel_status st = accel_logger_logv(lg, level, flags, fmt, ap);
    va_end(ap);
    return st;
}

void accel__warnv(const char *fmt, va_list ap) {
    accel_logger_logv(accel_get_logger("accel"), ACCEL_LOG_WARNING, ACCEL_LOG_ALL_PROCESSES, fmt, ap);
}

void accel__warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    accel__warnv(fmt, ap);
    va_end(ap);
}
