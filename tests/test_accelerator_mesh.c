/* The device mesh (src/accelerator/mesh.h) on 4 processes: sizes that do not
 * make the world refused with an error naming them, and each dimension's
 * subgroup holding exactly the ranks that differ from this one along it (this
 * rank alone along a dimension of size 1, the world's group along one that
 * spans it). */
#include <stdint.h>

#include <stdlib.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accelerator/accelerator_internal.h"
#include "accelerator/mesh.h"
#include "check.h"
#include "dist_group.h"

#define PP ACCEL__MESH_PP
#define REP ACCEL__MESH_DP_REPLICATE
#define SHARD ACCEL__MESH_DP_SHARD
#define TP ACCEL__MESH_TP

static void refused(accel_pg *pg, int pp, int rep, int shard, int cp, int tp, const char *why) {
    accel__mesh m;
    int size[ACCEL__MESH_DIMS] = {pp, rep, shard, cp, tp};
    CHECK(accel__mesh_init(&m, pg, size) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), why);
    for (int d = 0; d < ACCEL__MESH_DIMS; d++) CHECK(m.group[d] == NULL);
}

/* The world ranks of m's group along d, gathered over it, against the ranks
 * the row-major layout puts there (this rank's coordinates, d running). */
static void members_right(accel__mesh *m, int d) {
    int32_t me = m->rank, got[8] = {0};
    accel_pg *g = accel__mesh_group(m, d);
    CHECK_MSG(g != NULL && g == m->group[d], "%s", accel_last_error());
    if (!g) return;
    CHECK(accel__mesh_group(m, d) == g); /* made once */
    CHECK(accel_pg_size(g) == m->size[d] && accel_pg_rank(g) == m->coord[d]);
    CHECK(accel_pg_all_gather(g, &me, got, 1, ACCEL_I32) == ACCEL_OK);
    int at[ACCEL__MESH_DIMS];
    memcpy(at, m->coord, sizeof at);
    for (int k = 0; k < m->size[d]; k++) {
        at[d] = k;
        CHECK_MSG(got[k] == accel__mesh_rank_at(m, at), "rank %d, %s member %d: %d, want %d", m->rank,
                  accel__mesh_dim_name(d), k, got[k], accel__mesh_rank_at(m, at));
    }
}

/* m's group along d holds exactly the world ranks want[0..n) (written out, not derived). */
static void group_is(accel__mesh *m, int d, int n, const int *want) {
    int32_t me = m->rank, got[8] = {0};
    accel_pg *g = accel__mesh_group(m, d);
    CHECK(g && accel_pg_size(g) == n);
    if (!g || accel_pg_size(g) != n) return;
    CHECK(accel_pg_all_gather(g, &me, got, 1, ACCEL_I32) == ACCEL_OK);
    for (int k = 0; k < n; k++)
        CHECK_MSG(got[k] == want[k], "rank %d, %s member %d: %d, want %d", m->rank, accel__mesh_dim_name(d), k,
                  got[k], want[k]);
}

/* m's group over the dimensions in dims holds the ranks that share this
 * rank's other coordinates, in row-major order over dims (enumerated here by
 * walking the world, not derived from the group). */
static void over_right(accel__mesh *m, unsigned dims) {
    int32_t me = m->rank, got[8] = {0}, want[8], n = 0, index = -1;
    for (int r = 0; r < m->world; r++) {
        int c[ACCEL__MESH_DIMS], rest = r;
        for (int d = ACCEL__MESH_DIMS - 1; d >= 0; d--) c[d] = rest % m->size[d], rest /= m->size[d];
        bool same = true;
        for (int d = 0; d < ACCEL__MESH_DIMS; d++)
            if (!(dims >> d & 1) && c[d] != m->coord[d]) same = false;
        if (!same) continue;
        if (r == m->rank) index = n;
        want[n++] = r;
    }
    accel_pg *g = accel__mesh_group_over(m, dims);
    CHECK_MSG(g != NULL, "%s", accel_last_error());
    if (!g) return;
    CHECK(accel__mesh_group_over(m, dims) == g); /* made once */
    CHECK_MSG(accel_pg_size(g) == n && accel_pg_rank(g) == index, "dims 0x%x: size %d rank %d, want %d %d", dims,
              accel_pg_size(g), accel_pg_rank(g), n, index);
    CHECK(accel_pg_all_gather(g, &me, got, 1, ACCEL_I32) == ACCEL_OK);
    for (int k = 0; k < n; k++) CHECK_MSG(got[k] == want[k], "dims 0x%x member %d: %d, want %d", dims, k, got[k], want[k]);
}

