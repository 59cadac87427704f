/* Data loader: collation, end_of_dataloader lookahead, shuffling, skip_first_batches,
 * resumable state, map-style datasets, even_batches batch sizes (accelerate/data_loader.py; upstream's test_distributed_data_loop.py). */
#include "accel/accel.h"
#include "accel/data.h"
#include "check.h"

static accel_dataset *range_dataset(int64_t n) {
    float xs[64];
    for (int64_t i = 0; i < n; i++) xs[i] = (float)i;
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(n, 1), xs);
    return accel_tensor_dataset_new(1, &x);
}

/* Collects one epoch's first-field values, batch sizes and end flags. */
static int64_t run_epoch(accel_dataloader *dl, int64_t *vals, int64_t *sizes, bool *ends) {
    accel_batch b;
    int64_t nb = 0, k = 0;
    while (accel_dataloader_next(dl, &b)) {
        for (int64_t i = 0; i < b.size; i++) vals[k++] = (int64_t)accel_get(b.fields[0], (int64_t[]){i, 0});
        if (sizes) sizes[nb] = b.size;
        if (ends) ends[nb] = accel_dataloader_end_of_dataloader(dl);
        nb++;
        accel_step_reset();
    }
    return nb;
}

static void test_end_of_dataloader(void) {
    accel_dataset *ds = range_dataset(16);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 4;
    accel_dataloader *dl = accel_dataloader_new(ds, &o);
    CHECK(accel_dataloader_len(dl) == 4);
    for (int epoch = 0; epoch < 2; epoch++) {
        int64_t vals[16];
        bool ends[4];
        CHECK(!accel_dataloader_active(dl));
        CHECK(run_epoch(dl, vals, NULL, ends) == 4);
        for (int i = 0; i < 4; i++) CHECK(ends[i] == (i == 3));
        for (int i = 0; i < 16; i++) CHECK(vals[i] == i);
        CHECK(accel_dataloader_epoch(dl) == epoch + 1);
    }
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
}

static void test_skip_first_batches(void) {
    accel_dataset *ds = range_dataset(16);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 4;
    accel_dataloader *dl = accel_dataloader_new(ds, &o);
    accel_dataloader_set_epoch(dl, 3);
    accel_dataloader_skip_first_batches(dl, 2);
    int64_t vals[16];
    CHECK(run_epoch(dl, vals, NULL, NULL) == 2);
    for (int i = 0; i < 8; i++) CHECK(vals[i] == 8 + i); /* [[8..11], [12..15]] */
    CHECK(accel_dataloader_epoch(dl) == 4);          /* iteration carried over */
    CHECK(run_epoch(dl, vals, NULL, NULL) == 4);      /* the next epoch is whole again */
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
}

static void test_shuffle_reproducible(void) {
    accel_dataset *ds = range_dataset(10);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 2;
    o.shuffle = true;
    o.seed = 42;
    accel_dataloader *a = accel_dataloader_new(ds, &o), *b = accel_dataloader_new(ds, &o);
    int64_t va[3][10], vb[10];
    for (int e = 0; e < 3; e++) CHECK(run_epoch(a, va[e], NULL, NULL) == 5);
    CHECK(memcmp(va[0], va[1], sizeof va[0]) != 0); /* a new order every epoch */
    int sum = 0;
    for (int i = 0; i < 10; i++) sum += (int)va[0][i];
    CHECK(sum == 45); /* a permutation */
    for (int e = 0; e < 3; e++) {
        accel_dataloader_set_epoch(b, e);
        run_epoch(b, vb, NULL, NULL);
        CHECK(memcmp(va[e], vb, sizeof vb) == 0);
    }
    accel_dataloader_set_seed(b, 43);
    accel_dataloader_set_epoch(b, 0);
    run_epoch(b, vb, NULL, NULL);
    CHECK(memcmp(va[0], vb, sizeof vb) != 0);
    accel_dataloader_free(a);
    accel_dataloader_free(b);
    accel_dataset_free(ds);
}

