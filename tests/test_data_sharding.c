/* BatchSamplerShard tables (accelerate/data_loader.py's BatchSamplerShard, from upstream tests/test_data_loader.py,
 * regenerated with accelerate's own BatchSamplerShard) and the gather_for_metrics
 * remainder rule (§3.4) simulated over every rank. */
#include "accel/accel.h"
#include "accel/data.h"
#include "check.h"

static const char *fmt(const accel_batches *b, char *buf, size_t n) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "{");
    for (int64_t i = 0; i < b->n; i++) {
        k += (size_t)snprintf(buf + k, n - k, "%s{", i ? "," : "");
        for (int64_t j = 0; j < accel_batches_size(b, i); j++)
            k += (size_t)snprintf(buf + k, n - k, "%s%lld", j ? "," : "",
                                  (long long)accel_batches_at(b, i)[j]);
        k += (size_t)snprintf(buf + k, n - k, "}");
    }
    snprintf(buf + k, n - k, "}");
    return buf;
}

static const struct {
    int split, even, n, drop_last, bs;
    const char *p0, *p1;
} TABLE[] = {
    {0, 1, 24, 0, 3, "{{0,1,2},{6,7,8},{12,13,14},{18,19,20}}", "{{3,4,5},{9,10,11},{15,16,17},{21,22,23}}"},
    {0, 1, 24, 1, 3, "{{0,1,2},{6,7,8},{12,13,14},{18,19,20}}", "{{3,4,5},{9,10,11},{15,16,17},{21,22,23}}"},
    {0, 1, 21, 0, 3, "{{0,1,2},{6,7,8},{12,13,14},{18,19,20}}", "{{3,4,5},{9,10,11},{15,16,17},{0,1,2}}"},
    {0, 1, 21, 1, 3, "{{0,1,2},{6,7,8},{12,13,14}}", "{{3,4,5},{9,10,11},{15,16,17}}"},
    {0, 1, 22, 0, 3, "{{0,1,2},{6,7,8},{12,13,14},{18,19,20}}", "{{3,4,5},{9,10,11},{15,16,17},{21,0,1}}"},
    {0, 1, 22, 1, 3, "{{0,1,2},{6,7,8},{12,13,14}}", "{{3,4,5},{9,10,11},{15,16,17}}"},
    {0, 1, 20, 0, 3, "{{0,1,2},{6,7,8},{12,13,14},{18,19,0}}", "{{3,4,5},{9,10,11},{15,16,17},{1,2,3}}"},
    {0, 1, 20, 1, 3, "{{0,1,2},{6,7,8},{12,13,14}}", "{{3,4,5},{9,10,11},{15,16,17}}"},
    {0, 1, 2, 0, 3, "{{0,1,0}}", "{{1,0,1}}"},
    {0, 1, 2, 1, 3, "{}", "{}"},
    {0, 0, 24, 0, 3, "{{0,1,2},{6,7,8},{12,13,14},{18,19,20}}", "{{3,4,5},{9,10,11},{15,16,17},{21,22,23}}"},
    {0, 0, 24, 1, 3, "{{0,1,2},{6,7,8},{12,13,14},{18,19,20}}", "{{3,4,5},{9,10,11},{15,16,17},{21,22,23}}"},
    {0, 0, 21, 0, 3, "{{0,1,2},{6,7,8},{12,13,14},{18,19,20}}", "{{3,4,5},{9,10,11},{15,16,17}}"},
    {0, 0, 21, 1, 3, "{{0,1,2},{6,7,8},{12,13,14}}", "{{3,4,5},{9,10,11},{15,16,17}}"},
    {0, 0, 22, 0, 3, "{{0,1,2},{6,7,8},{12,13,14},{18,19,20}}", "{{3,4,5},{9,10,11},{15,16,17},{21}}"},
    {0, 0, 22, 1, 3, "{{0,1,2},{6,7,8},{12,13,14}}", "{{3,4,5},{9,10,11},{15,16,17}}"},
    {0, 0, 20, 0, 3, "{{0,1,2},{6,7,8},{12,13,14},{18,19}}", "{{3,4,5},{9,10,11},{15,16,17}}"},
    {0, 0, 20, 1, 3, "{{0,1,2},{6,7,8},{12,13,14}}", "{{3,4,5},{9,10,11},{15,16,17}}"},
    {0, 0, 2, 0, 3, "{{0,1}}", "{}"},
    {0, 0, 2, 1, 3, "{}", "{}"},
    {1, 1, 24, 0, 4, "{{0,1},{4,5},{8,9},{12,13},{16,17},{20,21}}", "{{2,3},{6,7},{10,11},{14,15},{18,19},{22,23}}"},
    {1, 1, 24, 1, 4, "{{0,1},{4,5},{8,9},{12,13},{16,17},{20,21}}", "{{2,3},{6,7},{10,11},{14,15},{18,19},{22,23}}"},
    {1, 1, 21, 0, 4, "{{0,1},{4,5},{8,9},{12,13},{16,17},{20,0}}", "{{2,3},{6,7},{10,11},{14,15},{18,19},{1,2}}"},
    {1, 1, 21, 1, 4, "{{0,1},{4,5},{8,9},{12,13},{16,17}}", "{{2,3},{6,7},{10,11},{14,15},{18,19}}"},
    {1, 1, 22, 0, 4, "{{0,1},{4,5},{8,9},{12,13},{16,17},{20,21}}", "{{2,3},{6,7},{10,11},{14,15},{18,19},{0,1}}"},
    {1, 1, 22, 1, 4, "{{0,1},{4,5},{8,9},{12,13},{16,17}}", "{{2,3},{6,7},{10,11},{14,15},{18,19}}"},
    {1, 1, 20, 0, 4, "{{0,1},{4,5},{8,9},{12,13},{16,17}}", "{{2,3},{6,7},{10,11},{14,15},{18,19}}"},
    {1, 1, 20, 1, 4, "{{0,1},{4,5},{8,9},{12,13},{16,17}}", "{{2,3},{6,7},{10,11},{14,15},{18,19}}"},
    {1, 1, 2, 0, 4, "{{0,1}}", "{{0,1}}"},
    {1, 1, 2, 1, 4, "{}", "{}"},
    {1, 0, 24, 0, 4, "{{0,1},{4,5},{8,9},{12,13},{16,17},{20,21}}", "{{2,3},{6,7},{10,11},{14,15},{18,19},{22,23}}"},
    {1, 0, 24, 1, 4, "{{0,1},{4,5},{8,9},{12,13},{16,17},{20,21}}", "{{2,3},{6,7},{10,11},{14,15},{18,19},{22,23}}"},
    {1, 0, 21, 0, 4, "{{0,1},{4,5},{8,9},{12,13},{16,17},{20}}", "{{2,3},{6,7},{10,11},{14,15},{18,19}}"},
    {1, 0, 21, 1, 4, "{{0,1},{4,5},{8,9},{12,13},{16,17}}", "{{2,3},{6,7},{10,11},{14,15},{18,19}}"},
    {1, 0, 22, 0, 4, "{{0,1},{4,5},{8,9},{12,13},{16,17},{20,21}}", "{{2,3},{6,7},{10,11},{14,15},{18,19}}"},
    {1, 0, 22, 1, 4, "{{0,1},{4,5},{8,9},{12,13},{16,17}}", "{{2,3},{6,7},{10,11},{14,15},{18,19}}"},
    {1, 0, 20, 0, 4, "{{0,1},{4,5},{8,9},{12,13},{16,17}}", "{{2,3},{6,7},{10,11},{14,15},{18,19}}"},
    {1, 0, 20, 1, 4, "{{0,1},{4,5},{8,9},{12,13},{16,17}}", "{{2,3},{6,7},{10,11},{14,15},{18,19}}"},
    {1, 0, 2, 0, 4, "{{0,1}}", "{}"},
    {1, 0, 2, 1, 4, "{}", "{}"},
    /* smaller than one round: the epoch's start is doubled past the first
     * allocation (issue #8: read freed memory, "sample index ... out of range") */
    {0, 1, 2, 0, 8, "{{0,1,0,1,0,1,0,1}}", "{{0,1,0,1,0,1,0,1}}"},
    {1, 1, 1, 0, 10, "{{0,0,0,0,0}}", "{{0,0,0,0,0}}"},
};