static void mesh_right(accel_pg *pg, int pp, int rep, int shard, int cp, int tp) {
    accel__mesh m;
    int size[ACCEL__MESH_DIMS] = {pp, rep, shard, cp, tp};
    accel_status st = accel__mesh_init(&m, pg, size);
    CHECK_MSG(st == ACCEL_OK, "%s", accel_last_error());
    if (st) return;
    CHECK(accel__mesh_rank_at(&m, m.coord) == m.rank);
    for (int d = 0; d < ACCEL__MESH_DIMS; d++) members_right(&m, d);
    over_right(&m, ACCEL__MESH_BIT(REP) | ACCEL__MESH_BIT(SHARD));
    over_right(&m, ACCEL__MESH_BIT(PP) | ACCEL__MESH_BIT(TP));
    over_right(&m, ACCEL__MESH_BIT(REP) | ACCEL__MESH_BIT(SHARD) | ACCEL__MESH_BIT(ACCEL__MESH_CP));
    over_right(&m, (1u << ACCEL__MESH_DIMS) - 1);
    CHECK(accel__mesh_group_over(&m, 0) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "no dimensions 0x0");
    accel__mesh_free(&m);
}

static int body(int rank, int world) {
    if (accel_dist_init() != ACCEL_OK) return 10;
    accel_pg *pg = accel_dist_default_group();
    refused(pg, 1, 3, 1, 1, 1, "dp_replicate=3 x dp_shard=1 x cp=1 x tp=1 makes 3 processes, the world has 4");
    refused(pg, 1, -1, 3, 1, 1, "the world of 4 processes does not divide into");
    refused(pg, 1, 0, 4, 1, 1, "dp_replicate must be >= 1");
    refused(pg, 1, 2, 2, 1, 2, "dp_shard=2 x cp=1 x tp=2 makes more processes than the world's 4");
    /* sizes whose product overflows 64 bits: refused before multiplying (UBSan catches the overflow) */
    refused(pg, 1 << 30, 1 << 30, 1 << 30, 1 << 30, 1 << 30,
            "pp=1073741824 x dp_replicate=1073741824 x dp_shard=1073741824 x cp=1073741824 x tp=1073741824 makes more "
            "processes than the world's 4");
    refused(pg, -1, 1 << 30, 1 << 30, 1 << 30, 1 << 30, "makes more processes than the world's 4");
    /* HSDP's mesh: two replicas of a 2-way shard; rank = 2 x replica + shard */
    mesh_right(pg, 1, 2, 2, 1, 1);
    {
        accel__mesh m;
        int size[ACCEL__MESH_DIMS] = {1, 2, 2, 1, 1};
        CHECK(accel__mesh_init(&m, pg, size) == ACCEL_OK);
        int shard_of[4][2] = {{0, 1}, {0, 1}, {2, 3}, {2, 3}}, rep_of[4][2] = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
        group_is(&m, SHARD, 2, shard_of[rank]);
        group_is(&m, REP, 2, rep_of[rank]);
        CHECK(accel__mesh_rank_at(&m, (int[]){0, 1, 0, 0, 0}) == 2);
        accel__mesh_free(&m);
    }
    {
        accel__mesh m;
        int size[ACCEL__MESH_DIMS] = {1, 1, 2, 1, 2}; /* tp innermost: consecutive ranks */
        CHECK(accel__mesh_init(&m, pg, size) == ACCEL_OK);
        int tp_of[4][2] = {{0, 1}, {0, 1}, {2, 3}, {2, 3}}, shard_of[4][2] = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
        group_is(&m, TP, 2, tp_of[rank]);
        group_is(&m, SHARD, 2, shard_of[rank]);
        accel__mesh_free(&m);
    }
    {
        accel__mesh m;
        int size[ACCEL__MESH_DIMS] = {1, 2, -1, 1, 1};
        CHECK(accel__mesh_init(&m, pg, size) == ACCEL_OK);
        CHECK(m.size[SHARD] == 2 && m.coord[SHARD] == rank % 2 && m.coord[REP] == rank / 2);
        accel__mesh_free(&m);
    }
    /* the whole world one dimension: its group is the world's */
    {
        accel__mesh m;
        int size[ACCEL__MESH_DIMS] = {1, 1, -1, 1, 1};
        CHECK(accel__mesh_init(&m, pg, size) == ACCEL_OK && m.size[SHARD] == world);
        CHECK(m.group[SHARD] == NULL); /* none made before asked for */
        CHECK(accel__mesh_group(&m, SHARD) == pg);
        accel__mesh_free(&m);
    }
    mesh_right(pg, 1, 1, 2, 1, 2);
    mesh_right(pg, 2, 1, 1, 2, 1);
    mesh_right(pg, 1, 4, 1, 1, 1);
    accel_dist_finalize();
    accel_thread_cleanup();
    return check_failures_ ? 1 : 0;
}

static void test_mesh_on_4(void) {
    dist_group g = {.world = 4, .one_machine = true, .timeout = "30"};
    CHECK(dist_group_runs_ok(&g, body, "mesh on 4"));
}

