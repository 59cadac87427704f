/* examples/dispatch.c DIR [--devices A,B]
 *
 * The seed's load_checkpoint_and_dispatch check on the 20-layer toy
 * checkpoint written by save_fake_llama: the skeleton is built on meta, then
 * an explicit two-device map puts embed_tokens + layers 0-9 on A and layers
 * 10-19 + norm + lm_head on B, and one forward runs on ids [[1, 2, 3]].
 * This machine has only the CPU, so A,B default to cpu,disk: the second half
 * stays in the mapped checkpoint and is read in as each layer runs. Any two
 * map values work (cpu,cpu; cuda:0,cuda:1 in a CUDA build); a device this
 * build lacks (npu:0) fails at load time naming the entry.
 * Prints first_layer_device, last_layer_device, out_device, out_shape, and
 * the time from process start to the logits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "accel/autograd.h"
#include "accel/bigmodel.h"
#include "accel/io.h"

static double process_seconds(void) {
    /* time since the process started: CLOCK_MONOTONIC now minus the start
     * time recorded in /proc/self/stat (in clock ticks since boot) */
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return -1;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long long start = 0;
    for (int field = 2; p && field < 22; field++) p = strchr(p + 1, ' ');
    if (!p || sscanf(p + 1, "%llu", &start) != 1) return -1;
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9 - (double)start / (double)sysconf(_SC_CLK_TCK);
}

int main(int argc, char **argv) {
    const char *dir = NULL, *devices = "cpu,disk";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--devices") == 0 && i + 1 < argc) devices = argv[++i];
        else if (argv[i][0] != '-' && !dir) dir = argv[i];
        else dir = NULL;
    }
    char a[24], b[24];
    const char *comma = strchr(devices, ',');
    if (!dir || !comma || comma == devices || !comma[1] || (size_t)(comma - devices) >= sizeof a ||
        strlen(comma + 1) >= sizeof b) {
        fprintf(stderr, "usage: dispatch DIR [--devices A,B]   (default cpu,disk)\n");
        return 2;
    }
    snprintf(a, sizeof a, "%.*s", (int)(comma - devices), devices);
    snprintf(b, sizeof b, "%s", comma + 1);
    double t0 = accel_now_seconds();

    accel_llama_config cfg;
    if (accel_llama_config_load(dir, &cfg) != ACCEL_OK) {
        fprintf(stderr, "dispatch: %s\n", accel_last_error());
        return 1;
    }
    accel_init_empty_weights_begin();
    accel_module *skeleton = accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    accel_init_empty_weights_end();
    accel_device_map *map = accel_device_map_new();
    if (!skeleton || !map) {
        fprintf(stderr, "dispatch: %s\n", accel_last_error());
        return 1;
    }
    int half = (int)(cfg.num_hidden_layers / 2);
    accel_device_map_set(map, "model.embed_tokens", a);
    for (int i = 0; i < cfg.num_hidden_layers; i++) {
        char key[64];
        snprintf(key, sizeof key, "model.layers.%d", i);
        accel_device_map_set(map, key, i < half ? a : b);
    }
    accel_device_map_set(map, "model.norm", b);
    accel_device_map_set(map, "lm_head", b);

    static const char *const no_split[] = {"LlamaDecoderLayer"};
    accel_device_map_opts mo = {.no_split = no_split, .n_no_split = 1};
    accel_load_opts lo = {.map_opts = &mo};
    accel_dispatched *d = accel_load_checkpoint_and_dispatch(skeleton, dir, map, NULL, NULL, &lo);
    int rc = 0;
    if (!d) {
        fprintf(stderr, "dispatch: %s\n", accel_last_error());
        rc = 1;
        goto done;
    }
    double t_load = accel_now_seconds();
    char key_first[64], key_last[64];
    snprintf(key_first, sizeof key_first, "model.layers.0.self_attn.q_proj.weight");
    snprintf(key_last, sizeof key_last, "model.layers.%d.self_attn.q_proj.weight", (int)cfg.num_hidden_layers - 1);

    accel_set_grad_enabled(false); /* inference (torch.no_grad) */
    accel_tensor *x = accel_from_data(ACCEL_I64, ACCEL_SHAPE(1, 3), (const int64_t[]){1, 2, 3});
    accel_tensor *out = accel_llama_forward(skeleton, x, NULL);
    if (!out) {
        fprintf(stderr, "dispatch: %s\n", accel_last_error());
        rc = 1;
        goto done;
    }
    double t_out = accel_now_seconds(), since_start = process_seconds();
    char shape[64];
    printf("first_layer_device=%s\n", accel_device_map_lookup(map, key_first));
    printf("last_layer_device=%s\n", accel_device_map_lookup(map, key_last));
    printf("out_device=%s\n", accel_device_type_name(out->device.type));
    printf("out_shape=%s\n", accel_shape_str(out, shape, sizeof shape));
    accel_dispatch_stats s;
    accel_dispatched_stats(d, &s);
    printf("load_ms=%.1f forward_ms=%.1f process_to_logits_ms=%.1f resident_bytes=%lld disk_bytes=%lld\n",
           (t_load - t0) * 1e3, (t_out - t_load) * 1e3, since_start * 1e3, (long long)s.bytes_resident,
           (long long)s.bytes_disk);
done:
    accel_step_reset();
    accel_dispatched_free(d);
    accel_module_free(skeleton);
    accel_device_map_free(map);
    return rc;
}
