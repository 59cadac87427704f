/* `accel to-fsdp2`: 200 generated configs converted as Accelerate's
 * to-fsdp2 converts them (tests/data/to_fsdp2_cases.json, made by
 * tools/gen_to_fsdp2_cases.py with Accelerate's own conversion and yaml.dump:
 * the file and the warnings byte for byte), then the refusals and what
 * Accelerate leaves undefined (a mapping under fsdp_config's strategy, a
 * JSON file). Runs build/bin/accel next to itself. */
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "cli_run.h"
#include "sibling_exe.h"

static char ACCEL[PATH_MAX + 32], TMP[PATH_MAX], IN[PATH_MAX + 32], OUTF[PATH_MAX + 32];
static char OUT[1 << 16], ERR[1 << 16], GOT[1 << 16];
static const cli_io IO = {TMP, OUT, ERR, sizeof OUT, sizeof ERR};

static void spit(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static int run(const char *const *args) { return cli_run(&IO, ACCEL, args, NULL, NULL); }

/* accel to-fsdp2 --config_file IN --output_file OUTF, OUTF removed first. */
static int convert(void) {
    unlink(OUTF);
    const char *a[] = {"to-fsdp2", "--config_file", IN, "--output_file", OUTF, NULL};
    int rc = run(a);
    cli_slurp(OUTF, GOT, sizeof GOT);
    return rc;
}

static void test_generated_cases(void) {
    json_error_t je;
    json_t *cases = json_load_file("data/to_fsdp2_cases.json", 0, &je);
    CHECK_MSG(json_is_array(cases) && json_array_size(cases) == 200, "%s", je.text);
    size_t i, same = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        spit(IN, json_string_value(json_object_get(c, "input")));
        int rc = convert();
        const char *want = json_string_value(json_object_get(c, "output"));
        const char *warn = json_string_value(json_object_get(c, "warnings"));
        bool ok = rc == 0 && want && !strcmp(GOT, want) && warn && !strcmp(ERR, warn);
        CHECK_MSG(ok, "case %zu: rc %d\n--- input\n%s--- want\n%s--- got\n%s--- warnings\n%s--- want\n%s", i, rc,
                  json_string_value(json_object_get(c, "input")), want, GOT, ERR, warn);
        same += ok;
    }
    printf("  %zu of %zu configs converted as Accelerate's to-fsdp2\n", same, json_array_size(cases));
    json_decref(cases);
}

static void test_refusals(void) {
    const char *none[] = {"to-fsdp2", NULL};
    CHECK(run(none) == 2);
    CHECK_STR_CONTAINS(ERR, "the following arguments are required: --config_file");
    char missing[PATH_MAX + 32];
    snprintf(missing, sizeof missing, "%s/missing.yaml", TMP);
    const char *gone[] = {"to-fsdp2", "--config_file", missing, "--output_file", OUTF, NULL};
    CHECK(run(gone) == 1);
    CHECK_STR_CONTAINS(ERR, "Config file");
    CHECK_STR_CONTAINS(ERR, "not found");
    spit(IN, "fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n");
    const char *nowhere[] = {"to-fsdp2", "--config-file", IN, NULL};
    CHECK(run(nowhere) == 1);
    CHECK_STR_CONTAINS(ERR, "If --overwrite is not set, --output_file must be provided");
    spit(OUTF, "keep: me\n");
    const char *exists[] = {"to-fsdp2", "--config_file", IN, "--output_file", OUTF, NULL};
    CHECK(run(exists) == 1);
    CHECK_STR_CONTAINS(ERR, "already exists and --overwrite is not set");
    cli_slurp(OUTF, GOT, sizeof GOT);
    CHECK(!strcmp(GOT, "keep: me\n")); /* never touched */
    /* --overwrite: over an existing output, or the input itself */
    const char *over[] = {"to-fsdp2", "--config_file", IN, "--output_file", OUTF, "--overwrite", NULL};
    CHECK(run(over) == 0);
    cli_slurp(OUTF, GOT, sizeof GOT);
    CHECK_MSG(!strcmp(GOT, "fsdp_config:\n  fsdp_reshard_after_forward: true\n  fsdp_version: 2\n"), "%s", GOT);
    const char *inplace[] = {"to-fsdp2", "--config_file", IN, "--overwrite", NULL};
    CHECK(run(inplace) == 0);
    cli_slurp(IN, GOT, sizeof GOT);
    CHECK_MSG(!strcmp(GOT, "fsdp_config:\n  fsdp_reshard_after_forward: true\n  fsdp_version: 2\n"), "%s", GOT);
    /* empty: refused, nothing written */
    spit(IN, "# only a comment\n");
    CHECK(convert() == 1);
    CHECK_STR_CONTAINS(ERR, "Config file is empty");
    CHECK(access(OUTF, F_OK) != 0);
    spit(IN, "{}\n");
    CHECK(convert() == 1);
    CHECK_STR_CONTAINS(ERR, "Config file is empty");
    /* not YAML, not a mapping, fsdp_config not a mapping (Accelerate fails with a traceback) */
    spit(IN, "a: [\n");
    CHECK(convert() == 1);
    CHECK_STR_CONTAINS(ERR, "could not be parsed");
    spit(IN, "- a\n- b\n");
    CHECK(convert() == 1);
    CHECK_STR_CONTAINS(ERR, "not a mapping");
    spit(IN, "fsdp_config: FULL_SHARD\n");
    CHECK(convert() == 1);
    CHECK_STR_CONTAINS(ERR, "fsdp_config must be a mapping");
    spit(IN, "fsdp_config: [1]\n");
    CHECK(convert() == 1);
    CHECK_STR_CONTAINS(ERR, "fsdp_config must be a mapping");
    CHECK(access(OUTF, F_OK) != 0);
    /* a directory as the config */
    const char *dir[] = {"to-fsdp2", "--config_file", TMP, "--output_file", OUTF, NULL};
    CHECK(run(dir) == 1);
    CHECK_STR_CONTAINS(ERR, "not a config file");
}