/* HYBRID_SHARD on 2 "machines" of 2: the launcher's local ranks must be
 * the mesh's (a machine's ranks consecutive). g_permuted: machine A holds
 * ranks {0, 2}, B {1, 3}; every rank refuses, naming the problem. */
static bool g_permuted;

static int hybrid_body(int rank, int world) {
    (void)world;
    int failed_before = check_failures_; /* the parent's, inherited */
    dist_setenv_int("LOCAL_RANK", g_permuted ? rank / 2 : rank % 2);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.fsdp_sharding_strategy = "HYBRID_SHARD";
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (g_permuted) {
        CHECK_MSG(acc == NULL, "rank %d: ranks {0, 2} on one machine accepted", rank);
        CHECK_STR_CONTAINS(accel_last_error(), "HYBRID_SHARD: the ranks of a machine must be consecutive");
    } else {
        CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
    }
    accel_accelerator_free(acc);
    accel_dist_finalize();
    accel_thread_cleanup();
    return check_failures_ > failed_before ? 1 : 0;
}

static void test_hybrid_local_ranks(void) {
    for (int permuted = 0; permuted < 2; permuted++) {
        g_permuted = permuted;
        dist_group g = {.world = 4, .timeout = "30"};
        CHECK(dist_group_runs_ok(&g, hybrid_body, "hybrid shard, permuted %d", permuted));
    }
}

/* opts.parallelism lays the mesh out on 4 processes: dp_replicate 2 x
 * dp_shard 2 under ZeRO-3 shards over pairs of consecutive ranks and averages
 * across the pairs; sizes that do not make the world, bad values and
 * dimensions not built are refused on every rank, naming the field. */
static void refused_opts(accel_parallelism_opts p, const char *zero, accel_status want, const char *why) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.parallelism = p;
    o.fsdp_sharding_strategy = zero;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc == NULL, "accepted: %s", why);
    CHECK(accel_last_status() == want);
    CHECK_STR_CONTAINS(accel_last_error(), why);
    accel_accelerator_free(acc);
}

