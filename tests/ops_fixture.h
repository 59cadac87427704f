/* tests/ops_fixture.h — reads the PyTorch fixtures written by
 * tools/gen_ops_fixtures.py (tests/data/ops_*.bin) and compares tensors.
 *
 * Format (little-endian): "AOPF" | u32 count | count x (u32 name_len | name |
 * u32 ndim | i64 shape[ndim] | f32 data[numel]). The loader checks every size
 * against the file length. Tensors are returned as persistent f32 tensors on
 * the default device (accel_default_device(): the op tests run on the hostless
 * test device too); the caller frees them with fx_free.
 */
#ifndef ACCEL_TESTS_OPS_FIXTURE_H
#define ACCEL_TESTS_OPS_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "check.h"

#define FX_MAX 256 /* tensors a fixture file holds (ops_conv.bin: 193) */

typedef struct fx_file {
    int n;
    char names[FX_MAX][64];
    accel_tensor *t[FX_MAX];
} fx_file;

/* A bad id or target: refused by the op itself (cpu, hostless) or, on a
 * device that checks them without a host wait (cuda, docs/cuda.md), by its
 * next synchronisation, whose error names the op. r: what the op returned. */
static inline bool refused_now_or_at_sync(const accel_tensor *r) {
    return !r || (r->device.type == ACCEL_DEV_CUDA && accel_device_synchronize(r->device) != ACCEL_OK);
}

static inline void fx_free(fx_file *f) {
    for (int i = 0; i < f->n; i++) accel_tensor_free(f->t[i]);
    f->n = 0;
}

static inline int fx_read_(FILE *fp, void *p, size_t n) { return fread(p, 1, n, fp) == n ? 0 : -1; }

/* Returns 0 on success; prints the problem otherwise. */
static inline int fx_load(fx_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "fixture %s: cannot open (run tests from tests/)\n", path);
        return -1;
    }
    char magic[4];
    uint32_t count;
    int rc = fx_read_(fp, magic, 4) || memcmp(magic, "AOPF", 4) || fx_read_(fp, &count, 4) || count > FX_MAX;
    for (uint32_t i = 0; !rc && i < count; i++) {
        uint32_t len, ndim;
        int64_t shape[ACCEL_MAX_DIMS];
        rc = fx_read_(fp, &len, 4) || len >= sizeof f->names[0] || fx_read_(fp, f->names[i], len) ||
             fx_read_(fp, &ndim, 4) || ndim > ACCEL_MAX_DIMS || fx_read_(fp, shape, 8 * (size_t)ndim);
        if (rc) break;
        f->names[i][len] = 0;
        int64_t numel = 1;
        for (uint32_t d = 0; d < ndim; d++) {
            if (shape[d] < 0 || shape[d] > (1 << 20)) rc = 1;
            numel *= shape[d];
        }
        if (rc || numel > (1 << 20)) break;
        f->t[i] = accel_tensor_new(ACCEL_F32, (int)ndim, shape, accel_default_device());
        f->n = (int)i + 1;
        float *buf = malloc(4 * (size_t)(numel ? numel : 1));
        rc = !f->t[i] || !buf || fx_read_(fp, buf, 4 * (size_t)numel) || accel_tensor_from_host(f->t[i], buf);
        free(buf);
    }
    fclose(fp);
    if (rc) {
        fprintf(stderr, "fixture %s: malformed\n", path);
        fx_free(f);
        return -1;
    }
    return 0;
}

/* The tensor called name, or NULL when absent (no failed CHECK: case loops
 * stop at the first absent case). */
static inline accel_tensor *fx_find(fx_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) return f->t[i];
    return NULL;
}

/* The tensor called name (NULL, with a failed CHECK, when absent). */
static inline accel_tensor *fx_get(fx_file *f, const char *name) {
    accel_tensor *t = fx_find(f, name);
    CHECK_MSG(t, "fixture has no tensor %s", name);
    return t;
}

/* Counts elements of `got` (any dtype) not within rtol/atol of `want` (f32);
 * prints the first mismatch. Shape mismatch counts as one failure. */
static inline int fx_compare(const char *what, const accel_tensor *got, const accel_tensor *want, double rtol,
                             double atol) {
    if (!got || !want || !accel_same_shape(got, want)) {
        fprintf(stderr, "%s: missing tensor or shape mismatch (%s)\n", what, accel_last_error());
        return 1;
    }
    int64_t n = accel_numel(want);
    float *g = malloc(sizeof(float) * (size_t)(n ? n : 1)), *w = malloc(sizeof(float) * (size_t)(n ? n : 1));
    accel_to_floats(got, g);
    accel_to_floats(want, w);
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)g[i] - w[i]) <= atol + rtol * fabs((double)w[i]))) {
            if (!bad) fprintf(stderr, "%s: elem %lld: %.9g vs torch %.9g\n", what, (long long)i, g[i], w[i]);
            bad++;
        }
    free(g);
    free(w);
    return bad;
}

#define CHECK_FX(what, got, want, rtol, atol) CHECK(fx_compare(what, got, want, rtol, atol) == 0)

#endif
