/* The outside review of the accelerator's settings (src/accelerator/
 * zero_config.c), one test each (every one failed before its fix):
 *   gradient_accumulation_steps 4294967297 in the DeepSpeed JSON ran with 1
 *     step (the int conversion wrapped), and 2^31 was reported as
 *     "got -2147483648";
 *   the JSON's stage-3 keys (stage3_param_persistence_threshold, ...) were
 *     read only when the JSON itself said stage 3: with the stage from the
 *     code (opts.zero_stage = 3) they were ignored, unchecked;
 *   a NaN gradient_clipping (opts, or ACCEL_GRADIENT_CLIPPING=nan) was taken:
 *     from the options as "no clipping", from the variable as a NaN norm;
 *   "bf16": {"enabled": 1} or "yes" (DeepSpeed reads both as true) ran
 *     without bf16, as if the key were absent;
 *   the nvme_path of the JSON and the launcher's were compared ignoring case:
 *     "/data/A" and "/data/a", two directories, "agreed";
 *   a DeepSpeed config that is a FIFO hung accel_accelerator_new (opened
 *     waiting for a writer), a directory was "'[' or '{' expected near end
 *     of file", and a key given twice was taken (the last one; DeepSpeed
 *     refuses duplicate keys);
 *   ACCEL_USE_CPU=maybe (or ACCELERATE_USE_CPU) was read as false and the
 *     run went on (Accelerate's str_to_bool raises). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "check.h"

static char DIR_[64], JSON[128];

static accel_accelerator_opts with_json(const char *text) {
    FILE *f = fopen(JSON, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.deepspeed_config_file = JSON;
    return o;
}

/* accel_accelerator_new(o) refuses, its error holding each of the needles. */
static void refused(accel_accelerator_opts o, const char *what, const char *needle, const char *needle2) {
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc == NULL, "%s: accepted", what);
    if (!acc) {
        CHECK_STR_CONTAINS(accel_last_error(), needle);
        if (needle2) CHECK_STR_CONTAINS(accel_last_error(), needle2);
    }
    accel_accelerator_free(acc);
    accel_clear_error();
}

/* Counts below their documented range: refused, naming the field (both were
 * taken as their "off" value). */
static void test_negative_counts(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.zero_stage = -5;
    refused(o, "zero_stage -5", "opts.zero_stage", "(got -5)");
    o.zero_stage = 0;
    o.total_limit = -1;
    refused(o, "total_limit -1", "total_limit must be >= 0", "(0 keeps every checkpoint; got -1)");
    o.total_limit = 0;
    o.zero_stage = -1;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc && accel_accelerator_zero_stage(acc) == 0, "%s", accel_last_error());
    accel_accelerator_free(acc);
}

static void test_accumulation_steps_past_int(void) {
    refused(with_json("{\"gradient_accumulation_steps\": 4294967297, \"zero_optimization\": {\"stage\": 2}}"),
            "2^32 + 1", "gradient_accumulation_steps", "4294967297");
    refused(with_json("{\"gradient_accumulation_steps\": 2147483648, \"zero_optimization\": {\"stage\": 2}}"),
            "2^31", "gradient_accumulation_steps", "(got 2147483648)");
    accel_accelerator_opts o = with_json("{\"gradient_accumulation_steps\": 3, \"zero_optimization\": {\"stage\": 2}}");
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc && accel_accelerator_gradient_accumulation_steps(acc) == 3, "%s", accel_last_error());
    accel_accelerator_free(acc);
}

/* Stage 3 from the code, the JSON's stage absent (DeepSpeed's default 0) or 3. */
static void test_stage3_keys_with_stage_from_code(void) {
    const char *bad[] = {"{\"zero_optimization\": {\"stage3_param_persistence_threshold\": -5}}",
                         "{\"zero_optimization\": {\"stage3_prefetch_bucket_size\": 1.5}}",
                         "{\"zero_optimization\": {\"stage3_max_live_parameters\": 1000}}",
                         "{\"zero_optimization\": {\"stage3_gather_16bit_weights_on_model_save\": \"yes\"}}"};
    const char *key[] = {"stage3_param_persistence_threshold", "stage3_prefetch_bucket_size",
                         "stage3_max_live_parameters", "stage3_gather_16bit_weights_on_model_save"};
    for (int k = 0; k < 4; k++) {
        accel_accelerator_opts o = with_json(bad[k]);
        o.zero_stage = 3;
        refused(o, key[k], key[k], NULL);
    }
    /* and at stage 2 from the code they stay DeepSpeed's business: ignored, as DeepSpeed does */
    accel_accelerator_opts o = with_json(bad[2]);
    o.zero_stage = 2;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    accel_accelerator_free(acc);
}

static void test_nan_gradient_clipping(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.gradient_clipping = NAN;
    refused(o, "opts NaN", "gradient_clipping", NULL);
    setenv("ACCEL_GRADIENT_CLIPPING", "nan", 1);
    refused(accel_accelerator_opts_default(), "ACCEL_GRADIENT_CLIPPING=nan", "ACCEL_GRADIENT_CLIPPING", "nan");
    setenv("ACCEL_GRADIENT_CLIPPING", "inf", 1); /* torch's clip_grad_norm_ takes an infinite norm: no clipping */
    accel_accelerator *acc = accel_accelerator_new(NULL);
    CHECK_MSG(acc && isinf(accel_accelerator_gradient_clipping(acc)), "%s", accel_last_error());
    accel_accelerator_free(acc);
    unsetenv("ACCEL_GRADIENT_CLIPPING");
}

