/* Trackers (TensorBoard against the real writer's fixture, JSONL, CSV, your
 * own), the logger, progress bars, register_for_checkpointing,
 * accelerator.save, find_executable_batch_size.
 *
 * ACCEL_TRACKING_KEEP=DIR keeps the TensorBoard run this test writes in DIR
 * (tools/check_tensorboard_reads_accel.py reads it with TensorBoard's reader). */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <pty.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "check.h"
#include "test_files.h"
#include "tb_event.pb-c.h"
#include "tracking/tb_internal.h"

static char *temp_dir(void) {
    static char dirs[16][64];
    static int n;
    char *d = dirs[n++ % 16];
    snprintf(d, 64, "/tmp/accel_track_XXXXXX");
    return mkdtemp(d);
}

/* The one entry of dir whose name starts with prefix (NULL when not exactly one). */
static bool find_entry(const char *dir, const char *prefix, bool want_dir, char *out, size_t n) {
    DIR *d = opendir(dir);
    int found = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.' || strncmp(e->d_name, prefix, strlen(prefix))) continue;
        char p[1024];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &sb) || S_ISDIR(sb.st_mode) != want_dir) continue;
        snprintf(out, n, "%s", p);
        found++;
    }
    if (d) closedir(d);
    return found == 1;
}

typedef struct records {
    int n;
    AccelTb__Event *ev[32];
} records;

/* Reads a TFRecord file, checking both masked CRC-32Cs of every record. */
static bool read_records(const char *path, records *r) {
    void *data;
    size_t len;
    r->n = 0;
    if (accel_load_bytes(path, &data, &len)) return false;
    const uint8_t *p = data, *end = p + len;
    bool ok = true;
    while (ok && p < end && r->n < 32) {
        if (end - p < 12) { ok = false; break; }
        uint64_t n = 0;
        uint32_t lc = 0, dc = 0;
        for (int i = 0; i < 8; i++) n |= (uint64_t)p[i] << (8 * i);
        for (int i = 0; i < 4; i++) lc |= (uint32_t)p[8 + i] << (8 * i);
        if (lc != accel__crc32c_masked(p, 8) || (uint64_t)(end - p) < 16 + n) { ok = false; break; }
        for (int i = 0; i < 4; i++) dc |= (uint32_t)p[12 + n + i] << (8 * i);
        if (dc != accel__crc32c_masked(p + 12, n)) { ok = false; break; }
        r->ev[r->n] = accel_tb__event__unpack(NULL, n, p + 12);
        ok = r->ev[r->n++] != NULL;
        p += 16 + n;
    }
    free(data);
    return ok && p == end;
}

static void records_free(records *r) {
    for (int i = 0; i < r->n; i++) accel_tb__event__free_unpacked(r->ev[i], NULL);
    r->n = 0;
}

static const AccelTb__Summary__Value *value_of(const AccelTb__Event *e) {
    return e->what_case == ACCEL_TB__EVENT__WHAT_SUMMARY && e->summary->n_value == 1 ? e->summary->value[0] : NULL;
}

static bool same_bytes(ProtobufCBinaryData a, ProtobufCBinaryData b) {
    return a.len == b.len && (!a.len || !memcmp(a.data, b.data, a.len));
}

static const AccelTb__Value *hparam(const AccelTb__SessionStartInfo *s, const char *key) {
    for (size_t i = 0; i < s->n_hparams; i++)
        if (!strcmp(s->hparams[i]->key, key)) return s->hparams[i]->value;
    return NULL;
}

static int hparam_type(const AccelTb__Experiment *x, const char *name) {
    for (size_t i = 0; i < x->n_hparam_infos; i++)
        if (!strcmp(x->hparam_infos[i]->name, name)) return x->hparam_infos[i]->type;
    return -1;
}

/* The hparams plugin payloads agree: same oneof, same keys with the same
 * types and values (map order is the writer's choice). */
static bool same_hparams(ProtobufCBinaryData a, ProtobufCBinaryData b) {
    AccelTb__HParamsPluginData *x = accel_tb__hparams_plugin_data__unpack(NULL, a.len, a.data);
    AccelTb__HParamsPluginData *y = accel_tb__hparams_plugin_data__unpack(NULL, b.len, b.data);
    bool ok = x && y && x->version == y->version && x->data_case == y->data_case;
    if (ok && x->data_case == ACCEL_TB__HPARAMS_PLUGIN_DATA__DATA_EXPERIMENT) {
        ok = x->experiment->n_hparam_infos == y->experiment->n_hparam_infos;
        for (size_t i = 0; ok && i < x->experiment->n_hparam_infos; i++) {
            const AccelTb__HParamInfo *h = x->experiment->hparam_infos[i];
            ok = (int)h->type == hparam_type(y->experiment, h->name);
        }
    } else if (ok && x->data_case == ACCEL_TB__HPARAMS_PLUGIN_DATA__DATA_SESSION_START_INFO) {
        const AccelTb__SessionStartInfo *s = x->session_start_info, *t = y->session_start_info;
        ok = s->n_hparams == t->n_hparams && s->start_time_secs == t->start_time_secs;
        for (size_t i = 0; ok && i < s->n_hparams; i++) {
            const AccelTb__Value *u = s->hparams[i]->value, *v = hparam(t, s->hparams[i]->key);
            ok = v && u->kind_case == v->kind_case &&
                 (u->kind_case == ACCEL_TB__VALUE__KIND_STRING_VALUE ? !strcmp(u->string_value, v->string_value)
                                                                     : u->number_value == v->number_value);
        }
    } else if (ok) {
        ok = x->session_end_info->status == y->session_end_info->status;
    }
    if (x) accel_tb__hparams_plugin_data__free_unpacked(x, NULL);
    if (y) accel_tb__hparams_plugin_data__free_unpacked(y, NULL);
    return ok;
}

/* Event by event: the same kind, step, tag, value field, plugin and payload
 * (wall times differ). */