static void test_state_resume(void) {
    accel_dataset *ds = range_dataset(20);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 3;
    o.shuffle = true;
    o.seed = 7;
    o.num_processes = 2;
    o.process_index = 1;
    accel_dataloader *ref = accel_dataloader_new(ds, &o), *dl = accel_dataloader_new(ds, &o);
    /* reference: two epochs straight */
    int64_t want[40], got[40];
    int64_t nw = 0, ng = 0;
    accel_batch b;
    for (int e = 0; e < 2; e++)
        while (accel_dataloader_next(ref, &b)) {
            for (int64_t i = 0; i < b.size; i++) want[nw++] = (int64_t)accel_get(b.fields[0], (int64_t[]){i, 0});
            accel_step_reset();
        }
    /* interrupted after 2 batches of epoch 0, state restored into a fresh loader */
    for (int k = 0; k < 2 && accel_dataloader_next(dl, &b); k++) {
        for (int64_t i = 0; i < b.size; i++) got[ng++] = (int64_t)accel_get(b.fields[0], (int64_t[]){i, 0});
        accel_step_reset();
    }
    accel_dataloader_state st = accel_dataloader_get_state(dl);
    CHECK(st.epoch == 0 && st.position == 2 && st.seed == 7);
    accel_dataloader_free(dl);
    o.seed = 999; /* restored from the state */
    dl = accel_dataloader_new(ds, &o);
    accel_dataloader_set_state(dl, &st);
    accel_dataloader_state back = accel_dataloader_get_state(dl); /* a restored state reads back */
    CHECK(back.epoch == 0 && back.position == 2 && back.seed == 7);
    for (int e = 0; e < 2; e++)
        while (accel_dataloader_next(dl, &b)) {
            for (int64_t i = 0; i < b.size; i++) got[ng++] = (int64_t)accel_get(b.fields[0], (int64_t[]){i, 0});
            accel_step_reset();
        }
    CHECK(ng == nw && memcmp(want, got, (size_t)nw * sizeof(int64_t)) == 0);
    /* epoch INT64_MAX has no next: its end incremented the epoch past int64
     * (undefined); refused, the loader unchanged */
    accel_clear_error();
    CHECK(accel_dataloader_set_epoch(dl, INT64_MAX) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "below INT64_MAX");
    CHECK(accel_dataloader_set_state(dl, &(accel_dataloader_state){INT64_MAX, 0, 7}) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    CHECK(accel_dataloader_epoch(dl) == 2);
    CHECK(accel_dataloader_set_epoch(dl, INT64_MAX - 1) == ACCEL_OK);
    while (accel_dataloader_next(dl, &b)) accel_step_reset();
    CHECK(accel_last_status() == ACCEL_OK && accel_dataloader_epoch(dl) == INT64_MAX);
    accel_dataloader_free(ref);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
}

static accel_status square_sample(void *ctx, int64_t index, void *const *fields) {
    int *calls = ctx;
    (*calls)++;
    float *x = fields[0];
    x[0] = (float)index;
    x[1] = (float)(index * index);
    *(int64_t *)fields[1] = index % 3;
    return ACCEL_OK;
}

static void test_map_dataset_collate(void) {
    int calls = 0;
    accel_field_spec specs[2] = {{ACCEL_F32, 1, {2}}, {ACCEL_I64, 0, {0}}};
    accel_dataset *ds = accel_map_dataset_new(7, 2, specs, square_sample, &calls);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 3;
    o.drop_last = true;
    accel_dataloader *dl = accel_dataloader_new(ds, &o);
    CHECK(accel_dataloader_len(dl) == 2);
    accel_batch b;
    CHECK(accel_dataloader_next(dl, &b));
    CHECK(accel_dataloader_next(dl, &b));
    CHECK(b.n_fields == 2 && b.size == 3);
    CHECK(b.fields[0]->ndim == 2 && b.fields[0]->shape[0] == 3 && b.fields[0]->shape[1] == 2);
    CHECK(b.fields[1]->dtype == ACCEL_I64 && b.fields[1]->ndim == 1);
    CHECK(accel_get(b.fields[0], (int64_t[]){2, 1}) == 25.0);
    CHECK(accel_get(b.fields[1], (int64_t[]){1}) == 1.0);
    CHECK(!accel_dataloader_next(dl, &b)); /* sample 6 dropped */
    CHECK(calls == 6);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    accel_step_reset();
    /* errors name the problem */
    accel_tensor *t2 = accel_zeros(ACCEL_F32, ACCEL_SHAPE(3)), *t3 = accel_zeros(ACCEL_F32, ACCEL_SHAPE(4));
    CHECK(accel_tensor_dataset_new(2, (accel_tensor *[]){t2, t3}) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "same first dim");
    accel_clear_error();
    /* a step tensor whose step ended (its header still in the arena, its
     * magic intact): refused by the arena's generation, naming which tensor,
     * never copied into the dataset */
    accel_tensor *live = accel_zeros(ACCEL_F32, ACCEL_SHAPE(3));
    accel_step_reset();
    accel_tensor *fresh = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(3), ACCEL_CPU_DEVICE);
    CHECK(accel_tensor_dataset_new(2, (accel_tensor *[]){fresh, live}) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_tensor_dataset_new: tensors[1] is a step tensor used after its "
                                           "step ended (accel_step_reset)");
    accel_clear_error();
    accel_tensor_free(fresh);
    accel_dataset *d3 = range_dataset(8);
    o = accel_dataloader_opts_default();
    o.batch_size = 3;
    o.num_processes = 2;
    o.split_batches = true;
    CHECK(accel_dataloader_new(d3, &o) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "round multiple of the number of processes (2)");
    accel_clear_error();
    /* batch size 1 is no exception (BatchSamplerShard raises; issue #8: every rank
     * got the whole batch and gather_for_metrics counted each sample twice) */
    o.batch_size = 1;
    CHECK(accel_dataloader_new(d3, &o) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "the batch size (1) needs to be a round multiple of the number of processes (2)");
    accel_clear_error();
    o.num_processes = 1; /* one process: nothing is split, nothing to refuse */
    accel_dataloader *one = accel_dataloader_new(d3, &o);
    CHECK(one != NULL);
    CHECK(accel_dataloader_shard(one, 3, 0, true, true) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "the batch size (1) needs to be a round multiple of the number of processes (3)");
    accel_clear_error();
    CHECK(accel_dataloader_len(one) == 8);
    accel_dataloader_free(one);
    accel_dataset_free(d3);
    accel_step_reset();
    /* A length whose index list's byte size wraps (2^61 + 1 samples: 8 bytes)
     * is refused, not indexed past its end by a shuffled epoch. */
    accel_dataset *huge = accel_map_dataset_new(((int64_t)1 << 61) + 1, 2, specs, square_sample, &calls);
    CHECK(huge != NULL);
    CHECK(accel_dataloader_new(huge, &(accel_dataloader_opts){.batch_size = 2, .shuffle = true}) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "2305843009213693953 samples is too long");
    accel_clear_error();
    accel_dataset_free(huge);
#if !defined(__SANITIZE_ADDRESS__) /* ASan aborts on an allocation past 1 TiB instead of failing it */
    /* One whose shuffle order memory cannot hold (8 TiB) is named as such (it
     * was the allocator's bare "out of memory allocating 8796093022208 bytes") */
    huge = accel_map_dataset_new((int64_t)1 << 40, 2, specs, square_sample, &calls);
    accel_dataloader *granted = accel_dataloader_new(huge, &(accel_dataloader_opts){.batch_size = 2, .shuffle = true});
    if (granted) { /* a kernel that overcommits always (vm.overcommit_memory=1) lends 8 TiB untouched */
        accel_dataloader_free(granted);
    } else {
        CHECK(accel_last_status() == ACCEL_ERR_OOM);
        CHECK_STR_CONTAINS(accel_last_error(), "accel_dataloader_new: the shuffle order of a dataset of 1099511627776 samples");
    }
    accel_clear_error();
    accel_dataset_free(huge);
#endif
}

