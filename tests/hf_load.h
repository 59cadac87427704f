/* A decoder checkpoint of tests/data (a tools/gen_hf_*fixtures.py folder)
 * built from a config and its model.safetensors loaded by name: the
 * fixtures' tests that compare with transformers (test_hf_padded,
 * test_hf_bf16_scores). */
#ifndef ACCEL_TESTS_HF_LOAD_H
#define ACCEL_TESTS_HF_LOAD_H

#include <stdbool.h>
#include <stdio.h>

#include "accel/accel.h"

/* dir's model.safetensors in a decoder built from c (a tied head is its
 * embedding: loaded under that name), in training mode or eval; NULL with
 * the error set. */
static inline accel_module *hf_load_as(const char *dir, const accel_llama_config *c, bool train) {
    accel_module *m = accel_llama_new(c, ACCEL_CPU_DEVICE);
    char path[320];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    accel_safetensors *w = m ? accel_safetensors_open(path) : NULL;
    accel_state_dict *sd = w ? accel_module_state_dict(m) : NULL;
    bool ok = sd != NULL;
    for (int i = 0; ok && i < sd->n; i++)
        ok = sd->entries[i].is_tied_alias ||
             accel_safetensors_load_into(w, sd->entries[i].name, sd->entries[i].t) == ACCEL_OK;
    accel_state_dict_free(sd);
    accel_safetensors_close(w);
    if (!ok) {
        accel_module_free(m);
        return NULL;
    }
    accel_module_train(m, train);
    return m;
}

/* dir's checkpoint built from its config.json, weights loaded by name, in eval. */
static inline accel_module *hf_load_eval(const char *dir) {
    accel_llama_config c;
    return accel_llama_config_load(dir, &c) == ACCEL_OK ? hf_load_as(dir, &c, false) : NULL;
}

#endif
