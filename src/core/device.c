/* Device names, the backend registry, availability, the default device. */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/core.h"
#include "core/backend.h"
#include "core/env.h"

/* ---------------------------------------------------------------- registry */

/* One backend per device type, set once (compare-and-swap) and read without a
 * lock: ops look their kernel table up on every call. The CPU backend is
 * built in (backends/registry.c); the others are plug-ins (backends/plugin.h), loaded the first time
 * their device type is asked for. */
static const accel_backend *registry[ACCEL_DEV_TYPE_COUNT];
static pthread_once_t registry_once = PTHREAD_ONCE_INIT;

static const accel_backend *registry_get(int t) { return __atomic_load_n(&registry[t], __ATOMIC_ACQUIRE); }

static void registry_init(void) { pthread_once(&registry_once, accel__backends_init); }

/* The hot path (every op looks its kernel table up): one load once the
 * built-in backends are in. */
static const accel_backend *cpu_backend(void) {
    const accel_backend *b = registry_get(ACCEL_DEV_CPU);
    if (b) return b;
    registry_init();
    return registry_get(ACCEL_DEV_CPU);
}

accel_status accel__backend_register(const accel_backend *b) {
    if (!b || (unsigned)b->type >= ACCEL_DEV_TYPE_COUNT || b->type == ACCEL_DEV_META)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel__backend_register: bad backend");
    /* Not registry_init(): this runs from inside it for ACCEL_TEST_DEVICES. */
    const accel_backend *had = NULL;
    if (__atomic_compare_exchange_n(&registry[b->type], &had, b, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return ACCEL_OK;
    if (had != b)
        return accel_set_error(ACCEL_ERR_STATE, "accel__backend_register: device type %s has a backend",
                               b->name);
    return ACCEL_OK;
}

const accel_backend *accel__backend_of(accel_device d) {
    if ((unsigned)d.type >= ACCEL_DEV_TYPE_COUNT) return NULL;
    if (d.type == ACCEL_DEV_CPU) return cpu_backend();
    registry_init();
    const accel_backend *b = registry_get(d.type);
    if (b || d.type == ACCEL_DEV_META) return b;
    /* once per type: a plug-in that did not load is not tried again */
    accel__plugin_load_type(d.type);
    return registry_get(d.type);
}

const accel_backend *accel__backend_for(accel_device d, const char *op) {
    const accel_backend *b = accel__backend_of(d);
    if (b && d.index >= 0 && d.index < b->device_count()) return b;
    char s[32];
    if (d.type == ACCEL_DEV_META)
        accel_set_error(ACCEL_ERR_DEVICE, "%s: meta tensors have no data", op);
    else if (b && b->device_count() > 0) /* the type has devices: the index is out of their range */
        accel_set_error(ACCEL_ERR_DEVICE, "%s: device %s:%d is not available: there %s %d %s device%s here", op,
                        accel_device_type_name(d.type), d.index, b->device_count() == 1 ? "is" : "are",
                        b->device_count(), accel_device_type_name(d.type), b->device_count() == 1 ? "" : "s");
    else {
        const char *why = accel__plugin_unavailable_reason(d.type);
        accel_set_error(ACCEL_ERR_DEVICE, "%s: device %s is not available%s%s", op, accel_device_str(d, s, sizeof s),
                        *why ? ": " : "", why);
    }
    return NULL;
}

int accel__backends(const accel_backend **out, int max) {
    registry_init();
    int n = 0;
    for (int t = 0; t < ACCEL_DEV_TYPE_COUNT; t++)
        if (registry_get(t) && n < max) out[n++] = registry_get(t);
    return n;
}

const accel_kernel_table *accel__kernel_table_of(accel_device dev, const char *op) {
    if (dev.type == ACCEL_DEV_CPU) return &cpu_backend()->kernels;
    const accel_backend *b = accel__backend_for(dev, op);
    return b ? &b->kernels : NULL;
}

accel_status accel__kernel_missing(const char *op, const char *kernel, accel_device d) {
    char s[32];
    return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: kernel %s is not implemented on %s", op, kernel,
                           accel_device_str(d, s, sizeof s));
}

/* ---------------------------------------------------------------- names */

static const char *const TYPE_NAME[ACCEL_DEV_TYPE_COUNT] = {
    [ACCEL_DEV_CPU] = "cpu", [ACCEL_DEV_META] = "meta", [ACCEL_DEV_CUDA] = "cuda",
    [ACCEL_DEV_NPU] = "npu", [ACCEL_DEV_HOSTLESS] = "hostless",
};

/* cpu and meta are one device each; the others are numbered. */
static bool indexed(accel_device_type t) { return t != ACCEL_DEV_CPU && t != ACCEL_DEV_META; }

const char *accel_device_type_name(accel_device_type t) {
    return (unsigned)t < ACCEL_DEV_TYPE_COUNT ? TYPE_NAME[t] : "unknown";
}

const char *accel_device_str(accel_device d, char *buf, size_t n) {
    if ((unsigned)d.type < ACCEL_DEV_TYPE_COUNT && indexed(d.type))
        snprintf(buf, n, "%s:%d", TYPE_NAME[d.type], d.index);
    else snprintf(buf, n, "%s", accel_device_type_name(d.type));
    return buf;
}

bool accel_device_eq(accel_device a, accel_device b) {
    return a.type == b.type && (!indexed(a.type) || a.index == b.index);
}

/* The names a string may use: cuda always (an unavailable device is a valid
 * name, as in PyTorch), the other indexed types when their backend is registered. */
static bool parsable(accel_device_type t) {
    return t == ACCEL_DEV_CUDA || accel__backend_of((accel_device){t, 0}) != NULL;
}

/* The indexed type whose name s starts with, followed by its end or ':'; -1 when none. */
static int indexed_type_of(const char *s) {
    for (int t = 0; t < ACCEL_DEV_TYPE_COUNT; t++) {
        size_t k = strlen(TYPE_NAME[t]);
        if (indexed((accel_device_type)t) && strncmp(s, TYPE_NAME[t], k) == 0 && (s[k] == '\0' || s[k] == ':'))
            return t;
    }
    return -1;
}

/* "type" (index 0) or "type:N" for indexed type t, N in 0..1023 written in
 * digits alone (strtol also took " 1", "+1" and "-0"). */
static accel_status parse_indexed(const char *s, accel_device_type t, accel_device *out) {
    const char *p = s + strlen(TYPE_NAME[t]);
    int idx = 0;
    if (*p == ':') {
        char *end = NULL;
        long v = isdigit((unsigned char)p[1]) ? strtol(p + 1, &end, 10) : -1;
        if (v < 0 || *end || v > 1023) return accel_set_error(ACCEL_ERR_INVALID_ARG, "bad device index in '%s'", s);
        idx = (int)v;
    }
    *out = (accel_device){t, idx};
    return ACCEL_OK;
}

accel_status accel_device_parse(const char *s, accel_device *out) {
    if (!s || !out) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_device_parse: NULL argument");
    if (strcmp(s, "cpu") == 0) { *out = ACCEL_CPU_DEVICE; return ACCEL_OK; }
    if (strcmp(s, "meta") == 0) { *out = ACCEL_META_DEVICE; return ACCEL_OK; }
    int t = indexed_type_of(s);
    if (t >= 0 && parsable((accel_device_type)t)) return parse_indexed(s, (accel_device_type)t, out);
    return accel_set_error(ACCEL_ERR_DEVICE, "unknown device '%s': accel knows cpu, meta, cuda:N%s%s", s,
                           registry_get(ACCEL_DEV_NPU) ? ", npu:N" : "",
                           registry_get(ACCEL_DEV_HOSTLESS) ? ", hostless:N (test devices)" : "");
}

accel_status accel__device_name(const char *s, accel_device *out) {
    if (strcmp(s, "cpu") == 0) { *out = ACCEL_CPU_DEVICE; return ACCEL_OK; }
    if (strcmp(s, "meta") == 0) { *out = ACCEL_META_DEVICE; return ACCEL_OK; }
    int t = indexed_type_of(s);
    if (t >= 0) return parse_indexed(s, (accel_device_type)t, out);
    return accel_set_error(ACCEL_ERR_INVALID_ARG, "unknown device '%s': device names are cpu, meta, cuda[:N], "
                           "npu[:N] and hostless[:N]", s);
}

bool accel_device_available(accel_device d) {
    if (d.type == ACCEL_DEV_META) return true;
    const accel_backend *b = accel__backend_of(d);
    return b && d.index >= 0 && d.index < b->device_count();
}

int accel_device_count(accel_device_type t) {
    if (t == ACCEL_DEV_META) return 1;
    const accel_backend *b = accel__backend_of((accel_device){t, 0});
    return b ? b->device_count() : 0;
}

accel_status accel_device_mem_info(accel_device d, size_t *free_bytes, size_t *total_bytes) {
    if (!free_bytes || !total_bytes)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_device_mem_info: NULL argument");
    const accel_backend *b = accel__backend_for(d, "accel_device_mem_info");
    return b ? b->mem.mem_info(d.index, free_bytes, total_bytes) : accel_last_status();
}

accel_status accel_device_synchronize(accel_device d) {
    if (d.type == ACCEL_DEV_META) return ACCEL_OK;
    const accel_backend *b = accel__backend_for(d, "accel_device_synchronize");
    if (!b) return accel_last_status();
    return b->async.synchronize ? b->async.synchronize(d.index) : ACCEL_OK;
}

/* ---------------------------------------------------------------- default device */

static _Thread_local bool tl_default_set;
static _Thread_local accel_device tl_default;

accel_device accel_default_device(void) {
    if (!tl_default_set) {
        tl_default_set = true;
        tl_default = ACCEL_CPU_DEVICE;
        const char *s = getenv("ACCEL_DEFAULT_DEVICE");
        accel_device d;
        if (s && *s) {
            if (accel_device_parse(s, &d) == ACCEL_OK && accel_device_available(d)) tl_default = d;
            else {
                fprintf(stderr, "accel: ACCEL_DEFAULT_DEVICE=%s is not an available device; using cpu\n", s);
                accel_clear_error();
            }
        }
    }
    return tl_default;
}

accel_device accel_set_default_device(accel_device d) {
    accel_device prev = accel_default_device();
    if (d.type != ACCEL_DEV_META && !accel_device_available(d)) {
        char s[32];
        accel_set_error(ACCEL_ERR_DEVICE, "accel_set_default_device: device %s is not available",
                        accel_device_str(d, s, sizeof s));
        return prev;
    }
    tl_default = d;
    return prev;
}
