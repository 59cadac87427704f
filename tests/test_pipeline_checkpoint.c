/* save_state / load_state under pipeline parallelism (forked processes): a
 * pp = 2 run of a 4-layer Llama (tied embeddings: on both ends) with AdamW
 * through accel_accelerator_pipeline_step (4 micro-batches, 1F1B) saves
 * after 2 steps; its files are a one-process checkpoint's (the whole model,
 * and the Adam state of every parameter in the optimizer's one-process
 * numbering, each once). Resumed from other weights on the same mesh, the
 * next 3 steps' losses equal the uninterrupted run's bit for bit; on one
 * process (pp = 1), on pp = 4 and on pp = 2 x dp = 2 (the replicas' mean
 * loss) within 1e-5. The same under interleaved 1F1B (pp = 2, 2 chunks of a
 * layer per stage: stage 0 holds layers 0 and 2 and the embedding, stage 1
 * layers 1 and 3 and the tied head): its files are a one-process checkpoint
 * too, resumed bit for bit on its mesh and within 1e-5 on one process. And
 * under ZeRO over each stage's dp ranks (dp_shard): pp = 2 x dp = 2 with
 * ZeRO-1 (1F1B) and ZeRO-2 (interleaved) write a one-process checkpoint
 * too (each stage's optimizer shards consolidated), resumed bit for bit on
 * their mesh and within 1e-5 on one process. And under context parallelism
 * over each stage's 2 cp ranks (pp = 2 x cp = 2, all-gather with 1F1B and
 * all-to-all with interleaved 1F1B): a one-process checkpoint, resumed bit
 * for bit on its mesh and within 1e-5 on one process. Param groups: the
 * checkpoint records each group's parameter count over the whole model (a
 * stage holds its part), so a state of other groups is refused by name on
 * pp = 2, with DDP and with ZeRO-1 (regroup_body). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accelerator.h"
#include "accel/io.h"
#include "check.h"
#include "io/checkpoint_marker.h"
#include "optim_groups.h"
#include "checkpoint_whole.h"
#include "dist_group.h"
#include "pipeline_model.h"

enum { LAYERS = 4, T = 12, ROWS = 8, MICRO = 4, SAVED_AT = 2, AFTER = 3, VOCAB = 40 };

typedef enum { FIRST, RESUME, ONE, WIDER, DP } phase;
static struct { phase ph; int pp, dp, virt, zero, cp; const char *cp_strategy; char dir[64]; } CFG;

static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", CFG.dir, name); }

static accel_module *model_of(uint64_t seed) {
    return pipeline_llama((pipeline_model){.seed = seed, .vocab = VOCAB, .hidden = 32, .ffn = 64, .positions = 32,
                                           .layers = LAYERS, .heads = 4, .kv_heads = 2, .tied = true});
}

static int body(int rank, int world) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.parallelism = (accel_parallelism_opts){.pp_size = CFG.pp, .dp_replicate_size = CFG.zero ? 1 : CFG.dp,
                                             .dp_shard_size = CFG.zero ? CFG.dp : 0,
                                             .num_micro_batches = MICRO, .pp_virtual_stages = CFG.virt,
                                             .pp_schedule = CFG.virt > 1 ? "interleaved" : "1f1b",
                                             .cp_size = CFG.cp, .cp_comm_strategy = CFG.cp_strategy};
    o.zero_stage = CFG.zero ? CFG.zero : -1; /* ZeRO over each stage's dp ranks (dp_shard), else DDP */
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 1;
    }
    /* resumed runs start from other weights: the checkpoint must replace them */
    accel_module *m = model_of(CFG.ph == FIRST ? 7 : 99);
    accel_optim_hparams h = {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h);
    CHECK_MSG(accel_accelerator_prepare(acc, m, opt) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_accelerator_zero_stage(acc) == CFG.zero);
    char ckpt[128], losses[128];
    path_in(ckpt, sizeof ckpt, "ckpt");
    path_in(losses, sizeof losses, "losses");
    if (CFG.ph != FIRST)
        CHECK_MSG(accel_accelerator_load_state(acc, ckpt, NULL) == ACCEL_OK, "rank %d: %s", rank, accel_last_error());
    /* ranks: pp-major, then dp, cp (a cp group's ranks train on the same rows) */
    int replica = rank / CFG.cp % CFG.dp, rows = ROWS / CFG.dp;
    double got[AFTER], want[AFTER];
    for (int s = CFG.ph == FIRST ? 0 : SAVED_AT; s < SAVED_AT + AFTER; s++) {
        if (CFG.ph == FIRST && s == SAVED_AT)
            CHECK_MSG(accel_accelerator_save_state(acc, ckpt, NULL, 0) == ACCEL_OK, "rank %d: %s", rank,
                      accel_last_error());
        double loss = NAN;
        CHECK_MSG(accel_accelerator_pipeline_step(acc, m, pipeline_batch(s, replica * rows, rows, T, VOCAB), &loss,
                                                  NULL) == ACCEL_OK, "%s", accel_last_error());
        if (CFG.dp > 1) { /* the replicas' mean: every rank of a replica's stages reports its loss */
            CHECK(accel_pg_all_reduce(accel_dist_default_group(), &loss, 1, ACCEL_F64, ACCEL_REDUCE_SUM) == ACCEL_OK);
            loss /= world;
        }
        if (s >= SAVED_AT) got[s - SAVED_AT] = loss;
        CHECK_MSG(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK, "%s", accel_last_error());
        CHECK(accel_accelerator_zero_grad(acc, opt) == ACCEL_OK);
        accel_step_reset();
    }
    if (CFG.ph == FIRST && rank == 0) {
        FILE *lf = fopen(losses, "wb");
        CHECK(lf && fwrite(got, sizeof got, 1, lf) == 1);
        if (lf) fclose(lf);
        accel_module *whole = model_of(7);
        check_whole_checkpoint(ckpt, whole);
        accel_module_free(whole);
    }
    FILE *lf = CFG.ph == FIRST ? NULL : fopen(losses, "rb");
    CHECK(CFG.ph == FIRST || (lf && fread(want, sizeof want, 1, lf) == 1));
    if (lf) fclose(lf);
    for (int s = 0; s < AFTER && CFG.ph != FIRST; s++) {
        if (CFG.ph == RESUME) /* the same mesh: the same arithmetic */
            CHECK_MSG(got[s] == want[s], "rank %d step %d: loss %.17g, uninterrupted %.17g", rank, s, got[s], want[s]);
        else
            CHECK_MSG(fabs(got[s] - want[s]) <= 1e-5 * fmax(1, fabs(want[s])), "pp %d x dp %d, rank %d step %d: "
                      "loss %.9g, uninterrupted %.9g", CFG.pp, CFG.dp, rank, s, got[s], want[s]);
    }
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(m);
    return check_summary();
}

