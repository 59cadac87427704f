/* examples/empty_weights.c — the seed's init_empty_weights check: a
 * 1-layer / 1-head / hidden-64 Llama built on the meta device costs no weight
 * memory. Prints empty_model_params=<n> (every state-dict tensor, like
 * sum(p.numel() for p in model.state_dict().values())) and device=meta. */
#include <stdio.h>

#include "accel/bigmodel.h"
#include "accel/io.h"

int main(void) {
    accel_llama_config cfg = accel_llama_config_default();
    cfg.vocab_size = 32;
    cfg.hidden_size = 64;
    cfg.intermediate_size = 64;
    cfg.num_hidden_layers = 1;
    cfg.num_attention_heads = 1;
    cfg.num_key_value_heads = 1;
    cfg.max_position_embeddings = 64;
    accel_init_empty_weights_begin();
    accel_module *model = accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    accel_init_empty_weights_end();
    accel_state_dict *sd = model ? accel_module_state_dict(model) : NULL;
    if (!sd) {
        fprintf(stderr, "empty_weights: %s\n", accel_last_error());
        accel_module_free(model);
        return 1;
    }
    int64_t n = 0;
    for (int i = 0; i < sd->n; i++) n += accel_numel(sd->entries[i].t);
    char dev[32];
    printf("empty_model_params=%lld\n", (long long)n);
    printf("device=%s\n", accel_device_str(sd->entries[0].t->device, dev, sizeof dev));
    accel_state_dict_free(sd);
    accel_module_free(model);
    return 0;
}
