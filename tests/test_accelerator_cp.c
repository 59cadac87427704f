/* Context parallelism through the Accelerator (opts.parallelism.cp_size /
 * cp_comm_strategy, sp_size) on forked processes: 5 SGD steps of a GQA Llama
 * give the losses and the weights (so the gradients) of one process within
 * 1e-5 (f32): cp 2 on 2 processes and cp 4 on 4 with each strategy (DDP
 * over the cp ranks), sp 2 x dp_shard 2 (Ulysses), and cp 2 x dp_shard 2
 * under ZeRO-3 on 4, where each dp_shard rank trains on its own batch. Every
 * rank of a cp group passes the same whole batch to accel_llama_loss; a
 * prepared data loader gives the ranks of a cp group the same batches.
 * The cp group lives on the prepared model, not the thread: the one-process
 * reference trains on the same thread while the accelerator's model is
 * context-parallel, and the model, once its accelerator is freed, runs
 * unsharded (its loss and gradients are the reference's). */
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "check.h"
#include "dist_group.h"

#define STEPS 5
#define MAX_DP 2

static accel_parallelism_opts g_par;
static int g_zero_stage;

static accel_module *tiny_seed(uint64_t seed) {
    accel_manual_seed(seed);
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 37, c.hidden_size = 16, c.intermediate_size = 24, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 64;
    c.torch_dtype = ACCEL_F32;
    return accel_llama_new(&c, ACCEL_CPU_DEVICE);
}

static accel_module *tiny(void) { return tiny_seed(7); }

/* The whole batch [2, T] of data-parallel index d at step s. */
static accel_tensor *batch(int s, int d, int64_t T) {
    int64_t ids[2 * 16];
    for (int64_t i = 0; i < 2 * T; i++) ids[i] = (i * 11 + s * 5 + d * 17 + 3) % 37;
    return accel_from_data(ACCEL_I64, ACCEL_SHAPE(2, T), ids);
}

static accel_optimizer *sgd(accel_module *m) {
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.5);
    return accel_optimizer_new_module(ACCEL_OPTIM_SGD, m, &h);
}

/* One process: each step the mean of the dp batches' losses (what DDP's
 * average of their gradients trains on). loss[s][d]: batch d's loss. */
static accel_module *reference(int dp, int64_t T, double loss[STEPS][MAX_DP]) {
    accel_module *m = tiny();
    accel_optimizer *o = sgd(m);
    for (int s = 0; s < STEPS; s++) {
        accel_tensor *sum = NULL;
        for (int d = 0; d < dp; d++) {
            accel_tensor *l = accel_llama_loss(m, batch(s, d, T));
            loss[s][d] = accel_item(l);
            sum = sum ? accel_add(sum, l) : l;
        }
        accel_backward(accel_mul_scalar(sum, 1.0 / dp));
        accel_optimizer_step(o);
        accel_optimizer_zero_grad(o);
        accel_step_reset();
    }
    accel_optimizer_free(o);
    return m;
}