/* A copy of the stage's own parameters (the others' are released: meta). */
static float *stage_params(accel_module *m, int64_t *n_out) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += ps[i]->device.type == ACCEL_DEV_META ? 0 : accel_numel(ps[i]);
    float *out = malloc(sizeof(float) * (size_t)(total ? total : 1)), *at = out;
    for (int i = 0; i < n && out; i++)
        if (ps[i]->device.type != ACCEL_DEV_META) {
            memcpy(at, ps[i]->data, sizeof(float) * (size_t)accel_numel(ps[i]));
            at += accel_numel(ps[i]);
        }
    accel_free(ps);
    *n_out = total;
    return out;
}

/* pp = 2 (x dp, ZeRO over it when CFG.zero): a checkpoint of groups split
 * at parameter `half` of the whole model, after a step, loaded into an
 * optimizer split at half + 1 (whose entries all fit: they are by
 * parameter), and the one-group run's checkpoint into it: both refused
 * naming the group and both counts, the stage's weights and lrs as they were; the
 * same split loads. */
/* dir's optimizer file with its "state.0.*" entries renamed "state.4294967296.*"
 * (rank 0 writes it again, and the marker over it; every rank waits). */
static void state_number_past_int(accel_accelerator *acc, const char *dir, int rank, int world) {
    if (rank == 0) {
        char path[600];
        snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
        accel_safetensors *f = accel_safetensors_open(path);
        CHECK_MSG(f != NULL, "%s", accel_last_error());
        int n = f ? accel_safetensors_count(f) : 0, renamed = 0;
        char **names = calloc((size_t)n + 1, sizeof *names);
        accel_tensor **ts = calloc((size_t)n + 1, sizeof *ts);
        for (int i = 0; i < n; i++) {
            const char *name = accel_safetensors_at(f, i)->name;
            names[i] = malloc(strlen(name) + 16);
            if (!strncmp(name, "state.0.", 8)) snprintf(names[i], strlen(name) + 16, "state.4294967296.%s", name + 8), renamed++;
            else strcpy(names[i], name);
            ts[i] = accel_safetensors_tensor(f, name, -1);
        }
        CHECK(renamed > 0 && accel_safetensors_save(path, n, (const char *const *)names, ts, 0, NULL) == ACCEL_OK);
        for (int i = 0; i < n; i++) free(names[i]), accel_tensor_free(ts[i]);
        free(names);
        free(ts);
        accel_safetensors_close(f);
        CHECK_MSG(accel__marker_write(dir, world, NULL, "state_number_past_int") == ACCEL_OK, "%s", accel_last_error());
    }
    accel_accelerator_wait_for_everyone(acc);
}