static void check_same_records(const records *mine, const records *ref, const char *what) {
    CHECK_MSG(mine->n == ref->n, "%s: %d records vs the real writer's %d", what, mine->n, ref->n);
    for (int i = 0; i < mine->n && i < ref->n; i++) {
        const AccelTb__Event *a = mine->ev[i], *b = ref->ev[i];
        CHECK_MSG(a->what_case == b->what_case && a->step == b->step && a->wall_time > 1e9,
                  "%s record %d: kind %d step %lld vs %d %lld", what, i, a->what_case, (long long)a->step,
                  b->what_case, (long long)b->step);
        if (a->what_case == ACCEL_TB__EVENT__WHAT_FILE_VERSION && b->what_case == a->what_case) {
            CHECK(!strcmp(a->file_version, "brain.Event:2") && !strcmp(b->file_version, a->file_version));
            continue;
        }
        const AccelTb__Summary__Value *u = value_of(a), *v = value_of(b);
        CHECK_MSG(u && v, "%s record %d: one summary value each", what, i);
        if (!u || !v) continue;
        CHECK_MSG(!strcmp(u->tag, v->tag) && u->value_case == v->value_case, "%s record %d: tag %s vs %s", what, i,
                  u->tag, v->tag);
        if (u->value_case == ACCEL_TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE && v->value_case == u->value_case)
            CHECK(u->simple_value == v->simple_value);
        CHECK_MSG(!u->metadata == !v->metadata, "%s record %d: metadata on one side only", what, i);
        if (u->metadata && v->metadata) {
            const AccelTb__SummaryMetadata__PluginData *p = u->metadata->plugin_data, *q = v->metadata->plugin_data;
            CHECK(p && q && !strcmp(p->plugin_name, q->plugin_name));
            if (p && q && !strcmp(p->plugin_name, "hparams")) CHECK_MSG(same_hparams(p->content, q->content), "%s", u->tag);
            else if (p && q) CHECK(same_bytes(p->content, q->content));
        }
        if (u->value_case == ACCEL_TB__SUMMARY__VALUE__VALUE_TENSOR && v->value_case == u->value_case) {
            const AccelTb__TensorProto *s = u->tensor, *t = v->tensor;
            CHECK(s->dtype == t->dtype && s->n_string_val == 1 && t->n_string_val == 1 &&
                  same_bytes(s->string_val[0], t->string_val[0]));
            CHECK(s->tensor_shape && t->tensor_shape && s->tensor_shape->n_dim == 1 && t->tensor_shape->n_dim == 1 &&
                  s->tensor_shape->dim[0]->size == t->tensor_shape->dim[0]->size);
        }
    }
}

static const accel_value CONFIG[] = {
    ACCEL_VALUE_F("lr", 0.001),
    ACCEL_VALUE_I("batch_size", 8),
    ACCEL_VALUE_S("model", "llama"),
    ACCEL_VALUE_B("shuffle", true),
};
#define N_CONFIG ((int)(sizeof CONFIG / sizeof *CONFIG))

/* ---------------------------------------------------------------- TensorBoard */

static void test_crc32c(void) {
    /* The check value of CRC-32C (RFC 3720's polynomial). */
    CHECK(accel__crc32c("123456789", 9) == 0xE3069283u);
    CHECK(accel__crc32c("", 0) == 0);
}

/* The real writer's files pass accel's CRC and protobuf reading. */
static void test_fixture_reads(void) {
    records r;
    CHECK(read_records("data/tensorboard/scalars_text.tfevents", &r));
    CHECK(r.n == 4 && r.ev[0]->what_case == ACCEL_TB__EVENT__WHAT_FILE_VERSION);
    records_free(&r);
    CHECK(read_records("data/tensorboard/hparams.tfevents", &r));
    CHECK(r.n == 4);
    records_free(&r);
}

static void test_tensorboard_matches_real_writer(void) {
    const char *keep = getenv("ACCEL_TRACKING_KEEP");
    char *dir = keep ? (char *)keep : temp_dir();
    accel_tracker *t = accel_tracker_open("tensorboard", "run", dir);
    CHECK(t && !strcmp(accel_tracker_name(t), "tensorboard"));
    accel_value step1[] = {ACCEL_VALUE_F("loss", 0.5), ACCEL_VALUE_F("lr", 0.001)};
    accel_value step2[] = {ACCEL_VALUE_S("note", "hello")};
    CHECK(accel_tracker_store_init_configuration(t, N_CONFIG, CONFIG) == ACCEL_OK);
    CHECK(accel_tracker_log(t, 2, step1, 1) == ACCEL_OK);
    CHECK(accel_tracker_log(t, 1, step2, 2) == ACCEL_OK);
    CHECK(accel_tracker_finish(t) == ACCEL_OK);

    char run[512], events[1024], sub[1024], sub_events[1400], yml[1400];
    snprintf(run, sizeof run, "%s/run", dir);
    CHECK(find_entry(run, "events.out.tfevents.", false, events, sizeof events));
    CHECK(find_entry(run, "1", true, sub, sizeof sub)); /* <time.time()> */
    CHECK(find_entry(sub, "events.out.tfevents.", false, sub_events, sizeof sub_events));
    records mine, ref;
    CHECK(read_records(events, &mine) && read_records("data/tensorboard/scalars_text.tfevents", &ref));
    check_same_records(&mine, &ref, "scalars/text");
    records_free(&mine);
    records_free(&ref);
    CHECK(read_records(sub_events, &mine) && read_records("data/tensorboard/hparams.tfevents", &ref));
    check_same_records(&mine, &ref, "hparams");
    records_free(&mine);
    records_free(&ref);

    snprintf(yml, sizeof yml, "%s/hparams.yml", sub);
    char *y = slurp(yml);
    CHECK(y && !strcmp(y, "batch_size: 8\nlr: 0.001\nmodel: llama\nshuffle: true\n"));
    free(y);
    if (!keep) rm_rf(dir);
}

/* ---------------------------------------------------------------- JSONL / CSV */

