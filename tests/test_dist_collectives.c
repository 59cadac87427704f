/* Collectives against serially computed results.
 *
 * Run plainly it is a group of one (the "self" backend); tests/dist.cmake also
 * runs it under `accel launch --num_processes 2/3/4` (the "shm" backend). Each
 * rank fills its input from (rank, index), so every rank can compute what
 * every collective must return. Sizes cross the staging chunk (256 KiB) so the
 * chunked paths run, and both private and shared (zero-copy) buffers are used. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "accel/dist.h"
#include "check.h"
#include "dist/backend.h" /* accel__pg_within_machine */

static int R, N;
static accel_pg *PG;

static const accel_dtype RED_DTYPES[] = {ACCEL_F32, ACCEL_BF16, ACCEL_F16, ACCEL_F64, ACCEL_I32, ACCEL_I64};

/* Small integers: exact in every dtype (bf16 has 8 bits of mantissa). */
static double val(int rank, size_t i) { return (double)((int)((i * 7 + (size_t)rank * 13) % 61) - 30); }

static void fill(void *p, accel_dtype dt, int rank, size_t n, size_t base) {
    for (size_t i = 0; i < n; i++) {
        double v = val(rank, base + i);
        switch (dt) {
        case ACCEL_F32: ((float *)p)[i] = (float)v; break;
        case ACCEL_F64: ((double *)p)[i] = v; break;
        case ACCEL_I32: ((int32_t *)p)[i] = (int32_t)v; break;
        case ACCEL_I64: ((int64_t *)p)[i] = (int64_t)v; break;
        case ACCEL_BF16: ((uint16_t *)p)[i] = accel_f32_to_bf16((float)v); break;
        case ACCEL_F16: ((uint16_t *)p)[i] = accel_f32_to_f16((float)v); break;
        default: break;
        }
    }
}

static double get(const void *p, accel_dtype dt, size_t i) {
    switch (dt) {
    case ACCEL_F32: return ((const float *)p)[i];
    case ACCEL_F64: return ((const double *)p)[i];
    case ACCEL_I32: return ((const int32_t *)p)[i];
    case ACCEL_I64: return (double)((const int64_t *)p)[i];
    case ACCEL_BF16: return accel_bf16_to_f32(((const uint16_t *)p)[i]);
    case ACCEL_F16: return accel_f16_to_f32(((const uint16_t *)p)[i]);
    default: return 0;
    }
}

static double expect_reduce(accel_reduce_op op, accel_dtype dt, size_t i) {
    double acc = val(0, i);
    for (int k = 1; k < N; k++) {
        double v = val(k, i);
        if (op == ACCEL_REDUCE_MAX) acc = v > acc ? v : acc;
        else if (op == ACCEL_REDUCE_MIN) acc = v < acc ? v : acc;
        else acc += v;
    }
    if (op == ACCEL_REDUCE_AVG) {
        if (dt == ACCEL_I32 || dt == ACCEL_I64) return (double)((int64_t)acc / N);
        acc /= N;
        if (dt == ACCEL_BF16) return accel_bf16_to_f32(accel_f32_to_bf16((float)acc));
        if (dt == ACCEL_F16) return accel_f16_to_f32(accel_f32_to_f16((float)acc));
    }
    return acc;
}

static double tol(accel_dtype dt) { return dt == ACCEL_F32 ? 1e-6 : dt == ACCEL_F64 ? 1e-12 : 0; }

