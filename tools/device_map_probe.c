/* tools/device_map_probe.c: what accel's from_pretrained does with a device
 * map, for tools/sweep_device_maps.py, which compares it with Accelerate and
 * transformers. Reads cases from stdin, one a line, tab-separated; prints one
 * line a case, or "ERROR <message>".
 *
 * device_map_probe: the map from_pretrained would infer, without loading a
 * weight (compared with Accelerate's infer_auto_device_map, after
 * get_balanced_memory for the balanced ones):
 *     DIR <tab> STRATEGY <tab> BUDGETS [<tab> HEAD]
 * STRATEGY: auto, balanced, balanced_low_0 or sequential; BUDGETS:
 * DEVICE=BYTES,... (DEVICE a GPU index, cpu or disk); HEAD, for a BERT,
 * RoBERTa or XLM-RoBERTa directory only: transformers' class of the head
 * ("BertForMaskedLM", ...), as accel_bert_from_pretrained_head_dispatched
 * takes it. Prints the map as JSON (accel_device_map_str). The model is
 * built on meta from DIR's config.json in its torch_dtype, its
 * accel_module_no_split_classes unsplit, as from_pretrained places it.
 *
 * device_map_probe --load: where from_pretrained puts each weight with a map
 * transformers made (json.dump(model.hf_device_map), accel_device_map_load):
 *     DIR <tab> MAP.json [<tab> HEAD]
 * Prints {"state dict name": placement, ...} (accel_dispatched_placement:
 * "cpu", "disk", "cpu-offload", "hostless:0", ...) for every name of the
 * model's state dict.
 * Built with the library: build/bin/device_map_probe. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/bert.h"
#include "accel/bigmodel.h"
#include "accel/io.h"

/* The next tab-separated field of *p (empty ones kept), NULL past the last. */
static char *field(char **p) {
    char *f = *p, *tab = f ? strchr(f, '\t') : NULL;
    if (tab) *tab = 0;
    *p = tab ? tab + 1 : NULL;
    return f;
}

/* dir's BERT config with the head whose class for its model type is cls. */
static accel_status bert_config(const char *dir, const char *cls, accel_bert_config *cfg) {
    if (accel_bert_config_load(dir, cfg) != ACCEL_OK) return accel_last_status();
    for (int h = 0; h < ACCEL_BERT_HEADS; h++) {
        const char *name = accel_bert_class_name(cfg->model_type, (accel_bert_head)h);
        if (name && !strcmp(name, cls)) {
            cfg->head = (accel_bert_head)h;
            return ACCEL_OK;
        }
    }
    return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: no head of model type %s is called %s", dir,
                           accel_bert_model_type_name(cfg->model_type), cls);
}

/* dir's model on meta: a decoder (head NULL) or BERT's with that head. */
static accel_module *skeleton(const char *dir, const char *head) {
    accel_llama_config cfg;
    accel_bert_config bcfg;
    if ((head ? bert_config(dir, head, &bcfg) : accel_llama_config_load(dir, &cfg)) != ACCEL_OK) return NULL;
    accel_init_empty_weights_begin();
    accel_module *m = head ? accel_bert_new(&bcfg, ACCEL_CPU_DEVICE) : accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    accel_init_empty_weights_end();
    return m;
}

static void infer(const char *dir, const char *strategy, char *budgets, const char *head) {
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
    accel_module *m = skeleton(dir, head);
    if (!m) {
        printf("ERROR %s\n", accel_last_error());
        return;
    }
    const char *no_split[ACCEL_MAX_NO_SPLIT];
    accel_device_map_opts mo = {.no_split = no_split, .n_no_split = accel_module_no_split_classes(m, no_split)};
    accel_device_map *map = accel_device_map_from_string(m, strategy, &mm, &mo);
    static char buf[1 << 20];
    if (map) printf("%s\n", accel_device_map_str(map, buf, sizeof buf));
    else printf("ERROR %s\n", accel_last_error());
    accel_device_map_free(map);
    accel_module_free(m);
}

static void load(const char *dir, const char *map_file, const char *head) {
    accel_device_map *map = accel_device_map_load(map_file);
    accel_bert_config cfg;
    accel_dispatched *d = NULL;
    accel_module *m = !map ? NULL
                      : !head ? accel_llama_from_pretrained(dir, map, NULL, NULL, NULL, &d)
                      : bert_config(dir, head, &cfg) == ACCEL_OK
                          ? accel_bert_from_pretrained_head_dispatched(dir, (int)cfg.head, 0, map, NULL, NULL, NULL, &d)
                          : NULL;
    accel_state_dict *sd = m ? accel_module_state_dict(m) : NULL;
    if (!sd) {
        printf("ERROR %s\n", accel_last_error());
    } else {
        for (int i = 0; i < sd->n; i++) {
            const char *where = accel_dispatched_placement(d, sd->entries[i].name);
            printf("%s\"%s\": \"%s\"", i ? ", " : "{", sd->entries[i].name, where ? where : "?");
        }
        printf("}\n");
    }
    accel_state_dict_free(sd);
    accel_dispatched_free(d);
    accel_module_free(m);
    accel_device_map_free(map);
}

int main(int argc, char **argv) {
    bool loading = argc == 2 && !strcmp(argv[1], "--load");
    if (argc > 1 && !loading) {
        fprintf(stderr, "usage: device_map_probe [--load] < cases\n");
        return 2;
    }
    static char line[1 << 16];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        char *p = line, *dir = field(&p), *second = field(&p), *third = field(&p), *fourth = field(&p);
        if (!dir[0] || !second) {
            printf("ERROR a case is %s\n", loading ? "DIR<tab>MAP[<tab>HEAD]" : "DIR<tab>STRATEGY<tab>BUDGETS[<tab>HEAD]");
        } else if (loading) {
            load(dir, second, third && third[0] ? third : NULL);
        } else {
            char none[1] = "";
            infer(dir, second, third ? third : none, fourth && fourth[0] ? fourth : NULL);
        }
        fflush(stdout);
    }
    return 0;
}
