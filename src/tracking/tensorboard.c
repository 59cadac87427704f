/* The "tensorboard" tracker: event files as torch.utils.tensorboard's
 * SummaryWriter writes them, encoded with protobuf-c (tb_event.proto) and
 * framed as TFRecords. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <yaml.h>

#include "tb_event.pb-c.h"
#include "core/afile.h"
#include "core/core_internal.h"
#include "tracking/tb_internal.h"

typedef struct tb {
    char *dir;     /* <logging_dir>/<project> */
    char *path;    /* its events file */
    int fd;
} tb;

static double wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint32_t accel__crc32c_masked(const void *data, size_t n) {
    uint32_t c = accel__crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* A TFRecord: length, masked CRC of the length, data, masked CRC of the data
 * (all little-endian). */
static accel_status write_record(FILE *f, const uint8_t *data, size_t n) {
    uint8_t head[12];
    uint64_t len = n;
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)(len >> (8 * i));
    uint32_t lc = accel__crc32c_masked(head, 8), dc = accel__crc32c_masked(data, n);
    for (int i = 0; i < 4; i++) head[8 + i] = (uint8_t)(lc >> (8 * i));
    uint8_t tail[4];
    for (int i = 0; i < 4; i++) tail[i] = (uint8_t)(dc >> (8 * i));
    if (fwrite(head, 1, 12, f) != 12 || fwrite(data, 1, n, f) != n || fwrite(tail, 1, 4, f) != 4)
        return accel_set_error(ACCEL_ERR_IO, "tensorboard tracker: cannot write an event: %s", strerror(errno));
    return ACCEL_OK;
}

static accel_status write_event(FILE *f, AccelTb__Event *ev) {
    size_t n = accel_tb__event__get_packed_size(ev);
    uint8_t *buf = accel_malloc(n ? n : 1);
    if (!buf) return accel_last_status();
    accel_tb__event__pack(ev, buf);
    accel_status st = write_record(f, buf, n);
    accel_free(buf);
    return st;
}

/* One Summary of one value, as its own event (SummaryWriter.add_scalar & co.). */
static accel_status write_summary(FILE *f, AccelTb__Summary__Value *v, int64_t step) {
    AccelTb__Summary s = ACCEL_TB__SUMMARY__INIT;
    s.n_value = 1;
    s.value = &v;
    AccelTb__Event ev = ACCEL_TB__EVENT__INIT;
    ev.wall_time = wall_time();
    if (step >= 0) ev.step = step;
    ev.what_case = ACCEL_TB__EVENT__WHAT_SUMMARY;
    ev.summary = &s;
    return write_event(f, &ev);
}

/* One call's records, built in memory and appended to the events file whole
 * or not at all. A write cut short (disk full) left half a record behind,
 * and TensorBoard's reader stops at the first broken record: everything
 * logged after the handled error was lost, silently. */
typedef struct records {
    FILE *m; /* open_memstream over buf */
    char *buf;
    size_t len;
} records;

static FILE *records_open(records *r) {
    r->buf = NULL;
    r->len = 0;
    if (!(r->m = open_memstream(&r->buf, &r->len)))
        accel_set_error(ACCEL_ERR_OOM, "tensorboard tracker: out of memory for an event");
    return r->m;
}

/* Ends r and, when st is ACCEL_OK, appends its bytes to fd; a failed append
 * is cut off again, so the file stays a sequence of whole records. */
static accel_status records_commit(records *r, accel_status st, int fd, const char *path) {
    if (fclose(r->m) && !st) st = accel_set_error(ACCEL_ERR_OOM, "tensorboard tracker: out of memory for an event");
    if (!st) st = accel__append_whole(fd, false, "tensorboard tracker", "an event to ", path, r->buf, r->len);
    free(r->buf);
    return st;
}

/* events.out.tfevents.<10-digit time>.<host>.<pid>.<n> in dir, created (never
 * an existing file: a restarted process can have the same pid within the
 * same second) and opened with its file_version event. -1 on failure. */
