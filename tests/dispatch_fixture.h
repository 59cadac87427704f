/* Helpers of the tests that save a Llama, load it back onto devices with
 * load_checkpoint_and_dispatch and compare with the cpu (test_device_bigmodel,
 * test_pinned_staging). Include after check.h. */
#ifndef ACCEL_TESTS_DISPATCH_FIXTURE_H
#define ACCEL_TESTS_DISPATCH_FIXTURE_H

#include <stdlib.h>

#include "accel/bigmodel.h"
#include "accel/nn.h"

/* max |a - b| over the elements of two tensors on any devices (-1 on a size mismatch) */
static inline double max_diff(const accel_tensor *a, const accel_tensor *b) {
    int64_t n = accel_numel(a);
    if (!a || !b || n != accel_numel(b)) return -1;
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
    double m = -1;
    if (accel_to_floats(a, x) == ACCEL_OK && accel_to_floats(b, y) == ACCEL_OK) {
        m = 0;
        for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)x[i] - y[i]));
    }
    free(x);
    free(y);
    return m;
}

/* A Llama of cfg with weights drawn from seed, saved (save_pretrained) into dir. */
static inline void save_llama(const accel_llama_config *cfg, uint64_t seed, const char *dir) {
    accel_manual_seed(seed);
    accel_module *m = accel_llama_new(cfg, ACCEL_CPU_DEVICE);
    CHECK_MSG(m && accel_save_pretrained(m, dir, 0) == ACCEL_OK, "%s", accel_last_error());
    accel_module_free(m);
}

typedef struct loaded {
    accel_module *m;
    accel_dispatched *d;
} loaded;

static const char *const FIXTURE_NO_SPLIT[] = {"LlamaDecoderLayer"};

/* The Llama saved in dir, built on meta and loaded with map (freed here;
 * NULL: all on the cpu) and the options of extra, decoder layers unsplit. */
static inline loaded load_llama(const char *dir, accel_device_map *map, const accel_load_opts *extra) {
    accel_llama_config cfg;
    loaded l = {0};
    if (accel_llama_config_load(dir, &cfg) != ACCEL_OK) return l;
    accel_init_empty_weights_begin();
    l.m = accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    accel_init_empty_weights_end();
    accel_device_map_opts mo = {.no_split = FIXTURE_NO_SPLIT, .n_no_split = 1};
    accel_load_opts lo = extra ? *extra : (accel_load_opts){0};
    lo.map_opts = &mo;
    l.d = l.m ? accel_load_checkpoint_and_dispatch(l.m, dir, map, NULL, NULL, &lo) : NULL;
    CHECK_MSG(l.d != NULL, "%s", accel_last_error());
    accel_device_map_free(map);
    return l;
}

static inline void unload(loaded *l) {
    accel_dispatched_free(l->d);
    accel_module_free(l->m);
}

/* Logits of the n token ids as a persistent cpu tensor (they come back to
 * the cpu, where the ids are: io_same_device). */
static inline accel_tensor *llama_logits(loaded *l, const int64_t *ids, int64_t n) {
    accel_tensor *x = accel_from_data(ACCEL_I64, ACCEL_SHAPE(1, n), ids);
    accel_tensor *y = l->d ? accel_llama_forward(l->m, x, NULL) : NULL;
    CHECK_MSG(y != NULL, "%s", accel_last_error());
    CHECK(!y || y->device.type == ACCEL_DEV_CPU);
    accel_tensor *out = y ? accel_tensor_clone_persistent(y, ACCEL_CPU_DEVICE) : NULL;
    accel_step_reset();
    return out;
}

#endif
