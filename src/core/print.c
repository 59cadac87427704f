/* Readable tensor printing, in the spirit of PyTorch's repr. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/core.h"
#include "core_internal.h"

typedef struct sbuf {
    char *p;
    size_t n, len;
} sbuf;

static void put(sbuf *b, const char *fmt, double v, int use_v) {
    if (b->len >= b->n) return;
    int k = use_v ? snprintf(b->p + b->len, b->n - b->len, fmt, v)
                  : snprintf(b->p + b->len, b->n - b->len, "%s", fmt);
    if (k > 0) b->len += (size_t)k;
    if (b->len > b->n) b->len = b->n;
}

static void put_value(sbuf *b, const accel_tensor *t, int64_t off) {
    double v = accel__load_elem(t->data, t->dtype, (size_t)off);
    if (accel_dtype_is_float(t->dtype)) {
        if (isnan(v)) put(b, "nan", 0, 0);
        else if (isinf(v)) put(b, v > 0 ? "inf" : "-inf", 0, 0);
        else if (v != 0 && (fabs(v) >= 1e8 || fabs(v) < 1e-4)) put(b, "%.4e", v, 1);
        else put(b, "%.4f", v, 1);
    } else if (t->dtype == ACCEL_BOOL) {
        put(b, v != 0 ? "True" : "False", 0, 0);
    } else {
        put(b, "%.0f", v, 1);
    }
}

/* Prints dim d starting at element offset off; summarises dims longer than 6
 * when the tensor has more than 1000 elements, as PyTorch does. */
static void put_dim(sbuf *b, const accel_tensor *t, int d, int64_t off, bool summarize) {
    if (t->ndim == 0) {
        put_value(b, t, 0);
        return;
    }
    put(b, "[", 0, 0);
    int64_t n = t->shape[d];
    for (int64_t i = 0; i < n; i++) {
        if (summarize && n > 6 && i == 3) {
            put(b, d == t->ndim - 1 ? "..., " : "...,\n", 0, 0);
            i = n - 3;
        }
        int64_t o = off + i * t->stride[d];
        if (d == t->ndim - 1) put_value(b, t, o);
        else put_dim(b, t, d + 1, o, summarize);
        if (i + 1 < n) {
            put(b, ",", 0, 0);
            if (d == t->ndim - 1) put(b, " ", 0, 0);
            else {
                for (int k = d; k < t->ndim - 1; k++) put(b, "\n", 0, 0);
                for (int k = 0; k <= d; k++) put(b, " ", 0, 0);
                put(b, "       ", 0, 0);
            }
        }
    }
    put(b, "]", 0, 0);
}

static size_t finish(sbuf *b, char *out, size_t n) {
    if (b->len >= n) b->len = n - 1;
    out[b->len] = '\0';
    return b->len;
}

static size_t format(const accel_tensor *t, char *out, size_t n) {
    sbuf b = {out, n, 0};
    char sh[96];
    if (!t || t->magic != ACCEL_TENSOR_MAGIC) {
        put(&b, "tensor(<invalid>)", 0, 0);
    } else if (t->device.type == ACCEL_DEV_META) {
        put(&b, "tensor(..., device='meta', size=", 0, 0);
        put(&b, accel_shape_str(t, sh, sizeof sh), 0, 0);
        put(&b, ", dtype=", 0, 0);
        put(&b, accel_dtype_name(t->dtype), 0, 0);
        put(&b, ")", 0, 0);
    } else {
        /* Off the cpu, the values are read from a host copy (step memory). */
        accel_tensor *h = t->device.type == ACCEL_DEV_CPU ? NULL : accel_empty_on(t->dtype, t->ndim, t->shape, ACCEL_CPU_DEVICE);
        if (t->device.type != ACCEL_DEV_CPU && (!h || accel_copy_(h, t) != ACCEL_OK)) {
            put(&b, "tensor(<unreadable: ", 0, 0);
            put(&b, accel_last_error(), 0, 0);
            put(&b, ">)", 0, 0);
            return finish(&b, out, n);
        }
        put(&b, "tensor(", 0, 0);
        put_dim(&b, h ? h : t, 0, 0, accel_numel(t) > 1000);
        if (h) {
            char d[32];
            put(&b, ", device='", 0, 0);
            put(&b, accel_device_str(t->device, d, sizeof d), 0, 0);
            put(&b, "'", 0, 0);
        }
        if (t->dtype != ACCEL_F32 && t->dtype != ACCEL_I64 && t->dtype != ACCEL_BOOL) {
            put(&b, ", dtype=torch.", 0, 0);
            put(&b, accel_dtype_name(t->dtype), 0, 0);
        }
        if (t->requires_grad) put(&b, ", requires_grad=True", 0, 0);
        put(&b, ")", 0, 0);
    }
    return finish(&b, out, n);
}

