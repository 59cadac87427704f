/* accel_accelerator_clear's status under ZeRO on 2 forked ranks (shm, one
 * machine, and tcp, two "machines"): a model (with or without its AdamW)
 * trains 2 steps, then
 *   - both ranks clear: ACCEL_OK, and the optimizer holds its consolidated
 *     state again (its "state.<u>.exp_avg" entries);
 *   - rank 1 dies (SIGKILL) before clear: rank 0's clear returns the dead
 *     peer's failure, its error naming what came back lost (ZeRO-2 and -3
 *     with an optimizer: its state could not be consolidated, it starts
 *     fresh; a ZeRO-3 model alone: its unit could not be gathered, zeros);
 *     nothing stays prepared (a second clear is ACCEL_OK), the optimizer
 *     still steps on its own, and accel_accelerator_free is safe (no leak:
 *     LeakSanitizer checks rank 0 at exit);
 *   - a NULL accelerator is refused by name. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "check.h"
#include "dist_group.h"

enum { H = 16, ROWS = 4 };

typedef struct scenario {
    int stage;
    bool with_opt;
    bool peer_dies;
} scenario;
static scenario g_sc;

/* Whether opt's state lists tensor entries ("state.<u>.exp_avg"): AdamW's
 * moments, which a fresh optimizer does not have yet. */
static bool has_moments(accel_optimizer *opt) {
    accel_named_state *st;
    int n = accel_optimizer_state(opt, &st);
    CHECK_MSG(n >= 0, "%s", accel_last_error());
    bool any = false;
    for (int i = 0; i < n; i++) any |= strstr(st[i].name, ".exp_avg") != NULL;
    if (n >= 0) accel_named_state_free(st, n);
    return any;
}

static accel_status train_step(accel_accelerator *acc, accel_module *m, accel_optimizer *opt, int rank, int step) {
    float xs[ROWS * H], ys[ROWS * H];
    for (int i = 0; i < ROWS * H; i++) {
        xs[i] = (float)((i * 7 + rank * 13 + step * 5) % 11) / 11.0f - 0.5f;
        ys[i] = 0.25f * xs[i];
    }
    accel_tensor *loss = accel_mse_loss(accel_module_call(m, accel_from_floats(ACCEL_SHAPE(ROWS, H), xs)),
                                        accel_from_floats(ACCEL_SHAPE(ROWS, H), ys));
    accel_status st = accel_accelerator_backward(acc, loss);
    if (!st && opt) st = accel_accelerator_optimizer_step(acc, opt);
    if (!st && opt) st = accel_accelerator_zero_grad(acc, opt);
    accel_step_reset();
    return st;
}

static int body(int rank, int world) {
    (void)world;
    check_failures_ = 0;
    scenario sc = g_sc;
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.zero_stage = sc.stage;
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 10;
    }
    accel_manual_seed(5);
    accel_module *l[2] = {accel_linear_new(H, H, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                          accel_linear_new(H, H, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    accel_module *m = accel_sequential_new(2, l);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    accel_optimizer *opt = sc.with_opt ? accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h) : NULL;
    CHECK_MSG(accel_accelerator_prepare(acc, m, opt, NULL, NULL) == ACCEL_OK, "%s", accel_last_error());
    for (int s = 0; s < 2; s++) CHECK_MSG(train_step(acc, m, opt, rank, s) == ACCEL_OK, "%s", accel_last_error());
    if (sc.peer_dies && rank == 1) raise(SIGKILL);

    accel_status st = accel_accelerator_clear(acc);
    const char *what = !sc.peer_dies ? NULL
                       : sc.with_opt ? "optimizer 0's state could not be consolidated"
                                     : "unit 0 could not be gathered";
    if (!what) {
        CHECK_MSG(st == ACCEL_OK, "stage %d: clear: %s", sc.stage, accel_last_error());
        if (opt) CHECK_MSG(has_moments(opt), "stage %d: the optimizer's state did not come back", sc.stage);
    } else {
        fprintf(stderr, "rank %d, stage %d, dead peer: %s\n", rank, sc.stage, accel_last_error());
        CHECK_MSG(st == ACCEL_ERR_DIST && accel_last_status() == st, "stage %d: clear with a dead peer: status %d",
                  sc.stage, (int)st);
        CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_clear");
        CHECK_STR_CONTAINS(accel_last_error(), what);
        CHECK_STR_CONTAINS(accel_last_error(), sc.with_opt ? "fresh state" : "zeros");
        CHECK_STR_CONTAINS(accel_last_error(), "rank 1"); /* the dead peer, in the group's error */
        if (opt) CHECK(!has_moments(opt));
    }
    /* nothing left prepared either way: a second clear has nothing to release */
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "stage %d: second clear: %s", sc.stage, accel_last_error());
    /* the user's model and optimizer, on their own again */
    if (opt) CHECK_MSG(train_step(acc, m, NULL, rank, 2) == ACCEL_OK && accel_optimizer_step(opt) == ACCEL_OK,
                       "stage %d: a step after clear: %s", sc.stage, accel_last_error());
    accel_optimizer_free(opt);
    accel_module_free(m);
    accel_accelerator_free(acc);
    accel_clear_error();
    accel_thread_cleanup();
    return check_failures_ ? 1 : 0;
}

static void run(scenario sc, bool shm) {
    g_sc = sc;
    dist_group g = {.world = 2, .one_machine = shm, .timeout = "30", .kill_after_s = 90};
    int st[DIST_GROUP_MAX];
    dist_group_run(&g, body, st);
    const char *how = shm ? "shm" : "tcp";
    CHECK_MSG(dist_exited_ok(st[0]), "stage %d%s%s on %s: rank 0 status %#x", sc.stage,
              sc.with_opt ? " with AdamW" : "", sc.peer_dies ? ", dead peer" : "", how, st[0]);
    if (sc.peer_dies) CHECK(WIFSIGNALED(st[1]) && WTERMSIG(st[1]) == SIGKILL);
    else CHECK_MSG(dist_exited_ok(st[1]), "stage %d on %s: rank 1 status %#x", sc.stage, how, st[1]);
}

static void test_clean_clear(void) {
    run((scenario){.stage = 2, .with_opt = true}, true);
    run((scenario){.stage = 3, .with_opt = true}, false);
}

static void test_clear_after_a_dead_peer(void) {
    for (int shm = 1; shm >= 0; shm--) {
        run((scenario){.stage = 2, .with_opt = true, .peer_dies = true}, shm);
        run((scenario){.stage = 3, .with_opt = true, .peer_dies = true}, shm);
        run((scenario){.stage = 3, .peer_dies = true}, shm);
    }
}

static void test_null(void) {
    CHECK(accel_accelerator_clear(NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_clear: accelerator is NULL");
    accel_clear_error();
}

int main(void) {
    setenv("OMP_NUM_THREADS", "1", 0);
    RUN(test_null);
    RUN(test_clean_clear);
    RUN(test_clear_after_a_dead_peer);
    return check_summary();
}
