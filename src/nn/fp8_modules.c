/* mixed_precision='fp8' on modules (nn/fp8_modules.h). */
#include "nn/fp8_modules.h"

#include <string.h>

#include "nn_internal.h"
#include "ops/fp8_linear.h"
#include "tp_internal.h"

static const char META_NAME[] = "fp8_meta";

/* A Linear, or a tensor-parallel one judged by the slice its GEMM reads
 * (as TransformerEngine's parallel Linears: a weight whose whole dims are
 * multiples of 16 but whose slice's are not stays bf16). */
static bool fp8_eligible(accel_module *m) {
    accel_tensor *w = accel__module_tensor(m, "weight");
    int64_t s[2];
    if (!accel__tp_linear_gemm_shape(m, s)) {
        if (strcmp(m->ops->type_name, "Linear") != 0 || !w || w->ndim != 2) return false;
        s[0] = w->shape[0], s[1] = w->shape[1];
    }
    return s[0] % 16 == 0 && s[1] % 16 == 0 && w->device.type != ACCEL_DEV_META;
}

accel_status accel__fp8_convert_model(accel_module *root, accel__fp8_recipe r) {
    if (!root) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel__fp8_convert_model: module is NULL");
    if (fp8_eligible(root) && !accel__module_tensor(root, META_NAME)) {
        accel_tensor *meta = accel__fp8_meta_new(r.history_len, accel__module_tensor(root, "weight")->device);
        if (!meta || !accel_module_add_buffer(root, META_NAME, meta)) return accel_last_status();
    }
    for (int i = 0; i < root->n_children; i++) {
        accel_status st = accel__fp8_convert_model(root->children[i], r);
        if (st != ACCEL_OK) return st;
    }
    return ACCEL_OK;
}

bool accel__fp8_meta_name(const char *name) {
    size_t n = strlen(name), k = sizeof META_NAME - 1;
    return n >= k && !strcmp(name + n - k, META_NAME) && (n == k || name[n - k - 1] == '.');
}

/* Appends root's tree's metas to metas and their Linears' weights to
 * weights, depth first; *n counts them (metas NULL: only counts; weights
 * NULL: the metas only). */
static void collect_metas(accel_module *root, accel_tensor **metas, accel_tensor **weights, int *n) {
    accel_tensor *meta = accel__module_tensor(root, META_NAME);
    if (meta) {
        if (metas) metas[*n] = meta;
        if (weights) weights[*n] = accel__module_tensor(root, "weight");
        (*n)++;
    }
    for (int i = 0; i < root->n_children; i++) collect_metas(root->children[i], metas, weights, n);
}

accel_status accel__fp8_model_metas(accel_module *root, accel_tensor ***metas, accel_tensor ***weights, int *n) {
    int count = 0;
    *metas = NULL, *n = 0;
    if (weights) *weights = NULL;
    collect_metas(root, NULL, NULL, &count);
    if (!count) return ACCEL_OK;
    *metas = accel_malloc(sizeof **metas * (size_t)count);
    accel_tensor **w = *metas && weights ? accel_malloc(sizeof *w * (size_t)count) : NULL;
    if (!*metas || (weights && !w)) {
        accel_free(*metas);
        *metas = NULL;
        return accel_last_status();
    }
    if (weights) *weights = w;
    collect_metas(root, *metas, w, n);
    return ACCEL_OK;
}

accel_status accel__fp8_check_devices(accel_module *root, const char *op) {
    if (fp8_eligible(root)) {
        accel_status st = accel__fp8_device_check(accel__module_tensor(root, "weight")->device, op);
        if (st != ACCEL_OK) return st;
    }
    for (int i = 0; i < root->n_children; i++) {
        accel_status st = accel__fp8_check_devices(root->children[i], op);
        if (st != ACCEL_OK) return st;
    }
    return ACCEL_OK;
}

accel_tensor *accel__fp8_linear_meta(accel_module *m) {
    return accel__fp8_autocast() ? accel__module_tensor(m, META_NAME) : NULL;
}