static void test_shard_tables(void) {
    accel_batches g, out;
    accel_batches_init(&g);
    accel_batches_init(&out);
    char buf[512];
    for (size_t t = 0; t < sizeof TABLE / sizeof TABLE[0]; t++) {
        CHECK(accel_batches_from_order(&g, TABLE[t].n, NULL, TABLE[t].bs, TABLE[t].drop_last) == ACCEL_OK);
        for (int r = 0; r < 2; r++) {
            accel_shard_opts o = {2, r, TABLE[t].split, !TABLE[t].even, TABLE[t].bs, TABLE[t].drop_last};
            CHECK(accel_batch_sampler_shard(&g, &o, &out) == ACCEL_OK);
            const char *want = r ? TABLE[t].p1 : TABLE[t].p0;
            CHECK_MSG(strcmp(fmt(&out, buf, sizeof buf), want) == 0,
                      "split=%d even=%d range(%d) drop_last=%d rank %d: got %s want %s", TABLE[t].split,
                      TABLE[t].even, TABLE[t].n, TABLE[t].drop_last, r, buf, want);
            /* __len__ matches iteration everywhere except upstream's split + !even tail quirk. */
            if (!(TABLE[t].split && !TABLE[t].even))
                CHECK(accel_batch_sampler_shard_len(g.n, &o) == out.n);
        }
    }
    accel_batches_free(&g);
    accel_batches_free(&out);
}