static int regroup_body(int rank, int world) {
    (void)world;
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.parallelism = (accel_parallelism_opts){.pp_size = CFG.pp, .dp_replicate_size = CFG.zero ? 1 : CFG.dp,
                                             .dp_shard_size = CFG.zero ? CFG.dp : 0, .num_micro_batches = MICRO,
                                             .pp_schedule = "1f1b"};
    o.zero_stage = CFG.zero ? CFG.zero : -1;
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 1;
    }
    char ckpt[128], grouped_ckpt[128];
    path_in(ckpt, sizeof ckpt, "ckpt");
    path_in(grouped_ckpt, sizeof grouped_ckpt, "grouped");
    accel_module *m = model_of(7), *m2 = model_of(99), *m3 = model_of(98);
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps), half = n / 2;
    accel_free(ps);
    accel_optimizer *saved = grouped(m, half, 0.01, 0.02), *other = grouped(m2, half + 1, 0.03, 0.04),
                    *same = grouped(m3, half, 0.05, 0.06);
    int replica = rank % CFG.dp, rows = ROWS / CFG.dp;
    CHECK_MSG(accel_accelerator_prepare(acc, m, saved) == ACCEL_OK, "%s", accel_last_error());
    double loss = NAN;
    CHECK_MSG(accel_accelerator_pipeline_step(acc, m, pipeline_batch(0, replica * rows, rows, T, VOCAB), &loss, NULL) ==
                  ACCEL_OK, "%s", accel_last_error());
    CHECK_MSG(accel_accelerator_optimizer_step(acc, saved) == ACCEL_OK, "%s", accel_last_error());
    accel_step_reset();
    CHECK_MSG(accel_accelerator_save_state(acc, grouped_ckpt, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());

    CHECK_MSG(accel_accelerator_prepare(acc, m2, other) == ACCEL_OK, "%s", accel_last_error());
    int64_t nw;
    float *w = stage_params(m2, &nw);
    char want[160];
    snprintf(want, sizeof want, "param group 0 holds %d parameters in the saved state, %d in this optimizer", half,
             half + 1);
    CHECK(accel_accelerator_load_state(acc, grouped_ckpt, NULL) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), want);
    accel_clear_error();
    CHECK(accel_accelerator_load_state(acc, ckpt, NULL) == ACCEL_ERR_FORMAT); /* the one-group run's: all n in 0 */
    snprintf(want, sizeof want, "param group 0 holds %d parameters in the saved state, %d in this optimizer", n,
             half + 1);
    CHECK_STR_CONTAINS(accel_last_error(), want);
    accel_clear_error();
    int64_t nw2;
    float *w2 = stage_params(m2, &nw2);
    CHECK_MSG(nw == nw2 && !memcmp(w, w2, sizeof(float) * (size_t)nw), "rank %d: the stage's weights were loaded "
              "before its optimizer failed", rank);
    CHECK(accel_optimizer_get_lr(other, 0) == 0.03 && accel_optimizer_get_lr(other, 1) == 0.04);
    free(w);
    free(w2);
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());

    CHECK_MSG(accel_accelerator_prepare(acc, m3, same) == ACCEL_OK, "%s", accel_last_error());
    CHECK_MSG(accel_accelerator_load_state(acc, grouped_ckpt, NULL) == ACCEL_OK, "rank %d: %s", rank,
              accel_last_error());
    CHECK(accel_optimizer_get_lr(same, 0) == 0.01 && accel_optimizer_get_lr(same, 1) == 0.02);
    /* a parameter number past int: sscanf's %d wrapped "state.4294967296" to parameter 0, whose state it loaded */
    state_number_past_int(acc, grouped_ckpt, rank, world);
    CHECK(accel_accelerator_load_state(acc, grouped_ckpt, NULL) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "state.4294967296.");
    accel_clear_error();
    accel_accelerator_free(acc);
    accel_optimizer_free(saved);
    accel_optimizer_free(other);
    accel_optimizer_free(same);
    accel_module_free(m);
    accel_module_free(m2);
    accel_module_free(m3);
    return check_summary();
}