static int body(int rank, int world) {
    int cp = g_par.cp_size > 1 ? g_par.cp_size : g_par.sp_size, dp = world / cp, d = rank / cp;
    int64_t T = 4 * cp;
    double want[STEPS][MAX_DP];
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.parallelism = g_par;
    o.zero_stage = g_zero_stage;
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 10;
    }
    /* a prepared data loader: the ranks of a cp group get the same batches, the dp indices others */
    int64_t rows[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    accel_dataset *ds = accel_tensor_dataset_new(1, (accel_tensor *[]){accel_from_data(ACCEL_I64, ACCEL_SHAPE(8, 1), rows)});
    accel_dataloader_opts dlo = accel_dataloader_opts_default();
    dlo.batch_size = 1;
    accel_dataloader *dl = accel_dataloader_new(ds, &dlo);
    accel_batch b;
    int64_t first[8] = {-1};
    if (accel_accelerator_prepare(acc, dl) != ACCEL_OK || !accel_dataloader_next(dl, &b)) return 15;
    first[0] = (int64_t)accel_item(b.fields[0]);
    int64_t all[8];
    accel_pg_all_gather(accel_dist_default_group(), first, all, 1, ACCEL_I64);
    for (int r = 0; r < world; r++)
        if (all[r] != all[r / cp * cp] || (r % cp == 0 && r > 0 && all[r] == all[0])) {
            fprintf(stderr, "rank %d: first batches by rank: %lld %lld %lld %lld\n", rank, (long long)all[0],
                    (long long)all[1 % world], (long long)all[2 % world], (long long)all[3 % world]);
            return 16;
        }
    accel_step_reset();
    accel_module *m = tiny();
    accel_optimizer *opt = sgd(m);
    if (accel_accelerator_prepare(acc, m, opt, NULL, NULL) != ACCEL_OK) {
        fprintf(stderr, "rank %d: prepare: %s\n", rank, accel_last_error());
        return 11;
    }
    if (!accel_llama_cp_group(m, NULL)) return 17;
    /* a model without a context-parallel forward would train on the cp ranks' one batch cp times over */
    accel_module *lin = accel_linear_new(4, 4, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    if (accel_accelerator_prepare(acc, lin) != ACCEL_ERR_UNSUPPORTED ||
        !strstr(accel_last_error(), "no context-parallel forward")) {
        fprintf(stderr, "rank %d: a Linear under cp: %s\n", rank, accel_last_error());
        return 19;
    }
    accel_module_free(lin);
    accel_module *ref = reference(dp, T, want); /* on this thread, beside the cp model */
    /* a second accelerator, without cp, beside the first: its model runs unsharded */
    accel_accelerator_opts o2 = accel_accelerator_opts_default();
    o2.mixed_precision = "no";
    accel_accelerator *acc2 = accel_accelerator_new(&o2);
    accel_module *m2 = tiny();
    if (!acc2 || accel_accelerator_prepare(acc2, m2) != ACCEL_OK || accel_llama_cp_group(m2, NULL)) {
        fprintf(stderr, "rank %d: a second accelerator: %s\n", rank, accel_last_error());
        return 21;
    }
    /* its logits of the whole batch are a plain model's (under cp the ids would be taken as chunks) */
    accel_module *m3 = tiny();
    accel_tensor *y2 = accel_llama_forward(m2, batch(0, d, T), NULL), *y3 = accel_llama_forward(m3, batch(0, d, T), NULL);
    int64_t ny = y2 && y3 ? accel_numel(y3) : 0;
    float *f2 = malloc((size_t)(ny ? ny : 1) * sizeof *f2), *f3 = malloc((size_t)(ny ? ny : 1) * sizeof *f3);
    int differ = !ny || accel_numel(y2) != ny;
    if (!differ) {
        accel_to_floats(y2, f2);
        accel_to_floats(y3, f3);
        for (int64_t i = 0; i < ny && !differ; i++) differ = !(fabsf(f2[i] - f3[i]) <= 1e-6f * (1 + fabsf(f3[i])));
    }
    free(f2);
    free(f3);
    accel_module_free(m3);
    if (differ) {
        fprintf(stderr, "rank %d: the second accelerator's model: logits differ from a plain model's (%s)\n", rank,
                accel_last_error());
        return 22;
    }
    accel_step_reset();
    accel_accelerator_free(acc2);
    accel_module_free(m2);
    int bad = 0;
    for (int s = 0; s < STEPS; s++) {
        accel_tensor *l = accel_llama_loss(m, batch(s, d, T));
        if (!l || accel_accelerator_backward(acc, l) != ACCEL_OK || accel_accelerator_optimizer_step(acc, opt) ||
            accel_accelerator_zero_grad(acc, opt)) {
            fprintf(stderr, "rank %d step %d: %s\n", rank, s, accel_last_error());
            return 12;
        }
        double got = accel_item(l);
        if (!(fabs(got - want[s][d]) <= 1e-5 * (1 + fabs(want[s][d])))) {
            fprintf(stderr, "rank %d step %d: loss %.9g, one process %.9g\n", rank, s, got, want[s][d]);
            bad++;
        }
        accel_step_reset();
    }
    /* ZeRO-3: the full weights back in m */
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());
    accel_tensor **pa, **pb;
    int n = accel_module_parameters(m, &pa);
    accel_module_parameters(ref, &pb);
    for (int i = 0; i < n; i++) {
        int64_t k = accel_numel(pa[i]);
        float *a = malloc((size_t)k * sizeof *a), *b = malloc((size_t)k * sizeof *b);
        accel_to_floats(pa[i], a);
        accel_to_floats(pb[i], b);
        for (int64_t j = 0; j < k; j++)
            if (!(fabsf(a[j] - b[j]) <= 1e-5f * (1 + fabsf(b[j])))) {
                fprintf(stderr, "rank %d: after %d steps %s[%lld] = %.9g, one process %.9g\n", rank, STEPS,
                        pa[i]->name ? pa[i]->name : "?", (long long)j, a[j], b[j]);
                bad++;
                break;
            }
        free(a);
        free(b);
    }
    accel_free(pa);
    accel_free(pb);
    accel_optimizer_free(opt);
    accel_accelerator_free(acc);
    /* the model outlives its accelerator and runs unsharded: its loss and
     * gradient on one batch are the reference's (a cp rank's would be a share) */
    accel_step_reset();
    accel_tensor *la = accel_llama_loss(m, batch(0, d, T));
    accel_tensor *lb = la && !accel_backward(la) ? accel_llama_loss(ref, batch(0, d, T)) : NULL;
    if (accel_llama_cp_group(m, NULL) || !lb || accel_backward(lb)) {
        fprintf(stderr, "rank %d: after the accelerator: %s\n", rank, accel_last_error());
        return 18;
    }
    if (!(fabs(accel_item(la) - accel_item(lb)) <= 1e-5 * (1 + fabs(accel_item(lb))))) bad++;
    n = accel_module_parameters(m, &pa);
    accel_module_parameters(ref, &pb);
    for (int i = 0; i < n; i++) {
        if (!pa[i]->grad || !pb[i]->grad) {
            bad++;
            break;
        }
        int64_t k = accel_numel(pa[i]);
        float *a = malloc((size_t)k * sizeof *a), *b = malloc((size_t)k * sizeof *b);
        accel_to_floats(pa[i]->grad, a);
        accel_to_floats(pb[i]->grad, b);
        for (int64_t j = 0; j < k; j++)
            if (!(fabsf(a[j] - b[j]) <= 1e-5f * (1 + fabsf(b[j])))) {
                fprintf(stderr, "rank %d: after the accelerator, grad %s[%lld] = %.9g, one process %.9g\n", rank,
                        pa[i]->name ? pa[i]->name : "?", (long long)j, a[j], b[j]);
                bad++;
                break;
            }
        free(a);
        free(b);
    }
    accel_free(pa);
    accel_free(pb);
    accel_module_free(m);
    accel_module_free(ref);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    accel_thread_cleanup();
    return bad ? 20 : 0;
}