static void test_variable_size_batch_sampler(void) {
    static const int64_t idx[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    static const int64_t sizes[] = {3, 2, 4, 3, 2};
    accel_batches g, out;
    accel_batches_init(&g);
    accel_batches_init(&out);
    int64_t off = 0;
    for (int i = 0; i < 5; i++) {
        CHECK(accel_batches_push(&g, sizes[i], idx + off) == ACCEL_OK);
        off += sizes[i];
    }
    char buf[256];
    const char *want[2][2] = {{"{{0,1,2},{5,6,7,8},{12,13}}", "{{3,4},{9,10,11}}"},
                              {"{{0,1,2},{5,6,7,8},{12,13}}", "{{3,4},{9,10,11},{0,1,2}}"}};
    for (int even = 0; even < 2; even++)
        for (int r = 0; r < 2; r++) {
            accel_shard_opts o = {2, r, false, !even, 0, false};
            CHECK(accel_batch_sampler_shard(&g, &o, &out) == ACCEL_OK);
            CHECK_MSG(strcmp(fmt(&out, buf, sizeof buf), want[even][r]) == 0, "even=%d rank %d: %s", even,
                      r, buf);
        }
    /* one batch of 9 for 3 processes: initial_data doubled past 16 indices
     * (upstream: every rank gets [0..8]) */
    accel_batches one;
    accel_batches_init(&one);
    CHECK(accel_batches_push(&one, 9, idx) == ACCEL_OK);
    for (int r = 0; r < 3; r++) {
        accel_shard_opts o3 = {3, r, false, false, 0, false};
        CHECK(accel_batch_sampler_shard(&one, &o3, &out) == ACCEL_OK);
        CHECK_MSG(strcmp(fmt(&out, buf, sizeof buf), "{{0,1,2,3,4,5,6,7,8}}") == 0, "rank %d: %s", r, buf);
        CHECK(accel_batch_sampler_shard_len(one.n, &o3) == 1);
    }
    accel_shard_opts o3 = {3, 0, false, false, 0, false};
    CHECK(accel_batch_sampler_shard(&one, &o3, &one) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "another list than global");
    accel_clear_error();
    accel_batches_free(&one);
    accel_shard_opts o = {2, 0, false, true, 0, false};
    CHECK(accel_batch_sampler_shard_len(5, &o) == 3);
    o.process_index = 1;
    CHECK(accel_batch_sampler_shard_len(5, &o) == 2);
    /* a negative count is refused (it came back as -5 / 2 + 1 = -1 batches, -5 under split_batches) */
    accel_clear_error();
    CHECK(accel_batch_sampler_shard_len(-5, &o) == 0);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "-5 batches");
    accel_clear_error();
    CHECK(accel_batch_sampler_shard_len(-5, &(accel_shard_opts){2, 0, true, false, 4, false}) == 0);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    /* split_batches needs a fixed batch size that N divides */
    accel_shard_opts bad = {2, 0, true, false, 3, false};
    CHECK(accel_batch_sampler_shard(&g, &bad, &out) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "round multiple");
    accel_clear_error();
    accel_batches_free(&g);
    accel_batches_free(&out);
}

/* Re-pushing a list's own batch while it grows reads from the moved storage. */
static void test_push_own_batch(void) {
    int64_t first[16];
    for (int i = 0; i < 16; i++) first[i] = 100 + i;
    accel_batches b;
    accel_batches_init(&b);
    CHECK(accel_batches_push(&b, 16, first) == ACCEL_OK);
    for (int k = 0; k < 3; k++) CHECK(accel_batches_push(&b, 16, accel_batches_at(&b, k)) == ACCEL_OK);
    CHECK(b.n == 4);
    for (int64_t k = 0; k < b.n; k++)
        for (int i = 0; i < 16; i++) CHECK_MSG(accel_batches_at(&b, k)[i] == 100 + i, "batch %lld [%d]", (long long)k, i);
    accel_batches_free(&b);
}

