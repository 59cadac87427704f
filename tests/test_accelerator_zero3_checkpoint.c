/* Checkpoints under ZeRO-3 / FSDP FULL_SHARD (docs/accelerator.md
 * "Checkpoints under ZeRO-3"), run plainly (stage 3 on one process) or under
 * `accel launch` (tests/zero3.cmake):
 *   - SHARDED_STATE_DICT and FULL_STATE_DICT save_state + load_state resume
 *     bit for bit on the same world size: the losses after the resume and the
 *     final save_model files equal an uninterrupted run's, byte for byte;
 *   - save_model writes the files DDP's save_model writes for the same weights
 *     (accel_save_module of the gathered model), byte for byte, sharded by
 *     max_shard_size too; merging a sharded checkpoint gives the same file;
 *   - bad checkpoints fail naming the file, unit or parameter;
 *   - a checkpoint whose model `accel merge-weights --remove_checkpoint_dir`
 *     took out is refused saying so, and passed over by the automatic resume
 *     and total_limit;
 *   - `save DIR` / `resume DIR`: one launch trains and saves on N processes,
 *     another resumes on M != N (resharding at load): losses and final weights
 *     equal the uninterrupted run within tolerance;
 *   - `save16 DIR DTYPE`: save_model under the launch's 16-bit setting writes
 *     DTYPE tensors, the masters rounded (stage3_gather_16bit_weights_on_model_save);
 *   - all of it under HYBRID_SHARD on two "machines" too (tests/zero3.cmake).
 * Prints "zero3 checkpoint world=N shard_world=S" for the launcher tests to match. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/dist.h"
#include "accelerator/accelerator_internal.h" /* the state-dict type, the merge */
#include "check.h"
#include "sibling_exe.h"
#include "tiny_llama.h"
#include "core/core_internal.h" /* accel__tensor_write_bytes */
#include "io/checkpoint_marker.h"     /* accel__marker_write */

static int N, R;
static accel_accelerator *A;
static char ROOT[512];

enum { K_STEPS = 3, M_STEPS = 3, ROWS = 12 }; /* ROWS: the global batch, split evenly over 1-4 ranks */