/* ---------------------------------------------------------------- save_state / load_state */

#define RESUME_AT 2
static char g_dir[256];

static accel_optimizer *adamw(accel_module *m) {
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.05);
    return accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h);
}

/* Steps [from, to) of data-parallel index d through acc; loss[s] recorded. */
static int train(accel_accelerator *acc, accel_module *m, accel_optimizer *o, int from, int to, int d, int64_t T,
                 double *loss) {
    for (int s = from; s < to; s++) {
        accel_tensor *l = accel_llama_loss(m, batch(s, d, T));
        if (!l || accel_accelerator_backward(acc, l) != ACCEL_OK || accel_accelerator_optimizer_step(acc, o) ||
            accel_accelerator_zero_grad(acc, o)) {
            fprintf(stderr, "step %d: %s\n", s, accel_last_error());
            return 1;
        }
        loss[s] = accel_item(l);
        accel_step_reset();
    }
    return 0;
}

/* Every parameter's values, flat (after accel_accelerator_clear under ZeRO-3). */
static float *flat_weights(accel_module *m, int64_t *n_out) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += accel_numel(ps[i]);
    float *w = malloc((size_t)total * sizeof *w);
    for (int i = 0, o = 0; i < n; o += (int)accel_numel(ps[i]), i++) accel_to_floats(ps[i], w + o);
    accel_free(ps);
    *n_out = total;
    return w;
}

