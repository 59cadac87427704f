/* config.json of a model's root by its family (nn/family.h): the writer of
 * each family's file, so save_model asks for "the config" and names no model. */
#include "accel/bert.h"
#include "io/io_internal.h"
#include "nn/family.h"

static accel_status save_decoder(const accel_module *m, const char *dir, accel_dtype dt) {
    accel_llama_config cfg = *(const accel_llama_config *)m->impl;
    cfg.torch_dtype = dt;
    return accel_llama_config_save(dir, &cfg);
}

static accel_status save_bert(const accel_module *m, const char *dir, accel_dtype dt) {
    accel_bert_config cfg = *(const accel_bert_config *)m->impl;
    cfg.torch_dtype = dt;
    return accel_bert_config_save(dir, &cfg);
}

static const struct {
    const accel__family *family;
    accel_status (*save)(const accel_module *m, const char *dir, accel_dtype dt);
} WRITERS[] = {{&accel__decoder_family, save_decoder}, {&accel__bert_family, save_bert}};

accel_status accel__family_config_save(const accel__family *f, const accel_module *m, const char *dir,
                                       accel_dtype dt) {
    for (size_t i = 0; i < sizeof WRITERS / sizeof WRITERS[0]; i++)
        if (WRITERS[i].family == f) return WRITERS[i].save(m, dir, dt);
    return accel_set_error(ACCEL_ERR_UNSUPPORTED, "save_model: no config.json writer for the %s family", f->name);
}
