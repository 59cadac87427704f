/* tools/device_map_probe.c: the device map accel_llama_from_pretrained would
 * build for a model directory, a strategy and budgets, without loading a
 * weight: for tools/sweep_device_maps.py, which compares it with Accelerate's
 * infer_auto_device_map (after get_balanced_memory for the balanced ones).
 *
 * Reads cases from stdin, one a line, tab-separated:
 *     DIR <tab> STRATEGY <tab> BUDGETS
 * STRATEGY: auto, balanced, balanced_low_0 or sequential; BUDGETS:
 * DEVICE=BYTES,... (DEVICE a GPU index, cpu or disk). Prints one line a case:
 * the map as JSON (accel_device_map_str), or "ERROR <message>". The model is
 * built on meta from DIR's config.json in its torch_dtype, its decoder layer
 * class unsplit, as accel_llama_from_pretrained builds and places it.
 * Built with the library: build/bin/device_map_probe. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/bigmodel.h"
#include "accel/io.h"

static void probe(char *dir, const char *strategy, char *budgets) {
    accel_max_memory mm = {0};
    for (char *save = NULL, *tok = strtok_r(budgets, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) {
            printf("ERROR budget '%s' is not DEVICE=BYTES\n", tok);
            return;
        }
        *eq = 0;
        if (accel_max_memory_set(&mm, tok, eq + 1) != ACCEL_OK) {
            printf("ERROR %s\n", accel_last_error());
            return;
        }
    }
    accel_llama_config cfg;
    if (accel_llama_config_load(dir, &cfg) != ACCEL_OK) {
        printf("ERROR %s\n", accel_last_error());
        return;
    }
    accel_init_empty_weights_begin();
    accel_module *m = accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    accel_init_empty_weights_end();
    if (!m) {
        printf("ERROR %s\n", accel_last_error());
        return;
    }
    const char *no_split[] = {accel_module_decoder_layer_class(m)};
    accel_device_map_opts mo = {.no_split = no_split, .n_no_split = 1};
    accel_device_map *map = accel_device_map_from_string(m, strategy, &mm, &mo);
    static char buf[1 << 20];
    if (map) printf("%s\n", accel_device_map_str(map, buf, sizeof buf));
    else printf("ERROR %s\n", accel_last_error());
    accel_device_map_free(map);
    accel_module_free(m);
}

int main(void) {
    static char line[1 << 16];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        char *save = NULL, *dir = strtok_r(line, "\t", &save), *strategy = strtok_r(NULL, "\t", &save),
             *budgets = strtok_r(NULL, "\t", &save);
        if (!dir || !strategy) {
            printf("ERROR a case is DIR<tab>STRATEGY<tab>BUDGETS\n");
        } else {
            char none[1] = "";
            probe(dir, strategy, budgets ? budgets : none);
        }
        fflush(stdout);
    }
    return 0;
}