/* Simulates gather_for_metrics across N ranks: every step, all ranks' batches are
 * concatenated in rank order; at the last step the result is cut to the remainder.
 * The total must be exactly the dataset, each index once. */
static void simulate_gather_for_metrics(int64_t n, int64_t bs, int N, bool split, bool shuffle) {
    accel_dataloader *dls[8];
    float *xs = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) xs[i] = (float)i;
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(n), xs);
    accel_dataset *ds = accel_tensor_dataset_new(1, &x);
    for (int r = 0; r < N; r++) {
        accel_dataloader_opts o = accel_dataloader_opts_default();
        o.batch_size = bs;
        o.shuffle = shuffle;
        o.seed = 1234;
        o.num_processes = N;
        o.process_index = r;
        o.split_batches = split;
        dls[r] = accel_dataloader_new(ds, &o);
    }
    int64_t steps = accel_dataloader_len(dls[0]);
    for (int r = 1; r < N; r++) CHECK(accel_dataloader_len(dls[r]) == steps);
    int *seen = calloc((size_t)n, sizeof(int));
    int64_t total = 0;
    for (int64_t s = 0; s < steps; s++) {
        int64_t gathered[4096], g = 0;
        bool end = false;
        for (int r = 0; r < N; r++) {
            accel_batch b;
            CHECK(accel_dataloader_next(dls[r], &b));
            for (int64_t i = 0; i < b.size; i++) gathered[g++] = (int64_t)accel_get(b.fields[0], &i);
            end = accel_dataloader_end_of_dataloader(dls[r]);
            CHECK(end == (s == steps - 1));
        }
        int64_t rem = accel_dataloader_remainder(dls[0]);
        if (end && rem > 0) g = rem;
        for (int64_t i = 0; i < g; i++) seen[gathered[i]]++;
        total += g;
        accel_step_reset();
    }
    CHECK_MSG(total == n, "n=%lld bs=%lld N=%d split=%d: gathered %lld", (long long)n, (long long)bs, N,
              split, (long long)total);
    int ok = 1;
    for (int64_t i = 0; i < n; i++) ok &= seen[i] == 1;
    CHECK_MSG(ok, "n=%lld N=%d split=%d: not every index exactly once", (long long)n, N, split);
    for (int r = 0; r < N; r++) {
        accel_batch b;
        CHECK(!accel_dataloader_next(dls[r], &b) && accel_last_status() == ACCEL_OK);
        CHECK(accel_dataloader_epoch(dls[r]) == 1);
        accel_dataloader_free(dls[r]);
    }
    accel_dataset_free(ds);
    free(seen);
    free(xs);
    accel_step_reset();
}

static void test_gather_for_metrics_remainder(void) {
    const int64_t sizes[] = {82, 99, 512};
    for (int N = 2; N <= 3; N++)
        for (int s = 0; s < 3; s++)
            for (int split = 0; split < 2; split++) {
                if (split && 16 % N) continue; /* 16 is not split across 3 */
                simulate_gather_for_metrics(sizes[s], 16, N, split, false);
            }
    for (int shuffle = 0; shuffle < 2; shuffle++) simulate_gather_for_metrics(22, 4, 4, false, shuffle);
    /* upstream worked example: 82 samples, bs 16, 2 processes -> remainder 18 */
    float z[82] = {0};
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(82), z);
    accel_dataset *ds = accel_tensor_dataset_new(1, &x);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 16;
    o.num_processes = 2;
    accel_dataloader *dl = accel_dataloader_new(ds, &o);
    CHECK(accel_dataloader_remainder(dl) == 18);
    CHECK(accel_dataloader_len(dl) == 3);
    accel_dataloader_free(dl);
    o.drop_last = true;
    dl = accel_dataloader_new(ds, &o);
    CHECK(accel_dataloader_remainder(dl) == -1);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    accel_step_reset();
}

int main(void) {
    RUN(test_shard_tables);
    RUN(test_variable_size_batch_sampler);
    RUN(test_push_own_batch);
    RUN(test_gather_for_metrics_remainder);
    accel_thread_cleanup();
    return check_summary();
}