static void test_all_reduce(void) {
    const size_t sizes[] = {1, 37, 100003};
    for (int shared = 0; shared < 2; shared++)
        for (size_t d = 0; d < sizeof RED_DTYPES / sizeof *RED_DTYPES; d++)
            for (int op = ACCEL_REDUCE_SUM; op <= ACCEL_REDUCE_MIN; op++)
                for (size_t s = 0; s < 3; s++) {
                    accel_dtype dt = RED_DTYPES[d];
                    size_t n = sizes[s], es = accel_dtype_size(dt);
                    void *buf = shared ? accel_pg_alloc_shared(PG, n * es) : malloc(n * es);
                    CHECK(buf != NULL);
                    fill(buf, dt, R, n, 0);
                    CHECK(accel_pg_all_reduce(PG, buf, n, dt, (accel_reduce_op)op) == ACCEL_OK);
                    int bad = 0;
                    for (size_t i = 0; i < n; i++) {
                        double want = expect_reduce((accel_reduce_op)op, dt, i);
                        if (!(fabs(get(buf, dt, i) - want) <= tol(dt) * (1 + fabs(want)))) bad++;
                    }
                    CHECK_MSG(bad == 0, "all_reduce %s op %d n %zu shared %d: %d wrong", accel_dtype_name(dt), op,
                              n, shared, bad);
                    if (shared) accel_pg_free_shared(PG, buf);
                    else free(buf);
                }
}

static void test_broadcast_gather(void) {
    size_t n = 70001;
    double *b = malloc(n * sizeof *b);
    fill(b, ACCEL_F64, R, n, 0);
    int root = N - 1;
    CHECK(accel_pg_broadcast(PG, b, n, ACCEL_F64, root) == ACCEL_OK);
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += b[i] != val(root, i);
    CHECK(bad == 0);
    free(b);

    /* all_gather / gather of u8 and f32 */
    size_t m = 90001;
    float *send = malloc(m * sizeof *send), *recv = malloc(m * (size_t)N * sizeof *recv);
    fill(send, ACCEL_F32, R, m, 0);
    CHECK(accel_pg_all_gather(PG, send, recv, m, ACCEL_F32) == ACCEL_OK);
    bad = 0;
    for (int k = 0; k < N; k++)
        for (size_t i = 0; i < m; i++) bad += recv[(size_t)k * m + i] != (float)val(k, i);
    CHECK(bad == 0);
    memset(recv, 0, m * (size_t)N * sizeof *recv);
    int groot = 1 % N;
    CHECK(accel_pg_gather(PG, send, R == groot ? recv : NULL, m, ACCEL_F32, groot) == ACCEL_OK);
    if (R == groot) {
        bad = 0;
        for (int k = 0; k < N; k++)
            for (size_t i = 0; i < m; i++) bad += recv[(size_t)k * m + i] != (float)val(k, i);
        CHECK(bad == 0);
    }
    free(send);
    free(recv);
}