static void test_bf16_enabled_not_a_bool(void) {
    refused(with_json("{\"bf16\": {\"enabled\": 1}, \"zero_optimization\": {\"stage\": 2}}"), "enabled 1",
            "bf16.enabled", NULL);
    refused(with_json("{\"fp16\": {\"enabled\": \"yes\"}, \"zero_optimization\": {\"stage\": 2}}"), "enabled yes",
            "fp16.enabled", NULL);
    refused(with_json("{\"bf16\": true, \"zero_optimization\": {\"stage\": 2}}"), "bf16 true", "bf16", NULL);
    /* "auto" and a bool are what DeepSpeed documents */
    accel_accelerator_opts o = with_json("{\"bf16\": {\"enabled\": \"auto\"}, \"zero_optimization\": {\"stage\": 2}}");
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    accel_accelerator_free(acc);
}

static void test_nvme_paths_differ_in_case(void) {
    char a[128], b[128], text[512];
    snprintf(a, sizeof a, "%s/A", DIR_);
    snprintf(b, sizeof b, "%s/a", DIR_);
    CHECK(mkdir(a, 0700) == 0 && mkdir(b, 0700) == 0);
    snprintf(text, sizeof text, "{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"nvme\", "
             "\"nvme_path\": \"%s\"}}}", a);
    setenv("ACCEL_OFFLOAD_OPTIMIZER_NVME_PATH", b, 1);
    refused(with_json(text), "A vs a", "offload_optimizer.nvme_path", "ACCEL_OFFLOAD_OPTIMIZER_NVME_PATH");
    setenv("ACCEL_OFFLOAD_OPTIMIZER_NVME_PATH", a, 1); /* the same path agrees */
    accel_accelerator_opts o = with_json(text);
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    accel_accelerator_free(acc);
    /* a device name is a keyword: any case */
    setenv("ACCEL_OFFLOAD_OPTIMIZER_DEVICE", "NVME", 1);
    o = with_json(text);
    acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    accel_accelerator_free(acc);
    unsetenv("ACCEL_OFFLOAD_OPTIMIZER_DEVICE");
    unsetenv("ACCEL_OFFLOAD_OPTIMIZER_NVME_PATH");
    rmdir(a);
    rmdir(b);
}

/* The DeepSpeed config is a FIFO (no writer: opening it waited forever), a
 * directory, or holds a key twice (DeepSpeed refuses duplicate keys). */
static void test_use_cpu_not_a_bool(void) {
    setenv("ACCEL_USE_CPU", "maybe", 1);
    refused(accel_accelerator_opts_default(), "ACCEL_USE_CPU=maybe", "ACCEL_USE_CPU=maybe", "not a boolean");
    unsetenv("ACCEL_USE_CPU");
    setenv("ACCELERATE_USE_CPU", "Yes please", 1);
    refused(accel_accelerator_opts_default(), "ACCELERATE_USE_CPU", "ACCELERATE_USE_CPU=Yes please", NULL);
    accel_accelerator_opts cpu = {.cpu = true}; /* the code's choice: the variable is not read */
    accel_accelerator *acc = accel_accelerator_new(&cpu);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    accel_accelerator_free(acc);
    setenv("ACCELERATE_USE_CPU", "ON", 1); /* Accelerate's spellings, any case; either variable */
    setenv("ACCEL_USE_CPU", "0", 1);
    acc = accel_accelerator_new(NULL);
    CHECK_MSG(acc && accel_accelerator_device(acc).type == ACCEL_DEV_CPU, "%s", accel_last_error());
    accel_accelerator_free(acc);
    unsetenv("ACCELERATE_USE_CPU");
    unsetenv("ACCEL_USE_CPU");
}

static void test_deepspeed_config_not_a_file(void) {
    char fifo[128];
    snprintf(fifo, sizeof fifo, "%s/fifo.json", DIR_);
    CHECK(mkfifo(fifo, 0600) == 0);
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.deepspeed_config_file = fifo;
    alarm(20); /* a hang fails here, not at ctest's timeout */
    refused(o, "a FIFO", fifo, "a FIFO");
    alarm(0);
    unlink(fifo);
    o.deepspeed_config_file = DIR_;
    refused(o, "a directory", DIR_, "a directory");
    refused(with_json("{\"zero_optimization\": {\"stage\": 2, \"stage\": 3}}"), "duplicate", "duplicate", "stage");
    refused(with_json("{\"zero_optimization\": {\"stage\": 2}} trailing"), "trailing", "DeepSpeed config", NULL);
}

int main(void) {
    snprintf(DIR_, sizeof DIR_, "/tmp/accel_review_config_XXXXXX");
    CHECK(mkdtemp(DIR_) != NULL);
    snprintf(JSON, sizeof JSON, "%s/ds.json", DIR_);
    RUN(test_negative_counts);
    RUN(test_accumulation_steps_past_int);
    RUN(test_stage3_keys_with_stage_from_code);
    RUN(test_nan_gradient_clipping);
    RUN(test_bf16_enabled_not_a_bool);
    RUN(test_nvme_paths_differ_in_case);
    RUN(test_deepspeed_config_not_a_file);
    RUN(test_use_cpu_not_a_bool);
    unlink(JSON);
    rmdir(DIR_);
    accel_thread_cleanup();
    return check_summary();
}
