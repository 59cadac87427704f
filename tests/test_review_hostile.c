/* Hostile input and unlucky values found by the outside review, one test
 * each (every one failed before its fix):
 *   accel_llama_config_save of a NaN / infinite rms_norm_eps or rope_theta
 *     crashed (repr of "nan" has no exponent: strchr(.., 'e') was NULL);
 *   an index naming 20,000 distinct shards took minutes to parse (the shard
 *     list was re-sorted after every new shard: quadratic);
 *   a data loader with batch_size INT64_MAX said len 0 (n + bs - 1 wrapped)
 *     while it yields one batch, and its remainder wrapped (bs * processes);
 *   a map dataset's spec with a negative dim or a sample past int64 bytes
 *     was accepted (spec_bytes wrapped);
 *   the len of a loader whose batch_sampler fails was 0, as for an empty
 *     epoch (contract: a count is -1 on failure);
 *   accel_safetensors_save of a tensor named in bytes that are not UTF-8
 *     "succeeded" and wrote a file no reader opens (jansson dropped the
 *     entry, its bytes stayed); metadata of such bytes vanished; torch_save
 *     wrote them into the pickle, where torch.load fails to decode them;
 *   sampling from logits holding a NaN or +inf returned the last token id
 *     (every comparison with NaN is false) where torch.multinomial raises,
 *     and so did logits that are all -inf;
 *   a progress bar on a terminal given a negative update read before its
 *     table of eighths (tqdm allows update(-n));
 *   a tracker key (or string) that is not UTF-8 went into the tensorboard
 *     event file, whose reader then fails on the whole file ("String field
 *     had bad UTF-8"), and into the csv; jsonl alone refused it;
 *   LOCAL_RANK >= LOCAL_WORLD_SIZE was taken as given (a wrong GPU and a
 *     wrong machine for splits), and LOCAL_WORLD_SIZE > WORLD_SIZE was
 *     reported as a job on several machines without a secret ("2 < 1"). */
#include <pty.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/bigmodel.h"
#include "accel/data.h"
#include "accel/dist.h"
#include "accel/io.h"
#include "accel/nn.h"
#include "accel/tracking.h"
#include "check.h"

static char TMP[64];

static void check_save_refuses(accel_llama_config c, const char *field) {
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", TMP);
    accel_status st = accel_llama_config_save(path, &c);
    CHECK_MSG(st == ACCEL_ERR_INVALID_ARG, "%s: status %d", field, (int)st);
    CHECK_STR_CONTAINS(accel_last_error(), field);
    CHECK(access(path, F_OK) != 0); /* nothing written */
    accel_clear_error();
}

static void test_config_save_non_finite(void) {
    accel_llama_config c = accel_llama_config_default();
    c.rms_norm_eps = NAN;
    check_save_refuses(c, "rms_norm_eps");
    c = accel_llama_config_default();
    c.rope_theta = INFINITY;
    check_save_refuses(c, "rope_theta");
    c = accel_llama_config_default();
    c.initializer_range = -INFINITY;
    check_save_refuses(c, "initializer_range");
    /* what load refuses, save refuses too: a file that cannot be read back */
    c = accel_llama_config_default();
    c.rms_norm_eps = 0;
    check_save_refuses(c, "rms_norm_eps");
    /* and a finite config still round-trips */
    c = accel_llama_config_default();
    c.rms_norm_eps = 1e-5;
    CHECK(accel_llama_config_save(TMP, &c) == ACCEL_OK);
    accel_llama_config back;
    CHECK(accel_llama_config_load(TMP, &back) == ACCEL_OK);
    CHECK(back.rms_norm_eps == 1e-5 && back.rope_theta == c.rope_theta);
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", TMP);
    unlink(path);
}