static void test_all_gatherv(void) {
    size_t counts[8], total = 0;
    for (int k = 0; k < N; k++) {
        counts[k] = k == 1 ? 0 : (size_t)k * 40000 + 5; /* uneven, one empty, some past a chunk */
        total += counts[k];
    }
    int32_t *send = malloc((counts[R] + 1) * sizeof *send), *recv = malloc(total * sizeof *recv);
    fill(send, ACCEL_I32, R, counts[R], 0);
    CHECK(accel_pg_all_gatherv(PG, send, counts[R], recv, counts, ACCEL_I32) == ACCEL_OK);
    size_t off = 0;
    int bad = 0;
    for (int k = 0; k < N; k++) {
        for (size_t i = 0; i < counts[k]; i++) bad += recv[off + i] != (int32_t)val(k, i);
        off += counts[k];
    }
    CHECK(bad == 0);
    /* a mismatched own count is an argument error, detected before communicating */
    CHECK(accel_pg_all_gatherv(PG, send, counts[R] + 1, recv, counts, ACCEL_I32) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    free(send);
    free(recv);
}

static void test_reduce_scatter(void) {
    for (size_t d = 0; d < sizeof RED_DTYPES / sizeof *RED_DTYPES; d++) {
        accel_dtype dt = RED_DTYPES[d];
        size_t count = 50003, es = accel_dtype_size(dt);
        char *send = malloc(count * (size_t)N * es), *recv = malloc(count * es);
        fill(send, dt, R, count * (size_t)N, 0);
        CHECK(accel_pg_reduce_scatter(PG, send, recv, count, dt, ACCEL_REDUCE_SUM) == ACCEL_OK);
        int bad = 0;
        for (size_t i = 0; i < count; i++) {
            double want = expect_reduce(ACCEL_REDUCE_SUM, dt, (size_t)R * count + i);
            bad += fabs(get(recv, dt, i) - want) > tol(dt) * (1 + fabs(want));
        }
        CHECK_MSG(bad == 0, "reduce_scatter %s: %d wrong", accel_dtype_name(dt), bad);
        free(send);
        free(recv);
    }
}

static void test_bytes(void) {
    /* broadcast_bytes from the last rank; all_gather_bytes with uneven (and one empty) blobs */
    char *data = NULL;
    size_t len = 0;
    char msg[64];
    snprintf(msg, sizeof msg, "hello from rank %d", R);
    if (R == N - 1) {
        data = msg;
        len = strlen(msg);
    }
    CHECK(accel_pg_broadcast_bytes(PG, (void **)&data, &len, N - 1) == ACCEL_OK);
    char want[64];
    snprintf(want, sizeof want, "hello from rank %d", N - 1);
    CHECK(len == strlen(want) && memcmp(data, want, len) == 0);
    if (R != N - 1) accel_free(data);

    size_t mylen = R == 0 ? 300000 : (size_t)R * 3 - 3; /* rank 1: empty */
    char *blob = malloc(mylen + 1);
    for (size_t i = 0; i < mylen; i++) blob[i] = (char)('a' + (R + i) % 26);
    void *out = NULL;
    size_t lens[8];
    CHECK(accel_pg_all_gather_bytes(PG, blob, mylen, &out, lens) == ACCEL_OK);
    size_t off = 0;
    int bad = 0;
    for (int k = 0; k < N; k++) {
        size_t lk = k == 0 ? 300000 : (size_t)k * 3 - 3;
        CHECK(lens[k] == lk);
        for (size_t i = 0; i < lk; i++) bad += ((char *)out)[off + i] != (char)('a' + (k + i) % 26);
        off += lk;
    }
    CHECK(bad == 0);
    accel_free(out);
    free(blob);
}

static void test_async(void) {
    /* Several outstanding operations; waited in reverse order; then a sync one. */
    size_t n = 100003;
    float *a = accel_pg_alloc_shared(PG, n * sizeof *a), *b = malloc(n * sizeof *b);
    double *c = malloc(1000 * sizeof *c);
    fill(a, ACCEL_F32, R, n, 0);
    fill(b, ACCEL_F32, R, n, 0);
    fill(c, ACCEL_F64, R, 1000, 0);
    accel_dist_set_op_label("test_async");
    accel_work *w1 = accel_pg_all_reduce_async(PG, a, n, ACCEL_F32, ACCEL_REDUCE_SUM);
    accel_work *w2 = accel_pg_all_reduce_async(PG, b, n, ACCEL_F32, ACCEL_REDUCE_MAX);
    accel_work *w3 = accel_pg_broadcast_async(PG, c, 1000, ACCEL_F64, 0);
    accel_dist_set_op_label(NULL);
    CHECK(w1 && w2 && w3);
    CHECK(accel_work_wait(w3) == ACCEL_OK);
    CHECK(accel_work_done(w1) && accel_work_done(w2)); /* issue order */
    CHECK(accel_work_wait(w2) == ACCEL_OK);
    CHECK(accel_work_wait(w1) == ACCEL_OK);
    accel_work_free(w1);
    accel_work_free(w2);
    accel_work_free(w3);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        bad += a[i] != (float)expect_reduce(ACCEL_REDUCE_SUM, ACCEL_F32, i);
        bad += b[i] != (float)expect_reduce(ACCEL_REDUCE_MAX, ACCEL_F32, i);
    }
    for (size_t i = 0; i < 1000; i++) bad += c[i] != val(0, i);
    CHECK(bad == 0);
    /* an async reduce_scatter and all_gather, then a sync barrier drains them */
    float *rs = malloc(10 * (size_t)N * sizeof *rs), *rr = malloc(10 * sizeof *rr);
    float *ag = malloc(10 * (size_t)N * sizeof *ag);
    fill(rs, ACCEL_F32, R, 10 * (size_t)N, 0);
    accel_work *w4 = accel_pg_reduce_scatter_async(PG, rs, rr, 10, ACCEL_F32, ACCEL_REDUCE_AVG);
    accel_work *w5 = accel_pg_all_gather_async(PG, rr, ag, 10, ACCEL_F32);
    CHECK(accel_pg_barrier(PG) == ACCEL_OK);
    CHECK(accel_work_done(w4) && accel_work_done(w5));
    CHECK(accel_work_wait(w4) == ACCEL_OK && accel_work_wait(w5) == ACCEL_OK);
    accel_work_free(w4);
    accel_work_free(w5);
    bad = 0;
    for (int k = 0; k < N; k++)
        for (size_t i = 0; i < 10; i++)
            bad += fabs(ag[(size_t)k * 10 + i] - expect_reduce(ACCEL_REDUCE_AVG, ACCEL_F32, (size_t)k * 10 + i)) > 1e-5;
    CHECK(bad == 0);
    free(rs);
    free(rr);
    free(ag);
    accel_pg_free_shared(PG, a);
    free(b);
    free(c);
}