/* On the cp mesh: RESUME_AT AdamW steps, save_state, the rest (run A); then
 * a fresh accelerator and a model of other weights load that state and
 * train the rest again (run B): B's losses and final weights are A's, bit
 * for bit. */
static int body_resume(int rank, int world) {
    int cp = g_par.cp_size, d = rank / cp;
    int64_t T = 4 * cp;
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.parallelism = g_par;
    o.zero_stage = g_zero_stage;
    double la[STEPS], lb[STEPS];
    float *w[2] = {NULL, NULL};
    int64_t n[2] = {0, 0};
    for (int run = 0; run < 2; run++) {
        accel_accelerator *acc = accel_accelerator_new(&o);
        accel_module *m = tiny_seed(run == 0 ? 7 : 99);
        accel_optimizer *opt = m ? adamw(m) : NULL;
        if (!acc || !opt || accel_accelerator_prepare(acc, m, opt, NULL, NULL) != ACCEL_OK) {
            fprintf(stderr, "rank %d run %d: %s\n", rank, run, accel_last_error());
            return 10;
        }
        if (run == 0 && (train(acc, m, opt, 0, RESUME_AT, d, T, la) ||
                         accel_accelerator_save_state(acc, g_dir, NULL, 0) != ACCEL_OK)) {
            fprintf(stderr, "rank %d: save_state: %s\n", rank, accel_last_error());
            return 11;
        }
        if (run == 1 && accel_accelerator_load_state(acc, g_dir, NULL) != ACCEL_OK) {
            fprintf(stderr, "rank %d: load_state: %s\n", rank, accel_last_error());
            return 12;
        }
        if (train(acc, m, opt, RESUME_AT, STEPS, d, T, run == 0 ? la : lb)) return 13;
        /* ZeRO-3: the full weights back in m */
        CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());
        w[run] = flat_weights(m, &n[run]);
        accel_optimizer_free(opt);
        accel_accelerator_free(acc);
        accel_module_free(m);
    }
    int bad = 0;
    for (int s = RESUME_AT; s < STEPS; s++)
        if (la[s] != lb[s]) {
            fprintf(stderr, "rank %d step %d: resumed loss %.9g, uninterrupted %.9g\n", rank, s, lb[s], la[s]);
            bad++;
        }
    if (n[0] != n[1] || memcmp(w[0], w[1], (size_t)n[0] * sizeof *w[0])) {
        fprintf(stderr, "rank %d: the resumed weights differ from the uninterrupted run's\n", rank);
        bad++;
    }
    free(w[0]);
    free(w[1]);
    accel_thread_cleanup();
    return bad ? 20 : 0;
}

/* One process without cp loads the cp run's checkpoint and trains the rest
 * (the cp mesh had one data-parallel index): its losses are those of a
 * plain uninterrupted AdamW run of the same model within 1e-5. */