void accel_print_tensor(FILE *f, const accel_tensor *t) {
    char buf[16384];
    format(t, buf, sizeof buf);
    fprintf(f ? f : stdout, "%s\n", buf);
}

const char *accel_tensor_str(const accel_tensor *t) {
    size_t n = 16384;
    char *buf = accel_arena_alloc(accel_step_arena(), n, 16);
    if (!buf) return "tensor(<out of memory>)";
    format(t, buf, n);
    return buf;
}

int accel__shortest_digits(double v, char digits[18], int *exponent) {
    /* A correctly rounded decimal that reads back as v still does with more
     * digits: the fewest is found by bisecting 1..17 (5 conversions, not up
     * to 17: a tokenizer's 250,000 Unigram scores go through here). */
    char sci[40];
    int lo = 0, hi = 16; /* precision: digits after the point */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        snprintf(sci, sizeof sci, "%.*e", mid, v);
        if (strtod(sci, NULL) == v) hi = mid;
        else lo = mid + 1;
    }
    snprintf(sci, sizeof sci, "%.*e", lo, v);
    /* sci is "[-]d[.ddd]e[+-]xx" */
    const char *p = sci + (sci[0] == '-');
    int n = 0;
    for (; *p != 'e'; p++)
        if (*p != '.') digits[n++] = *p;
    digits[n] = '\0';
    *exponent = atoi(p + 1);
    return n;
}

const char *accel__float_repr(char *buf, size_t n, double v) {
    if (!isfinite(v)) {
        snprintf(buf, n, "%s", isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
        return buf;
    }
    char digits[18], text[40], *t = text;
    int exponent, count = accel__shortest_digits(v, digits, &exponent);
    if (signbit(v)) *t++ = '-';
    if (exponent < -4 || exponent >= 16) { /* d[.ddd]e[+-]XX, as repr switches */
        *t++ = digits[0];
        if (count > 1) *t++ = '.';
        for (int i = 1; i < count; i++) *t++ = digits[i];
        snprintf(t, sizeof text - (size_t)(t - text), "e%c%02d", exponent < 0 ? '-' : '+', abs(exponent));
    } else { /* positional, a digit on each side of the point at least: 1.0, 0.003 */
        int before = exponent + 1; /* digits before the point; <= 0 below 1 */
        if (before <= 0) *t++ = '0';
        for (int i = 0; i < before; i++) *t++ = i < count ? digits[i] : '0';
        *t++ = '.';
        for (int i = before; i < 0; i++) *t++ = '0';
        if (count <= before) *t++ = '0';
        for (int i = before > 0 ? before : 0; i < count; i++) *t++ = digits[i];
        *t = '\0';
    }
    snprintf(buf, n, "%s", text);
    return buf;
}

/* A lead byte says how many continuation bytes follow; the code point they
 * make must need that many (no overlong form) and be a scalar value. */
bool accel__is_utf8_n(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) {
        unsigned c = *p++, cp, min;
        int more;
        if (c < 0x80) continue;
        if ((c & 0xE0) == 0xC0) more = 1, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) more = 2, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) more = 3, cp = c & 0x07, min = 0x10000;
        else return false;
        if (end - p < more) return false;
        for (; more; more--, p++) {
            if ((*p & 0xC0) != 0x80) return false;
            cp = cp << 6 | (*p & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    }
    return true;
}

bool accel__is_utf8(const char *s) { return accel__is_utf8_n(s, strlen(s)); }
