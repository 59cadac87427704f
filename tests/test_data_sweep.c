/* The sharding sweep: tests/data/sharding_sweep.json holds what accelerate's own
 * BatchSamplerShard and prepare_data_loader yield on every rank for a grid of
 * (dataset size, batch size, processes, split_batches, even_batches, drop_last),
 * and for variable-size batch samplers (batch_size None) on 1..4 processes
 * (tools/gen_sharding_fixtures.py). Every case is compared batch by batch with
 * accel_batch_sampler_shard and with a sharded accel_dataloader (its len, remainder
 * and end_of_dataloader too); where accelerate raises, accel must refuse with the
 * same complaint. */
#include <jansson.h>

#include "accel/accel.h"
#include "accel/data.h"
#include "check.h"

#define SWEEP_FILE "data/sharding_sweep.json"

/* bs > 0: BatchSampler(range(n), bs, drop_last). bs == 0: a variable-size
 * sampler of n_sizes batches, batch i the next sizes[i] indices of range(n). */
typedef struct sweep_case {
    int64_t n, bs;
    int procs;
    bool split, even, drop_last;
    int64_t sizes[16];
    int n_sizes;
} sweep_case;

static int64_t int_at(const json_t *array, size_t i) { return json_integer_value(json_array_get(array, i)); }

static const char *label(const sweep_case *c, int rank) {
    static char buf[256];
    size_t k = (size_t)snprintf(buf, sizeof buf, "n=%lld bs=%lld procs=%d split=%d even=%d drop_last=%d rank %d",
                                (long long)c->n, (long long)c->bs, c->procs, c->split, c->even, c->drop_last, rank);
    for (int i = 0; i < c->n_sizes && k < sizeof buf; i++)
        k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%lld%s", i ? "," : " sizes [", (long long)c->sizes[i],
                              i + 1 == c->n_sizes ? "]" : "");
    return buf;
}

/* The epoch's global batches: the torch BatchSampler, or the variable sizes. */
static accel_status global_batches(const sweep_case *c, accel_batches *out) {
    if (c->bs > 0) return accel_batches_from_order(out, c->n, NULL, c->bs, c->drop_last);
    out->n = 0;
    int64_t idx[64], off = 0;
    for (int i = 0; i < c->n_sizes; i++) {
        for (int64_t j = 0; j < c->sizes[i]; j++) idx[j] = off + j;
        accel_status st = accel_batches_push(out, c->sizes[i], idx);
        if (st) return st;
        off += c->sizes[i];
    }
    return ACCEL_OK;
}

static accel_status variable_sampler(void *ctx, int64_t epoch, int64_t dataset_len, accel_batches *out) {
    return global_batches(ctx, out);
}

/* The fixture's encoding of a rank's batches: ';' between batches, ',' between
 * runs, a run "a-b" for a, a+1, ..., b. False when buf is too small. */
static bool encode_batches(const accel_batches *b, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = '\0';
    for (int64_t i = 0; i < b->n; i++) {
        const int64_t *x = accel_batches_at(b, i);
        int64_t len = accel_batches_size(b, i);
        for (int64_t s = 0; s < len;) {
            int64_t e = s;
            while (e + 1 < len && x[e + 1] == x[e] + 1) e++;
            const char *sep = s ? "," : i ? ";" : "";
            int w = e == s ? snprintf(buf + k, cap - k, "%s%lld", sep, (long long)x[s])
                           : snprintf(buf + k, cap - k, "%s%lld-%lld", sep, (long long)x[s], (long long)x[e]);
            if (w < 0 || (size_t)w >= cap - k) return false;
            k += (size_t)w;
            s = e + 1;
        }
    }
    return true;
}

static void check_batches(const accel_batches *got, const char *want, const char *what, const sweep_case *c,
                          int rank) {
    char buf[4096];
    CHECK_MSG(encode_batches(got, buf, sizeof buf), "%s %s: %lld batches do not fit the buffer", what,
              label(c, rank), (long long)got->n);
    CHECK_MSG(!strcmp(buf, want), "%s %s:\n  got  %s\n  want %s", what, label(c, rank), buf, want);
}

/* accelerate raised `upstream`; accel must have refused with the same complaint
 * ("the batch size (B) needs to be a round multiple of the number of processes (N)"). */
static void check_refused(accel_status st, const char *upstream, const char *what, const sweep_case *c) {
    CHECK_MSG(st == ACCEL_ERR_INVALID_ARG, "%s %s: accepted, accelerate raises \"%s\"", what, label(c, 0),
              upstream);
    const char *from = strstr(upstream, "the batch size (");
    const char *to = strrchr(upstream, '.');
    CHECK_MSG(from && to > from, "%s: unknown upstream error \"%s\"", what, upstream);
    if (!from || to <= from || st != ACCEL_ERR_INVALID_ARG) return;
    char want[256];
    snprintf(want, sizeof want, "%.*s", (int)(to - from), from);
    CHECK_MSG(strstr(accel_last_error(), want), "%s %s: error \"%s\" lacks \"%s\"", what, label(c, 0),
              accel_last_error(), want);
    accel_clear_error();
}