static int parallelism_body(int rank, int world) {
    (void)world;
    int failed_before = check_failures_; /* the parent's, inherited */
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.zero_stage = 3;
    o.parallelism = (accel_parallelism_opts){.dp_replicate_size = 2, .dp_shard_size = 2};
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
    if (acc) {
        CHECK(acc->shard_world == 2 && acc->shard_rank == rank % 2);
        CHECK(acc->replica_pg && accel_pg_size(acc->replica_pg) == 2 && accel_pg_rank(acc->replica_pg) == rank / 2);
        accel_accelerator_free(acc);
    }
    refused_opts((accel_parallelism_opts){.dp_shard_size = 3}, NULL, ACCEL_ERR_INVALID_ARG,
                 "= 3, not the 4 processes of the job");
    refused_opts((accel_parallelism_opts){.dp_shard_size = 1 << 30, .tp_size = 1 << 30, .pp_size = 1 << 30,
                                          .dp_replicate_size = 1 << 30, .cp_size = 1 << 30},
                 NULL, ACCEL_ERR_INVALID_ARG, "more than the 4 processes of the job");
    refused_opts((accel_parallelism_opts){.dp_replicate_size = -2}, NULL, ACCEL_ERR_INVALID_ARG,
                 "opts.parallelism.dp_replicate_size must be >= 1, or 0 for not set (got -2)");
    refused_opts((accel_parallelism_opts){.cp_size = 2, .sp_size = 2}, NULL, ACCEL_ERR_INVALID_ARG,
                 "mutually exclusive");
    refused_opts((accel_parallelism_opts){.cp_size = 2, .dp_replicate_size = 2}, NULL, ACCEL_ERR_INVALID_ARG,
                 "not with pure replication");
    refused_opts((accel_parallelism_opts){.dp_shard_size = 4, .cp_comm_strategy = "ring"}, NULL,
                 ACCEL_ERR_INVALID_ARG, "cp_comm_strategy \"ring\"");
    refused_opts((accel_parallelism_opts){.dp_shard_size = 4, .pp_schedule = "zb"}, NULL, ACCEL_ERR_INVALID_ARG,
                 "pp_schedule \"zb\"");
    refused_opts((accel_parallelism_opts){.dp_replicate_size = 2, .dp_shard_size = 2}, "HYBRID_SHARD",
                 ACCEL_ERR_INVALID_ARG, "HYBRID_SHARD and opts.parallelism's sizes both");
    /* tp splits the data-parallel group: consecutive ranks share a tp group */
    o.zero_stage = 0;
    o.parallelism = (accel_parallelism_opts){.dp_shard_size = 2, .tp_size = 2};
    acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
    if (acc) {
        accel_pg *tp = accel_accelerator_tp_group(acc);
        CHECK(tp && accel_pg_size(tp) == 2 && accel_pg_rank(tp) == rank % 2);
        CHECK(accel_pg_size(acc->dp_pg) == 2 && accel_pg_rank(acc->dp_pg) == rank / 2);
        accel_accelerator_free(acc);
    }
    refused_opts((accel_parallelism_opts){.sp_size = 2, .dp_replicate_size = 2}, NULL, ACCEL_ERR_INVALID_ARG,
                 "sp_size = 2 with dp_replicate_size = 2 and dp_shard_size = 1");
    /* cp x pp: a cp group in each stage (consecutive ranks), each pp group the same cp rank of every stage, the
     * data-parallel group the stage's cp ranks */
    o.parallelism = (accel_parallelism_opts){.cp_size = 2, .pp_size = 2};
    acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
    if (acc) {
        accel_pg *cp = accel__mesh_group(&acc->mesh, ACCEL__MESH_CP), *pp = accel__mesh_group(&acc->mesh, ACCEL__MESH_PP);
        CHECK(cp && accel_pg_size(cp) == 2 && accel_pg_rank(cp) == rank % 2);
        CHECK(pp && accel_pg_size(pp) == 2 && accel_pg_rank(pp) == rank / 2);
        CHECK(accel_pg_size(acc->dp_pg) == 2 && accel_pg_rank(acc->dp_pg) == rank % 2);
        accel_accelerator_free(acc);
    }
    /* cp x tp (Ulysses' sp_size the same dimension): tp the consecutive ranks, cp one rank of each tp group, the
     * data-parallel group (what DDP averages over) the cp ranks, tp left out */
    o.parallelism = (accel_parallelism_opts){.sp_size = 2, .tp_size = 2};
    acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
    if (acc) {
        accel_pg *tp = accel_accelerator_tp_group(acc), *cp = accel__mesh_group(&acc->mesh, ACCEL__MESH_CP);
        CHECK(tp && accel_pg_size(tp) == 2 && accel_pg_rank(tp) == rank % 2);
        CHECK(cp && accel_pg_size(cp) == 2 && accel_pg_rank(cp) == rank / 2);
        CHECK(accel_pg_size(acc->dp_pg) == 2 && accel_pg_rank(acc->dp_pg) == rank / 2);
        accel_accelerator_free(acc);
    }
    /* tp x pp (with sequence parallelism too): a tp group in each stage, each pp group the same tp rank of
     * every stage */
    o.parallelism = (accel_parallelism_opts){.tp_size = 2, .pp_size = 2, .sequence_parallelism = ACCEL_TRUE};
    acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
    if (acc) {
        accel_pg *tp = accel_accelerator_tp_group(acc), *pp = accel__mesh_group(&acc->mesh, ACCEL__MESH_PP);
        CHECK(tp && accel_pg_size(tp) == 2 && accel_pg_rank(tp) == rank % 2);
        CHECK(pp && accel_pg_size(pp) == 2 && accel_pg_rank(pp) == rank / 2);
        accel_accelerator_free(acc);
    }
    /* the ranks of a pp or cp group hold one batch: gather_for_metrics is refused, not counted twice */
    const accel_parallelism_opts split[] = {{.pp_size = 2, .dp_shard_size = 2}, {.cp_size = 2, .dp_shard_size = 2}};
    const char *why[] = {"opts.parallelism.pp_size is 2: gather_for_metrics is not built yet under pipeline",
                         "opts.parallelism.cp_size is 2: gather_for_metrics is not built yet under context"};
    for (int k = 0; k < 2; k++) {
        o.parallelism = split[k];
        acc = accel_accelerator_new(&o);
        CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
        if (!acc) continue;
        accel_tensor *t = accel_full(ACCEL_F32, ACCEL_SHAPE(3), rank);
        CHECK(accel_accelerator_gather_for_metrics(acc, t) == NULL);
        CHECK(accel_last_status() == ACCEL_ERR_UNSUPPORTED);
        CHECK_STR_CONTAINS(accel_last_error(), why[k]);
        accel_tensor_free(t);
        accel_accelerator_free(acc);
    }
    refused_opts((accel_parallelism_opts){.dp_shard_size = 4, .sequence_parallelism = ACCEL_TRUE}, NULL,
                 ACCEL_ERR_INVALID_ARG, "sequence_parallelism needs tp_size > 1");
    accel_dist_finalize();
    accel_thread_cleanup();
    return check_failures_ > failed_before ? 1 : 0;
}

static void test_parallelism_opts(void) {
    dist_group g = {.world = 4, .timeout = "30"};
    CHECK(dist_group_runs_ok(&g, parallelism_body, "opts.parallelism"));
}

int main(void) {
    RUN(test_mesh_on_4);
    RUN(test_hybrid_local_ranks);
    RUN(test_parallelism_opts);
    return check_summary();
}