static int open_events(const char *dir, char **path_out) {
    static int uid;
    char host[256] = "localhost", path[4600];
    gethostname(host, sizeof host - 1);
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 100; tries++) {
        snprintf(path, sizeof path, "%s/events.out.tfevents.%010ld.%s.%d.%d", dir, (long)wall_time(), host,
                 (int)getpid(), __atomic_fetch_add(&uid, 1, __ATOMIC_RELAXED));
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        accel_set_error(ACCEL_ERR_IO, "tensorboard tracker: cannot create %s: %s", path, strerror(errno));
        return -1;
    }
    AccelTb__Event ev = ACCEL_TB__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.what_case = ACCEL_TB__EVENT__WHAT_FILE_VERSION;
    ev.file_version = (char *)"brain.Event:2";
    records r;
    if (!records_open(&r) || records_commit(&r, write_event(r.m, &ev), fd, path) ||
        (path_out && !(*path_out = accel_strdup(path)))) {
        close(fd);
        unlink(path);
        return -1;
    }
    return fd;
}

void *accel__tb_open(const char *run_dir) {
    tb *t = accel_calloc(1, sizeof *t);
    if (!t) return NULL;
    if (!(t->dir = accel_strdup(run_dir)) || (t->fd = open_events(run_dir, &t->path)) < 0) {
        accel_free(t->dir);
        accel_free(t);
        return NULL;
    }
    return t;
}

/* ---------------------------------------------------------------- log */

static accel_status log_scalar(FILE *f, const char *tag, double value, int64_t step) {
    AccelTb__Summary__Value v = ACCEL_TB__SUMMARY__VALUE__INIT;
    v.tag = (char *)tag;
    v.value_case = ACCEL_TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    v.simple_value = (float)value;
    return write_summary(f, &v, step);
}

/* SummaryWriter.add_text: tag "<key>/text_summary", the text plugin, a 1-element DT_STRING tensor. */
static accel_status log_text(FILE *f, const char *key, const char *text, int64_t step) {
    AccelTb__TextPluginData tp = ACCEL_TB__TEXT_PLUGIN_DATA__INIT;
    uint8_t content[16];
    size_t cn = accel_tb__text_plugin_data__pack(&tp, content);
    AccelTb__SummaryMetadata__PluginData pd = ACCEL_TB__SUMMARY_METADATA__PLUGIN_DATA__INIT;
    pd.plugin_name = (char *)"text";
    pd.content = (ProtobufCBinaryData){cn, content};
    AccelTb__SummaryMetadata md = ACCEL_TB__SUMMARY_METADATA__INIT;
    md.plugin_data = &pd;
    AccelTb__TensorShapeProto__Dim dim = ACCEL_TB__TENSOR_SHAPE_PROTO__DIM__INIT, *dims = &dim;
    dim.size = 1;
    AccelTb__TensorShapeProto shape = ACCEL_TB__TENSOR_SHAPE_PROTO__INIT;
    shape.n_dim = 1;
    shape.dim = &dims;
    ProtobufCBinaryData sv = {strlen(text), (uint8_t *)text};
    AccelTb__TensorProto tensor = ACCEL_TB__TENSOR_PROTO__INIT;
    tensor.dtype = ACCEL_TB__DATA_TYPE__DT_STRING;
    tensor.tensor_shape = &shape;
    tensor.n_string_val = 1;
    tensor.string_val = &sv;
    /* As long as the key: a fixed buffer cut long keys, and a cut inside a
     * UTF-8 sequence made tensorboard's reader refuse the whole file. */
    size_t tag_len = strlen(key) + sizeof "/text_summary";
    char *tag = accel_malloc(tag_len);
    if (!tag) return accel_last_status();
    snprintf(tag, tag_len, "%s/text_summary", key);
    AccelTb__Summary__Value v = ACCEL_TB__SUMMARY__VALUE__INIT;
    v.tag = tag;
    v.metadata = &md;
    v.value_case = ACCEL_TB__SUMMARY__VALUE__VALUE_TENSOR;
    v.tensor = &tensor;
    accel_status st = write_summary(f, &v, step);
    accel_free(tag);
    return st;
}

/* The values' events, appended whole (and so on disk after every call). */
static accel_status tb_log(void *ctx, int n, const accel_value *values, int64_t step) {
    tb *t = ctx;
    records r;
    FILE *f = records_open(&r);
    if (!f) return accel_last_status();
    accel_status st = ACCEL_OK;
    for (int i = 0; i < n && !st; i++) {
        const accel_value *v = &values[i];
        switch (v->kind) {
        case ACCEL_VALUE_FLOAT: st = log_scalar(f, v->key, v->f, step); break;
        case ACCEL_VALUE_INT:
        case ACCEL_VALUE_BOOL: st = log_scalar(f, v->key, (double)v->i, step); break;
        case ACCEL_VALUE_STRING: st = log_text(f, v->key, v->s, step); break;
        }
    }
    return records_commit(&r, st, t->fd, t->path);
}

