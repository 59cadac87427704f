/* Tensor-parallel models that outlive their group, on forked processes.
 *
 * A group is known by its id, not its address: a model prepared under tp 2,
 * let go by its accelerator (freed), is refused by a new accelerator even
 * when that one's tp group is made at the freed group's address (malloc
 * reuses it). Before, the tombstone remembered the freed group's address and
 * the new accelerator adopted the model as its own.
 *
 * A group freed under a model whose owner never told it: a model cut by the
 * user's plan over accel_accelerator_tp_group (a Sequential of Linears) and
 * one by the decoder's plan (accel_llama_parallelize), never prepared, then
 * the accelerator freed (tp 2 over the job's default group on 2 ranks, its
 * last holder; a tp subgroup under dp_shard 2 x tp 2 on 4); and a model
 * prepared under tp over every rank, its accelerator freed while the test
 * holds the default group (the model computes on), then the default group
 * finalized (and a new one made, at the same address or not; the models'
 * first forward after the free before it or only under it); and models cut
 * over a 1-rank default group (no collective in their forwards), then the
 * group finalized. Each forward
 * after the group is gone fails with ACCEL_ERR_STATE naming the freed group,
 * and the models free cleanly. Before, the modules read the freed group
 * (a use-after-free: a crash, a hang or collectives on garbage). */
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "check.h"
#include "dist_group.h"
#include "recycle_alloc.h"
#include "refuse_band.h"
#include "tiny_llama.h"

enum { B = 2, T = 8 };

static const char FREED[] = "which was freed (its accelerator freed, accel_pg_free, or the last accel_dist_finalize)";

static accel_accelerator *make(int tp, int dp_shard) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.parallelism = (accel_parallelism_opts){.tp_size = tp, .dp_shard_size = dp_shard};
    return accel_accelerator_new(&o);
}

static accel_module *llama(void) {
    accel_llama_config c = tiny_llama_config();
    accel_manual_seed(3);
    return accel_llama_new(&c, ACCEL_CPU_DEVICE);
}

static accel_tensor *ids(void) {
    int64_t v[B * T];
    for (int i = 0; i < B * T; i++) v[i] = (i * 7 + 3) % 40;
    return accel_from_data(ACCEL_I64, 2, (int64_t[]){B, T}, v);
}

