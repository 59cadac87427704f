/* A model unprepared (accel_accelerator_unprepare_model) and prepared again
 * under pipeline parallelism while its optimizer stays prepared: `accel
 * launch --num_processes 2` (pp 2, DDP) and 4 (pp 2 x dp_shard 2 under
 * ZeRO 1 and 2; pipeline.cmake), `test_pipeline_reprepare ZERO`. The
 * optimizer keeps the stage's parameters it was cut to at its prepare and
 * the other stages' parameters stay released, so training goes on as if the
 * model had never been let go: each stage's weights after 3 steps of
 * accel_accelerator_pipeline_step with a cycle after each equal those
 * without the cycles; prepared again under another split, it is refused
 * (test_other_split_refused). Prints "pipeline reprepare zero=ZERO ok" on rank 0.
 * Run plainly (ctest's pipeline_reprepare): one process, pp 1, the same
 * cycle through pipeline_step's one stage. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "check.h"
#include "pipeline_model.h"

#define T 8
#define ROWS 4 /* per replica: 2 micro-batches of 2 rows */
#define STEPS 3
#define MAXP 64

/* 3 steps of AdamW, each stage's weights then in w (its released ones
 * skipped: meta in both runs, which the caller checks). cycle: unprepare and
 * prepare the model again after each step. */
/* pp stages of 2 micro-batches, under ZeRO stage `zero` (0: DDP) over each
 * stage's 2 replicas. */
static accel_accelerator *accelerator(int pp, int zero) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.parallelism.pp_size = pp;
    o.parallelism.num_micro_batches = 2;
    if (zero) {
        o.zero_stage = zero;
        o.parallelism.dp_replicate_size = 1;
        o.parallelism.dp_shard_size = 2;
    }
    return accel_accelerator_new(&o);
}

/* The test's Llama of `layers` layers. */
static accel_module *model(int layers) {
    return pipeline_llama((pipeline_model){.seed = 7, .vocab = 40, .hidden = 16, .ffn = 32, .positions = 16,
                                           .layers = layers, .heads = 2, .kv_heads = 1});
}

static void train(int pp, int zero, bool cycle, float *w[MAXP], bool held[MAXP]) {
    accel_accelerator *acc = accelerator(pp, zero);
    accel_module *m = model(2);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.05);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h);
    CHECK_MSG(acc && m && opt && accel_accelerator_prepare(acc, m, opt) == ACCEL_OK, "%s", accel_last_error());
    if (!acc) return;
    int replica = zero ? accel_accelerator_process_index(acc) % 2 : 0;
    for (int s = 0; s < STEPS; s++) {
        double loss;
        accel_tensor *ids = pipeline_batch(s, replica * ROWS, ROWS, T, 40);
        CHECK_MSG(accel_accelerator_pipeline_step(acc, m, ids, &loss, NULL) == ACCEL_OK &&
                      accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK &&
                      accel_accelerator_zero_grad(acc, opt) == ACCEL_OK,
                  "zero %d cycle %d step %d: %s", zero, cycle, s, accel_last_error());
        accel_step_reset();
        if (cycle) {
            CHECK_MSG(accel_accelerator_unprepare_model(acc, m) == ACCEL_OK, "%s", accel_last_error());
            CHECK_MSG(accel_accelerator_prepare(acc, m) == ACCEL_OK, "zero %d step %d: prepare again: %s", zero, s,
                      accel_last_error());
        }
    }
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    CHECK(n <= MAXP);
    for (int i = 0; i < n && i < MAXP; i++) {
        held[i] = ps[i]->device.type != ACCEL_DEV_META;
        w[i] = held[i] ? malloc((size_t)accel_numel(ps[i]) * sizeof(float)) : NULL;
        if (held[i]) CHECK(accel_tensor_to_host(ps[i], w[i]) == ACCEL_OK);
    }
    accel_free(ps);
    accel_step_reset();
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(m);
}

/* Prepared again under another split (accel_accelerator_pipeline_set_layers
 * 1 + 3 layers, then 3 + 1): stage 0 would keep layers it released at the
 * first prepare, so the prepare is refused on every rank, naming the
 * parameter there and that rank elsewhere (before, it was taken, and stage
 * 0's pipeline_step failed on a tensor with no data while stage 1 waited
 * for it); the split the model had is taken again and trains. */