/* ---------------------------------------------------------------- hparams */

/* One hparams-plugin summary (tag "_hparams_/<what>") as its own event. */
static accel_status write_hparams(FILE *f, const char *what, AccelTb__HParamsPluginData *data) {
    size_t n = accel_tb__hparams_plugin_data__get_packed_size(data);
    uint8_t *content = accel_malloc(n ? n : 1);
    if (!content) return accel_last_status();
    accel_tb__hparams_plugin_data__pack(data, content);
    AccelTb__SummaryMetadata__PluginData pd = ACCEL_TB__SUMMARY_METADATA__PLUGIN_DATA__INIT;
    pd.plugin_name = (char *)"hparams";
    pd.content = (ProtobufCBinaryData){n, content};
    AccelTb__SummaryMetadata md = ACCEL_TB__SUMMARY_METADATA__INIT;
    md.plugin_data = &pd;
    char tag[64];
    snprintf(tag, sizeof tag, "_hparams_/%s", what);
    AccelTb__Summary__Value v = ACCEL_TB__SUMMARY__VALUE__INIT;
    v.tag = tag;
    v.metadata = &md;
    accel_status st = write_summary(f, &v, -1);
    accel_free(content);
    return st;
}

/* torch's hparams(config, {}): numbers (bools too: Python's bool is an int)
 * as FLOAT64 number_value, strings as STRING string_value; no start time. */
static accel_status write_hparams_all(FILE *f, int n, const accel_value *config) {
    AccelTb__Value *vals = accel_calloc((size_t)n + 1, sizeof *vals);
    AccelTb__SessionStartInfo__HparamsEntry *ents = accel_calloc((size_t)n + 1, sizeof *ents);
    AccelTb__SessionStartInfo__HparamsEntry **entp = accel_calloc((size_t)n + 1, sizeof *entp);
    AccelTb__HParamInfo *infos = accel_calloc((size_t)n + 1, sizeof *infos);
    AccelTb__HParamInfo **infop = accel_calloc((size_t)n + 1, sizeof *infop);
    accel_status st = vals && ents && entp && infos && infop ? ACCEL_OK : accel_last_status();
    for (int i = 0; i < n && !st; i++) {
        const accel_value *c = &config[i];
        accel_tb__value__init(&vals[i]);
        accel_tb__session_start_info__hparams_entry__init(&ents[i]);
        accel_tb__hparam_info__init(&infos[i]);
        if (c->kind == ACCEL_VALUE_STRING) {
            vals[i].kind_case = ACCEL_TB__VALUE__KIND_STRING_VALUE;
            vals[i].string_value = (char *)c->s;
            infos[i].type = ACCEL_TB__HPARAM_DATA_TYPE__DATA_TYPE_STRING;
        } else {
            vals[i].kind_case = ACCEL_TB__VALUE__KIND_NUMBER_VALUE;
            vals[i].number_value = c->kind == ACCEL_VALUE_FLOAT ? c->f : (double)c->i;
            infos[i].type = ACCEL_TB__HPARAM_DATA_TYPE__DATA_TYPE_FLOAT64;
        }
        ents[i].key = infos[i].name = (char *)c->key;
        ents[i].value = &vals[i];
        entp[i] = &ents[i];
        infop[i] = &infos[i];
    }
    AccelTb__Experiment exp = ACCEL_TB__EXPERIMENT__INIT;
    exp.n_hparam_infos = (size_t)n;
    exp.hparam_infos = infop;
    AccelTb__SessionStartInfo ssi = ACCEL_TB__SESSION_START_INFO__INIT;
    ssi.n_hparams = (size_t)n;
    ssi.hparams = entp;
    AccelTb__SessionEndInfo sei = ACCEL_TB__SESSION_END_INFO__INIT;
    sei.status = ACCEL_TB__STATUS__STATUS_SUCCESS;
    AccelTb__HParamsPluginData d = ACCEL_TB__HPARAMS_PLUGIN_DATA__INIT;
    d.data_case = ACCEL_TB__HPARAMS_PLUGIN_DATA__DATA_EXPERIMENT;
    d.experiment = &exp;
    if (!st) st = write_hparams(f, "experiment", &d);
    d.data_case = ACCEL_TB__HPARAMS_PLUGIN_DATA__DATA_SESSION_START_INFO;
    d.session_start_info = &ssi;
    if (!st) st = write_hparams(f, "session_start_info", &d);
    d.data_case = ACCEL_TB__HPARAMS_PLUGIN_DATA__DATA_SESSION_END_INFO;
    d.session_end_info = &sei;
    if (!st) st = write_hparams(f, "session_end_info", &d);
    accel_free(vals);
    accel_free(ents);
    accel_free(entp);
    accel_free(infos);
    accel_free(infop);
    return st;
}