static int body_resume_one(int rank, int world) {
    (void)rank, (void)world;
    int64_t T = 4 * g_par.cp_size;
    double want[STEPS], got[STEPS];
    accel_module *ref = tiny();
    accel_optimizer *ro = adamw(ref);
    for (int s = 0; s < STEPS; s++) {
        accel_tensor *l = accel_llama_loss(ref, batch(s, 0, T));
        want[s] = accel_item(l);
        accel_backward(l);
        accel_optimizer_step(ro);
        accel_optimizer_zero_grad(ro);
        accel_step_reset();
    }
    accel_optimizer_free(ro);
    accel_module_free(ref);
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    accel_accelerator *acc = accel_accelerator_new(&o);
    accel_module *m = tiny_seed(99);
    accel_optimizer *opt = adamw(m);
    if (!acc || accel_accelerator_prepare(acc, m, opt, NULL, NULL) != ACCEL_OK ||
        accel_accelerator_load_state(acc, g_dir, NULL) != ACCEL_OK || train(acc, m, opt, RESUME_AT, STEPS, 0, T, got)) {
        fprintf(stderr, "one process: %s\n", accel_last_error());
        return 10;
    }
    int bad = 0;
    for (int s = RESUME_AT; s < STEPS; s++)
        if (!(fabs(got[s] - want[s]) <= 1e-5 * (1 + fabs(want[s])))) {
            fprintf(stderr, "one process step %d: loss %.9g after loading the cp checkpoint, uninterrupted %.9g\n", s,
                    got[s], want[s]);
            bad++;
        }
    accel_optimizer_free(opt);
    accel_accelerator_free(acc);
    accel_module_free(m);
    accel_thread_cleanup();
    return bad ? 20 : 0;
}

static void run_body(int world, accel_parallelism_opts p, int zero_stage, dist_body_fn body, const char *what) {
    g_par = p;
    g_zero_stage = zero_stage;
    dist_group g = {.world = world, .one_machine = true, .timeout = "60", .kill_after_s = 150};
    CHECK(dist_group_runs_ok(&g, body, "%s, %d processes, cp %d sp %d dp_shard %d %s, zero %d", what, world, p.cp_size,
                             p.sp_size, p.dp_shard_size, p.cp_comm_strategy ? p.cp_comm_strategy : "", zero_stage));
}

/* g_dir: a checkpoint directory inside a fresh temporary one (removed after). */
static void resume_case(int world, accel_parallelism_opts p, int zero_stage, bool one_process) {
    char tmp[64] = "/tmp/accel_cp_resume_XXXXXX", cmd[128];
    CHECK(mkdtemp(tmp) != NULL);
    snprintf(g_dir, sizeof g_dir, "%s/ckpt", tmp);
    run_body(world, p, zero_stage, body_resume, "resume on the same mesh");
    if (one_process) run_body(1, p, zero_stage, body_resume_one, "resume on one process");
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    CHECK(system(cmd) == 0);
}

static void test_resume_cp2(void) { resume_case(2, (accel_parallelism_opts){.cp_size = 2}, 0, true); }
static void test_resume_cp2_dp_shard2_zero3(void) {
    resume_case(4, (accel_parallelism_opts){.cp_size = 2, .dp_shard_size = 2}, 3, false);
}

static void run(int world, accel_parallelism_opts p, int zero_stage) { run_body(world, p, zero_stage, body, "5 steps"); }

static void test_cp2(void) {
    run(2, (accel_parallelism_opts){.cp_size = 2}, 0);
    run(2, (accel_parallelism_opts){.cp_size = 2, .cp_comm_strategy = "alltoall"}, 0);
}
static void test_cp4(void) {
    run(4, (accel_parallelism_opts){.cp_size = 4, .cp_comm_strategy = "allgather"}, 0);
    run(4, (accel_parallelism_opts){.cp_size = 4, .cp_comm_strategy = "alltoall"}, 0);
}
static void test_sp2_dp_shard2(void) { run(4, (accel_parallelism_opts){.sp_size = 2, .dp_shard_size = 2}, 0); }
static void test_cp2_dp_shard2_zero3(void) {
    run(4, (accel_parallelism_opts){.cp_size = 2, .dp_shard_size = 2}, 3);
}

int main(void) {
    setenv("OMP_NUM_THREADS", "1", 0);
    RUN(test_cp2);
    RUN(test_cp4);
    RUN(test_sp2_dp_shard2);
    RUN(test_cp2_dp_shard2_zero3);
    RUN(test_resume_cp2);
    RUN(test_resume_cp2_dp_shard2_zero3);
    return check_summary();
}