/* What Accelerate's conversion raises on (an unhashable strategy value) is
 * kept as it is; a .json name is read and written as JSON. */
static void test_beyond_accelerate(void) {
    spit(IN, "fsdp_config:\n  fsdp_sharding_strategy: [FULL_SHARD]\n  fsdp_reshard_after_forward: {a: 1}\n");
    CHECK(convert() == 0);
    CHECK_MSG(!strcmp(GOT, "fsdp_config:\n  fsdp_reshard_after_forward:\n    a: 1\n  fsdp_version: 2\n"), "%s", GOT);
    char jin[PATH_MAX + 32], jout[PATH_MAX + 32];
    snprintf(jin, sizeof jin, "%s/in.json", TMP);
    snprintf(jout, sizeof jout, "%s/out.json", TMP);
    spit(jin, "{\"fsdp_config\": {\"fsdp_sharding_strategy\": \"SHARD_GRAD_OP\", \"fsdp_use_orig_params\": true}, "
              "\"num_processes\": 2, \"main_process_ip\": null}");
    const char *a[] = {"to-fsdp2", "--config_file", jin, "--output_file", jout, NULL};
    CHECK(run(a) == 0);
    CHECK_STR_CONTAINS(ERR, "Argument fsdp_use_orig_params has been removed in FSDP2, skipping this key...");
    json_error_t je;
    json_t *j = json_load_file(jout, 0, &je);
    json_t *f = json_object_get(j, "fsdp_config");
    CHECK_MSG(j && json_is_false(json_object_get(f, "fsdp_reshard_after_forward")) &&
                  json_integer_value(json_object_get(f, "fsdp_version")) == 2 && json_object_size(f) == 2 &&
                  json_is_null(json_object_get(j, "main_process_ip")) &&
                  json_integer_value(json_object_get(j, "num_processes")) == 2,
              "%s", je.text);
    json_decref(j);
}

int main(void) {
    if (!sibling_exe("accel", ACCEL, sizeof ACCEL)) return 1;
    snprintf(TMP, sizeof TMP, "/tmp/accel_to_fsdp2_XXXXXX");
    if (!mkdtemp(TMP)) return 1;
    snprintf(IN, sizeof IN, "%s/in.yaml", TMP);
    snprintf(OUTF, sizeof OUTF, "%s/out.yaml", TMP);
    RUN(test_generated_cases);
    RUN(test_refusals);
    RUN(test_beyond_accelerate);
    char rm[PATH_MAX + 16];
    snprintf(rm, sizeof rm, "rm -rf %s", TMP);
    if (system(rm) != 0) fprintf(stderr, "could not remove %s\n", TMP);
    return check_summary();
}