static void check_shard(const sweep_case *c, json_t *shard, json_t *errors) {
    accel_batches g, out;
    accel_batches_init(&g);
    accel_batches_init(&out);
    CHECK(global_batches(c, &g) == ACCEL_OK);
    for (int r = 0; r < c->procs; r++) {
        accel_shard_opts o = {c->procs, r, c->split, !c->even, c->bs, c->drop_last};
        accel_status st = accel_batch_sampler_shard(&g, &o, &out);
        if (json_is_integer(shard)) {
            check_refused(st, json_string_value(json_array_get(errors, (size_t)json_integer_value(shard))),
                          "BatchSamplerShard", c);
            break;
        }
        CHECK_MSG(st == ACCEL_OK, "BatchSamplerShard %s: %s", label(c, r), accel_last_error());
        check_batches(&out, json_string_value(json_array_get(json_array_get(shard, 1), (size_t)r)),
                      "BatchSamplerShard", c, r);
        int64_t want_len = int_at(json_array_get(shard, 0), (size_t)r);
        CHECK_MSG(accel_batch_sampler_shard_len(g.n, &o) == want_len, "len(BatchSamplerShard) %s: %lld, want %lld",
                  label(c, r), (long long)accel_batch_sampler_shard_len(g.n, &o), (long long)want_len);
    }
    accel_batches_free(&g);
    accel_batches_free(&out);
}

static accel_status write_index(void *ctx, int64_t index, void *const *fields) {
    (void)ctx;
    *(int64_t *)fields[0] = index;
    return ACCEL_OK;
}

/* One epoch of the loader: its batches' dataset indices, checking that the
 * collated sample is its index and that end_of_dataloader flags the last batch only. */
static void run_epoch(accel_dataloader *dl, accel_batches *got, const sweep_case *c, int rank) {
    accel_batch b;
    got->n = 0;
    bool end_before = false;
    accel_clear_error(); /* next() returning false: the status tells an error from the end */
    while (accel_dataloader_next(dl, &b)) {
        CHECK_MSG(!end_before, "loader %s: end_of_dataloader before the last batch", label(c, rank));
        end_before = accel_dataloader_end_of_dataloader(dl);
        for (int64_t i = 0; i < b.size; i++) CHECK(accel_get(b.fields[0], &i) == (double)b.indices[i]);
        CHECK(accel_batches_push(got, b.size, b.indices) == ACCEL_OK);
        accel_step_reset();
    }
    CHECK_MSG(accel_last_status() == ACCEL_OK, "loader %s: %s", label(c, rank), accel_last_error());
    CHECK_MSG(got->n == 0 || end_before, "loader %s: end_of_dataloader never set", label(c, rank));
}

/* gather_for_metrics over the ranks' epochs: each step concatenates every rank's
 * batch, the last one cut to the remainder. Without drop_last, and with a
 * remainder (a sized batch sampler), this must give the dataset once, in order. */
static void check_gather_for_metrics(const accel_batches *ranks, int64_t remainder, const sweep_case *c) {
    int64_t steps = ranks[0].n, next = 0;
    for (int r = 1; r < c->procs; r++)
        if (ranks[r].n != steps) return; /* uneven shards: gather is not collective-safe */
    bool exact = true;
    for (int64_t s = 0; s < steps; s++) {
        int64_t keep = INT64_MAX;
        if (s == steps - 1 && remainder > 0) keep = remainder;
        for (int r = 0; r < c->procs; r++)
            for (int64_t i = 0; i < accel_batches_size(&ranks[r], s) && keep > 0; i++, keep--)
                exact &= accel_batches_at(&ranks[r], s)[i] == next++;
    }
    CHECK_MSG(exact && next == c->n, "gather_for_metrics %s: not every sample exactly once", label(c, 0));
}

/* Rank r's sharded loader against prepare_data_loader's; false when accel
 * refused it (rightly or not). */