static void test_other_split_refused(int zero) {
    accel_accelerator *acc = accelerator(2, zero);
    accel_module *m = model(4);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.05);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h);
    CHECK(acc && m && opt && accel_accelerator_pipeline_set_layers(acc, 1, 0) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_prepare(acc, m, opt) == ACCEL_OK, "%s", accel_last_error());
    if (!acc) return;
    int stage = accel_accelerator_process_index(acc) / (zero ? 2 : 1);
    double loss;
    CHECK_MSG(accel_accelerator_pipeline_step(acc, m, pipeline_batch(0, 0, ROWS, T, 40), &loss, NULL) == ACCEL_OK,
              "%s", accel_last_error());
    accel_step_reset();
    CHECK(accel_accelerator_unprepare_model(acc, m) == ACCEL_OK);
    CHECK(accel_accelerator_pipeline_set_layers(acc, 3, 0) == ACCEL_OK);
    accel_status st = accel_accelerator_prepare(acc, m);
    CHECK_MSG(st == ACCEL_ERR_STATE, "prepared again under another split: %d %s", st, accel_last_error());
    if (st == ACCEL_OK) { /* its step would wait on a stage that fails */
        accel_accelerator_free(acc);
        return;
    }
    CHECK_STR_CONTAINS(accel_last_error(), stage == 0 ? "pipeline stage 0 keeps model.layers.1." :
                                                        "rank 0 (pipeline stage 0) lacks parameters its stage keeps");
    CHECK(accel_accelerator_pipeline_set_layers(acc, 1, 0) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_prepare(acc, m) == ACCEL_OK, "the split it had: %s", accel_last_error());
    CHECK_MSG(accel_accelerator_pipeline_step(acc, m, pipeline_batch(1, 0, ROWS, T, 40), &loss, NULL) == ACCEL_OK &&
                  accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK && isfinite(loss),
              "after the refusal: %s", accel_last_error());
    accel_step_reset();
    accel_accelerator_free(acc);
    /* let go, the model holds its stage only: its own forward (and loss) refuses, naming why, where it gave a
     * result without data whose backward failed with "does not require grad" */
    char why[64];
    snprintf(why, sizeof why, "holds only pipeline stage %d of 2", stage);
    CHECK(accel_llama_forward(m, pipeline_batch(2, 0, ROWS, T, 40), NULL) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), why);
    accel_clear_error();
    CHECK(accel_llama_loss(m, pipeline_batch(2, 0, ROWS, T, 40)) == NULL && accel_last_status() == ACCEL_ERR_STATE);
    accel_clear_error();
    accel_step_reset();
    /* a checkpoint loaded into it gives every parameter its data back: whole again, its forward runs */
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/accel_pp_reload_XXXXXX");
    accel_module *whole = model(4);
    CHECK(mkdtemp(dir) && accel_save_module(dir, whole, 1 << 30) == ACCEL_OK);
    accel_dispatched *d = accel_load_checkpoint_in_model(m, dir, NULL, NULL);
    CHECK_MSG(d != NULL, "%s", accel_last_error());
    accel_dispatched_free(d);
    CHECK_MSG(accel_llama_forward(m, pipeline_batch(2, 0, ROWS, T, 40), NULL) != NULL, "loaded again: %s",
              accel_last_error());
    accel_step_reset();
    char rm[96];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    CHECK(system(rm) == 0);
    accel_module_free(whole);
    accel_optimizer_free(opt);
    accel_module_free(m);
}

int main(int argc, char **argv) {
    int zero = argc > 1 ? atoi(argv[1]) : 0;
    const char *world = getenv("WORLD_SIZE");
    int pp = world ? atoi(world) / (zero ? 2 : 1) : 1;
    float *a[MAXP] = {0}, *b[MAXP] = {0};
    bool ha[MAXP] = {0}, hb[MAXP] = {0};
    train(pp, zero, false, a, ha);
    train(pp, zero, true, b, hb);
    accel_module *shape = pipeline_llama((pipeline_model){.seed = 7, .vocab = 40, .hidden = 16, .ffn = 32,
                                                          .positions = 16, .layers = 2, .heads = 2, .kv_heads = 1});
    accel_tensor **ps;
    int n = accel_module_parameters(shape, &ps), kept = 0;
    double worst = 0;
    for (int i = 0; i < n && i < MAXP; i++) {
        CHECK_MSG(ha[i] == hb[i], "parameter %d: %s with the cycles, %s without", i, hb[i] ? "held" : "released",
                  ha[i] ? "held" : "released");
        if (!ha[i] || !hb[i]) continue;
        kept++;
        for (int64_t j = 0; j < accel_numel(ps[i]); j++) worst = fmax(worst, fabs((double)a[i][j] - b[i][j]));
    }
    CHECK_MSG(kept > 0 && (pp == 1 ? kept == n : kept < n), "the stage held %d of %d parameters", kept, n);
    CHECK_MSG(worst <= 1e-6, "zero %d: the stage's weights differ by %g after the unprepare/prepare cycles", zero,
              worst);
    for (int i = 0; i < MAXP; i++) free(a[i]), free(b[i]);
    accel_free(ps);
    accel_module_free(shape);
    if (pp == 2) test_other_split_refused(zero);
    int failed = check_summary();
    if (!failed && (!getenv("RANK") || !strcmp(getenv("RANK"), "0"))) printf("pipeline reprepare zero=%d ok\n", zero);
    return failed;
}
