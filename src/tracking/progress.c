/* Progress bars: tqdm's line on a terminal, plain periodic lines elsewhere,
 * drawn by the main process only. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "accel/data.h"
#include "core/env.h"
#include "tracking/tracking_internal.h"

struct accel_progress {
    bool on, tty;
    FILE *f;
    char desc[128], unit[16], postfix[128];
    int64_t total, n, tokens;
    double loss;
    bool have_loss;
    double start, last_draw, min_interval, delay;
    bool drawn;         /* anything drawn yet (a delayed bar that never drew stays silent) */
    size_t last_len;    /* terminal: characters drawn last time (to blank the rest) */
};

accel_progress_opts accel_progress_opts_default(void) {
    return (accel_progress_opts){.unit = "it", .min_interval = 0};
}


accel_progress *accel_progress_new(int64_t total, const accel_progress_opts *opts) {
    accel_progress_opts o = opts ? *opts : accel_progress_opts_default();
    bool env_disabled;
    if (accel__env_bool("ACCEL_DISABLE_PROGRESS", false, &env_disabled) != ACCEL_OK) return NULL;
    accel_progress *p = accel_calloc(1, sizeof *p);
    if (!p) return NULL;
    p->f = o.stream ? o.stream : stderr;
    p->on = !o.disable && !env_disabled && (o.all_processes || accel_process_index() == 0);
    p->tty = isatty(fileno(p->f));
    snprintf(p->desc, sizeof p->desc, "%s", o.desc ? o.desc : "");
    snprintf(p->unit, sizeof p->unit, "%s", o.unit ? o.unit : "it");
    p->total = total > 0 ? total : 0;
    p->min_interval = o.min_interval != 0 ? o.min_interval : p->tty ? 0.1 : 10.0;
    p->delay = o.delay;
    p->start = p->last_draw = accel_now_seconds();
    return p;
}

/* tqdm's format_interval: "mm:ss", or "h:mm:ss" from an hour on. */
static void interval(char *out, size_t n, double s) {
    if (!isfinite(s) || s < 0 || s >= 1e15) { /* past ~30 million years: not a long's worth, nor meaningful */
        snprintf(out, n, "?");
        return;
    }
    long t = (long)s, h = t / 3600, m = t / 60 % 60, sec = t % 60;
    if (h) snprintf(out, n, "%ld:%02ld:%02ld", h, m, sec);
    else snprintf(out, n, "%02ld:%02ld", m, sec);
}

/* A 10-cell bar: eighths of a block on a terminal, '#' in plain lines. */
static void bar(char *out, size_t n, double frac, bool tty) {
    enum { W = 10 };
    /* As tqdm's Bar: a count below 0 (update(-n)) draws an empty bar; the
     * negative remainder indexed before eighths[]. */
    frac = frac < 0 ? 0 : frac > 1 ? 1 : frac;
    static const char *eighths[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
    int cells8 = (int)(frac * W * 8), full = cells8 / 8, part = cells8 % 8;
    size_t k = 0;
    for (int i = 0; i < W && k + 4 < n; i++) {
        const char *c = i < full ? (tty ? "█" : "#") : i == full && tty && part ? eighths[part] : " ";
        size_t l = strlen(c);
        memcpy(out + k, c, l);
        k += l;
    }
    out[k] = '\0';
}

static size_t format_line(const accel_progress *p, char *line, size_t size, double now) {
    double el = now - p->start, rate = el > 0 ? p->n / el : 0;
    char e[32], r[32], b[64], fields[256] = "";
    interval(e, sizeof e, el);
    size_t k = 0;
    if (p->have_loss) k += snprintf(fields + k, sizeof fields - k, ", loss=%.4f", p->loss);
    if (p->tokens && k < sizeof fields)
        k += snprintf(fields + k, sizeof fields - k, ", tok/s=%.0f", el > 0 ? p->tokens / el : 0.0);
    if (p->postfix[0] && k < sizeof fields) snprintf(fields + k, sizeof fields - k, ", %s", p->postfix);
    const char *sep = p->desc[0] ? ": " : "";
    int m;
    if (p->total) {
        double frac = p->n >= p->total ? 1.0 : (double)p->n / (double)p->total;
        interval(r, sizeof r, rate > 0 ? ((double)p->total - (double)p->n) / rate : NAN);
        bar(b, sizeof b, frac, p->tty);
        m = snprintf(line, size, "%s%s%3.0f%%|%s| %lld/%lld [%s<%s, %.2f%s/s%s]", p->desc, sep, frac * 100, b,
                     (long long)p->n, (long long)p->total, e, r, rate, p->unit, fields);
    } else {
        m = snprintf(line, size, "%s%s%lld%s [%s, %.2f%s/s%s]", p->desc, sep, (long long)p->n, p->unit, e, rate,
                     p->unit, fields);
    }
    return m < 0 ? 0 : (size_t)m >= size ? size - 1 : (size_t)m;
}

static void draw(accel_progress *p, double now, bool final) {
    char line[512];
    size_t len = format_line(p, line, sizeof line, now);
    if (p->tty) {
        /* Redraw in place; blank what a longer previous line left. */
        int pad = p->last_len > len ? (int)(p->last_len - len) : 0;
        fprintf(p->f, "\r%s%*s%s", line, pad, "", final ? "\n" : "");
        p->last_len = len;
    } else {
        fprintf(p->f, "%s\n", line);
    }
    fflush(p->f);
    p->last_draw = now;
    p->drawn = true;
}

void accel_progress_update(accel_progress *p, int64_t n) {
    if (!p) return;
    /* saturating: an absurd n pins the count, never overflows it */
    if (__builtin_add_overflow(p->n, n, &p->n)) p->n = n > 0 ? INT64_MAX : INT64_MIN;
    if (!p->on) return;
    double now = accel_now_seconds();
    if (now - p->start < p->delay) return;
    /* A delayed bar shows itself as soon as its delay is over. */
    if (now - p->last_draw >= p->min_interval || (p->delay > 0 && !p->drawn)) draw(p, now, false);
}

void accel_progress_set_loss(accel_progress *p, double loss) {
    if (p) p->loss = loss, p->have_loss = true;
}

void accel_progress_add_tokens(accel_progress *p, int64_t tokens) {
    if (p) p->tokens += tokens;
}

void accel_progress_set_postfix(accel_progress *p, const char *fmt, ...) {
    if (!p || !fmt) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->postfix, sizeof p->postfix, fmt, ap);
    va_end(ap);
}

int64_t accel_progress_count(const accel_progress *p) {
    if (!p) accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_progress_count: progress is NULL");
    return p ? p->n : 0;
}

void accel_progress_close(accel_progress *p) {
    if (!p) return;
    if (p->on && (p->drawn || p->delay <= 0)) draw(p, accel_now_seconds(), true);
    accel_free(p);
}

accel_progress *accel_progress_over_loader(accel_dataloader *dl, const accel_progress_opts *opts) {
    int64_t n = accel_dataloader_len(dl);
    return accel_progress_new(n > 0 ? n : 0, opts);
}

bool accel_progress_next(accel_progress *p, accel_dataloader *dl, accel_batch *out) {
    bool more = accel_dataloader_next(dl, out);
    if (more) accel_progress_update(p, 1);
    return more;
}