static void test_save_non_utf8_names(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/bad.safetensors", TMP);
    accel_tensor *t = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE);
    const char *names[2] = {"ok", "w\xff\xfe"};
    accel_tensor *ts[2] = {t, t};
    accel_status st = accel_safetensors_save(path, 2, names, ts, 0, NULL);
    CHECK_MSG(st == ACCEL_ERR_INVALID_ARG, "status %d", (int)st);
    CHECK_STR_CONTAINS(accel_last_error(), "is not valid UTF-8");
    CHECK(access(path, F_OK) != 0);
    accel_clear_error();
    accel_kv meta = {"note", "caf\xe9"}; /* latin-1, not UTF-8 */
    st = accel_safetensors_save(path, 1, names, ts, 1, &meta);
    CHECK_MSG(st == ACCEL_ERR_INVALID_ARG, "status %d", (int)st);
    CHECK_STR_CONTAINS(accel_last_error(), "metadata 'note' is not valid UTF-8");
    CHECK(access(path, F_OK) != 0);
    accel_clear_error();
    snprintf(path, sizeof path, "%s/bad.bin", TMP);
    st = accel_torch_save(path, 2, names, ts);
    CHECK_MSG(st == ACCEL_ERR_INVALID_ARG, "status %d", (int)st);
    CHECK_STR_CONTAINS(accel_last_error(), "is not valid UTF-8");
    CHECK(access(path, F_OK) != 0);
    accel_clear_error();
    /* UTF-8 names are names like any other */
    const char *utf8[1] = {"caf\xc3\xa9.weight"};
    snprintf(path, sizeof path, "%s/ok.safetensors", TMP);
    CHECK(accel_safetensors_save(path, 1, utf8, ts, 0, NULL) == ACCEL_OK);
    accel_safetensors *r = accel_safetensors_open(path);
    CHECK(r && accel_safetensors_find(r, utf8[0]) != NULL);
    accel_safetensors_close(r);
    unlink(path);
    accel_tensor_free(t);
}

static void test_index_many_shards(void) {
    /* No clock: re-sorting the shard list after each new name (n^2 log n; 20,000
     * shards took 12.8 s of CPU) would take far past the test's timeout here,
     * sorting once takes a fraction of a second. */
    enum { SHARDS = 200000 };
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", TMP);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs("{\"metadata\": {}, \"weight_map\": {", f);
    /* descending names: every new shard sorts first */
    for (int i = 0; i < SHARDS; i++) fprintf(f, "%s\"w%d\": \"s%06d.safetensors\"", i ? ", " : "", i, SHARDS - i);
    fputs("}}", f);
    fclose(f);
    accel_checkpoint *ck = accel_checkpoint_open(path);
    CHECK(ck == NULL); /* no shard exists */
    CHECK_STR_CONTAINS(accel_last_error(), "is missing");
    accel_checkpoint_close(ck);
    accel_clear_error();
    unlink(path);
}

static void test_loader_huge_batch_size(void) {
    accel_tensor *x = accel_arange(ACCEL_I64, 0, 10); /* a step tensor: the dataset copies it */
    accel_dataset *ds = accel_tensor_dataset_new(1, &x);
    accel_dataloader *dl = accel_dataloader_new(ds, &(accel_dataloader_opts){.batch_size = INT64_MAX});
    CHECK(dl != NULL);
    if (dl) {
        CHECK_MSG(accel_dataloader_len(dl) == 1, "len %lld", (long long)accel_dataloader_len(dl));
        CHECK(accel_dataloader_remainder(dl) == 10); /* len(dataset) % total_batch_size */
        accel_batch b;
        int64_t batches = 0, samples = 0;
        while (accel_dataloader_next(dl, &b)) batches++, samples += b.size;
        CHECK(accel_last_status() == ACCEL_OK);
        CHECK(batches == 1 && samples == 10);
        /* two processes: bs * 2 does not fit in int64, the remainder is still 10 */
        CHECK(accel_dataloader_shard(dl, 2, 0, false, true) == ACCEL_OK);
        CHECK_MSG(accel_dataloader_remainder(dl) == 10, "remainder %lld", (long long)accel_dataloader_remainder(dl));
        CHECK(accel_dataloader_len(dl) == 1);
    }
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    accel_step_reset();
}