/* §9.4: batch sizes per rank with and without even_batches (2 processes). */
static void test_even_batches_sizes(void) {
    struct { int n, bs, even; int64_t p0[3], p1[3]; } cases[] = {
        {3, 1, 1, {1, 1, 0}, {1, 1, 0}}, {7, 2, 1, {2, 2, 0}, {2, 2, 0}},
        {3, 1, 0, {1, 1, 0}, {1, 0, 0}}, {7, 2, 0, {2, 2, 0}, {2, 1, 0}},
    };
    for (size_t c = 0; c < 4; c++) {
        accel_dataset *ds = range_dataset(cases[c].n);
        for (int r = 0; r < 2; r++) {
            accel_dataloader_opts o = accel_dataloader_opts_default();
            o.batch_size = cases[c].bs;
            o.num_processes = 2;
            o.process_index = r;
            o.no_even_batches = !cases[c].even;
            accel_dataloader *dl = accel_dataloader_new(ds, &o);
            int64_t vals[16], sizes[4] = {0};
            int64_t nb = run_epoch(dl, vals, sizes, NULL);
            const int64_t *want = r ? cases[c].p1 : cases[c].p0;
            for (int i = 0; i < 3; i++) CHECK_MSG(sizes[i] == want[i], "case %zu rank %d batch %d", c, r, i);
            CHECK(nb == accel_dataloader_len(dl));
            accel_dataloader_free(dl);
        }
        accel_dataset_free(ds);
    }
}