/* PyYAML's implicit resolvers (YAML 1.1, resolver.py), as POSIX EREs: a
 * plain scalar matching one is read back as a bool, float, int, merge key,
 * null, date or `=` value, not as the string written. yaml.dump quotes
 * exactly those. A number-like test alone left "1:20" (an int, 80),
 * "2024-01-01" (a date), "0b101", "1_000", "+.inf", keys such as "123" or
 * "true", and "=" (yaml.safe_load refuses the file: no constructor for
 * tag:yaml.org,2002:value) plain. */
static const char *const YAML_IMPLICIT[] = {
    "^(yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$",
    "^([-+]?[0-9][0-9_]*\\.[0-9_]*([eE][-+][0-9]+)?|\\.[0-9][0-9_]*([eE][-+][0-9]+)?"
    "|[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+\\.[0-9_]*|[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN))$",
    "^([-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(:[0-5]?[0-9])+)$",
    "^(<<|~|null|Null|NULL|=|)$",
    "^([0-9]{4}-[0-9]{2}-[0-9]{2}|[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([Tt]|[ \t]+)[0-9]{1,2}:[0-9]{2}:[0-9]{2}"
    "(\\.[0-9]*)?([ \t]*(Z|[-+][0-9]{1,2}(:[0-9]{2})?))?)$",
};
#define N_IMPLICIT (sizeof YAML_IMPLICIT / sizeof *YAML_IMPLICIT)

typedef struct yaml_resolvers {
    regex_t re[N_IMPLICIT];
    size_t n; /* compiled */
} yaml_resolvers;

static accel_status resolvers_init(yaml_resolvers *r) {
    for (r->n = 0; r->n < N_IMPLICIT; r->n++)
        if (regcomp(&r->re[r->n], YAML_IMPLICIT[r->n], REG_EXTENDED | REG_NOSUB))
            return accel_set_error(ACCEL_ERR_OOM, "tensorboard tracker: cannot compile YAML resolver %zu (out of memory)", r->n);
    return ACCEL_OK;
}

static void resolvers_free(yaml_resolvers *r) {
    while (r->n) regfree(&r->re[--r->n]);
}

/* Would PyYAML read this plain scalar back as something else than a string? */
static bool needs_quotes(const yaml_resolvers *r, const char *s) {
    for (size_t i = 0; i < r->n; i++)
        if (!regexec(&r->re[i], s, 0, NULL, 0)) return true;
    return false;
}

/* A float as yaml.dump writes it: repr, with ".0" put before an exponent
 * that has no point ("1e-05" is a string to YAML 1.1; "1.0e-05" a float). */
static void yaml_float(char *buf, size_t n, double v) {
    char repr[32];
    accel__float_repr(repr, sizeof repr, v);
    char *e = strchr(repr, 'e');
    if (e && !strchr(repr, '.')) snprintf(buf, n, "%.*s.0%s", (int)(e - repr), repr, e);
    else snprintf(buf, n, "%s", repr);
}

static int emit_scalar(yaml_emitter_t *em, const char *s, yaml_scalar_style_t style) {
    yaml_event_t ev;
    yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)s, (int)strlen(s), 1, 1, style);
    return yaml_emitter_emit(em, &ev);
}

static int cmp_key(const void *a, const void *b) {
    return strcmp((*(const accel_value *const *)a)->key, (*(const accel_value *const *)b)->key);
}

static int yaml_out(void *data, unsigned char *buf, size_t n) { return fwrite(buf, 1, n, data) == n; }

