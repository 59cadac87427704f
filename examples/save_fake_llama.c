/* examples/save_fake_llama.c DIR [--dtype float32|bfloat16|float16] [--layers N] [--seed S]
 *
 * The seed's toy checkpoint: a 20-layer / hidden-512 / intermediate-1024 /
 * vocab-32000 / 8-head Llama built on meta, materialised (to_empty), every
 * parameter filled with randn * 0.02, written with save_pretrained
 * (config.json + model.safetensors) so transformers can load it. Prints DIR. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/bigmodel.h"
#include "accel/io.h"

int main(int argc, char **argv) {
    const char *dir = NULL;
    accel_dtype dt = ACCEL_F32;
    long layers = 20;
    unsigned long long seed = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
            int d = accel_dtype_parse(argv[++i]);
            if (d < 0 || !accel_dtype_is_float((accel_dtype)d)) {
                fprintf(stderr, "save_fake_llama: unknown floating dtype '%s'\n", argv[i]);
                return 2;
            }
            dt = (accel_dtype)d;
        } else if (strcmp(argv[i], "--layers") == 0 && i + 1 < argc) {
            layers = strtol(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 10);
        } else if (argv[i][0] != '-' && !dir) {
            dir = argv[i];
        } else {
            dir = NULL;
            break;
        }
    }
    if (!dir || layers < 1) {
        fprintf(stderr, "usage: save_fake_llama DIR [--dtype float32|bfloat16|float16] [--layers N] [--seed S]\n");
        return 2;
    }
    accel_llama_config cfg = accel_llama_config_default();
    cfg.vocab_size = 32000;
    cfg.hidden_size = 512;
    cfg.intermediate_size = 1024;
    cfg.num_hidden_layers = layers;
    cfg.num_attention_heads = 8;
    cfg.num_key_value_heads = 8;
    cfg.max_position_embeddings = 64;
    cfg.torch_dtype = dt;
    accel_init_empty_weights_begin();
    accel_module *model = accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    accel_init_empty_weights_end();
    accel_status st = model ? accel_module_to_empty(model, ACCEL_CPU_DEVICE, (int)dt) : accel_last_status();
    accel_tensor **params = NULL;
    int n = st == ACCEL_OK ? accel_module_parameters(model, &params) : 0;
    if (n < 0) st = accel_last_status();
    accel_rng rng;
    accel_rng_init(&rng, seed);
    for (int i = 0; i < n && st == ACCEL_OK; i++) st = accel_rng_normal_(&rng, params[i], 0.0, 0.02);
    if (st == ACCEL_OK) st = accel_save_pretrained(model, dir, 0);
    accel_free(params);
    accel_module_free(model);
    if (st != ACCEL_OK) {
        fprintf(stderr, "save_fake_llama: %s\n", accel_last_error());
        return 1;
    }
    printf("%s\n", dir);
    return 0;
}