static bool check_loader_rank(accel_dataset *ds, const sweep_case *c, int r, json_t *shard, json_t *loader,
                              json_t *errors, accel_batches *got) {
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = c->bs;
    o.drop_last = c->drop_last;
    o.num_processes = c->procs;
    o.process_index = r;
    o.split_batches = c->split;
    o.no_even_batches = !c->even;
    if (c->bs == 0) {
        o.batch_sampler = variable_sampler;
        o.batch_sampler_ctx = (void *)c;
    }
    accel_dataloader *dl = accel_dataloader_new(ds, &o);
    if (json_is_integer(loader)) {
        check_refused(dl ? ACCEL_OK : accel_last_status(),
                      json_string_value(json_array_get(errors, (size_t)json_integer_value(loader))),
                      "prepare_data_loader", c);
        accel_dataloader_free(dl);
        return false;
    }
    CHECK_MSG(dl != NULL, "loader %s: %s", label(c, r), accel_last_error());
    if (!dl) return false;
    int64_t want_len = int_at(json_array_get(loader, 1), (size_t)r), remainder = int_at(loader, 0);
    json_t *want = json_array_size(loader) == 3 ? json_array_get(loader, 2) : json_array_get(shard, 1);
    run_epoch(dl, got, c, r);
    check_batches(got, json_string_value(json_array_get(want, (size_t)r)), "loader", c, r);
    CHECK_MSG(accel_dataloader_len(dl) == want_len, "len(loader) %s: %lld, want %lld", label(c, r),
              (long long)accel_dataloader_len(dl), (long long)want_len);
    CHECK_MSG(accel_dataloader_remainder(dl) == remainder, "remainder %s: %lld, want %lld", label(c, r),
              (long long)accel_dataloader_remainder(dl), (long long)remainder);
    accel_dataloader_free(dl);
    return true;
}

static void check_loader(const sweep_case *c, json_t *shard, json_t *loader, json_t *errors) {
    accel_field_spec spec = {.dtype = ACCEL_I64, .ndim = 0};
    accel_dataset *ds = accel_map_dataset_new(c->n, 1, &spec, write_index, NULL);
    accel_batches ranks[4];
    for (int r = 0; r < c->procs; r++) accel_batches_init(&ranks[r]);
    bool loaded = true;
    for (int r = 0; r < c->procs && loaded; r++)
        loaded = check_loader_rank(ds, c, r, shard, loader, errors, &ranks[r]);
    int64_t remainder = loaded ? int_at(loader, 0) : -1;
    if (remainder >= 0 && !c->drop_last) check_gather_for_metrics(ranks, remainder, c);
    for (int r = 0; r < c->procs; r++) accel_batches_free(&ranks[r]);
    accel_dataset_free(ds);
}

static json_t *load_sweep(void) {
    json_error_t jerr;
    json_t *doc = json_load_file(SWEEP_FILE, 0, &jerr);
    CHECK_MSG(doc != NULL, "%s: %s (line %d)", SWEEP_FILE, jerr.text, jerr.line);
    return doc;
}

static void check_case(sweep_case *c, json_t *shard, json_t *loader, json_t *errors) {
    CHECK_MSG(c->procs >= 1 && c->procs <= 4 && c->n_sizes >= 0, "bad case %s", label(c, 0));
    if (c->procs < 1 || c->procs > 4 || c->n_sizes < 0) return;
    check_shard(c, shard, errors);
    check_loader(c, shard, loader, errors);
}

/* [n, bs, procs, split, even, drop_last, shard, loader] */
static void test_fixed_size_sweep(void) {
    json_t *doc = load_sweep();
    if (!doc) return;
    json_t *errors = json_object_get(doc, "errors"), *cases = json_object_get(doc, "cases");
    CHECK(json_array_size(cases) > 10000);
    size_t i, refused = 0;
    json_t *e;
    json_array_foreach(cases, i, e) {
        sweep_case c = {int_at(e, 0), int_at(e, 1), (int)int_at(e, 2), int_at(e, 3) != 0, int_at(e, 4) != 0,
                        int_at(e, 5) != 0, {0}, 0};
        refused += json_is_integer(json_array_get(e, 6));
        check_case(&c, json_array_get(e, 6), json_array_get(e, 7), errors);
    }
    CHECK(refused > 0); /* the grid holds refused cases: the error path is exercised */
    json_decref(doc);
}

/* [sizes, procs, even, shard, loader] */
static void test_variable_size_sweep(void) {
    json_t *doc = load_sweep();
    if (!doc) return;
    json_t *errors = json_object_get(doc, "errors"), *cases = json_object_get(doc, "variable");
    CHECK(json_array_size(cases) >= 800);
    size_t i;
    json_t *e;
    json_array_foreach(cases, i, e) {
        json_t *sizes = json_array_get(e, 0);
        sweep_case c = {0, 0, (int)int_at(e, 1), false, int_at(e, 2) != 0, false, {0}, (int)json_array_size(sizes)};
        if (c.n_sizes > 16) c.n_sizes = -1; /* refused by check_case */
        for (int k = 0; k < c.n_sizes; k++) {
            c.sizes[k] = int_at(sizes, (size_t)k);
            if (c.sizes[k] < 1 || c.sizes[k] > 64) c.n_sizes = -1;
            else c.n += c.sizes[k];
        }
        check_case(&c, json_array_get(e, 3), json_array_get(e, 4), errors);
    }
    json_decref(doc);
}

int main(void) {
    RUN(test_fixed_size_sweep);
    RUN(test_variable_size_sweep);
    accel_thread_cleanup();
    return check_summary();
}