/* yaml.dump(config): a block mapping with sorted keys. */
static accel_status write_hparams_yml(const char *path, int n, const accel_value *config) {
    yaml_resolvers res;
    if (resolvers_init(&res)) {
        resolvers_free(&res);
        return accel_last_status();
    }
    const accel_value **sorted = accel_calloc((size_t)n + 1, sizeof *sorted);
    accel__afile af; /* replaced whole, as every file accel replaces (core/afile.h) */
    bool opened = sorted && accel__afile_open(&af, path) == ACCEL_OK;
    int fd = opened ? dup(af.fd) : -1; /* the stream's own descriptor: af's stays for the commit */
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        accel_status st = !opened ? accel_last_status()
                                  : accel_set_error(ACCEL_ERR_IO, "tensorboard tracker: cannot write %s: %s", af.tmp,
                                                    strerror(errno));
        if (fd >= 0) close(fd);
        if (opened) accel__afile_abort(&af);
        resolvers_free(&res);
        accel_free(sorted);
        return st;
    }
    for (int i = 0; i < n; i++) sorted[i] = &config[i];
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_key);
    yaml_emitter_t em;
    yaml_event_t ev;
    yaml_emitter_initialize(&em);
    yaml_emitter_set_output(&em, yaml_out, f);
    yaml_emitter_set_unicode(&em, 1);
    int ok = yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING) && yaml_emitter_emit(&em, &ev) &&
             yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1) && yaml_emitter_emit(&em, &ev) &&
             yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE) &&
             yaml_emitter_emit(&em, &ev);
    for (int i = 0; i < n && ok; i++) {
        const accel_value *c = sorted[i];
        char num[64];
        const char *text = num;
        yaml_scalar_style_t style = YAML_PLAIN_SCALAR_STYLE;
        switch (c->kind) {
        case ACCEL_VALUE_FLOAT:
            if (isnan(c->f)) text = ".nan";
            else if (isinf(c->f)) text = c->f > 0 ? ".inf" : "-.inf";
            else yaml_float(num, sizeof num, c->f);
            break;
        case ACCEL_VALUE_INT: snprintf(num, sizeof num, "%lld", (long long)c->i); break;
        case ACCEL_VALUE_BOOL: text = c->i ? "true" : "false"; break;
        case ACCEL_VALUE_STRING:
            text = c->s;
            style = needs_quotes(&res, c->s) ? YAML_SINGLE_QUOTED_SCALAR_STYLE : YAML_ANY_SCALAR_STYLE;
            break;
        }
        yaml_scalar_style_t key_style = needs_quotes(&res, c->key) ? YAML_SINGLE_QUOTED_SCALAR_STYLE
                                                                   : YAML_ANY_SCALAR_STYLE;
        ok = emit_scalar(&em, c->key, key_style) && emit_scalar(&em, text, style);
    }
    ok = ok && yaml_mapping_end_event_initialize(&ev) && yaml_emitter_emit(&em, &ev) &&
         yaml_document_end_event_initialize(&ev, 1) && yaml_emitter_emit(&em, &ev) &&
         yaml_stream_end_event_initialize(&ev) && yaml_emitter_emit(&em, &ev);
    yaml_emitter_delete(&em);
    resolvers_free(&res);
    accel_free(sorted);
    if (fclose(f) || !ok) {
        accel__afile_abort(&af);
        return accel_set_error(ACCEL_ERR_IO, "tensorboard tracker: cannot write %s", path);
    }
    return accel__afile_commit(&af);
}

/* add_hparams(config, metric_dict={}): a sub-run <dir>/<time.time()> holding
 * the three hparams summaries, and hparams.yml there (Accelerate writes the
 * yml into a second <time.time()> directory; one directory keeps them together). */
static accel_status tb_store_config(void *ctx, int n, const accel_value *config) {
    tb *t = ctx;
    char sub[4400], path[4500];
    snprintf(sub, sizeof sub, "%s/%.7f", t->dir, wall_time());
    char *events = NULL;
    int fd = accel__mkdirs(sub) ? -1 : open_events(sub, &events);
    if (fd < 0) return accel_last_status();
    records r;
    accel_status st = records_open(&r) ? records_commit(&r, write_hparams_all(r.m, n, config), fd, events)
                                       : accel_last_status();
    if (close(fd) && !st) st = accel_set_error(ACCEL_ERR_IO, "tensorboard tracker: cannot close %s: %s", events,
                                               strerror(errno));
    accel_free(events);
    snprintf(path, sizeof path, "%s/hparams.yml", sub);
    if (!st) st = write_hparams_yml(path, n, config);
    return st;
}

static accel_status tb_finish(void *ctx) {
    tb *t = ctx;
    accel_status st = close(t->fd) ? accel_set_error(ACCEL_ERR_IO, "tensorboard tracker: cannot close %s: %s",
                                                     t->path, strerror(errno))
                                   : ACCEL_OK;
    accel_free(t->path);
    accel_free(t->dir);
    accel_free(t);
    return st;
}

const accel_tracker_ops accel__tb_ops = {
    .name = "tensorboard",
    .store_init_configuration = tb_store_config,
    .log = tb_log,
    .finish = tb_finish,
};
