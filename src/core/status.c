/* Per-thread error state. A failure that originates in a call replaces the
 * pending message (the most recent failure owns it); accel_propagate_error
 * only fills in a message when none is pending, for a NULL input that an
 * earlier failure produced. docs/contract.md "Errors". */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/core.h"
#include "core/core_internal.h" /* accel__set_errorv */

static _Thread_local accel_status tl_status = ACCEL_OK;
static _Thread_local char tl_message[1024];
static _Thread_local unsigned long tl_errors_set; /* messages set on this thread: accel__error_mark */

const char *accel_last_error(void) { return tl_message; }
accel_status accel_last_status(void) { return tl_status; }

void accel_clear_error(void) {
    tl_status = ACCEL_OK;
    tl_message[0] = '\0';
}

/* Formatted aside first: an argument may be accel_last_error() itself (a
 * message that wraps the one before), which vsnprintf must not overlap. */
static void set_message(accel_status st, const char *fmt, va_list ap) {
    char m[sizeof tl_message];
    vsnprintf(m, sizeof m, fmt, ap);
    tl_status = st;
    memcpy(tl_message, m, sizeof m);
    tl_errors_set++;
}

accel_status accel_set_error(accel_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_message(st, fmt, ap);
    va_end(ap);
    return st;
}

/* accel_set_error with a va_list: what a backend plug-in's accel_set_error
 * calls (backends/plugin.h). */
accel_status accel__set_errorv(accel_status st, const char *fmt, va_list ap) {
    set_message(st, fmt, ap);
    return st;
}

accel_status accel_propagate_error(accel_status st, const char *fmt, ...) {
    if (tl_status != ACCEL_OK) return tl_status;
    va_list ap;
    va_start(ap, fmt);
    set_message(st, fmt, ap);
    va_end(ap);
    return st;
}

unsigned long accel__error_mark(void) { return tl_errors_set; }

accel_status accel__callback_failed(accel_status st, unsigned long mark, const char *what, ...) {
    char w[512];
    va_list ap;
    va_start(ap, what);
    vsnprintf(w, sizeof w, what, ap);
    va_end(ap);
    if (tl_errors_set != mark && tl_status != ACCEL_OK) return accel_set_error(st, "%s failed: %s", w, tl_message);
    return accel_set_error(st, "%s failed (%s) and gave no reason", w, accel_status_name(st));
}

const char *accel_status_name(accel_status st) {
    switch (st) {
    case ACCEL_OK: return "ok";
    case ACCEL_ERR_INVALID_ARG: return "invalid argument";
    case ACCEL_ERR_SHAPE: return "shape error";
    case ACCEL_ERR_DTYPE: return "dtype error";
    case ACCEL_ERR_DEVICE: return "device error";
    case ACCEL_ERR_OOM: return "out of memory";
    case ACCEL_ERR_IO: return "I/O error";
    case ACCEL_ERR_FORMAT: return "format error";
    case ACCEL_ERR_DIST: return "distributed error";
    case ACCEL_ERR_TIMEOUT: return "timeout";
    case ACCEL_ERR_UNSUPPORTED: return "unsupported";
    case ACCEL_ERR_STATE: return "invalid state";
    }
    return "unknown status";
}

static void default_abort(const char *file, int line, const char *msg) {
    fprintf(stderr, "accel: internal error at %s:%d: %s\n", file, line, msg);
}

static accel_abort_fn abort_handler = default_abort;

void accel_set_abort_handler(accel_abort_fn fn) { abort_handler = fn ? fn : default_abort; }

void accel_abort_at(const char *file, int line, const char *msg) {
    abort_handler(file, line, msg);
    abort();
}