static void run_regroup(int dp, int zero) {
    CFG.pp = 2, CFG.dp = dp, CFG.zero = zero, CFG.virt = 1, CFG.cp = 1;
    dist_group g = {.world = 2 * dp, .one_machine = true, .timeout = "60", .kill_after_s = 240};
    CHECK(dist_group_runs_ok(&g, regroup_body, "param groups (pp 2 x dp %d, ZeRO %d)", dp, zero));
}

static void run_cp(phase ph, int pp, int dp, int virt, int zero, int cp, const char *cp_strategy) {
    CFG.ph = ph, CFG.pp = pp, CFG.dp = dp, CFG.virt = virt, CFG.zero = zero, CFG.cp = cp;
    CFG.cp_strategy = cp_strategy;
    dist_group g = {.world = pp * dp * cp, .one_machine = true, .timeout = "60", .kill_after_s = 240};
    CHECK(dist_group_runs_ok(&g, body, "phase %d (pp %d x dp %d x cp %d, %d virtual, ZeRO %d)", (int)ph, pp, dp, cp,
                             virt, zero));
}

static void run(phase ph, int pp, int dp, int virt, int zero) { run_cp(ph, pp, dp, virt, zero, 1, NULL); }

int main(void) {
    snprintf(CFG.dir, sizeof CFG.dir, "/tmp/accel_ppckpt_XXXXXX");
    CHECK(mkdtemp(CFG.dir) != NULL);
    run(FIRST, 2, 1, 1, 0);
    run(RESUME, 2, 1, 1, 0);
    run(ONE, 1, 1, 1, 0);
    run(WIDER, 4, 1, 1, 0);
    run(DP, 2, 2, 1, 0);
    run(FIRST, 2, 1, 2, 0); /* interleaved: its own checkpoint and losses */
    run(RESUME, 2, 1, 2, 0);
    run(ONE, 1, 1, 1, 0);
    run(FIRST, 2, 2, 1, 1); /* ZeRO-1 over each stage's 2 ranks */
    run(RESUME, 2, 2, 1, 1);
    run(ONE, 1, 1, 1, 0);
    run(FIRST, 2, 2, 2, 2); /* ZeRO-2, interleaved */
    run(RESUME, 2, 2, 2, 2);
    run(ONE, 1, 1, 1, 0);
    run_cp(FIRST, 2, 1, 1, 0, 2, "allgather"); /* cp 2 in each stage */
    run_cp(RESUME, 2, 1, 1, 0, 2, "allgather");
    run(ONE, 1, 1, 1, 0);
    run_cp(FIRST, 2, 1, 2, 0, 2, "alltoall"); /* interleaved, Ulysses' exchange */
    run_cp(RESUME, 2, 1, 2, 0, 2, "alltoall");
    run(ONE, 1, 1, 1, 0);
    run_regroup(1, 0); /* the last FIRST's checkpoint (one group) is in ckpt */
    run_regroup(2, 1);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", CFG.dir);
    CHECK(system(cmd) == 0);
    return check_summary();
}