static void test_arg_errors(void) {
    uint8_t u[4] = {0};
    CHECK(accel_pg_all_reduce(PG, u, 4, ACCEL_BOOL, ACCEL_REDUCE_SUM) == ACCEL_ERR_DTYPE);
    CHECK_STR_CONTAINS(accel_last_error(), "cannot reduce bool");
    accel_clear_error();
    CHECK(accel_pg_broadcast(PG, u, 4, ACCEL_U8, N) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "root");
    accel_clear_error();
    CHECK(accel_pg_all_reduce(NULL, u, 4, ACCEL_F32, ACCEL_REDUCE_SUM) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    CHECK(accel_pg_all_reduce_async(PG, NULL, 4, ACCEL_F32, ACCEL_REDUCE_SUM) == NULL);
    accel_clear_error();
    /* the group still works after argument errors */
    CHECK(accel_pg_barrier(PG) == ACCEL_OK);
}

/* The backend a subgroup must get: an mpi group's are mpi (MPI_Comm_split);
 * else self alone, shm on one machine, tcp across (or when forced). */
static const char *sub_backend(int size, bool one_machine) {
    const char *forced = getenv("ACCEL_DIST_BACKEND");
    if (!strcmp(accel_pg_backend(PG), "mpi")) return "mpi";
    if (size == 1) return "self";
    if (forced && !strcmp(forced, "tcp")) return "tcp";
    return one_machine ? "shm" : "tcp";
}

/* accel_pg_split: the ranks of one parity, ranked in reverse (key -rank);
 * then the ranks of each machine. Sums and an asynchronous all_gather stay
 * within the subgroup, which lives beside the parent. */
static void test_split(void) {
    int parity = R % 2, top = (N - 1) % 2 == parity ? N - 1 : N - 2, size = (top - parity) / 2 + 1;
    int machine_first = R - accel_dist_local_rank(), local_n = accel_dist_local_world_size();
    accel_pg *sub = accel_pg_split(PG, parity, -R);
    CHECK_MSG(sub != NULL, "accel_pg_split: %s", accel_last_error());
    if (!sub) return;
    CHECK(accel_pg_size(sub) == size && accel_pg_rank(sub) == (top - R) / 2);
    bool one_machine = local_n == N; /* the parity groups span the machines of a multi-machine job */
    CHECK_MSG(!strcmp(accel_pg_backend(sub), sub_backend(size, one_machine)), "subgroup backend %s",
              accel_pg_backend(sub));
    double v = R + 1, want = 0;
    for (int r = parity; r < N; r += 2) want += r + 1;
    CHECK(accel_pg_all_reduce(sub, &v, 1, ACCEL_F64, ACCEL_REDUCE_SUM) == ACCEL_OK && v == want);
    int32_t me = R, all[8] = {0};
    accel_work *w = accel_pg_all_gather_async(sub, &me, all, 1, ACCEL_I32);
    CHECK(accel_pg_barrier(PG) == ACCEL_OK); /* the parent works while the subgroup's gather is in flight */
    CHECK(w && accel_work_wait(w) == ACCEL_OK);
    accel_work_free(w);
    for (int k = 0; k < size; k++) CHECK(all[k] == top - 2 * k);
    accel_pg_free(sub);
    accel_pg *machine = accel_pg_split(PG, machine_first, R);
    CHECK(machine && accel_pg_size(machine) == local_n && accel_pg_rank(machine) == R - machine_first);
    if (machine) CHECK(!strcmp(accel_pg_backend(machine), sub_backend(local_n, true)));
    accel_pg_free(machine);
}

/* Free order: a group freed before the works it handed out (accel_pg_free
 * waits for them) leaves them to wait on and free; accel_work_free read the
 * freed group. Two works: the first freed back, the last frees the queue. */
static void test_work_outlives_group(void) {
    accel_pg *sub = accel_pg_split(PG, 0, R);
    CHECK_MSG(sub != NULL, "accel_pg_split: %s", accel_last_error());
    if (!sub) return;
    double a = R + 1, b = 2 * (R + 1);
    accel_work *wa = accel_pg_all_reduce_async(sub, &a, 1, ACCEL_F64, ACCEL_REDUCE_SUM);
    accel_work *wb = accel_pg_all_reduce_async(sub, &b, 1, ACCEL_F64, ACCEL_REDUCE_SUM);
    CHECK(wa && wb);
    accel_pg_free(sub);
    CHECK(accel_work_done(wa) && accel_work_wait(wa) == ACCEL_OK && accel_work_wait(wb) == ACCEL_OK);
    CHECK(a == N * (N + 1) / 2.0 && b == N * (N + 1.0));
    accel_work_free(wa);
    accel_work_free(wb); /* ASan: no use of the freed group, no leak */
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

/* A job of several machines with several ranks each runs its collectives
 * hierarchically (shm inside a machine, tcp between: src/dist/hier.c) unless
 * ACCEL_DIST_HIERARCHICAL=0 or a forced backend; the calls below go that way
 * (counted), and every rank prints a digest of their results, which
 * tests/run_hier_compare.sh compares with the flat ring's. */
static void test_hierarchy(void) {
    const char *hier = getenv("ACCEL_DIST_HIERARCHICAL"), *forced = getenv("ACCEL_DIST_BACKEND");
    int L = accel_dist_local_world_size();
    bool want = L > 1 && L < N && N % L == 0 && !(forced && *forced) && !(hier && !strcmp(hier, "0"));
    uint64_t before = 0, after = 0, h = 14695981039346656037ull;
    const char *inside = accel__pg_within_machine(PG, &before);
    CHECK_MSG(want ? inside && !strcmp(inside, "shm") : !inside, "inside a machine: %s", inside ? inside : "flat");
    size_t n = 70001, rs = 1237;
    float *a = accel_pg_alloc_shared(PG, n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(rs * N * sizeof *c), *d = malloc(rs * sizeof *d);
    uint16_t *bf = malloc(n * sizeof *bf);
    int32_t *g = malloc((size_t)N * 3 * sizeof *g), mine[3] = {R, -R, 7 * R};
    if (!a || !b || !c || !d || !bf || !g) {
        CHECK(!"out of memory");
        return;
    }
    fill(a, ACCEL_F32, R, n, 5);
    fill(b, ACCEL_F32, R, n, 11);
    fill(c, ACCEL_F32, R, rs * N, 3);
    fill(bf, ACCEL_BF16, R, n, 1);
    CHECK(accel_pg_all_reduce(PG, a, n, ACCEL_F32, ACCEL_REDUCE_SUM) == ACCEL_OK); /* zero-copy inside */
    CHECK(accel_pg_all_reduce(PG, b, n, ACCEL_F32, ACCEL_REDUCE_AVG) == ACCEL_OK);
    CHECK(accel_pg_all_reduce(PG, bf, n, ACCEL_BF16, ACCEL_REDUCE_SUM) == ACCEL_OK);
    CHECK(accel_pg_reduce_scatter(PG, c, d, rs, ACCEL_F32, ACCEL_REDUCE_MAX) == ACCEL_OK);
    CHECK(accel_pg_broadcast(PG, b, n, ACCEL_F32, N - 1) == ACCEL_OK);
    CHECK(accel_pg_all_gather(PG, mine, g, 3, ACCEL_I32) == ACCEL_OK);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += a[i] != (float)expect_reduce(ACCEL_REDUCE_SUM, ACCEL_F32, i + 5) ||
               accel_bf16_to_f32(bf[i]) != (float)expect_reduce(ACCEL_REDUCE_SUM, ACCEL_BF16, i + 1) ||
               b[i] != (float)expect_reduce(ACCEL_REDUCE_AVG, ACCEL_F32, i + 11);
    for (size_t j = 0; j < rs; j++) bad += d[j] != (float)expect_reduce(ACCEL_REDUCE_MAX, ACCEL_F32, R * rs + j + 3);
    CHECK_MSG(bad == 0, "%zu wrong elements", bad);
    for (int k = 0; k < N; k++) CHECK(g[3 * k] == k && g[3 * k + 1] == -k && g[3 * k + 2] == 7 * k);
    h = fnv(fnv(fnv(fnv(fnv(h, a, n * 4), b, n * 4), bf, n * 2), d, rs * 4), g, (size_t)N * 12);
    accel__pg_within_machine(PG, &after);
    if (want) CHECK_MSG(after == before + 6, "%llu of 6 collectives went hierarchically",
                        (unsigned long long)(after - before));
    printf("digest rank %d: %016llx\n", R, (unsigned long long)h);
    fflush(stdout);
    accel_pg_free_shared(PG, a);
    free(b);
    free(c);
    free(d);
    free(bf);
    free(g);
}

int main(void) {
    CHECK(!accel_dist_is_initialized());
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "accel_dist_init: %s\n", accel_last_error());
        return 1;
    }
    CHECK(accel_dist_init() == ACCEL_OK); /* a second reference to the same group */
    PG = accel_dist_default_group();
    R = accel_pg_rank(PG);
    N = accel_pg_size(PG);
    CHECK(R == accel_dist_rank() && N == accel_dist_world_size());
    CHECK(N <= 8);
    /* a world formed from a cluster's variables (tests/run_netns_slurm.sh) says what it must be */
    const char *want_n = getenv("ACCEL_TEST_WORLD");
    if (want_n) CHECK(N == atoi(want_n));
    /* tests/dist_multi.cmake runs it again with ACCEL_DIST_BACKEND=tcp / mpi,
     * and as a two-machine job (tcp chosen since LOCAL_WORLD_SIZE < WORLD_SIZE) */
    const char *want_be = getenv("ACCEL_DIST_BACKEND");
    if (!want_be || !*want_be) want_be = accel_dist_local_world_size() < N ? "tcp" : "shm";
    CHECK(strcmp(accel_pg_backend(PG), N == 1 ? "self" : want_be) == 0);
    RUN(test_all_reduce);
    RUN(test_broadcast_gather);
    RUN(test_all_gatherv);
    RUN(test_reduce_scatter);
    RUN(test_bytes);
    RUN(test_async);
    RUN(test_arg_errors);
    RUN(test_split);
    RUN(test_work_outlives_group);
    RUN(test_hierarchy);
    accel_dist_finalize();
    CHECK(accel_dist_is_initialized()); /* one reference left */
    CHECK(accel_pg_barrier(PG) == ACCEL_OK);
    accel_dist_finalize();
    CHECK(!accel_dist_is_initialized());
    accel_thread_cleanup();
    return check_summary();
}