static void test_sample_non_finite_logits(void) {
    accel_rng rng;
    accel_rng_init(&rng, 7);
    accel_generate_opts o = {.do_sample = true};
    const float bad[2][4] = {{0.5f, NAN, 1.0f, 0.25f}, {0.5f, INFINITY, 1.0f, 0.25f}};
    for (int k = 0; k < 2; k++) {
        accel_tensor *l = accel_from_floats(ACCEL_SHAPE(4), bad[k]);
        int64_t tok = accel_sample_logits(l, &o, &rng);
        CHECK_MSG(tok == -1, "%s logit: token %lld", k ? "+inf" : "NaN", (long long)tok);
        CHECK_STR_CONTAINS(accel_last_error(), "NaN or +inf");
        accel_clear_error();
        /* -inf is a filtered token, not an error */
        const float ok[4] = {-INFINITY, 2.0f, -INFINITY, -INFINITY};
        accel_tensor *m = accel_from_floats(ACCEL_SHAPE(4), ok);
        CHECK(accel_sample_logits(m, &o, &rng) == 1);
    }
    const float none[3] = {-INFINITY, -INFINITY, -INFINITY};
    CHECK(accel_sample_logits(accel_from_floats(ACCEL_SHAPE(3), none), &o, &rng) == -1);
    CHECK_STR_CONTAINS(accel_last_error(), "every logit is -inf");
    accel_clear_error();
    accel_step_reset();
}

static accel_status no_sample(void *ctx, int64_t index, void *const *fields) {
    (void)ctx, (void)index, (void)fields;
    return ACCEL_OK;
}

/* A negative dim (a huge size_t) or a sample too large for int64 is refused
 * when the dataset is made, naming the field, not at some later batch. */
static void test_map_dataset_bad_spec(void) {
    const accel_field_spec bad[2] = {{ACCEL_F32, 1, {-3}}, {ACCEL_F32, 2, {INT64_C(1) << 40, INT64_C(1) << 40}}};
    for (int k = 0; k < 2; k++) {
        accel_dataset *ds = accel_map_dataset_new(4, 1, &bad[k], no_sample, NULL);
        CHECK_MSG(ds == NULL, "spec %d accepted", k);
        CHECK_STR_CONTAINS(accel_last_error(), "bad spec for field 0");
        accel_dataset_free(ds);
        accel_clear_error();
    }
    const accel_field_spec good = {ACCEL_F32, 2, {0, 3}}; /* empty samples are samples */
    accel_dataset *ds = accel_map_dataset_new(4, 1, &good, no_sample, NULL);
    CHECK(ds != NULL);
    accel_dataset_free(ds);
}

static accel_status failing_sampler(void *ctx, int64_t epoch, int64_t n, accel_batches *out) {
    (void)ctx, (void)epoch, (void)n, (void)out;
    return accel_set_error(ACCEL_ERR_IO, "failing_sampler: the index file is gone");
}

/* A sampler that fails has no length: -1 and its error, not 0 (an empty epoch). */
static void test_loader_len_of_failing_sampler(void) {
    accel_tensor *x = accel_arange(ACCEL_I64, 0, 4);
    accel_dataset *ds = accel_tensor_dataset_new(1, &x);
    accel_dataloader *dl = accel_dataloader_new(ds, &(accel_dataloader_opts){.batch_sampler = failing_sampler});
    CHECK(dl != NULL);
    CHECK(accel_dataloader_len(dl) == -1);
    CHECK_STR_CONTAINS(accel_last_error(), "the index file is gone");
    accel_clear_error();
    CHECK(accel_dataloader_len(NULL) == -1);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_dataloader_len: dataloader is NULL");
    accel_clear_error();
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    accel_step_reset();
}

/* tqdm.update(-n) is allowed; on a terminal the bar of a negative count read
 * eighths[-k] (a negative remainder) before its array. tqdm clamps the bar to
 * [0, 1] and still prints the percentage. */
static void test_progress_negative_update(void) {
    int master, slave;
    CHECK(openpty(&master, &slave, NULL, NULL, NULL) == 0);
    FILE *tty = fdopen(slave, "w");
    accel_progress *p = accel_progress_new(100, &(accel_progress_opts){.desc = "neg", .stream = tty,
                                                                      .min_interval = -1});
    accel_progress_update(p, -3);
    accel_progress_close(p);
    fclose(tty);
    char buf[2048];
    ssize_t n = 0, r;
    while (n < (ssize_t)sizeof buf - 1 && (r = read(master, buf + n, sizeof buf - 1 - (size_t)n)) > 0) n += r;
    close(master);
    buf[n > 0 ? n : 0] = '\0';
    CHECK_STR_CONTAINS(buf, "\rneg:  -3%|          | -3/100 [");
}

