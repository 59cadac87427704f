/* Lookups every file of src/accelerator shares: a NULL accelerator, the
 * prepared model of a module, the running data loader, the autocast dtype,
 * whether a backward synchronises gradients. */
#include "accelerator_internal.h"

bool accel__acc_null(const accel_accelerator *acc, const char *fn) {
    if (acc) return ACCEL__DEAD(acc, ACCEL__MAGIC_ACCELERATOR, fn, "accelerator");
    accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: accelerator is NULL", fn);
    return true;
}

accel__model *accel__find_model(accel_accelerator *acc, const accel_module *m) {
    if (!acc) return NULL;
    for (int i = 0; i < acc->n_models; i++)
        if (acc->models[i].m == m) return &acc->models[i];
    return NULL;
}

accel_dataloader *accel__active_dataloader(const accel_accelerator *acc) {
    for (int i = acc->n_dls - 1; i >= 0; i--)
        if (accel_dataloader_active(acc->dls[i])) return acc->dls[i];
    return NULL;
}

accel_dtype accel__acc_autocast_dtype(const accel_accelerator *acc) {
    return acc->mp == ACCEL_MP_BF16 || acc->mp == ACCEL_MP_FP8 ? ACCEL_BF16
           : acc->mp == ACCEL_MP_FP16                       ? ACCEL_F16
                                                             : ACCEL_F32;
}

bool accel__model_syncs(const accel_accelerator *acc, const accel__model *pm) {
    return pm->ddp && !pm->no_sync && (acc->sync_gradients || acc->o.sync_each_batch);
}
