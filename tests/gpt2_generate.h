/* examples/generate on a Hub-style copy of the gpt2 fixture (test_hf_archs,
 * test_hf_padded): tests/data/hf_arch_gpt2's config.json and
 * model.safetensors beside tests/data/tokenizers/gpt2's tokenizer.json in a
 * scratch folder, which is removed after the run. */
#ifndef ACCEL_TESTS_GPT2_GENERATE_H
#define ACCEL_TESTS_GPT2_GENERATE_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "accel/io.h"
#include "sibling_exe.h"

/* Runs `setup` in the folder (a shell command; "" for none), then generate
 * FOLDER args; its stdout and stderr into out[out_n]. want gets prefix and
 * the fixture's text_greedy ids (transformers' greedy tokens of "Hello
 * world") as generate prints them: "1, 2, 3]". Returns generate's exit
 * status, -1 when it could not run. */
static inline int gpt2_generate(const char *setup, const char *args, const char *prefix, char *want, size_t want_n,
                                char *out, size_t out_n) {
    char gen[8192], dir[] = "/tmp/accel_gpt2_generate_XXXXXX", cmd[16384];
    out[0] = 0;
    snprintf(want, want_n, "%s", prefix);
    accel_safetensors *st = accel_safetensors_open("data/hf_arch_gpt2/expected.safetensors");
    accel_tensor *g = st ? accel_safetensors_tensor(st, "text_greedy", -1) : NULL;
    int64_t ids[64], n = g ? g->shape[1] : 0;
    bool ok = g && n <= 64 && accel_to_int64s(g, ids) == ACCEL_OK && sibling_exe("generate", gen, sizeof gen) &&
              mkdtemp(dir) != NULL;
    accel_tensor_free(g);
    accel_safetensors_close(st);
    if (!ok) return -1;
    for (int64_t i = 0; i < n; i++)
        snprintf(want + strlen(want), want_n - strlen(want), "%lld%s", (long long)ids[i], i + 1 < n ? ", " : "]");
    snprintf(cmd, sizeof cmd,
             "cp data/hf_arch_gpt2/config.json data/hf_arch_gpt2/model.safetensors data/tokenizers/gpt2/tokenizer.json "
             "%s/ && (cd %s && %s) && %s %s %s 2>&1; rc=$?; rm -rf %s; exit $rc",
             dir, dir, *setup ? setup : "true", gen, dir, args, dir);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t got = fread(out, 1, out_n - 1, p);
    out[got] = 0;
    int st_ = pclose(p);
    return WIFEXITED(st_) ? WEXITSTATUS(st_) : -1;
}

#endif