/* A Sequential of two Linears cut by the user's plan over pg. */
static accel_module *own_model(accel_pg *pg) {
    accel_module *lin[2] = {accel_linear_new(4, 8, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                            accel_linear_new(8, 4, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    accel_module *m = accel_sequential_new(2, lin);
    accel_tp_plan_entry plan[] = {{"0", ACCEL_TP_COLWISE, false}, {"1", ACCEL_TP_ROWWISE, false}};
    CHECK(accel_module_parallelize(m, plan, 2, pg) == ACCEL_OK);
    return m;
}

static accel_tensor *own_forward(accel_module *m) { return accel_module_call(m, accel_ones(ACCEL_F32, 2, (int64_t[]){3, 4})); }

/* Both models' forwards refused, naming the freed group. */
static void refused(accel_module *m, accel_module *own, int rank, const char *when) {
    CHECK_MSG(accel_llama_loss(m, ids()) == NULL && accel_last_status() == ACCEL_ERR_STATE, "rank %d, %s: %d %s", rank,
              when, (int)accel_last_status(), accel_last_error());
    CHECK_STR_CONTAINS(accel_last_error(), FREED);
    CHECK_MSG(own_forward(own) == NULL && accel_last_status() == ACCEL_ERR_STATE, "rank %d, %s: %d %s", rank, when,
              (int)accel_last_status(), accel_last_error());
    CHECK_STR_CONTAINS(accel_last_error(), FREED);
    accel_step_reset();
}

/* A model let go by a freed accelerator is not another accelerator's, at
 * whatever address that one's tp group is made: accelerators made and freed
 * one after another, the second preparing the model, the later ones
 * refusing it (glibc's malloc gives a later one the preparing one's group
 * address within a few). */
static int other_accelerator_body(int rank, int world) {
    bool held = world > 2 && accel_dist_init() == ACCEL_OK;
    accel_module *m = llama();
    for (int k = 0; k < 9; k++) {
        accel_accelerator *acc = make(2, world / 2);
        CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
        if (!acc) break;
        if (k == 3) {
            CHECK_MSG(accel_accelerator_prepare(acc, m) == ACCEL_OK, "rank %d: %s", rank, accel_last_error());
        } else if (k > 3) {
            CHECK_MSG(accel_accelerator_prepare(acc, m) == ACCEL_ERR_INVALID_ARG, "rank %d, accelerator %d: %s", rank,
                      k, accel_last_error());
            CHECK_STR_CONTAINS(accel_last_error(), "is parallelized over another group than the accelerator's tp group");
            CHECK(accel_llama_loss(m, ids()) == NULL && accel_last_status() == ACCEL_ERR_STATE);
            accel_step_reset();
        }
        accel_accelerator_free(acc);
    }
    accel_module_free(m);
    if (held) accel_dist_finalize();
    return check_summary();
}

/* Models cut over an accelerator's tp group, never prepared, then the accelerator freed. */
static int never_prepared_body(int rank, int world) {
    bool held = world > 2 && accel_dist_init() == ACCEL_OK; /* a subgroup goes with its accelerator */
    accel_accelerator *acc = make(2, world / 2);
    CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
    if (!acc) return check_summary();
    accel_module *m = llama(), *own = own_model(accel_accelerator_tp_group(acc));
    CHECK(accel_llama_parallelize(m, accel_accelerator_tp_group(acc), false) == ACCEL_OK);
    CHECK_MSG(accel_llama_loss(m, ids()) && own_forward(own), "rank %d: %s", rank, accel_last_error());
    accel_step_reset();
    accel_accelerator_free(acc);
    refused(m, own, rank, "after the accelerator's free");
    accel_module_free(m);
    accel_module_free(own);
    if (held) accel_dist_finalize();
    return check_summary();
}

/* A body's end: the new default group finalized, both models freed, the checks' verdict. */
static int finalize_and_free(accel_module *m, accel_module *own) {
    accel_dist_finalize();
    accel_module_free(m);
    accel_module_free(own);
    return check_summary();
}

/* On a default group held by the test: tp over every rank, a Llama prepared and a model of the user's plan
 * over the accelerator's tp group, then the accelerator freed (the group lives on: the test holds it).
 * False (checks failed) when the accelerator cannot be made. */
static bool prepared_then_freed(int rank, int world, accel_module **m, accel_module **own) {
    CHECK(accel_dist_init() == ACCEL_OK);
    accel_accelerator *acc = make(world, 1);
    CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
    if (!acc) return false;
    *m = llama(), *own = own_model(accel_accelerator_tp_group(acc));
    CHECK(accel_accelerator_prepare(acc, *m) == ACCEL_OK);
    accel_accelerator_free(acc);
    return true;
}

/* tp over every rank: the default group outlives the accelerator while the test holds it, then goes. */
static int default_group_body(int rank, int world) {
    accel_module *m, *own;
    if (!prepared_then_freed(rank, world, &m, &own)) return check_summary();
    CHECK_MSG(accel_llama_loss(m, ids()) && own_forward(own), "rank %d: %s", rank, accel_last_error());
    accel_step_reset();
    accel_dist_finalize(); /* the last holder: the group is freed */
    refused(m, own, rank, "after accel_dist_finalize");
    CHECK(accel_dist_init() == ACCEL_OK); /* a new default group, another one */
    refused(m, own, rank, "under a new default group");
    return finalize_and_free(m, own);
}

/* As above, but the models' first forward after the free comes only under a new default group (made at
 * the freed group's address or not): nothing gave them a tombstone before, and the group they hold is
 * known freed by its id, which no live group has. */
static int first_forward_under_new_group_body(int rank, int world) {
    accel_module *m, *own;
    if (!prepared_then_freed(rank, world, &m, &own)) return check_summary();
    const accel_pg *freed = accel_dist_default_group();
    recycle_install(); /* the new group at the freed one's address */
    accel_dist_finalize(); /* the last holder: the group is freed */
    CHECK(accel_dist_init() == ACCEL_OK);
    recycle_uninstall();
    CHECK_MSG(accel_dist_default_group() == freed, "rank %d: the new group is not at the freed one's address", rank);
    refused(m, own, rank, "first forward under a new default group");
    return finalize_and_free(m, own);
}

/* A 1-rank group: its forwards call no collective, and computed on over the freed group; refused as on
 * more ranks. Its tombstone out of memory, the module reported no tp group (read as a plain module). */
static int one_rank_body(int rank, int world) {
    (void)world;
    CHECK(accel_dist_init() == ACCEL_OK);
    accel_module *m = llama(), *own = own_model(accel_dist_default_group());
    CHECK(accel_llama_parallelize(m, accel_dist_default_group(), false) == ACCEL_OK);
    CHECK_MSG(accel_llama_loss(m, ids()) && own_forward(own), "rank %d: %s", rank, accel_last_error());
    accel_step_reset();
    accel_dist_finalize(); /* the last holder: the group is freed */
    /* its tombstone out of memory: still tensor-parallel (not read as a plain Linear), its group refused */
    refuse_band all = {.min = 0, .max = SIZE_MAX};
    accel_pg *g = NULL;
    refuse_band_install(&all);
    bool tp = accel_module_tp_info(own->children[0], NULL, &g, NULL, NULL);
    refuse_band_install(NULL);
    CHECK_MSG(all.refused && tp && g, "refused %d, tp %d, group %p", all.refused, tp, (void *)g);
    CHECK(g && accel_pg_barrier(g) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "was freed (out of memory recording which)");
    refused(m, own, rank, "a 1-rank group finalized");
    accel_module_free(m);
    accel_module_free(own);
    return check_summary();
}

static void run(int world, const char *what, dist_body_fn body) {
    dist_group g = {.world = world, .one_machine = true, .timeout = "30", .kill_after_s = 120};
    CHECK(dist_group_runs_ok(&g, body, "%s", what));
}

static void test_other_accelerator(void) {
    run(2, "a freed accelerator's model, another accelerator", other_accelerator_body);
    run(4, "a freed accelerator's model, another accelerator, dp_shard 2 x tp 2", other_accelerator_body);
}

static void test_never_prepared(void) {
    run(2, "never prepared, tp 2 over the default group", never_prepared_body);
    run(4, "never prepared, dp_shard 2 x tp 2", never_prepared_body);
}

static void test_default_group_finalized(void) {
    run(2, "tp over every rank, the default group finalized", default_group_body);
    run(2, "tp over every rank, the first forward under a new default group", first_forward_under_new_group_body);
    run(1, "a 1-rank group finalized", one_rank_body);
}

int main(void) {
    setenv("OMP_NUM_THREADS", "1", 0);
    RUN(test_other_accelerator);
    RUN(test_never_prepared);
    RUN(test_default_group_finalized);
    return check_summary();
}