/* Batch sizes past what memory holds: even_batches completes the last round
 * to processes x batch size indices (accelerate's `initial_data += initial_data`
 * until that long). The product past int64 is refused at once (it overflowed,
 * and the doubling ran on to a 32 GiB allocation), and the loader's error says
 * which epoch, process and batch size it was making (it was the allocator's
 * bare "out of memory allocating N bytes"). */
static void test_absurd_batch_sizes(void) {
    accel_dataset *ds = range_dataset(7);
    /* (2^31 - 1) processes x 2^33 wraps in int64 to a small list: refused
     * as the product it is, never asked of the allocator (64 GiB for the
     * last round's batch alone, copied from a list of 7) */
    struct { int64_t bs; int n, split; } cases[] = {
        {INT64_MAX, 3, 0}, {(int64_t)1 << 62, 2, 1}, {(int64_t)1 << 33, INT32_MAX, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        accel_dataloader_opts o = {.batch_size = cases[c].bs, .num_processes = cases[c].n,
                                   .process_index = cases[c].n - 1, .split_batches = cases[c].split};
        accel_dataloader *dl = accel_dataloader_new(ds, &o);
        CHECK_MSG(dl != NULL, "%s", accel_last_error());
        if (!dl) continue;
        CHECK(accel_dataloader_len(dl) == 1);
        accel_batch b = {.n_fields = 5}; /* a failure leaves it holding no batch */
        CHECK(!accel_dataloader_next(dl, &b) && accel_last_status() == ACCEL_ERR_OOM && b.n_fields == 0);
        char want[160];
        snprintf(want, sizeof want, "epoch 0's batches for process %d of %d (batch size %lld, a dataset of 7)",
                 cases[c].n - 1, cases[c].n, (long long)cases[c].bs);
        CHECK_STR_CONTAINS(accel_last_error(), "accel_dataloader_next: ");
        CHECK_STR_CONTAINS(accel_last_error(), want);
        CHECK_STR_CONTAINS(accel_last_error(), "entries do not fit in memory");
        accel_clear_error();
        accel_dataloader_free(dl);
    }
    accel_dataset_free(ds);
}

static accel_status varying(void *ctx, int64_t epoch, int64_t len, accel_batches *out) {
    static const int64_t sizes[] = {3, 2, 4, 3, 2};
    int64_t idx[14];
    for (int i = 0; i < 14; i++) idx[i] = i;
    out->n = 0;
    int64_t off = 0;
    for (int i = 0; i < 5; i++) {
        accel_status st = accel_batches_push(out, sizes[i], idx + off);
        if (st) return st;
        off += sizes[i];
    }
    return ACCEL_OK;
}

/* A variable-size custom batch sampler through the loader (§4.2, even_batches). */
static void test_custom_batch_sampler(void) {
    accel_dataset *ds = range_dataset(14);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 0;
    o.batch_sampler = varying;
    o.num_processes = 2;
    o.process_index = 1;
    accel_dataloader *dl = accel_dataloader_new(ds, &o);
    int64_t vals[16], sizes[4];
    CHECK(run_epoch(dl, vals, sizes, NULL) == 3);
    CHECK(sizes[0] == 2 && sizes[1] == 3 && sizes[2] == 3);
    CHECK(vals[0] == 3 && vals[2] == 9 && vals[5] == 0 && vals[7] == 2); /* [3,4],[9,10,11],[0,1,2] */
    CHECK(accel_dataloader_len(dl) == 3);
    accel_dataloader_free(dl);
    o.split_batches = true; /* variable sizes cannot be cut in slices */
    CHECK(accel_dataloader_new(ds, &o) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "needs a batch size that is a natural number (got 0)");
    accel_clear_error();
    accel_dataset_free(ds);
}

/* Only pushes, as "fills out" reads: pairs, the last one short. */
static accel_status pairs(void *ctx, int64_t epoch, int64_t len, accel_batches *out) {
    (void)ctx, (void)epoch;
    for (int64_t s = 0; s < len; s += 2) {
        int64_t idx[2] = {s, s + 1};
        accel_status st = accel_batches_push(out, len - s < 2 ? len - s : 2, idx);
        if (st) return st;
    }
    return ACCEL_OK;
}

/* Every epoch hands the sampler an empty list, as a Python batch sampler is
 * iterated afresh: the loader passed the list still holding the previous
 * epoch's batches, so epoch 2 yielded 6 batches, epoch 3 9, while len said 3. */
static void test_custom_batch_sampler_each_epoch(void) {
    accel_dataset *ds = range_dataset(5);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 2;
    o.batch_sampler = pairs;
    accel_dataloader *dl = accel_dataloader_new(ds, &o);
    for (int e = 0; e < 3; e++) {
        int64_t vals[32], sizes[16];
        CHECK(run_epoch(dl, vals, sizes, NULL) == 3);
        CHECK(accel_last_status() == ACCEL_OK);
        CHECK(sizes[0] == 2 && sizes[2] == 1 && vals[0] == 0 && vals[4] == 4);
        CHECK(accel_dataloader_len(dl) == 3);
    }
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
}

/* Fails without setting an error, as data.h allows (it asks only for a status). */
static accel_status silent_failure(void *ctx, int64_t epoch, int64_t len, accel_batches *out) {
    (void)ctx, (void)epoch, (void)len, (void)out;
    return ACCEL_ERR_IO;
}

/* A batch sampler's failure is the loader's error with the sampler's status,
 * not an end of epoch: without an error of the sampler's own, the last
 * status was read (OK), and next() said false with ACCEL_OK, which a loop
 * takes for the epoch's end. */
static void test_batch_sampler_fails_silently(void) {
    accel_dataset *ds = range_dataset(7);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 0;
    o.batch_sampler = silent_failure;
    accel_dataloader *dl = accel_dataloader_new(ds, &o);
    CHECK(dl != NULL);
    accel_batch b;
    CHECK(dl && !accel_dataloader_next(dl, &b));
    CHECK(accel_last_status() == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "(batch size its batch sampler's, a dataset of 7) could not be made: "
                                           "the batch sampler gave no reason");
    accel_clear_error();
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
}

int main(void) {
    RUN(test_custom_batch_sampler);
    RUN(test_custom_batch_sampler_each_epoch);
    RUN(test_batch_sampler_fails_silently);
    RUN(test_end_of_dataloader);
    RUN(test_skip_first_batches);
    RUN(test_shuffle_reproducible);
    RUN(test_state_resume);
    RUN(test_map_dataset_collate);
    RUN(test_even_batches_sizes);
    RUN(test_absurd_batch_sizes);
    accel_thread_cleanup();
    return check_summary();
}