static void test_jsonl(void) {
    char *dir = temp_dir();
    accel_tracker *t = accel_tracker_open("jsonl", "p", dir);
    accel_value a[] = {ACCEL_VALUE_F("loss", 0.25), ACCEL_VALUE_S("phase", "train")};
    accel_value b[] = {ACCEL_VALUE_I("tokens", 64), ACCEL_VALUE_B("eval", false), ACCEL_VALUE_F("nan", NAN)};
    CHECK(accel_tracker_store_init_configuration(t, N_CONFIG, CONFIG) == ACCEL_OK);
    CHECK(accel_tracker_log(t, 2, a, 3) == ACCEL_OK);
    CHECK(accel_tracker_log(t, 3, b, -1) == ACCEL_OK);
    CHECK(accel_tracker_finish(t) == ACCEL_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/p/log.jsonl", dir);
    char *s = slurp(path);
    CHECK_MSG(s && !strcmp(s, "{\"step\":3,\"loss\":0.25,\"phase\":\"train\"}\n"
                              "{\"tokens\":64,\"eval\":false,\"nan\":null}\n"), "%s", s);
    free(s);
    snprintf(path, sizeof path, "%s/p/config.json", dir);
    s = slurp(path);
    CHECK_STR_CONTAINS(s, "\"batch_size\": 8,\n  \"lr\": 0.001,\n  \"model\": \"llama\",\n  \"shuffle\": true");
    free(s);
    rm_rf(dir);
}

static void test_csv_widens(void) {
    char *dir = temp_dir();
    accel_tracker *t = accel_tracker_open("csv", "p", dir);
    accel_value a[] = {ACCEL_VALUE_F("loss", 0.5), ACCEL_VALUE_S("note", "a,\"b\"\nc")};
    accel_value b[] = {ACCEL_VALUE_F("acc", 0.75)};
    accel_value c[] = {ACCEL_VALUE_F("loss", 0.003)}; /* shortest repr, as Python writes it */
    CHECK(accel_tracker_log(t, 2, a, 1) == ACCEL_OK);
    CHECK(accel_tracker_log(t, 1, b, 2) == ACCEL_OK);
    CHECK(accel_tracker_log(t, 1, c, -1) == ACCEL_OK);
    CHECK(accel_tracker_finish(t) == ACCEL_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/p/log.csv", dir);
    char *s = slurp(path);
    CHECK_MSG(s && !strcmp(s, "step,loss,note,acc\n1,0.5,\"a,\"\"b\"\"\nc\",\n2,,,0.75\n,0.003,,\n"), "%s", s);
    free(s);
    rm_rf(dir);
}

/* A csv run in a folder that holds an earlier run's log.csv keeps it, as
 * log.1.csv, then log.2.csv (it was deleted). */
static void test_csv_keeps_earlier_runs(void) {
    char *dir = temp_dir();
    accel_value v[] = {ACCEL_VALUE_F("loss", 0.5)};
    for (int run = 0; run < 3; run++) {
        accel_tracker *t = accel_tracker_open("csv", "p", dir);
        CHECK(t != NULL);
        CHECK(accel_tracker_log(t, 1, v, run) == ACCEL_OK);
        CHECK(accel_tracker_finish(t) == ACCEL_OK);
    }
    const char *files[] = {"log.1.csv", "log.2.csv", "log.csv"};
    for (int run = 0; run < 3; run++) {
        char path[512], want[64];
        snprintf(path, sizeof path, "%s/p/%s", dir, files[run]);
        snprintf(want, sizeof want, "step,loss\n%d,0.5\n", run);
        char *s = slurp(path);
        CHECK_MSG(s && !strcmp(s, want), "%s: %s", files[run], s ? s : "missing");
        free(s);
    }
    rm_rf(dir);
}

/* A value named "step" (Hugging Face's no_trainer examples log {"step":
 * completed_steps} with step=completed_steps) is the record's step: equal,
 * written once; with no step, the step; different or not a whole number,
 * refused naming both, the file untouched (jsonl wrote it in place of the
 * step, csv dropped it). */
static void test_step_value(void) {
    for (int csv = 0; csv < 2; csv++) {
        char *dir = temp_dir();
        accel_tracker *t = accel_tracker_open(csv ? "csv" : "jsonl", "p", dir);
        accel_value same[] = {ACCEL_VALUE_I("step", 3), ACCEL_VALUE_F("acc", 0.5)};
        accel_value alone[] = {ACCEL_VALUE_F("acc", 0.25), ACCEL_VALUE_F("step", 5.0)};
        accel_value other[] = {ACCEL_VALUE_I("step", 7)}, frac[] = {ACCEL_VALUE_F("step", 2.5)};
        CHECK(accel_tracker_log(t, 2, same, 3) == ACCEL_OK);
        CHECK(accel_tracker_log(t, 2, alone, -1) == ACCEL_OK);
        CHECK(accel_tracker_log(t, 1, other, 3) == ACCEL_ERR_INVALID_ARG);
        CHECK_STR_CONTAINS(accel_last_error(), "a value named \"step\" (7) differs from the step (3)");
        CHECK(accel_tracker_log(t, 1, frac, -1) == ACCEL_ERR_INVALID_ARG);
        CHECK_STR_CONTAINS(accel_last_error(), "must be a whole number >= 0");
        accel_clear_error();
        CHECK(accel_tracker_finish(t) == ACCEL_OK);
        char path[512];
        snprintf(path, sizeof path, "%s/p/log.%s", dir, csv ? "csv" : "jsonl");
        char *s = slurp(path);
        const char *want = csv ? "step,acc\n3,0.5\n5,0.25\n" : "{\"step\":3,\"acc\":0.5}\n{\"step\":5,\"acc\":0.25}\n";
        CHECK_MSG(s && !strcmp(s, want), "%s", s);
        free(s);
        rm_rf(dir);
    }
}

static void test_tracker_errors(void) {
    accel_clear_error();
    CHECK(!strcmp(accel_tracker_builtin(0), "tensorboard") && !strcmp(accel_tracker_builtin(2), "csv"));
    CHECK(!accel_tracker_builtin(3) && !accel_tracker_builtin(-1));
    CHECK(!accel_tracker_open("wandb", "p", "/tmp"));
    CHECK_STR_CONTAINS(accel_last_error(), "unknown tracker 'wandb'");
    accel_clear_error();
    CHECK(!accel_tracker_open("jsonl", "p", "/proc/no/such"));
    CHECK(accel_last_status() == ACCEL_ERR_IO);
    accel_clear_error();
    static const accel_tracker_ops ops = {.name = "nothing"};
    accel_tracker *t = accel_tracker_new(&ops, NULL);
    accel_value bad[] = {ACCEL_VALUE_S("s", NULL)};
    CHECK(accel_tracker_log(t, 1, bad, 0) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "string 's' is NULL");
    accel_clear_error();
    accel_value nokey[] = {ACCEL_VALUE_F("", 1)};
    CHECK(accel_tracker_log(t, 1, nokey, 0) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    CHECK(accel_tracker_finish(t) == ACCEL_OK);
}

/* ---------------------------------------------------------------- Accelerator trackers */

typedef struct counts {
    int configs, logs, finishes;
    int64_t last_step;
    double last_loss;
} counts;

static accel_status my_config(void *ctx, int n, const accel_value *c) {
    ((counts *)ctx)->configs += n;
    return ACCEL_OK;
}
static accel_status my_log(void *ctx, int n, const accel_value *v, int64_t step) {
    counts *k = ctx;
    k->logs++;
    k->last_step = step;
    k->last_loss = n ? v[0].f : NAN;
    return ACCEL_OK;
}
static accel_status my_finish(void *ctx) {
    ((counts *)ctx)->finishes++;
    return ACCEL_OK;
}

/* dir/exp's csv and jsonl logs hold the one line of loss 1.5 at step 7. */
static void check_exp_logs(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/exp/log.csv", dir);
    char *s = slurp(path);
    CHECK(s && !strcmp(s, "step,loss\n7,1.5\n"));
    free(s);
    snprintf(path, sizeof path, "%s/exp/log.jsonl", dir);
    s = slurp(path);
    CHECK(s && !strcmp(s, "{\"step\":7,\"loss\":1.5}\n"));
    free(s);
}

static void test_accelerator_trackers(void) {
    char *dir = temp_dir();
    setenv("ACCEL_LOG_WITH", "jsonl, csv", 1);
    setenv("ACCEL_PROJECT_DIR", dir, 1);
    accel_accelerator *acc = accel_accelerator_new(NULL);
    CHECK(acc);
    static const accel_tracker_ops ops = {"mine", my_config, my_log, my_finish};
    counts k = {0};
    CHECK(accel_accelerator_add_tracker(acc, accel_tracker_new(&ops, &k)) == ACCEL_OK);
    /* a bad config is refused (n < 0 was taken as no config) and does not use up the call */
    CHECK(accel_accelerator_init_trackers(acc, "exp", -1, NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_init_trackers: -1 values");
    CHECK(accel_accelerator_init_trackers(acc, "exp", 2, NULL) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    CHECK(accel_accelerator_init_trackers(acc, "exp", N_CONFIG, CONFIG) == ACCEL_OK);
    CHECK(accel_accelerator_init_trackers(acc, "exp", 0, NULL) == ACCEL_ERR_STATE);
    accel_clear_error();
    accel_value v[] = {ACCEL_VALUE_F("loss", 1.5)};
    CHECK(accel_accelerator_log(acc, 1, v, 7) == ACCEL_OK);
    CHECK(k.configs == N_CONFIG && k.logs == 1 && k.last_step == 7 && k.last_loss == 1.5);
    CHECK(accel_accelerator_get_tracker(acc, "csv") && accel_accelerator_get_tracker(acc, "jsonl"));
    CHECK(!accel_accelerator_get_tracker(acc, "tensorboard"));
    CHECK(accel_tracker_context(accel_accelerator_get_tracker(acc, "mine")) == &k);
    CHECK(accel_accelerator_end_training(acc) == ACCEL_OK);
    CHECK(k.finishes == 1);
    CHECK(accel_accelerator_end_training(acc) == ACCEL_OK && k.finishes == 1);
    accel_accelerator_free(acc);
    check_exp_logs(dir);

    /* Without end_training, free finishes the trackers. */
    acc = accel_accelerator_new(NULL);
    counts k2 = {0};
    accel_accelerator_add_tracker(acc, accel_tracker_new(&ops, &k2));
    accel_accelerator_free(acc);
    CHECK(k2.finishes == 1);

    /* The values are checked with no tracker open too (as on the ranks that
     * write nothing): a bad key fails wherever log is called, not only where
     * a tracker would have written it. */
    unsetenv("ACCEL_LOG_WITH");
    acc = accel_accelerator_new(NULL);
    accel_value bad[] = {ACCEL_VALUE_F("lo\xffss", 1.0)}, none[] = {ACCEL_VALUE_F("", 1.0)};
    CHECK(accel_accelerator_log(acc, 1, bad, 1) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_log: key 'lo");
    CHECK(accel_accelerator_log(acc, 1, none, 1) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "value 0 has no key");
    CHECK(accel_accelerator_log(acc, -1, NULL, 1) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    CHECK(accel_accelerator_log(acc, 1, v, 1) == ACCEL_OK);
    accel_accelerator_free(acc);

    setenv("ACCEL_LOG_WITH", "tensorboard,wandb", 1);
    accel_clear_error();
    CHECK(!accel_accelerator_new(NULL));
    CHECK_STR_CONTAINS(accel_last_error(), "unknown tracker 'wandb' in log_with");
    accel_clear_error();
    unsetenv("ACCEL_LOG_WITH");
    unsetenv("ACCEL_PROJECT_DIR");
    rm_rf(dir);
}

/* A log_with tracker that cannot be opened (here log.csv is a directory)
 * fails init_trackers naming it and keeps none of log_with's trackers, and
 * the call does not count: once the cause is gone, init_trackers opens them
 * (it answered "already initialized" for good, and logged to what had opened). */
static void test_init_trackers_retry(void) {
    char *dir = temp_dir(), path[512];
    snprintf(path, sizeof path, "%s/exp", dir);
    CHECK(mkdir(path, 0777) == 0);
    snprintf(path, sizeof path, "%s/exp/log.csv", dir);
    CHECK(mkdir(path, 0777) == 0);
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.log_with = "jsonl,csv";
    o.project_dir = dir;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK(acc);
    static const accel_tracker_ops ops = {"mine", my_config, my_log, my_finish};
    counts k = {0};
    CHECK(accel_accelerator_add_tracker(acc, accel_tracker_new(&ops, &k)) == ACCEL_OK);
    CHECK(accel_accelerator_init_trackers(acc, "exp", N_CONFIG, CONFIG) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "log.csv");
    CHECK_STR_CONTAINS(accel_last_error(), "call init_trackers again");
    CHECK(!accel_accelerator_get_tracker(acc, "jsonl") && !accel_accelerator_get_tracker(acc, "csv"));
    CHECK(accel_accelerator_get_tracker(acc, "mine") && k.configs == 0 && k.finishes == 0);
    accel_clear_error();
    CHECK(rmdir(path) == 0);
    CHECK(accel_accelerator_init_trackers(acc, "exp", N_CONFIG, CONFIG) == ACCEL_OK);
    CHECK(accel_accelerator_get_tracker(acc, "jsonl") && accel_accelerator_get_tracker(acc, "csv"));
    CHECK(k.configs == N_CONFIG);
    accel_value v[] = {ACCEL_VALUE_F("loss", 1.5)};
    CHECK(accel_accelerator_log(acc, 1, v, 7) == ACCEL_OK);
    CHECK(accel_accelerator_init_trackers(acc, "exp", 0, NULL) == ACCEL_ERR_STATE);
    accel_clear_error();
    accel_accelerator_free(acc);
    CHECK(k.finishes == 1);
    check_exp_logs(dir);
    rm_rf(dir);
}

/* ---------------------------------------------------------------- logger */

static char *read_stream(FILE *f) {
    fflush(f);
    long n = ftell(f);
    char *s = calloc(1, (size_t)n + 1);
    rewind(f);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = '\0';
    rewind(f);
    if (ftruncate(fileno(f), 0)) s[0] = '\0';
    return s;
}

static void test_logger(void) {
    FILE *f = tmpfile();
    setenv("ACCEL_LOG_LEVEL", "info", 1);
    accel_logger *lg = accel_get_logger("test.logger");
    CHECK(lg == accel_get_logger("test.logger") && accel_logger_level(lg) == ACCEL_LOG_INFO);
    accel_logger_set_stream(lg, f);
    accel_log_info(lg, "epoch %d", 3);
    accel_log_debug(lg, "hidden");
    char *s = read_stream(f);
    CHECK_MSG(!strcmp(s, "INFO:test.logger:[RANK 0] epoch 3\n"), "%s", s);
    free(s);

    /* ACCELERATE_LOG_LEVEL when ACCEL_LOG_LEVEL is unset; WARNING otherwise. */
    unsetenv("ACCEL_LOG_LEVEL");
    setenv("ACCELERATE_LOG_LEVEL", "ERROR", 1);
    CHECK(accel_logger_level(accel_get_logger("test.second")) == ACCEL_LOG_ERROR);
    unsetenv("ACCELERATE_LOG_LEVEL");
    CHECK(accel_logger_level(accel_get_logger("test.third")) == ACCEL_LOG_WARNING);
    CHECK(accel_log_level_parse("Warning") == ACCEL_LOG_WARNING && accel_log_level_parse("15") == 15);
    CHECK(accel_log_level_parse("loud") == -1);

    /* Another rank (no accelerator: the launcher's RANK): main_process_only drops it. */
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    accel_log_warning(lg, "main only");
    accel_logger_log(lg, ACCEL_LOG_WARNING, ACCEL_LOG_ALL_PROCESSES, "everyone");
    s = read_stream(f);
    CHECK_MSG(!strcmp(s, "WARNING:test.logger:[RANK 1] everyone\n"), "%s", s);
    free(s);
    accel_clear_error();
    CHECK(accel_logger_log(lg, ACCEL_LOG_INFO, ACCEL_LOG_IN_ORDER, "x") == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "You must initialize the accelerate state");
    accel_clear_error();
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");

    /* With an accelerator (one process) in_order just logs. */
    accel_accelerator *acc = accel_accelerator_new(NULL);
    CHECK(accel_logger_log(lg, ACCEL_LOG_INFO, ACCEL_LOG_IN_ORDER, "ordered") == ACCEL_OK);
    accel_accelerator_free(acc);
    s = read_stream(f);
    CHECK(!strcmp(s, "INFO:test.logger:[RANK 0] ordered\n"));
    free(s);
    accel_logger_set_stream(lg, NULL);
    fclose(f);
}

/* The library's warnings (here bigmodel's, when the caller gave no stream)
 * go through the "accel" logger, on every rank. */
static void test_library_warnings(void) {
    FILE *f = tmpfile();
    accel_logger *lg = accel_get_logger("accel");
    accel_logger_set_stream(lg, f);
    accel_module *m = accel_linear_new(2, 2, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_device_map *map = accel_device_map_new();
    accel_device_map_set(map, "", "cpu");
    accel_device_map_set(map, "nowhere", "cpu");
    CHECK(accel_check_device_map(m, map, NULL) == ACCEL_OK);
    char *s = read_stream(f);
    CHECK_MSG(!strcmp(s, "WARNING:accel:[RANK 0] The following device_map keys do not match any submodules in "
                         "the model: ['nowhere']\n"), "%s", s);
    free(s);
    accel_logger_set_level(lg, ACCEL_LOG_ERROR);
    CHECK(accel_check_device_map(m, map, NULL) == ACCEL_OK);
    s = read_stream(f);
    CHECK(!*s); /* ACCEL_LOG_LEVEL=error silences them */
    free(s);
    accel_logger_set_level(lg, ACCEL_LOG_WARNING);
    accel_logger_set_stream(lg, NULL);
    accel_device_map_free(map);
    accel_module_free(m);
    fclose(f);
}

/* ---------------------------------------------------------------- progress */

static void test_progress_plain_lines(void) {
    FILE *f = tmpfile();
    accel_progress_opts o = accel_progress_opts_default();
    o.desc = "train";
    o.stream = f;
    o.min_interval = -1; /* every update */
    accel_progress *p = accel_progress_new(4, &o);
    accel_progress_set_loss(p, 1.25);
    accel_progress_add_tokens(p, 100);
    accel_progress_update(p, 1);
    accel_progress_update(p, 2);
    accel_progress_set_postfix(p, "lr=%g", 0.5);
    accel_progress_update(p, 1);
    CHECK(accel_progress_count(p) == 4);
    accel_progress_close(p);
    char *s = read_stream(f);
    int lines = 0;
    for (char *c = s; *c; c++) lines += *c == '\n';
    CHECK_MSG(lines == 4, "%s", s); /* three updates and the close */
    CHECK_STR_CONTAINS(s, "train:  25%|##        | 1/4 [");
    CHECK_STR_CONTAINS(s, "train: 100%|##########| 4/4 [");
    CHECK_STR_CONTAINS(s, "<00:00, "); /* nothing left at the end */
    CHECK_STR_CONTAINS(s, "it/s, loss=1.2500, tok/s=");
    CHECK_STR_CONTAINS(s, ", lr=0.5]\n");
    CHECK(!strchr(s, '\r'));
    free(s);

    /* Unknown total: a count and a rate. */
    p = accel_progress_new(0, &o);
    accel_progress_update(p, 5);
    accel_progress_close(p);
    s = read_stream(f);
    CHECK_STR_CONTAINS(s, "train: 5it [");
    free(s);

    /* Absurd counts saturate (no signed overflow) and still draw. */
    p = accel_progress_new(INT64_MAX, &o);
    accel_progress_update(p, 1);
    accel_progress_close(p);
    p = accel_progress_new(4, &o);
    accel_progress_update(p, INT64_MAX);
    accel_progress_update(p, INT64_MAX);
    CHECK(accel_progress_count(p) == INT64_MAX);
    accel_progress_update(p, INT64_MIN);
    accel_progress_update(p, INT64_MIN);
    CHECK(accel_progress_count(p) == INT64_MIN);
    accel_progress_close(p);
    free(read_stream(f));

    /* Off: the environment, the flag, a delay not reached, another rank. */
    setenv("ACCEL_DISABLE_PROGRESS", "1", 1);
    p = accel_progress_new(4, &o);
    accel_progress_update(p, 4);
    accel_progress_close(p);
    unsetenv("ACCEL_DISABLE_PROGRESS");
    o.disable = true;
    p = accel_progress_new(4, &o);
    accel_progress_update(p, 4);
    accel_progress_close(p);
    o.disable = false;
    o.delay = 3600; /* work shorter than the delay stays quiet, also at the close */
    p = accel_progress_new(4, &o);
    accel_progress_update(p, 4);
    accel_progress_close(p);
    o.delay = 0;
    setenv("RANK", "1", 1);
    p = accel_progress_new(4, &o);
    accel_progress_update(p, 4);
    CHECK(accel_progress_count(p) == 4);
    accel_progress_close(p);
    unsetenv("RANK");
    s = read_stream(f);
    CHECK_MSG(!*s, "%s", s);
    free(s);
    fclose(f);
}

/* On a terminal: one line redrawn with '\r', eighth-block bar, newline at the close. */
static void test_progress_terminal(void) {
    int master, slave;
    CHECK(openpty(&master, &slave, NULL, NULL, NULL) == 0);
    FILE *tty = fdopen(slave, "w");
    accel_progress_opts o = accel_progress_opts_default();
    o.desc = "tty";
    o.stream = tty;
    o.min_interval = -1;
    accel_progress *p = accel_progress_new(16, &o);
    accel_progress_update(p, 3); /* 3/16 of 10 cells = 15 eighths: one full cell and 7/8 of the next */
    accel_progress_update(p, 13);
    accel_progress_close(p);
    fclose(tty);
    /* Everything the slave side wrote, until the master reads EIO (slave closed). */
    char buf[2048];
    ssize_t n = 0, r;
    while (n < (ssize_t)sizeof buf - 1 && (r = read(master, buf + n, sizeof buf - 1 - (size_t)n)) > 0) n += r;
    close(master);
    buf[n] = '\0';
    CHECK_STR_CONTAINS(buf, "\rtty:  19%|█▉        | 3/16 [");
    CHECK_STR_CONTAINS(buf, "\rtty: 100%|██████████| 16/16 [");
    CHECK(n > 0 && strchr(buf, '\n') == buf + n - 1); /* redrawn in place, one line break at the close */
}

static void test_progress_over_loader(void) {
    float xs[10] = {0};
    accel_tensor *x = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(10, 1), ACCEL_CPU_DEVICE);
    memcpy(x->data, xs, sizeof xs);
    accel_dataset *ds = accel_tensor_dataset_new(1, (accel_tensor *[]){x});
    accel_dataloader_opts lo = accel_dataloader_opts_default();
    lo.batch_size = 3;
    accel_dataloader *dl = accel_dataloader_new(ds, &lo);
    FILE *f = tmpfile();
    accel_progress_opts o = accel_progress_opts_default();
    o.stream = f;
    o.min_interval = 3600; /* only the close draws */
    accel_progress *p = accel_progress_over_loader(dl, &o);
    accel_batch b;
    int batches = 0;
    while (accel_progress_next(p, dl, &b)) batches++, accel_step_reset();
    CHECK(batches == 4 && accel_progress_count(p) == 4);
    accel_progress_close(p);
    char *s = read_stream(f);
    CHECK_MSG(!strncmp(s, "100%|##########| 4/4 [", 22), "%s", s);
    free(s);
    fclose(f);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    accel_tensor_free(x);
}

/* ---------------------------------------------------------------- saving anything */

typedef struct counter {
    int64_t value;
} counter;

static accel_status counter_save(void *obj, void **data, size_t *len) {
    *data = malloc(sizeof(int64_t));
    memcpy(*data, &((counter *)obj)->value, sizeof(int64_t));
    *len = sizeof(int64_t);
    return ACCEL_OK;
}

static accel_status counter_load(void *obj, const void *data, size_t len) {
    if (len != sizeof(int64_t)) return accel_set_error(ACCEL_ERR_FORMAT, "counter: %zu bytes", len);
    memcpy(&((counter *)obj)->value, data, len);
    return ACCEL_OK;
}

static void test_register_for_checkpointing(void) {
    char *dir = temp_dir();
    char ck[512];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    accel_accelerator *acc = accel_accelerator_new(NULL);
    counter c = {41};
    char blob[6] = "hello";
    CHECK(accel_accelerator_register_for_checkpointing(acc, &c, counter_save, counter_load) == ACCEL_OK);
    CHECK(accel_accelerator_register_blob_for_checkpointing(acc, blob, sizeof blob) == ACCEL_OK);
    CHECK(accel_accelerator_register_for_checkpointing(acc, &c, counter_save, NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "must include a `state_dict` and `load_state_dict`");
    accel_clear_error();
    CHECK(accel_accelerator_save_state(acc, ck, NULL, 0) == ACCEL_OK);
    c.value = 0;
    memcpy(blob, "xxxxx", 6);
    CHECK(accel_accelerator_load_state(acc, ck, NULL) == ACCEL_OK);
    CHECK(c.value == 41 && !strcmp(blob, "hello"));
    accel_accelerator_free(acc);

    /* Loading with fewer registered objects than saved ones. */
    acc = accel_accelerator_new(NULL);
    CHECK(accel_accelerator_register_for_checkpointing(acc, &c, counter_save, counter_load) == ACCEL_OK);
    CHECK(accel_accelerator_load_state(acc, ck, NULL) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "Found checkpoints: 2\n\tRegistered objects: 1");
    accel_clear_error();
    accel_accelerator_free(acc);

    /* A blob of another size: refused before anything is loaded (the
     * counter registered before it kept its value; it was loaded, 41) */
    acc = accel_accelerator_new(NULL);
    char small[3];
    c.value = 0;
    accel_accelerator_register_for_checkpointing(acc, &c, counter_save, counter_load);
    accel_accelerator_register_blob_for_checkpointing(acc, small, sizeof small);
    CHECK(accel_accelerator_load_state(acc, ck, NULL) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "holds 6 bytes, the registered blob 1 is 3");
    CHECK(c.value == 0);
    accel_clear_error();
    accel_accelerator_free(acc);
    rm_rf(dir);
}

/* load_state refused for a registered blob of another size changes nothing:
 * the model's weight (7 in the checkpoint) stays the fresh run's, as the
 * step and the generator's seed do (the weight was loaded, then the blob
 * refused). */
static void test_refused_load_changes_nothing(void) {
    char *dir = temp_dir();
    char ck[512], big[32] = "saved", blob[16] = "fresh";
    snprintf(ck, sizeof ck, "%s/ck", dir);
    for (int run = 0; run < 2; run++) { /* 0 saves, 1 loads */
        accel_manual_seed(run ? 5 : 1234);
        accel_accelerator *acc = accel_accelerator_new(NULL);
        accel_module *m = accel_linear_new(2, 1, false, ACCEL_CPU_DEVICE, ACCEL_F32);
        accel_tensor *w = accel_module_get_tensor(m, "weight");
        accel_fill_(w, run ? 0.0 : 7.0);
        CHECK(accel_accelerator_prepare(acc, m) == ACCEL_OK);
        if (run) {
            CHECK(accel_accelerator_register_blob_for_checkpointing(acc, blob, sizeof blob) == ACCEL_OK);
            CHECK(accel_accelerator_load_state(acc, ck, NULL) == ACCEL_ERR_FORMAT);
            CHECK_STR_CONTAINS(accel_last_error(), "holds 32 bytes, the registered blob 0 is 16");
            accel_clear_error();
            CHECK(accel_get(w, (int64_t[]){0, 0}) == 0.0 && accel_accelerator_step(acc) == 0);
            CHECK(accel_default_rng()->seed == 5 && !strcmp(blob, "fresh"));
        } else {
            CHECK(accel_accelerator_register_blob_for_checkpointing(acc, big, sizeof big) == ACCEL_OK);
            for (int i = 0; i < 3; i++) CHECK(accel_accelerator_accumulate(acc) == ACCEL_OK);
            CHECK(accel_accelerator_save_state(acc, ck, NULL, 0) == ACCEL_OK);
        }
        accel_accelerator_free(acc);
        accel_module_free(m);
    }
    rm_rf(dir);
}

/* A callback of the user's that fails (a registered object's save or load,
 * a tracker's log, store_init_configuration or finish) is named in the
 * call's error, with its own message when it set one; one that returns its
 * status alone is said to give no reason: the slot still held an earlier,
 * handled failure (a fresh run's "no complete checkpoint_*"), which the
 * error showed as this call's. */
static bool g_fail_quietly;
static accel_status failing_save(void *obj, void **data, size_t *len) {
    (void)obj, (void)data, (void)len;
    return g_fail_quietly ? ACCEL_ERR_IO : accel_set_error(ACCEL_ERR_IO, "the object's disk is full");
}
static accel_status failing_load(void *obj, const void *data, size_t len) {
    (void)obj, (void)data, (void)len;
    return ACCEL_ERR_FORMAT;
}
static accel_status failing_log(void *ctx, int n, const accel_value *v, int64_t step) {
    (void)ctx, (void)n, (void)v, (void)step;
    return ACCEL_ERR_IO;
}
static accel_status failing_finish(void *ctx) {
    (void)ctx;
    return ACCEL_ERR_IO;
}

static void test_callback_failures_named(void) {
    char *dir = temp_dir();
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.project_dir = dir;
    o.automatic_checkpoint_naming = true;
    accel_accelerator *acc = accel_accelerator_new(&o);
    int obj = 0;
    CHECK(accel_accelerator_register_for_checkpointing(acc, &obj, failing_save, failing_load) == ACCEL_OK);
    static const accel_tracker_ops ops = {.name = "mine", .log = failing_log, .finish = failing_finish};
    CHECK(accel_accelerator_add_tracker(acc, accel_tracker_new(&ops, NULL)) == ACCEL_OK);
    CHECK(accel_accelerator_init_trackers(acc, "p", 0, NULL) == ACCEL_OK);
    CHECK(accel_accelerator_load_state(acc, NULL, NULL) == ACCEL_ERR_IO); /* a fresh run: handled */
    g_fail_quietly = true;
    CHECK(accel_accelerator_save_state(acc, NULL, NULL, 0) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_save_state: the save of registered object 0 failed "
                                           "(I/O error) and gave no reason");
    CHECK(!strstr(accel_last_error(), "no complete checkpoint"));
    g_fail_quietly = false;
    CHECK(accel_accelerator_save_state(acc, NULL, NULL, 0) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "the save of registered object 0 failed: the object's disk is full");
    accel_value v[] = {ACCEL_VALUE_F("loss", 1.0)};
    CHECK(accel_accelerator_log(acc, 1, v, 0) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_log: the log of tracker 'mine' failed (I/O error) and "
                                           "gave no reason");
    CHECK(accel_accelerator_end_training(acc) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_end_training: the finish of tracker 'mine' failed");
    accel_accelerator_free(acc);

    /* a checkpoint whose object's load fails */
    char ck[512];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    acc = accel_accelerator_new(NULL);
    counter saved = {41};
    CHECK(accel_accelerator_register_for_checkpointing(acc, &saved, counter_save, failing_load) == ACCEL_OK);
    CHECK(accel_accelerator_save_state(acc, ck, NULL, 0) == ACCEL_OK);
    CHECK(accel_accelerator_load_state(acc, ck, NULL) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_load_state: the load of registered object 0 failed "
                                           "(format error) and gave no reason");
    accel_clear_error();
    accel_accelerator_free(acc);
    rm_rf(dir);
}

/* A tracker whose store_init_configuration fails fails init_trackers, which
 * does not count (it did: "already initialized" for good, the config never
 * stored) and keeps none of log_with's trackers it opened: made again once
 * the cause is fixed, it opens them and stores the config once. */
static int g_store_fails;
static accel_status flaky_config(void *ctx, int n, const accel_value *c) {
    if (g_store_fails) return accel_set_error(ACCEL_ERR_IO, "tracker service unreachable");
    return my_config(ctx, n, c);
}

static void test_init_trackers_store_retry(void) {
    char *dir = temp_dir();
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.log_with = "jsonl";
    o.project_dir = dir;
    accel_accelerator *acc = accel_accelerator_new(&o);
    static const accel_tracker_ops ops = {"remote", flaky_config, my_log, my_finish};
    static const accel_tracker_ops first = {"first", my_config, my_log, my_finish};
    counts k = {0}, k0 = {0};
    CHECK(accel_accelerator_add_tracker(acc, accel_tracker_new(&first, &k0)) == ACCEL_OK);
    CHECK(accel_accelerator_add_tracker(acc, accel_tracker_new(&ops, &k)) == ACCEL_OK);
    g_store_fails = 1;
    CHECK(accel_accelerator_init_trackers(acc, "exp", N_CONFIG, CONFIG) == ACCEL_ERR_IO);
    CHECK(k0.configs == N_CONFIG); /* the tracker before the failing one took it */
    CHECK_STR_CONTAINS(accel_last_error(), "the store_init_configuration of tracker 'remote' failed: tracker "
                                           "service unreachable (the call does not count: fix it and call "
                                           "init_trackers again)");
    CHECK(!accel_accelerator_get_tracker(acc, "jsonl") && k.configs == 0);
    g_store_fails = 0;
    CHECK_MSG(accel_accelerator_init_trackers(acc, "exp", N_CONFIG, CONFIG) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_accelerator_get_tracker(acc, "jsonl") && k.configs == N_CONFIG);
    CHECK_MSG(k0.configs == N_CONFIG, "the retry stored the config again into a tracker that took it (%d)", k0.configs);
    CHECK(accel_accelerator_init_trackers(acc, "exp", 0, NULL) == ACCEL_ERR_STATE);
    accel_clear_error();
    accel_accelerator_free(acc);
    CHECK(k.finishes == 1 && k0.finishes == 1);
    rm_rf(dir);
}

static void test_save_and_load(void) {
    char *dir = temp_dir();
    char path[512], tpath[512];
    snprintf(path, sizeof path, "%s/obj.bin", dir);
    snprintf(tpath, sizeof tpath, "%s/t.safetensors", dir);
    accel_accelerator *acc = accel_accelerator_new(NULL);
    CHECK(accel_accelerator_save_bytes(acc, path, "abc", 3) == ACCEL_OK);
    void *data;
    size_t len;
    CHECK(accel_load_bytes(path, &data, &len) == ACCEL_OK && len == 3 && !memcmp(data, "abc", 3));
    free(data);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0); /* renamed into place */
    accel_tensor *t = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE);
    ((float *)t->data)[1] = 3.5f;
    const char *names[] = {"w"};
    CHECK(accel_accelerator_save_tensors(acc, tpath, 1, names, &t) == ACCEL_OK);
    accel_safetensors *st = accel_safetensors_open(tpath);
    CHECK(st && accel_safetensors_count(st) == 1 && !strcmp(accel_safetensors_metadata(st, "format"), "pt"));
    accel_safetensors_close(st);
    accel_tensor_free(t);
    CHECK(accel_load_bytes("/no/such/file", &data, &len) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "/no/such/file");
    accel_clear_error();
    accel_accelerator_free(acc);
    rm_rf(dir);
}

/* ---------------------------------------------------------------- find_executable_batch_size */

/* An allocator that refuses anything above a limit, as a full device would. */
static size_t alloc_limit;
static void *limited_alloc(void *ctx, size_t bytes, size_t align) {
    (void)ctx;
    if (bytes > alloc_limit) return NULL;
    void *p = NULL;
    return posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, bytes) ? NULL : p;
}
static void limited_free(void *ctx, void *p) { (void)ctx, free(p); }

typedef struct tries {
    int n;
    int64_t sizes[32];
} tries;

enum { ROW = 1 << 16 }; /* floats per batch row: 256 KiB */

static accel_status train_rows(void *ctx, int64_t bs) {
    tries *t = ctx;
    if (t->n < 32) t->sizes[t->n++] = bs;
    accel_tensor *x = accel_empty(ACCEL_F32, ACCEL_SHAPE(bs, ROW));
    return x ? ACCEL_OK : accel_last_status();
}

static int64_t halve(void *ctx, int64_t bs) { return bs / 2; }

static accel_status never_fits(void *ctx, int64_t bs) {
    ++*(int *)ctx;
    return accel_set_error(ACCEL_ERR_OOM, "out of memory allocating %lld rows", (long long)bs);
}

static accel_status shape_error(void *ctx, int64_t bs) {
    ++*(int *)ctx;
    return accel_set_error(ACCEL_ERR_SHAPE, "not a memory problem");
}

static void test_find_executable_batch_size(void) {
    accel_thread_cleanup();
    alloc_limit = (size_t)50 * ROW * sizeof(float); /* 50 rows fit */
    accel_set_allocator(&(accel_allocator){limited_alloc, limited_free, NULL});
    tries t = {0};
    int64_t found = 0;
    CHECK(accel_find_executable_batch_size(train_rows, &t, 128, NULL, &found) == ACCEL_OK);
    static const int64_t want[] = {128, 115, 103, 92, 82, 73, 65, 58, 52, 46};
    CHECK_MSG(t.n == 10 && found == 46, "%d tries, found %lld", t.n, (long long)found);
    for (int i = 0; i < t.n && i < 10; i++) CHECK(t.sizes[i] == want[i]);
    CHECK(accel_last_status() == ACCEL_OK);

    tries h = {0};
    CHECK(accel_find_executable_batch_size(train_rows, &h, 128, halve, &found) == ACCEL_OK);
    CHECK(h.n == 3 && found == 32);

    accel_thread_cleanup();
    accel_set_allocator(NULL);

    int calls = 0;
    CHECK(accel_find_executable_batch_size(never_fits, &calls, 8, halve, &found) == ACCEL_ERR_OOM);
    CHECK_STR_CONTAINS(accel_last_error(), "No executable batch size found, reached zero.");
    CHECK(calls == 4); /* 8 4 2 1 */
    accel_clear_error();
    calls = 0;
    CHECK(accel_find_executable_batch_size(never_fits, &calls, 2, NULL, &found) == ACCEL_ERR_OOM);
    CHECK(calls == 2); /* 2, int(1.8) = 1, int(0.9) = 0 */
    accel_clear_error();

    calls = 0;
    CHECK(accel_find_executable_batch_size(shape_error, &calls, 16, NULL, NULL) == ACCEL_ERR_SHAPE && calls == 1);
    accel_clear_error();
    CHECK(accel_find_executable_batch_size(NULL, NULL, 16, NULL, NULL) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
}

/* ---------------------------------------------------------------- under accel launch */

/* Run by tests/tracking.cmake as `accel launch --num_processes 2 [--log_with
 * ... | --config_file ...] test_tracking launched TRACKERS`: the flags reach
 * the Accelerator, only rank 0 writes tracker files, and in_order logging
 * comes out rank by rank. */
/* mkdir -p path: true when it is a directory at the end (the launched
 * tests' project_dir does not exist yet in a fresh build tree). */
static bool make_dirs(const char *path) {
    char p[1100];
    snprintf(p, sizeof p, "%s", path);
    for (char *c = p + 1; *c; c++)
        if (*c == '/') {
            *c = 0;
            mkdir(p, 0777);
            *c = '/';
        }
    struct stat sb;
    return (mkdir(p, 0777) == 0 || errno == EEXIST) && stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int launched(const char *trackers) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    const char *pd = getenv("ACCEL_PROJECT_DIR");
    CHECK_MSG(acc && pd, "%s", accel_last_error());
    if (!acc || !pd) return check_summary();
    int rank = accel_accelerator_process_index(acc);
    CHECK(accel_accelerator_num_processes(acc) == 2);
    char path[1024];
    snprintf(path, sizeof path, "%s/launched", pd);
    if (rank == 0) rm_rf(path); /* jsonl appends to an earlier run's log */
    /* the csv tracker cannot open (log.csv a directory): the main process
     * fails, the call is made again on every rank once the cause is gone,
     * and succeeds on every rank (the others had counted the first call and
     * refused the second as already initialized); a third call is refused
     * on the main process, which alone opens trackers */
    char csv[1100];
    snprintf(csv, sizeof csv, "%s/log.csv", path);
    if (rank == 0) CHECK(make_dirs(csv));
    accel_accelerator_wait_for_everyone(acc);
    accel_status first = accel_accelerator_init_trackers(acc, "launched", N_CONFIG, CONFIG);
    CHECK_MSG(rank == 0 ? first == ACCEL_ERR_IO : first == ACCEL_OK, "rank %d: %s", rank, accel_last_error());
    accel_clear_error();
    accel_accelerator_wait_for_everyone(acc);
    if (rank == 0) CHECK(rmdir(csv) == 0);
    accel_accelerator_wait_for_everyone(acc);
    CHECK_MSG(accel_accelerator_init_trackers(acc, "launched", N_CONFIG, CONFIG) == ACCEL_OK, "rank %d: %s", rank,
              accel_last_error());
    accel_status third = accel_accelerator_init_trackers(acc, "launched", N_CONFIG, CONFIG);
    CHECK(rank == 0 ? third == ACCEL_ERR_STATE : third == ACCEL_OK);
    accel_clear_error();
    accel_value v[] = {ACCEL_VALUE_I("rank", rank)};
    CHECK(accel_accelerator_log(acc, 1, v, 1) == ACCEL_OK);
    CHECK(accel_accelerator_end_training(acc) == ACCEL_OK);

    snprintf(path, sizeof path, "%s/order.log", pd);
    if (rank == 0) fclose(fopen(path, "w"));
    accel_accelerator_wait_for_everyone(acc);
    FILE *f = fopen(path, "a");
    accel_logger *lg = accel_get_logger("launched");
    accel_logger_set_level(lg, ACCEL_LOG_INFO);
    accel_logger_set_stream(lg, f);
    for (int i = 0; i < 3; i++) CHECK(accel_logger_log(lg, ACCEL_LOG_INFO, ACCEL_LOG_IN_ORDER, "line %d", i) == ACCEL_OK);
    accel_logger_set_stream(lg, NULL);
    fclose(f);
    accel_accelerator_wait_for_everyone(acc);
    if (rank == 0) {
        char *s = slurp(path);
        CHECK_MSG(s && !strcmp(s, "INFO:launched:[RANK 0] line 0\nINFO:launched:[RANK 1] line 0\n"
                                  "INFO:launched:[RANK 0] line 1\nINFO:launched:[RANK 1] line 1\n"
                                  "INFO:launched:[RANK 0] line 2\nINFO:launched:[RANK 1] line 2\n"), "%s", s);
        free(s);
        bool want_csv = strstr(trackers, "csv") != NULL, want_jsonl = strstr(trackers, "jsonl") != NULL;
        snprintf(path, sizeof path, "%s/launched/log.csv", pd);
        s = slurp(path);
        CHECK_MSG(want_csv ? s && !strcmp(s, "step,rank\n1,0\n") : !s, "%s: %s", path, s);
        free(s);
        snprintf(path, sizeof path, "%s/launched/log.jsonl", pd);
        s = slurp(path);
        CHECK_MSG(want_jsonl ? s && !strcmp(s, "{\"step\":1,\"rank\":0}\n") : !s, "%s: %s", path, s);
        free(s);
    }
    accel_accelerator_free(acc);
    accel_clear_error();
    return check_summary();
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "launched")) return launched(argv[2]);
    unsetenv("ACCEL_LOG_WITH");
    unsetenv("ACCEL_DISABLE_PROGRESS");
    RUN(test_crc32c);
    RUN(test_fixture_reads);
    RUN(test_tensorboard_matches_real_writer);
    RUN(test_jsonl);
    RUN(test_csv_widens);
    RUN(test_step_value);
    RUN(test_csv_keeps_earlier_runs);
    RUN(test_tracker_errors);
    RUN(test_accelerator_trackers);
    RUN(test_init_trackers_retry);
    RUN(test_logger);
    RUN(test_library_warnings);
    RUN(test_progress_plain_lines);
    RUN(test_progress_terminal);
    RUN(test_progress_over_loader);
    RUN(test_register_for_checkpointing);
    RUN(test_refused_load_changes_nothing);
    RUN(test_callback_failures_named);
    RUN(test_init_trackers_store_retry);
    RUN(test_save_and_load);
    RUN(test_find_executable_batch_size);
    accel_thread_cleanup();
    return check_summary();
}