/* 8 -> 33 -> 33 -> 3: three units whose pieces straddle the ranks differently at each world size. */
static accel_module *mlp(uint64_t seed, int hidden) {
    accel_manual_seed(seed);
    accel_module *l[5] = {accel_linear_new(8, hidden, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(hidden, hidden, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                          accel_relu_module_new(), accel_linear_new(hidden, 3, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    return accel_sequential_new(5, l);
}

static accel_optimizer *optimizer(accel_module *m) {
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.02);
    h.eps = 1e-3;
    return accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h);
}

/* This rank's rows of step `step`'s global batch: the same data at every world size. */
static accel_tensor *loss_of(accel_module *m, bool is_llama, int64_t step) {
    int rows = ROWS / N, first = R * rows;
    if (is_llama) {
        int64_t ids[ROWS * 6];
        for (int i = 0; i < rows * 6; i++) ids[i] = (step * 7 + (first * 6 + i) * 11) % 40;
        return accel_llama_loss(m, accel_from_data(ACCEL_I64, ACCEL_SHAPE(rows, 6), ids));
    }
    float xs[ROWS * 8], ys[ROWS * 3];
    for (int i = 0; i < rows; i++) {
        int64_t k = step * 131 + (first + i) * 8;
        for (int j = 0; j < 8; j++) xs[i * 8 + j] = (float)sin((double)(k + j));
        for (int j = 0; j < 3; j++) ys[i * 3 + j] = 0.5f * xs[i * 8 + j] - 0.25f * xs[i * 8 + 7 - j];
    }
    return accel_mse_loss(accel_module_call(m, accel_from_floats(ACCEL_SHAPE(rows, 8), xs)),
                          accel_from_floats(ACCEL_SHAPE(rows, 3), ys));
}

/* One step; the global batch's loss (the mean of the ranks' equal slices). */
static double train_step(accel_module *m, accel_optimizer *o, bool is_llama, int64_t step) {
    accel_tensor *loss = loss_of(m, is_llama, step);
    double l = loss ? accel_item(loss) : NAN;
    CHECK(accel_accelerator_backward(A, loss) == ACCEL_OK);
    CHECK(accel_accelerator_optimizer_step(A, o) == ACCEL_OK);
    accel_accelerator_zero_grad(A, o);
    accel_step_reset();
    if (N > 1) CHECK(accel_pg_all_reduce(A->pg, &l, 1, ACCEL_F64, ACCEL_REDUCE_AVG) == ACCEL_OK);
    return l;
}

typedef struct run {
    accel_module *m;
    accel_optimizer *o;
    bool is_llama;
} run;

static run start(bool is_llama, uint64_t seed, int hidden) {
    run r = {is_llama ? tiny_llama(seed) : mlp(seed, hidden), NULL, is_llama};
    r.o = optimizer(r.m);
    CHECK(accel_accelerator_prepare_model(A, r.m) == ACCEL_OK);
    CHECK(accel_accelerator_prepare_optimizer(A, r.o) == ACCEL_OK);
    return r;
}

static void finish(run *r) {
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    accel_optimizer_free(r->o);
    accel_module_free(r->m);
}

static void path_of(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", ROOT, name); }

static bool files_equal(const char *a, const char *b) {
    void *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    bool eq = accel_load_bytes(a, &x, &nx) == ACCEL_OK && accel_load_bytes(b, &y, &ny) == ACCEL_OK && nx == ny &&
              !memcmp(x, y, nx);
    free(x);
    free(y);
    return eq;
}

/* Every file of dir a is in dir b with the same bytes, and b has no other. */
static bool dirs_equal(const char *a, const char *b) {
    const char *names[] = {"model.safetensors", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors", "model-00001-of-00003.safetensors",
                           "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"};
    int found = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char pa[1024], pb[1024];
        snprintf(pa, sizeof pa, "%s/%s", a, names[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, names[i]);
        bool ea = access(pa, F_OK) == 0, eb = access(pb, F_OK) == 0;
        if (ea != eb || (ea && !files_equal(pa, pb))) return false;
        found += ea;
    }
    return found > 0;
}

/* ---------------------------------------------------------------- same world size */

/* The uninterrupted run: K + M steps (their losses into want), its final
 * weights by save_model into ROOT/ref_model; then the same start trained K
 * steps (the same losses) and saved by save_state into ROOT/ckpt. */
static void train_and_checkpoint(bool is_llama, double want[K_STEPS + M_STEPS]) {
    char ckpt[600], ref[600];
    path_of(ckpt, sizeof ckpt, "ckpt");
    path_of(ref, sizeof ref, "ref_model");
    run r = start(is_llama, 1, 33);
    for (int s = 0; s < K_STEPS + M_STEPS; s++) want[s] = train_step(r.m, r.o, is_llama, s);
    CHECK(accel_accelerator_save_model(A, r.m, ref, NULL) == ACCEL_OK);
    finish(&r);
    r = start(is_llama, 1, 33);
    for (int s = 0; s < K_STEPS; s++) CHECK(train_step(r.m, r.o, is_llama, s) == want[s]);
    CHECK(accel_accelerator_save_state(A, ckpt, NULL, 0) == ACCEL_OK);
    finish(&r);
}

/* Train K, save, resume a differently initialised model, train M: the same
 * losses and the same final weights (save_model files) as K + M uninterrupted. */
static void resume_exactly(bool is_llama, bool full_state_dict) {
    A->fsdp.full_state_dict = full_state_dict;
    char ckpt[600], ref[600], got[600];
    path_of(ckpt, sizeof ckpt, "ckpt");
    path_of(ref, sizeof ref, "ref_model");
    path_of(got, sizeof got, "resumed_model");
    double want[K_STEPS + M_STEPS];
    train_and_checkpoint(is_llama, want);
    char probe[700];
    snprintf(probe, sizeof probe, "%s/%s", ckpt, full_state_dict ? "model.safetensors" : "pytorch_model_fsdp_0/shard_0.safetensors");
    CHECK_MSG(access(probe, F_OK) == 0, "%s", probe);

    run r = start(is_llama, 99, 33); /* other weights: all of them must come from the checkpoint */
    CHECK_MSG(accel_accelerator_load_state(A, ckpt, NULL) == ACCEL_OK, "%s", accel_last_error());
    for (int s = K_STEPS; s < K_STEPS + M_STEPS; s++) {
        double l = train_step(r.m, r.o, is_llama, s);
        CHECK_MSG(l == want[s], "step %d: loss %.9g after the resume, %.9g uninterrupted", s, l, want[s]);
    }
    CHECK(accel_accelerator_save_model(A, r.m, got, NULL) == ACCEL_OK);
    if (R == 0) CHECK_MSG(dirs_equal(ref, got), "%s and %s differ", ref, got);
    finish(&r);
    A->fsdp.full_state_dict = false;
}

static void test_sharded_resume_mlp(void) { resume_exactly(false, false); }
static void test_sharded_resume_llama(void) { resume_exactly(true, false); }
static void test_full_resume_mlp(void) { resume_exactly(false, true); }

/* DeepSpeed's stage3_param_persistence_threshold: the biases stay gathered;
 * a load must refresh them in full, not only their shards. */
static void test_sharded_resume_persistent(void) {
    int64_t saved = A->fsdp.persistence_threshold;
    A->fsdp.persistence_threshold = 40;
    resume_exactly(false, false);
    A->fsdp.persistence_threshold = saved;
}

/* ---------------------------------------------------------------- save_model, merge */

/* For tools/check_zero3_hf_logits.py: config.json and accel's logits of fixed
 * ids beside the save_model files, so transformers can load them and compare. */
static void export_for_transformers(accel_module *m, const char *dir) {
    CHECK(accel_llama_config_save(dir, accel_llama_config_of(m)) == ACCEL_OK);
    int64_t ids[2 * 7];
    for (int i = 0; i < 14; i++) ids[i] = (i * 17 + 3) % 40;
    bool prev = accel_set_grad_enabled(false);
    accel_tensor *t_ids = accel_tensor_new(ACCEL_I64, 2, (int64_t[]){2, 7}, ACCEL_CPU_DEVICE);
    CHECK(t_ids && accel__tensor_write_bytes(t_ids, 0, ids, sizeof ids) == ACCEL_OK);
    accel_tensor *logits = accel_llama_forward(m, t_ids, NULL);
    accel_set_grad_enabled(prev);
    char path[700];
    snprintf(path, sizeof path, "%s/accel_logits.safetensors", dir);
    const char *names[2] = {"ids", "logits"};
    accel_tensor *ts[2] = {t_ids, logits};
    CHECK(logits && accel_safetensors_save(path, 2, names, ts, 0, NULL) == ACCEL_OK);
    accel_tensor_free(t_ids);
    accel_step_reset();
}

/* A Llama trained two steps, written by save_model into `model` (and in 12 KB
 * shards into `shards` unless NULL) and by save_state into `ckpt`, then
 * gathered back into its module (clear). The caller frees the run. */
static run trained_and_saved(const char *model, const char *shards, const char *ckpt) {
    run r = start(true, 3, 0);
    for (int s = 0; s < 2; s++) train_step(r.m, r.o, true, s);
    CHECK(accel_accelerator_save_model(A, r.m, model, NULL) == ACCEL_OK);
    if (shards) CHECK(accel_accelerator_save_model(A, r.m, shards, "12KB") == ACCEL_OK);
    CHECK(accel_accelerator_save_state(A, ckpt, NULL, 0) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    return r;
}

/* accel merge-weights of the SHARDED_STATE_DICT checkpoint ckpt into
 * merged/model.safetensors; its model directory into sub [n]. */
static void merge_checkpoint(const char *ckpt, const char *merged, char *sub, size_t n) {
    int count = 0;
    CHECK(accel__zero3_find_sharded(ckpt, sub, n));
    CHECK(mkdir(merged, 0755) == 0 || access(merged, F_OK) == 0);
    CHECK_MSG(accel__zero3_merge(sub, merged, false, &count) == ACCEL_OK, "%s", accel_last_error());
}

/* The same tensors (names, dtypes, shapes, bytes) in files a and b (safetensors or torch.save). */
static bool same_tensors(const char *a, const char *b) {
    accel_safetensors *x = accel_safetensors_open(a), *y = accel_safetensors_open(b);
    bool same = x && y && accel_safetensors_count(x) == accel_safetensors_count(y);
    for (int i = 0; same && i < accel_safetensors_count(x); i++) {
        const accel_st_info *p = accel_safetensors_at(x, i), *q = accel_safetensors_find(y, p->name);
        same = q && p->dtype == q->dtype && p->ndim == q->ndim && p->nbytes == q->nbytes &&
               !memcmp(p->shape, q->shape, (size_t)p->ndim * sizeof *p->shape) &&
               !memcmp(p->bytes, q->bytes, p->nbytes);
    }
    accel_safetensors_close(x);
    accel_safetensors_close(y);
    return same;
}

/* save_model under ZeRO-3 writes what DDP's save_model writes for the same
 * weights: accel_save_module of the gathered model (after clear), byte for
 * byte, in one file and in shards; merge-weights of the sharded checkpoint
 * gives that one file. */
static void test_save_model_equals_ddp(void) {
    char z3[600], z3s[600], ddp[600], ddps[600], ckpt[600], merged[600];
    path_of(z3, sizeof z3, "z3_model");
    path_of(z3s, sizeof z3s, "z3_model_shards");
    path_of(ddp, sizeof ddp, "ddp_model");
    path_of(ddps, sizeof ddps, "ddp_model_shards");
    path_of(ckpt, sizeof ckpt, "merge_ckpt");
    path_of(merged, sizeof merged, "merged");
    run r = trained_and_saved(z3, z3s, ckpt);
    if (R == 0) {
        export_for_transformers(r.m, z3);
        CHECK(accel_save_module(ddp, r.m, 10000000000ll) == ACCEL_OK);
        CHECK(accel_save_module(ddps, r.m, 12000) == ACCEL_OK);
        CHECK_MSG(dirs_equal(z3, ddp), "save_model under ZeRO-3 (%s) differs from DDP's (%s)", z3, ddp);
        CHECK_MSG(dirs_equal(z3s, ddps), "sharded save_model under ZeRO-3 (%s) differs from DDP's (%s)", z3s, ddps);
        char idx[700];
        snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", z3s);
        CHECK_MSG(access(idx, F_OK) == 0, "12KB shards: %s", idx);
        char sub[1024];
        merge_checkpoint(ckpt, merged, sub, sizeof sub);
        CHECK_MSG(dirs_equal(merged, ddp), "merge-weights of %s differs from DDP's save_model", ckpt);
        /* --unsafe_serialization: the same tensors in pytorch_model.bin */
        char bin_dir[600], bin[700], st[700];
        int count = 0;
        path_of(bin_dir, sizeof bin_dir, "merged_bin");
        CHECK(mkdir(bin_dir, 0755) == 0 || access(bin_dir, F_OK) == 0);
        CHECK_MSG(accel__zero3_merge(sub, bin_dir, true, &count) == ACCEL_OK, "%s", accel_last_error());
        snprintf(bin, sizeof bin, "%s/pytorch_model.bin", bin_dir);
        snprintf(st, sizeof st, "%s/model.safetensors", merged);
        CHECK_MSG(count > 0 && same_tensors(bin, st), "%s differs from %s", bin, st);
        CHECK(accel__zero3_remove_sharded(sub) == ACCEL_OK); /* --remove_checkpoint_dir */
        CHECK_MSG(access(sub, F_OK) != 0, "%s is still there", sub);
    }
    accel_optimizer_free(r.o);
    accel_module_free(r.m);
}

/* ---------------------------------------------------------------- 16-bit save_model */

/* stage3_gather_16bit_weights_on_model_save as a DeepSpeed JSON gives it
 * (json_value NULL: absent) beside ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL
 * (env NULL: unset), as accel_accelerator_new reads them. */
static accel_status save_16bit_of(const char *json_value, const char *env, bool *out) {
    char path[128];
    snprintf(path, sizeof path, "/tmp/accel_z3_save16_%d_%d.json", (int)getpid(), R);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return ACCEL_ERR_IO;
    fprintf(f, "{\"zero_optimization\": {\"stage\": 3%s%s}}\n",
            json_value ? ", \"stage3_gather_16bit_weights_on_model_save\": " : "", json_value ? json_value : "");
    fclose(f);
    if (env) setenv("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", env, 1);
    else unsetenv("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL");
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.deepspeed_config_file = path;
    accel__zero_cfg c;
    accel_status st = accel__zero_config(&o, &c);
    *out = c.fsdp.save_16bit;
    unsetenv("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL");
    unlink(path);
    return st;
}

/* The JSON's true / false decides; absent or "auto", Accelerate's
 * zero3_save_16bit_model (the launcher's variable); other values are named. */
static void test_save_16bit_settings(void) {
    const struct { const char *json, *env; bool want; } OK[] = {
        {"true", NULL, true}, {"false", "true", false}, {"\"auto\"", "true", true}, {NULL, "TRUE", true},
        {NULL, "false", false}, {NULL, NULL, false}, {"\"auto\"", NULL, false},
    };
    for (size_t i = 0; i < sizeof OK / sizeof *OK; i++) {
        bool got = !OK[i].want;
        CHECK_MSG(save_16bit_of(OK[i].json, OK[i].env, &got) == ACCEL_OK && got == OK[i].want,
                  "json %s, env %s: %d (%s)", OK[i].json ? OK[i].json : "-", OK[i].env ? OK[i].env : "-", got,
                  accel_last_error());
    }
    bool got;
    accel_clear_error();
    CHECK(save_16bit_of("\"yes\"", NULL, &got) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "stage3_gather_16bit_weights_on_model_save must be true, false or \"auto\"");
    accel_clear_error();
    CHECK(save_16bit_of(NULL, "maybe", &got) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL=maybe is not a boolean");
}

/* f rounded to bf16, to nearest even (finite values), written out on its own
 * rather than through accel's conversion. */
static uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* The f32 values at src rounded to dt into dst. */
static void round_to(void *dst, accel_dtype dt, const float *src, size_t n) {
    for (size_t k = 0; k < n; k++) {
        if (dt == ACCEL_BF16) ((uint16_t *)dst)[k] = bf16_of(src[k]);
        else if (dt == ACCEL_F16) ((uint16_t *)dst)[k] = accel_f32_to_f16(src[k]);
        else ((float *)dst)[k] = src[k];
    }
}

/* Every tensor of the safetensors file `got` is `dt` and holds the f32
 * tensor of the same name in `ref` rounded to dt, byte for byte; the two
 * files name the same tensors. */
static bool rounded_equal(const char *got, const char *ref, accel_dtype dt) {
    accel_safetensors *fg = accel_safetensors_open(got), *fr = accel_safetensors_open(ref);
    bool ok = fg && fr && accel_safetensors_count(fg) == accel_safetensors_count(fr);
    for (int i = 0; ok && i < accel_safetensors_count(fg); i++) {
        const accel_st_info *g = accel_safetensors_at(fg, i), *r = accel_safetensors_find(fr, g->name);
        size_t n = r ? r->nbytes / sizeof(float) : 0;
        void *want = malloc(n * accel_dtype_size(dt) + 1);
        ok = r && want && r->dtype == ACCEL_F32 && g->dtype == dt && g->nbytes == n * accel_dtype_size(dt);
        if (ok) round_to(want, dt, r->bytes, n);
        ok = ok && !memcmp(want, g->bytes, g->nbytes);
        if (!ok) fprintf(stderr, "%s: %s is not %s's rounded to %s\n", got, g->name, ref, accel_dtype_name(dt));
        free(want);
    }
    accel_safetensors_close(fg);
    accel_safetensors_close(fr);
    return ok;
}

/* The module's f32 tensors rounded to dt in place: the weights a 16-bit save holds. */
static void round_module(accel_module *m, accel_dtype dt) {
    accel_state_dict *sd = accel_module_state_dict(m);
    for (int e = 0; sd && dt != ACCEL_F32 && e < sd->n; e++) {
        accel_tensor *t = sd->entries[e].t;
        if (t->dtype != ACCEL_F32 || sd->entries[e].is_tied_alias) continue;
        accel_tensor *h = accel_tensor_new(dt, t->ndim, t->shape, ACCEL_CPU_DEVICE);
        CHECK(h && accel_copy_(h, t) == ACCEL_OK && accel_copy_(t, h) == ACCEL_OK);
        accel_tensor_free(h);
    }
    accel_state_dict_free(sd);
}

/* `save16 DIR DTYPE`, under this launch's mixed precision and 16-bit setting:
 * save_model of a Llama trained two steps holds DTYPE tensors, the f32
 * masters rounded to DTYPE (DIR/masters: accel_save_module of the gathered
 * model), and so does merge-weights of a SHARDED_STATE_DICT checkpoint of the
 * same weights once rounded. DIR/z3_model keeps config.json and accel's
 * logits of the rounded weights for tools/check_zero3_hf_logits.py. */
static int save16_phase(const char *dtype_name) {
    int dt = accel_dtype_parse(dtype_name);
    CHECK_MSG(dt >= 0, "%s is not a dtype", dtype_name);
    char model[600], masters[600], ckpt[600], merged[600], a[700], b[700], sub[1024];
    path_of(model, sizeof model, "z3_model");
    path_of(masters, sizeof masters, "masters");
    path_of(ckpt, sizeof ckpt, "ckpt");
    path_of(merged, sizeof merged, "merged");
    run r = trained_and_saved(model, NULL, ckpt); /* the f32 masters back in the module */
    if (R == 0 && dt >= 0) {
        CHECK(accel_save_module(masters, r.m, 10000000000ll) == ACCEL_OK);
        snprintf(a, sizeof a, "%s/model.safetensors", model);
        snprintf(b, sizeof b, "%s/model.safetensors", masters);
        CHECK_MSG(rounded_equal(a, b, (accel_dtype)dt), "save_model is not the masters rounded to %s", dtype_name);
        merge_checkpoint(ckpt, merged, sub, sizeof sub);
        snprintf(b, sizeof b, "%s/model.safetensors", merged);
        CHECK_MSG(rounded_equal(a, b, (accel_dtype)dt), "save_model is not merge-weights' model rounded to %s",
                  dtype_name);
        round_module(r.m, (accel_dtype)dt);
        export_for_transformers(r.m, model);
    }
    accel_optimizer_free(r.o);
    accel_module_free(r.m);
    return 0;
}

/* ---------------------------------------------------------------- bad checkpoints */

/* Every rank fails; rank 0, which reads the first piece of every unit, names the cause. */
static void expect_load_error(const char *dir, const char *what) {
    accel_clear_error();
    accel_status st = accel_accelerator_load_state(A, dir, NULL);
    CHECK_MSG(st != ACCEL_OK, "loading %s should fail", dir);
    if (R == 0) CHECK_STR_CONTAINS(accel_last_error(), what);
}

/* merge-weights reads no marker: the sharded reader itself names the missing
 * file, and the unit whose range no file holds. */
static void expect_merge_errors(const char *broken) {
    char sub[700], out[700];
    int n = 0;
    snprintf(sub, sizeof sub, "%s/pytorch_model_fsdp_0", broken);
    path_of(out, sizeof out, "merged_broken");
    CHECK(mkdir(out, 0755) == 0);
    CHECK(accel__zero3_merge(sub, out, false, &n) != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "shard_0.safetensors is missing (it holds unit 0's range [0, ");
    char index[800];
    snprintf(index, sizeof index, "%s/sharded_index.json", sub);
    json_t *ix = json_load_file(index, 0, NULL);
    CHECK(ix && json_array_clear(json_object_get(json_array_get(json_object_get(ix, "files"), 0), "ranges")) == 0);
    CHECK(json_dump_file(ix, index, 0) == 0);
    json_decref(ix);
    CHECK(accel__zero3_merge(sub, out, false, &n) != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "(parameter 0.weight) are in none of its files: the index "
                                           "does not cover the model");
    /* a shape whose dims multiply past int64 (signed overflow: [2^40, 2^40, 2^40]
     * wrapped to 0 elements), refused by the index reader naming the index */
    ix = json_load_file(index, 0, NULL);
    json_t *shape = json_pack("[III]", (json_int_t)1 << 40, (json_int_t)1 << 40, (json_int_t)1 << 40);
    CHECK(ix && json_object_set_new(json_array_get(json_object_get(ix, "state_dict"), 0), "shape", shape) == 0);
    CHECK(json_dump_file(ix, index, 0) == 0);
    json_decref(ix);
    CHECK(accel__zero3_merge(sub, out, false, &n) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "sharded_index.json: a \"shape\" has more than 2^60 elements");
}

/* load_state of ckpt into r's model fails naming `what`, and the model's
 * weights (save_model's files, into ROOT/<tag>_before and _after) are as they
 * were: no rank's shard is written before every rank read all its pieces. */
static void expect_load_error_keeps_weights(run *r, const char *ckpt, const char *what, const char *tag) {
    char before[700], after[700], name[128];
    snprintf(name, sizeof name, "%s_before", tag);
    path_of(before, sizeof before, name);
    snprintf(name, sizeof name, "%s_after", tag);
    path_of(after, sizeof after, name);
    CHECK(accel_accelerator_save_model(A, r->m, before, NULL) == ACCEL_OK);
    expect_load_error(ckpt, what);
    CHECK(accel_accelerator_save_model(A, r->m, after, NULL) == ACCEL_OK);
    CHECK_MSG(dirs_equal(before, after), "%s: the failed load_state changed the weights (%s, %s)", tag, before, after);
}

/* A zero-size parameter (one inside the first Linear's unit, one last in
 * the last one's: it shares its flat offset with the next tensor, or with
 * none) is saved under its own name in the optimizer's groups and loads. */
static void test_zero_size_parameter(void) {
    char ckpt[600], index[700];
    path_of(ckpt, sizeof ckpt, "empty_ckpt");
    for (int pass = 0; pass < 2; pass++) {
        run r = {mlp(5, 33), NULL, false};
        CHECK(accel_module_add_param(r.m->children[0], "empty", accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(0), ACCEL_CPU_DEVICE)));
        CHECK(accel_module_add_param(r.m->children[4], "empty", accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(0), ACCEL_CPU_DEVICE)));
        r.o = optimizer(r.m);
        CHECK(accel_accelerator_prepare_model(A, r.m) == ACCEL_OK && accel_accelerator_prepare_optimizer(A, r.o) == ACCEL_OK);
        if (pass == 0) {
            train_step(r.m, r.o, false, 0);
            CHECK_MSG(accel_accelerator_save_state(A, ckpt, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
        } else {
            CHECK_MSG(accel_accelerator_load_state(A, ckpt, NULL) == ACCEL_OK, "%s", accel_last_error());
        }
        finish(&r);
    }
    snprintf(index, sizeof index, "%s/optimizer_0/sharded_index.json", ckpt);
    json_t *j = json_load_file(index, 0, NULL), *g = json_array_get(json_object_get(j, "groups"), 0);
    int seen = 0;
    for (size_t k = 0; k < json_array_size(g); k++) {
        const char *name = json_string_value(json_array_get(g, k));
        seen += name && (!strcmp(name, "0.empty") || !strcmp(name, "4.empty"));
    }
    CHECK_MSG(json_array_size(g) == 8 && seen == 2, "%s: the group's names", index);
    json_decref(j);
}

/* ckpt's optimizer index as written before the groups were recorded (rank
 * 0 drops "groups" and writes the marker again; every rank waits). */
static void forget_groups(const char *ckpt) {
    if (R == 0) {
        char index[700];
        snprintf(index, sizeof index, "%s/optimizer_0/sharded_index.json", ckpt);
        json_t *j = json_load_file(index, 0, NULL);
        CHECK(j && json_object_del(j, "groups") == 0 && json_dump_file(j, index, JSON_INDENT(2)) == 0);
        json_decref(j);
        CHECK(accel__marker_write(ckpt, N, NULL, "test") == ACCEL_OK);
    }
    if (N > 1) CHECK(accel_pg_barrier(A->pg) == ACCEL_OK);
}

/* mlp(seed, 33) prepared with an AdamW of two param groups: the weights,
 * then the biases (biases_first: the other way round). */
static run two_groups(uint64_t seed, bool biases_first) {
    run r = {mlp(seed, 33), NULL, false};
    accel_tensor **ps, *groups[2][3];
    int n = accel_module_parameters(r.m, &ps), ng[2] = {0, 0}, first = biases_first;
    for (int i = 0; i < n; i++) groups[ps[i]->ndim == 1][ng[ps[i]->ndim == 1]++] = ps[i];
    accel_free(ps);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.02);
    r.o = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, ng[first], groups[first], &h);
    CHECK(accel_optimizer_add_params(r.o, ng[!first], groups[!first], &h) >= 0);
    CHECK(accel_accelerator_prepare_model(A, r.m) == ACCEL_OK && accel_accelerator_prepare_optimizer(A, r.o) == ACCEL_OK);
    return r;
}

/* mlp(seed, 33) prepared with an AdamW of two param groups in the module's
 * order split at parameter `first`: the state's numbering is the same for
 * every split, only the groups' counts tell them apart. */
static run split_groups(uint64_t seed, int first) {
    run r = {mlp(seed, 33), NULL, false};
    accel_tensor **ps;
    int n = accel_module_parameters(r.m, &ps);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.02);
    r.o = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, first, ps, &h);
    h.lr = 0.01;
    CHECK(accel_optimizer_add_params(r.o, n - first, ps + first, &h) >= 0);
    accel_free(ps);
    CHECK(accel_accelerator_prepare_model(A, r.m) == ACCEL_OK && accel_accelerator_prepare_optimizer(A, r.o) == ACCEL_OK);
    return r;
}

static void test_bad_checkpoints(void) {
    char ckpt[600], broken[600], cmd[4096];
    path_of(ckpt, sizeof ckpt, "small_ckpt");
    path_of(broken, sizeof broken, "broken_ckpt");
    run r = start(false, 5, 33);
    train_step(r.m, r.o, false, 0);
    CHECK(accel_accelerator_save_state(A, ckpt, NULL, 0) == ACCEL_OK);
    finish(&r);
    /* an index that does not cover the model: a model with a layer more */
    accel_module *l[7] = {accel_linear_new(8, 33, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(33, 33, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(33, 3, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(3, 3, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    r = (run){accel_sequential_new(7, l), NULL, false};
    CHECK(accel_accelerator_prepare_model(A, r.m) == ACCEL_OK); /* the model alone: its index is checked */
    expect_load_error_keeps_weights(&r, ckpt, "has no parameter 6.weight: the checkpoint does not cover this model",
                                    "layer_more");
    CHECK(accel_accelerator_clear(A) == ACCEL_OK);
    r.o = optimizer(r.m); /* with its optimizer: the optimizer's groups are checked first */
    CHECK(accel_accelerator_prepare_model(A, r.m) == ACCEL_OK && accel_accelerator_prepare_optimizer(A, r.o) == ACCEL_OK);
    expect_load_error_keeps_weights(&r, ckpt, "param group 0 holds no 6.weight there: the checkpoint does not cover",
                                    "layer_more_optimizer");
    finish(&r);
    /* a mismatching model: other widths */
    r = start(false, 5, 17);
    expect_load_error_keeps_weights(&r, ckpt, "parameter 0.weight has shape [33, 8] there, [17, 8] in this model",
                                    "other_widths");
    finish(&r);
    /* another optimizer (SGD with momentum: one state of its own where
     * the shards hold AdamW's two), checked before the model loads */
    r = (run){mlp(9, 33), NULL, false};
    accel_optim_hparams sgd = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.02);
    sgd.momentum = 0.9;
    r.o = accel_optimizer_new_module(ACCEL_OPTIM_SGD, r.m, &sgd);
    CHECK(accel_accelerator_prepare_model(A, r.m) == ACCEL_OK && accel_accelerator_prepare_optimizer(A, r.o) == ACCEL_OK);
    expect_load_error_keeps_weights(&r, ckpt, "its state kinds are not this optimizer's", "sharded_other_optimizer");
    finish(&r);
    /* the shards keep the state by the model's layout, and the index says
     * which parameters each param group held: another grouping is refused
     * (a group's learning rate would go to other parameters) */
    r = two_groups(9, false);
    expect_load_error_keeps_weights(&r, ckpt, "1 param group there, 2 in this optimizer", "sharded_more_groups");
    finish(&r);
    char grouped[600];
    path_of(grouped, sizeof grouped, "grouped_ckpt");
    r = two_groups(5, false);
    train_step(r.m, r.o, false, 0);
    CHECK(accel_accelerator_save_state(A, grouped, NULL, 0) == ACCEL_OK);
    finish(&r);
    r = two_groups(9, true);
    expect_load_error_keeps_weights(&r, grouped, "param group 0 holds 0.weight there, not in this optimizer",
                                    "sharded_groups_swapped");
    finish(&r);
    r = two_groups(9, false); /* the same grouping loads */
    CHECK_MSG(accel_accelerator_load_state(A, grouped, NULL) == ACCEL_OK, "%s", accel_last_error());
    finish(&r);
    /* an index from before the groups were recorded: held to their count */
    forget_groups(grouped);
    r = start(false, 9, 33);
    expect_load_error_keeps_weights(&r, grouped, "2 param groups there, 1 in this optimizer", "sharded_old_index");
    finish(&r);
    r = two_groups(9, false); /* fewer groups there than here: loaded silently before the groups were recorded */
    forget_groups(ckpt);
    expect_load_error_keeps_weights(&r, ckpt, "1 param group there, 2 in this optimizer", "sharded_old_index_more");
    finish(&r);
    /* a model that is not sharded (DDP) is told what to do */
    accel_accelerator_opts ddp_opts = accel_accelerator_opts_default();
    ddp_opts.zero_stage = -1;
    accel_accelerator *ddp = accel_accelerator_new(&ddp_opts);
    accel_module *plain = mlp(5, 33);
    CHECK(ddp && accel_accelerator_prepare_model(ddp, plain) == ACCEL_OK);
    CHECK(accel_accelerator_load_state(ddp, ckpt, NULL) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "as a SHARDED_STATE_DICT");
    CHECK_STR_CONTAINS(accel_last_error(), "accel merge-weights");
    accel_accelerator_free(ddp);
    accel_module_free(plain);
    /* a missing rank file: the marker names it */
    if (R == 0) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s' && rm '%s/pytorch_model_fsdp_0/shard_0.safetensors'",
                 broken, ckpt, broken, broken);
        CHECK(system(cmd) == 0);
    }
    if (N > 1) CHECK(accel_pg_barrier(A->pg) == ACCEL_OK);
    r = start(false, 5, 33);
    expect_load_error(broken, "pytorch_model_fsdp_0/shard_0.safetensors is missing");
    finish(&r);
    if (R == 0) expect_merge_errors(broken);
    /* FULL_STATE_DICT: the consolidated optimizer file, checked before the
     * model loads: an optimizer of two groups (weights, then biases) where
     * the checkpoint's has one in the module's order fails with the
     * model's weights as they were */
    A->fsdp.full_state_dict = true;
    path_of(ckpt, sizeof ckpt, "full_ckpt");
    r = start(false, 5, 33);
    train_step(r.m, r.o, false, 0);
    CHECK(accel_accelerator_save_state(A, ckpt, NULL, 0) == ACCEL_OK);
    finish(&r);
    r = two_groups(9, false);
    expect_load_error_keeps_weights(&r, ckpt, "expected an f32 state of", "other_optimizer");
    finish(&r);
    /* its param groups' counts are the user's (not the shard's runs'): a
     * state of groups split at parameter 3 into one split at 2 (every entry
     * fits) is refused naming them, before the model loads; the same split
     * loads */
    path_of(ckpt, sizeof ckpt, "full_split_ckpt");
    r = split_groups(5, 3);
    train_step(r.m, r.o, false, 0);
    CHECK(accel_accelerator_save_state(A, ckpt, NULL, 0) == ACCEL_OK);
    finish(&r);
    r = split_groups(9, 2);
    expect_load_error_keeps_weights(&r, ckpt, "param group 0 holds 3 parameters in the saved state, 2 in this "
                                    "optimizer", "full_other_split");
    finish(&r);
    r = split_groups(9, 3);
    CHECK_MSG(accel_accelerator_load_state(A, ckpt, NULL) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_optimizer_get_lr(r.o, 1) == 0.01);
    finish(&r);
    A->fsdp.full_state_dict = false;
}

/* `accel merge-weights CKPT/pytorch_model_fsdp_0 OUT --remove_checkpoint_dir`
 * (Accelerate's way to export a SHARDED_STATE_DICT save) removes that
 * folder, the rest of the checkpoint left (optimizer, random states). Its
 * marker listed the removed rank files: load_state then said a rank file was
 * missing, as of a save that never finished. Now the marker says what went
 * where: load_state refuses the checkpoint saying so, the automatic resume
 * skips it for the one before, and total_limit neither counts nor deletes it. */
static void test_merged_checkpoint_passed_over(void) {
    char project[600], ck[3][700], out[600], path[800], cmd[16384], accel[4096 + 32];
    path_of(project, sizeof project, "merged_project");
    path_of(out, sizeof out, "merged_out");
    for (int i = 0; i < 3; i++) snprintf(ck[i], sizeof ck[i], "%s/checkpoints/checkpoint_%d", project, i);
    char *project_dir = A->project_dir;
    A->project_dir = project;
    A->o.automatic_checkpoint_naming = true;
    A->o.total_limit = 2;
    run r = start(false, 5, 33);
    for (int step = 0; step < 2; step++) { /* checkpoint_0 after one step, checkpoint_1 after two */
        train_step(r.m, r.o, false, step);
        CHECK_MSG(accel_accelerator_save_state(A, NULL, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
    }
    if (R == 0 && sibling_exe("accel", accel, sizeof accel)) {
        snprintf(cmd, sizeof cmd, "'%s' merge-weights '%s/pytorch_model_fsdp_0' '%s' --remove_checkpoint_dir", accel,
                 ck[1], out);
        CHECK_MSG(system(cmd) == 0, "%s", cmd);
        snprintf(path, sizeof path, "%s/pytorch_model_fsdp_0", ck[1]);
        CHECK_MSG(access(path, F_OK) != 0, "%s is still there", path);
        snprintf(path, sizeof path, "%s/optimizer_0/sharded_index.json", ck[1]);
        CHECK_MSG(access(path, F_OK) == 0, "%s was removed with the model", path);
    }
    if (N > 1) CHECK(accel_pg_barrier(A->pg) == ACCEL_OK);
    expect_load_error(ck[1], "checkpoint_1 is no longer a complete checkpoint: pytorch_model_fsdp_0 was removed "
                             "(`accel merge-weights --remove_checkpoint_dir` merged it into ");
    if (R == 0) CHECK_STR_CONTAINS(accel_last_error(), "merged_out/model.safetensors)");
    accel_resume_point at;
    CHECK_MSG(accel_accelerator_load_state(A, NULL, &at) == ACCEL_OK, "%s", accel_last_error());
    CHECK_MSG(at.optimizer_steps == 1, "the automatic resume loaded a checkpoint of %lld steps, not checkpoint_0's 1",
              (long long)at.optimizer_steps);
    train_step(r.m, r.o, false, 1);
    CHECK_MSG(accel_accelerator_save_state(A, NULL, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
    for (int i = 0; R == 0 && i < 3; i++) /* two complete checkpoints (0, 2): none over the limit */
        CHECK_MSG(access(ck[i], F_OK) == 0, "total_limit 2 deleted %s", ck[i]);
    finish(&r);
    A->o.automatic_checkpoint_naming = false;
    A->o.total_limit = 0;
    A->project_dir = project_dir;
}

/* ---------------------------------------------------------------- across world sizes */

/* `save DIR`: the uninterrupted run's losses and final weights, and a
 * checkpoint after K steps, all on this world size. */
static int save_phase(void) {
    char losses[600];
    path_of(losses, sizeof losses, "losses.bin");
    double want[K_STEPS + M_STEPS];
    train_and_checkpoint(true, want);
    CHECK(accel_accelerator_save_bytes(A, losses, want, sizeof want) == ACCEL_OK);
    return 0;
}

/* Largest relative difference between the tensors of two model.safetensors. */
static double max_rel_diff(const char *a, const char *b) {
    accel_safetensors *fa = accel_safetensors_open(a), *fb = accel_safetensors_open(b);
    double d = fa && fb ? 0 : INFINITY;
    for (int i = 0; fa && fb && i < accel_safetensors_count(fa); i++) {
        const accel_st_info *x = accel_safetensors_at(fa, i), *y = accel_safetensors_find(fb, x->name);
        if (!y || y->nbytes != x->nbytes) return INFINITY;
        const float *u = x->bytes, *v = y->bytes;
        for (size_t k = 0; k < x->nbytes / sizeof(float); k++) {
            double e = fabs((double)u[k] - v[k]) / (fabs(v[k]) > 1e-2 ? fabs(v[k]) : 1e-2);
            d = e > d ? e : d;
        }
    }
    accel_safetensors_close(fa);
    accel_safetensors_close(fb);
    return d;
}

/* `resume DIR` on another world size: the checkpoint resharded at load. AdamW
 * turns the reduction-order differences of the two world sizes into ~1e-6
 * relative differences of the weights (as FULL_SHARD against DDP). */
static int resume_phase(void) {
    char ref[600], ckpt[600], losses[600], got[600], a[700], b[700];
    path_of(ref, sizeof ref, "ref_model");
    path_of(ckpt, sizeof ckpt, "ckpt");
    path_of(losses, sizeof losses, "losses.bin");
    char mine[64]; /* resumes of one checkpoint on several world sizes may run at once */
    snprintf(mine, sizeof mine, "resumed_on_%d", N);
    path_of(got, sizeof got, mine);
    void *want = NULL;
    size_t len = 0;
    CHECK(accel_load_bytes(losses, &want, &len) == ACCEL_OK && len == (K_STEPS + M_STEPS) * sizeof(double));
    run r = start(true, 99, 0);
    /* A rank the checkpoint did not have keeps its own generator (as
     * Accelerate, when a rank's random_states file is missing); it took rank
     * 0's, which gave it rank 0's stream. */
    char rs[700];
    snprintf(rs, sizeof rs, "%s/random_states_%d.safetensors", ckpt, R);
    bool saved_rank = access(rs, F_OK) == 0;
    CHECK(accel_rng_init(accel_default_rng(), 1000 + (uint64_t)R) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_load_state(A, ckpt, NULL) == ACCEL_OK, "%s", accel_last_error());
    if (!saved_rank)
        CHECK_MSG(accel_default_rng()->seed == 1000 + (uint64_t)R && accel_default_rng()->offset == 0,
                  "rank %d (not in the checkpoint) took another rank's generator: seed %llu offset %llu", R,
                  (unsigned long long)accel_default_rng()->seed, (unsigned long long)accel_default_rng()->offset);
    for (int s = K_STEPS; s < K_STEPS + M_STEPS && want; s++) {
        double l = train_step(r.m, r.o, true, s), w = ((double *)want)[s];
        CHECK_MSG(fabs(l - w) <= 1e-5 * fabs(w), "step %d: loss %.9g resumed on %d processes, %.9g uninterrupted", s,
                  l, N, w);
    }
    CHECK(accel_accelerator_save_model(A, r.m, got, NULL) == ACCEL_OK);
    finish(&r);
    snprintf(a, sizeof a, "%s/model.safetensors", got);
    snprintf(b, sizeof b, "%s/model.safetensors", ref);
    if (R == 0) {
        double d = max_rel_diff(a, b);
        CHECK_MSG(d <= 2e-5, "final weights resumed on %d processes differ by %g (relative) from the uninterrupted run", N, d);
    }
    free(want);
    return 0;
}

int main(int argc, char **argv) {
    bool from_env = getenv("ACCEL_ZERO_STAGE") || getenv("ACCEL_FSDP_SHARDING_STRATEGY");
    accel_accelerator_opts o = accel_accelerator_opts_default();
    if (!from_env) o.zero_stage = 3;
    A = accel_accelerator_new(&o);
    if (!A) {
        fprintf(stderr, "error: %s\n", accel_last_error());
        return 1;
    }
    N = accel_accelerator_num_processes(A);
    R = accel_accelerator_process_index(A);
    CHECK(accel_accelerator_zero_stage(A) == 3);
    A->fsdp.wrap = ACCEL__WRAP_DEFAULT;
    A->fsdp.persistence_threshold = 0;
    if (argc == 4 && !strcmp(argv[1], "save16")) {
        snprintf(ROOT, sizeof ROOT, "%s", argv[2]);
        save16_phase(argv[3]);
    } else if (argc == 3) {
        snprintf(ROOT, sizeof ROOT, "%s", argv[2]);
        if (!strcmp(argv[1], "save")) save_phase();
        else resume_phase();
    } else {
        int64_t id = (int64_t)getpid();
        if (N > 1) CHECK(accel_pg_broadcast(A->pg, &id, 1, ACCEL_I64, 0) == ACCEL_OK);
        snprintf(ROOT, sizeof ROOT, "/tmp/accel_z3ckpt_%d_%lld", N, (long long)id);
        RUN(test_sharded_resume_mlp);
        RUN(test_sharded_resume_llama);
        RUN(test_full_resume_mlp);
        RUN(test_sharded_resume_persistent);
        RUN(test_save_model_equals_ddp);
        RUN(test_save_16bit_settings);
        RUN(test_bad_checkpoints);
        RUN(test_merged_checkpoint_passed_over);
        RUN(test_zero_size_parameter);
        if (N > 1) CHECK(accel_pg_barrier(A->pg) == ACCEL_OK);
        if (R == 0 && getenv("ACCEL_Z3_KEEP")) printf("kept %s\n", ROOT);
        else if (R == 0 && check_failures_ == 0) { /* kept for a look when something failed */
            char cmd[700];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", ROOT);
            CHECK(system(cmd) == 0);
        }
    }
    if (R == 0) printf("zero3 checkpoint world=%d shard_world=%d\n", N, A->shard_world);
    fflush(stdout);
    accel_accelerator_free(A);
    return check_summary();
}