static void test_tracker_non_utf8(void) {
    for (int k = 0; accel_tracker_builtin(k); k++) {
        const char *name = accel_tracker_builtin(k);
        accel_tracker *t = accel_tracker_open(name, "run", TMP);
        CHECK(t != NULL);
        accel_value bad_key = ACCEL_VALUE_F("loss\xff", 1.0), bad_str = ACCEL_VALUE_S("note", "caf\xe9");
        CHECK_MSG(accel_tracker_log(t, 1, &bad_key, 0) == ACCEL_ERR_INVALID_ARG, "%s took a non-UTF-8 key", name);
        CHECK_STR_CONTAINS(accel_last_error(), "is not valid UTF-8");
        accel_clear_error();
        CHECK_MSG(accel_tracker_log(t, 1, &bad_str, 0) == ACCEL_ERR_INVALID_ARG, "%s took a non-UTF-8 string", name);
        CHECK_STR_CONTAINS(accel_last_error(), "'note'");
        accel_clear_error();
        CHECK_MSG(accel_tracker_store_init_configuration(t, 1, &bad_str) == ACCEL_ERR_INVALID_ARG,
                  "%s took a non-UTF-8 config string", name);
        accel_clear_error();
        accel_value fine = ACCEL_VALUE_S("caf\xc3\xa9", "\xe2\x9c\x93");
        CHECK_MSG(accel_tracker_log(t, 1, &fine, 0) == ACCEL_OK, "%s: %s", name, accel_last_error());
        CHECK(accel_tracker_finish(t) == ACCEL_OK);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s/run", TMP);
    CHECK(system(cmd) == 0);
}

static void check_bad_local(const char *rank, const char *world, const char *lrank, const char *lworld,
                            const char *want) {
    setenv("RANK", rank, 1);
    setenv("WORLD_SIZE", world, 1);
    setenv("LOCAL_RANK", lrank, 1);
    if (lworld) setenv("LOCAL_WORLD_SIZE", lworld, 1);
    else unsetenv("LOCAL_WORLD_SIZE"); /* set but empty is an error of its own (test_env_strict) */
    accel_status st = accel_dist_init();
    CHECK_MSG(st == ACCEL_ERR_INVALID_ARG, "LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s WORLD_SIZE=%s: status %d (%s)", lrank,
              lworld, world, (int)st, accel_last_error());
    CHECK_STR_CONTAINS(accel_last_error(), want);
    if (st == ACCEL_OK) accel_dist_finalize();
    accel_clear_error();
}

static void test_local_rank_out_of_range(void) {
    unsetenv("MASTER_ADDR");
    unsetenv("ACCEL_JOB_SECRET");
    unsetenv("ACCEL_INSECURE_NO_SECRET");
    check_bad_local("0", "1", "1", "1", "LOCAL_RANK=1 is not below LOCAL_WORLD_SIZE=1");
    check_bad_local("0", "1", "0", "2", "LOCAL_WORLD_SIZE=2 is larger than WORLD_SIZE=1");
    check_bad_local("0", "1", "3", NULL, "LOCAL_RANK=3 is not below LOCAL_WORLD_SIZE=1");
    /* consistent values still join (a group of one) */
    setenv("LOCAL_RANK", "0", 1);
    setenv("LOCAL_WORLD_SIZE", "1", 1);
    CHECK(accel_dist_init() == ACCEL_OK);
    CHECK(accel_dist_local_rank() == 0 && accel_dist_local_world_size() == 1);
    accel_dist_finalize();
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
}

int main(void) {
    snprintf(TMP, sizeof TMP, "/tmp/accel_hostile_XXXXXX");
    if (!mkdtemp(TMP)) return 1;
    RUN(test_config_save_non_finite);
    RUN(test_save_non_utf8_names);
    RUN(test_index_many_shards);
    RUN(test_loader_huge_batch_size);
    RUN(test_map_dataset_bad_spec);
    RUN(test_loader_len_of_failing_sampler);
    RUN(test_sample_non_finite_logits);
    RUN(test_progress_negative_update);
    RUN(test_tracker_non_utf8);
    RUN(test_local_rank_out_of_range);
    rmdir(TMP);
    accel_thread_cleanup();
    return check_summary();
}
