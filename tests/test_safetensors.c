/* safetensors reader/writer, checkpoints, size strings, the directory
 * writers' refusal of a file where the directory goes. Corrupt files are
 * written byte by byte into a mkdtemp() folder. */
#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/bert.h"
#include "check.h"
#include "test_files.h"

static char g_dir[64];

static const char *tmp_path(const char *name) { return path_in(g_dir, name); }

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = calloc(1, (size_t)n + 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = 0;
    fclose(f);
    return s;
}

/* A safetensors file from a header string and `data_len` bytes of data (0x11...). */
static void write_st(const char *path, const char *header, size_t data_len) {
    size_t h = strlen(header);
    unsigned char *buf = calloc(1, 8 + h + data_len + 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    memset(buf + 8 + h, 0x11, data_len);
    write_file(path, buf, 8 + h + data_len);
    free(buf);
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static void test_roundtrip(void) {
    accel_tensor *a = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2, 3), ACCEL_CPU_DEVICE);
    accel_tensor *b = accel_tensor_new(ACCEL_BF16, ACCEL_SHAPE(4), ACCEL_CPU_DEVICE);
    accel_tensor *c = accel_tensor_new(ACCEL_I64, ACCEL_SHAPE(3), ACCEL_CPU_DEVICE);
    accel_tensor *d = accel_tensor_new(ACCEL_F32, 0, NULL, ACCEL_CPU_DEVICE);
    for (int i = 0; i < 6; i++) ((float *)a->data)[i] = (float)i * 0.5f - 1.0f;
    for (int i = 0; i < 4; i++) ((uint16_t *)b->data)[i] = accel_f32_to_bf16((float)i + 0.5f);
    for (int i = 0; i < 3; i++) ((int64_t *)c->data)[i] = (int64_t)i * 1000000000000LL - 7;
    ((float *)d->data)[0] = 42.0f;
    const char *names[] = {"w.a", "w.b", "c", "scalar"};
    accel_tensor *ts[] = {a, b, c, d};
    accel_kv meta[] = {{"note", "hello"}};
    const char *path = tmp_path("rt.safetensors");
    CHECK(accel_safetensors_save(path, 4, names, ts, 1, meta) == ACCEL_OK);
    CHECK(!exists(tmp_path("rt.safetensors.tmp")));

    /* header layout like the Python library: padded with spaces to 8 */
    char *raw = read_text(path);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | (unsigned char)raw[i];
    CHECK(hl % 8 == 0);
    CHECK(strncmp(raw + 8, "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"hello\"},\"w.a\":{\"dtype\":\"F32\","
                           "\"shape\":[2,3],\"data_offsets\":[0,24]}",
                  strlen("{\"__metadata__\":{\"format\":\"pt\",\"note\":\"hello\"},\"w.a\":{\"dtype\":\"F32\","
                         "\"shape\":[2,3],\"data_offsets\":[0,24]}")) == 0);
    CHECK(raw[8 + hl - 1] == '}' || raw[8 + hl - 1] == ' ');
    free(raw);

    accel_safetensors *st = accel_safetensors_open(path);
    CHECK_MSG(st != NULL, "%s", accel_last_error());
    if (!st) return;
    CHECK(accel_safetensors_count(st) == 4);
    CHECK(strcmp(accel_safetensors_at(st, 0)->name, "w.a") == 0);
    CHECK(strcmp(accel_safetensors_at(st, 3)->name, "scalar") == 0);
    CHECK(strcmp(accel_safetensors_metadata(st, "format"), "pt") == 0);
    CHECK(strcmp(accel_safetensors_metadata(st, "note"), "hello") == 0);
    CHECK(accel_safetensors_find(st, "nope") == NULL);
    const accel_st_info *ia = accel_safetensors_find(st, "w.a");
    CHECK(ia && ia->dtype == ACCEL_F32 && ia->ndim == 2 && ia->shape[1] == 3 && ia->nbytes == 24);

    /* zero-copy in the stored dtype */
    accel_tensor *za = accel_safetensors_tensor(st, "w.a", -1);
    CHECK(za && (za->flags & ACCEL_TF_MMAP) && za->data == ia->bytes);
    CHECK(za && memcmp(za->data, a->data, 24) == 0);
    /* writing to a zero-copy tensor is private (copy on write) */
    ((float *)za->data)[0] = 99.0f;
    accel_tensor_free(za);
    accel_tensor *zs = accel_safetensors_tensor(st, "scalar", ACCEL_F32);
    CHECK(zs && zs->ndim == 0 && ((float *)zs->data)[0] == 42.0f);
    accel_tensor_free(zs);
    /* converted copies */
    accel_tensor *fb = accel_safetensors_tensor(st, "w.b", ACCEL_F32);
    CHECK(fb && fb->dtype == ACCEL_F32 && !(fb->flags & ACCEL_TF_MMAP));
    CHECK(fb && ((float *)fb->data)[3] == 3.5f);
    accel_tensor_free(fb);
    accel_tensor *ic = accel_safetensors_tensor(st, "c", -1);
    CHECK(ic && ((int64_t *)ic->data)[2] == 2000000000000LL - 7);
    accel_tensor_free(ic);
    /* load_into with conversion, then a shape mismatch naming both shapes */
    accel_tensor *dst = accel_tensor_new(ACCEL_F16, ACCEL_SHAPE(2, 3), ACCEL_CPU_DEVICE);
    CHECK(accel_safetensors_load_into(st, "w.a", dst) == ACCEL_OK);
    CHECK(accel_f16_to_f32(((uint16_t *)dst->data)[5]) == 1.5f);
    CHECK(accel_safetensors_load_into(st, "w.b", dst) == ACCEL_ERR_SHAPE);
    CHECK_STR_CONTAINS(accel_last_error(), "has shape [4] but the destination has shape [2, 3]");
    accel_clear_error();
    CHECK(accel_safetensors_tensor(st, "missing", -1) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "has no tensor 'missing'");
    accel_clear_error();
    accel_tensor_free(dst);
    accel_safetensors_close(st);

    /* the file itself was not changed by the write through the mapping */
    st = accel_safetensors_open(path);
    CHECK(st && ((const float *)accel_safetensors_find(st, "w.a")->bytes)[0] == -1.0f);
    accel_safetensors_close(st);

    const char *dup[] = {"x", "x"};
    accel_tensor *two[] = {a, b};
    CHECK(accel_safetensors_save(tmp_path("dup.safetensors"), 2, dup, two, 0, NULL) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    accel_tensor *m = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2), ACCEL_META_DEVICE);
    const char *mn[] = {"m"};
    CHECK(accel_safetensors_save(tmp_path("meta.safetensors"), 1, mn, &m, 0, NULL) == ACCEL_ERR_DEVICE);
    accel_clear_error();
    accel_tensor_free(m);
    for (int i = 0; i < 4; i++) accel_tensor_free(ts[i]);
}

/* A file written by the Python safetensors library (tools/gen_safetensors_fixture.py). */
static void test_python_fixture(void) {
    accel_safetensors *st = accel_safetensors_open("data/st_small.safetensors");
    CHECK_MSG(st != NULL, "%s", accel_last_error());
    json_t *exp = json_load_file("data/st_small.json", 0, NULL);
    CHECK(exp != NULL);
    if (!st || !exp) return;
    CHECK(strcmp(accel_safetensors_metadata(st, "note"), "fixture") == 0);
    CHECK(accel_safetensors_count(st) == (int)json_object_size(exp));
    const char *name;
    json_t *e;
    json_object_foreach(exp, name, e) {
        const accel_st_info *in = accel_safetensors_find(st, name);
        CHECK_MSG(in != NULL, "%s", name);
        if (!in) continue;
        CHECK(accel_dtype_parse(json_string_value(json_object_get(e, "dtype"))) == (int)in->dtype);
        json_t *shape = json_object_get(e, "shape");
        CHECK((size_t)in->ndim == json_array_size(shape));
        for (int d = 0; d < in->ndim; d++) CHECK(in->shape[d] == json_integer_value(json_array_get(shape, (size_t)d)));
        accel_tensor *t = accel_safetensors_tensor(st, name, -1);
        CHECK_MSG(t && (t->flags & ACCEL_TF_MMAP), "%s zero-copy", name);
        accel_tensor *f = accel_safetensors_tensor(st, name, ACCEL_F64);
        json_t *vals = json_object_get(e, "values");
        for (size_t i = 0; f && i < json_array_size(vals); i++)
            CHECK_CLOSE(((double *)f->data)[i], json_number_value(json_array_get(vals, i)), 0, 0);
        accel_tensor_free(t);
        accel_tensor_free(f);
    }
    json_decref(exp);
    accel_safetensors_close(st);
}

/* Every file of tools/gen_safetensors_verdicts.py: accel accepts exactly the
 * files the Python safetensors library accepts, and loads all their tensors. */
static void test_python_verdicts(void) {
    json_t *doc = json_load_file("data/st_verdicts/verdicts.json", 0, NULL);
    json_t *verdicts = json_object_get(doc, "verdicts");
    CHECK(json_object_size(verdicts) > 40);
    const char *name;
    json_t *v;
    json_object_foreach(verdicts, name, v) {
        char path[256];
        snprintf(path, sizeof path, "data/st_verdicts/%s.safetensors", name);
        bool python_ok = strcmp(json_string_value(v), "ok") == 0;
        accel_clear_error();
        accel_safetensors *st = accel_safetensors_open(path);
        if (python_ok) {
            CHECK_MSG(st != NULL, "%s: Python accepts it, accel: %s", name, accel_last_error());
            for (int i = 0; st && i < accel_safetensors_count(st); i++) {
                accel_tensor *t = accel_safetensors_tensor(st, accel_safetensors_at(st, i)->name, ACCEL_F64);
                CHECK_MSG(t != NULL, "%s: %s", name, accel_last_error());
                accel_tensor_free(t);
            }
        } else {
            CHECK_MSG(st == NULL, "%s: accel accepts it, Python: %s", name, json_string_value(v));
            CHECK_MSG(accel_last_status() == ACCEL_ERR_FORMAT, "%s: %s", name, accel_last_error());
            CHECK_STR_CONTAINS(accel_last_error(), name);
        }
        accel_safetensors_close(st);
    }
    accel_clear_error();
    json_decref(doc);
}

static void expect_open_error(const char *file, accel_status code, const char *needle) {
    accel_clear_error();
    accel_safetensors *st = accel_safetensors_open(tmp_path(file));
    CHECK_MSG(st == NULL, "%s opened", file);
    CHECK_MSG(accel_last_status() == code, "%s: status %s", file, accel_status_name(accel_last_status()));
    CHECK_STR_CONTAINS(accel_last_error(), needle);
    CHECK_STR_CONTAINS(accel_last_error(), file);
    accel_safetensors_close(st);
    accel_clear_error();
}

static void test_corrupt_files(void) {
    write_file(tmp_path("short.st"), "abc", 3);
    expect_open_error("short.st", ACCEL_ERR_FORMAT, "too short for the 8-byte header length");

    unsigned char big[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    write_file(tmp_path("hdrlen.st"), big, 16);
    expect_open_error("hdrlen.st", ACCEL_ERR_FORMAT, "header length 65535 runs past the end of the file");

    /* truncated: a valid file cut inside its data */
    write_st(tmp_path("trunc.st"), "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 10);
    expect_open_error("trunc.st", ACCEL_ERR_FORMAT,
                      "tensor 'a': data_offsets [0, 16] run past the end of the data section (10 bytes)");

    write_st(tmp_path("json.st"), "{\"a\":{\"dtype\":\"F32\",", 0);
    expect_open_error("json.st", ACCEL_ERR_FORMAT, "header is not valid JSON");

    write_st(tmp_path("notobj.st"), "[1,2]   ", 0);
    expect_open_error("notobj.st", ACCEL_ERR_FORMAT, "header must be a JSON object");

    write_st(tmp_path("overlap.st"),
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
             12);
    expect_open_error("overlap.st", ACCEL_ERR_FORMAT, "tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]");

    /* the data section exactly covered, as the safetensors crate demands */
    write_st(tmp_path("gap.st"),
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[10,12]}}",
             12);
    expect_open_error("gap.st", ACCEL_ERR_FORMAT,
                      "tensor 'b': data_offsets [10, 12] leave bytes [8, 10) of the data section in no tensor");
    write_st(tmp_path("tail.st"), "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 9);
    expect_open_error("tail.st", ACCEL_ERR_FORMAT,
                      "the data section has 9 bytes but the tensors cover 8: the file is not fully covered");

    write_st(tmp_path("oob.st"), "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[100,104]}}", 8);
    expect_open_error("oob.st", ACCEL_ERR_FORMAT, "data_offsets [100, 104] run past the end of the data section");

    write_st(tmp_path("backwards.st"), "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", 8);
    expect_open_error("backwards.st", ACCEL_ERR_FORMAT, "end before they begin");

    write_st(tmp_path("size.st"), "{\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,12]}}", 12);
    expect_open_error("size.st", ACCEL_ERR_FORMAT,
                      "tensor 'lm_head.weight': data_offsets [0, 12] hold 12 bytes but shape [2, 3] of F32 needs 24");

    write_st(tmp_path("dtype.st"), "{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    expect_open_error("dtype.st", ACCEL_ERR_FORMAT, "tensor 'a': unknown dtype 'Q4'");

    write_st(tmp_path("fp8.st"), "{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    expect_open_error("fp8.st", ACCEL_ERR_UNSUPPORTED, "dtype F8_E4M3 is not supported by accel");

    write_st(tmp_path("negshape.st"), "{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1);
    expect_open_error("negshape.st", ACCEL_ERR_FORMAT, "tensor 'a': shape must be non-negative integers");

    write_st(tmp_path("dims.st"), "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1);
    expect_open_error("dims.st", ACCEL_ERR_FORMAT, "9 dimensions, at most 8");

    write_st(tmp_path("huge.st"),
             "{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8);
    expect_open_error("huge.st", ACCEL_ERR_FORMAT, "is too large");

    write_st(tmp_path("dupname.st"),
             "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
             "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
             2);
    expect_open_error("dupname.st", ACCEL_ERR_FORMAT, "duplicate object key");

    write_st(tmp_path("fmt.st"), "{\"__metadata__\":{\"format\":\"np\"}}", 0);
    expect_open_error("fmt.st", ACCEL_ERR_FORMAT, "format 'np' is not one of pt, tf, flax, mlx");

    write_st(tmp_path("metaval.st"), "{\"__metadata__\":{\"n\":1}}", 0);
    expect_open_error("metaval.st", ACCEL_ERR_FORMAT, "__metadata__ value of 'n' must be a string");

    write_st(tmp_path("offs.st"), "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1);
    expect_open_error("offs.st", ACCEL_ERR_FORMAT, "'data_offsets' must be [begin, end]");

    accel_clear_error();
    CHECK(accel_safetensors_open(tmp_path("does-not-exist")) == NULL && accel_last_status() == ACCEL_ERR_IO);
    accel_clear_error();
    CHECK(mkfifo(tmp_path("fifo.st"), 0644) == 0);
    CHECK(accel_safetensors_open(tmp_path("fifo.st")) == NULL); /* at once: no wait for a writer */
    CHECK_STR_CONTAINS(accel_last_error(), "fifo.st: is a FIFO, not a safetensors file");
    accel_clear_error();
    CHECK(accel_safetensors_open(g_dir) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "is a directory, not a safetensors file");
    accel_clear_error();

    /* absent metadata, unpadded header (misaligned data), zero-sized tensors: accepted */
    write_st(tmp_path("ok.st"),
             "{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
             "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
             8);
    accel_safetensors *st = accel_safetensors_open(tmp_path("ok.st"));
    CHECK_MSG(st != NULL, "%s", accel_last_error());
    CHECK(st && accel_safetensors_metadata(st, "format") == NULL);
    accel_tensor *t = st ? accel_safetensors_tensor(st, "a", -1) : NULL;
    CHECK(t != NULL);
    if (t && ((uintptr_t)accel_safetensors_find(st, "a")->bytes % 4) != 0) CHECK(!(t->flags & ACCEL_TF_MMAP));
    float v = 0;
    memset(&v, 0x11, 4);
    CHECK(t && ((float *)t->data)[1] == v);
    accel_tensor *dd = accel_tensor_new(ACCEL_F64, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE);
    CHECK(st && accel_safetensors_load_into(st, "a", dd) == ACCEL_OK && ((double *)dd->data)[0] == (double)v);
    accel_tensor_free(dd);
    accel_tensor_free(t);
    accel_safetensors_close(st);
}

static accel_tensor *filled(int64_t n, float base) {
    accel_tensor *t = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(n), ACCEL_CPU_DEVICE);
    for (int64_t i = 0; i < n; i++) ((float *)t->data)[i] = base + (float)i;
    return t;
}

static int count_files(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    if (d) closedir(d);
    return n;
}

static void test_sharded(void) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s", tmp_path("sharded"));
    /* sizes 40, 40, 200 (> max: own shard, before the open one), 40, 40 with max 100 */
    accel_tensor *t[5] = {filled(10, 0), filled(10, 100), filled(50, 200), filled(10, 300), NULL};
    t[4] = t[0]; /* a tied alias: same shard as its first name, counted once */
    const char *names[] = {"a", "b", "big", "c", "a_alias"};
    CHECK(accel_save_sharded(dir, 5, names, t, 100) == ACCEL_OK);
    char *index = read_text(tmp_path("sharded/model.safetensors.index.json"));
    const char *want =
        "{\n"
        "  \"metadata\": {\n"
        "    \"total_size\": 320\n"
        "  },\n"
        "  \"weight_map\": {\n"
        "    \"a\": \"model-00002-of-00003.safetensors\",\n"
        "    \"a_alias\": \"model-00002-of-00003.safetensors\",\n"
        "    \"b\": \"model-00002-of-00003.safetensors\",\n"
        "    \"big\": \"model-00001-of-00003.safetensors\",\n"
        "    \"c\": \"model-00003-of-00003.safetensors\"\n"
        "  }\n"
        "}\n";
    CHECK_MSG(index && strcmp(index, want) == 0, "index:\n%s", index ? index : "(none)");
    free(index);
    CHECK(!exists(tmp_path("sharded/model.safetensors")));

    accel_checkpoint *ck = accel_checkpoint_open(dir);
    CHECK_MSG(ck != NULL, "%s", accel_last_error());
    if (ck) {
        CHECK(accel_checkpoint_count(ck) == 5 && accel_checkpoint_num_shards(ck) == 3);
        CHECK(accel_checkpoint_total_size(ck) == 320);
        CHECK(accel_checkpoint_shard_of(ck, "big") == 0 && accel_checkpoint_shard_of(ck, "nope") == -1);
        accel_tensor *c = accel_checkpoint_tensor(ck, "c", -1);
        CHECK(c && ((float *)c->data)[9] == 309.0f);
        accel_tensor_free(c);
        accel_tensor *dst = accel_tensor_new(ACCEL_BF16, ACCEL_SHAPE(10), ACCEL_CPU_DEVICE);
        CHECK(accel_checkpoint_load_into(ck, "a_alias", dst) == ACCEL_OK);
        CHECK(accel_bf16_to_f32(((uint16_t *)dst->data)[3]) == 3.0f);
        accel_tensor_free(dst);
        accel_checkpoint_release_shard(ck, 1);
        CHECK(accel_checkpoint_find(ck, "b", NULL) != NULL); /* re-mapped on demand */
        CHECK(accel_checkpoint_find(ck, "zzz", NULL) == NULL);
        CHECK_STR_CONTAINS(accel_last_error(), "has no tensor 'zzz'");
        accel_clear_error();
        accel_checkpoint_close(ck);
    }
    /* the index path works too */
    ck = accel_checkpoint_open(tmp_path("sharded/model.safetensors.index.json"));
    CHECK(ck && accel_checkpoint_count(ck) == 5);
    accel_checkpoint_close(ck);

    /* re-saving as one file removes the stale shards and index */
    CHECK(accel_save_sharded(dir, 4, names, t, 1000000) == ACCEL_OK);
    CHECK(exists(tmp_path("sharded/model.safetensors")));
    CHECK(count_files(dir, "model-") == 0 && !exists(tmp_path("sharded/model.safetensors.index.json")));
    ck = accel_checkpoint_open(dir);
    CHECK(ck && accel_checkpoint_count(ck) == 4 && accel_checkpoint_total_size(ck) == -1);
    accel_checkpoint_close(ck);
    /* and sharding again removes the single file and shards of another count */
    write_file(tmp_path("sharded/model-00001-of-00009.safetensors"), "x", 1);
    CHECK_MSG(accel_save_sharded(dir, 4, names, t, 100) == ACCEL_OK, "%s", accel_last_error());
    CHECK(!exists(tmp_path("sharded/model.safetensors")));
    CHECK(!exists(tmp_path("sharded/model-00001-of-00009.safetensors")));
    CHECK(count_files(dir, "model-") == 3);
    for (int i = 0; i < 4; i++) accel_tensor_free(t[i]);
}

/* st and the last error are fn's refusal of file, a file where a directory belongs. */
static void refused_file(const char *fn, accel_status st, const char *file) {
    char want[320];
    snprintf(want, sizeof want, "%s: Provided path (%s) should be a directory, not a file", fn, file);
    CHECK_MSG(st == ACCEL_ERR_IO && strstr(accel_last_error(), want), "%s: status %d: %s", fn, (int)st,
              accel_last_error());
    accel_clear_error();
}

/* Every directory writer given an existing file refuses it alike:
 * ACCEL_ERR_IO, Accelerate's "Provided path (...) should be a directory, not
 * a file", the file kept and nothing made beside it (save_sharded and the
 * save_pretrained writers said ACCEL_ERR_INVALID_ARG, save_state and
 * save_model ACCEL_ERR_IO). */
static void test_directory_writers_refuse_a_file(void) {
    char file[256], staged[256];
    snprintf(file, sizeof file, "%s", tmp_path("a_file"));
    snprintf(staged, sizeof staged, "%s", tmp_path(".a_file.accel-staging"));
    write_file(file, "keep me", 7);
    accel_tensor *t = filled(4, 0);
    const char *name = "w";
    accel_module *lin = accel_linear_new(2, 2, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_llama_config lc = accel_llama_config_default();
    lc.vocab_size = 16, lc.hidden_size = 8, lc.intermediate_size = 16, lc.num_hidden_layers = 1;
    lc.num_attention_heads = 2, lc.num_key_value_heads = 2, lc.max_position_embeddings = 16;
    accel_module *llama = accel_llama_new(&lc, ACCEL_CPU_DEVICE);
    accel_bert_config bc = accel_bert_config_default();
    bc.vocab_size = 16, bc.hidden_size = 8, bc.num_hidden_layers = 1, bc.num_attention_heads = 2;
    bc.intermediate_size = 16, bc.max_position_embeddings = 16;
    accel_module *bert = accel_bert_new(&bc, ACCEL_CPU_DEVICE);
    CHECK_MSG(t && lin && llama && bert, "%s", accel_last_error());
    refused_file("accel_save_sharded", accel_save_sharded(file, 1, &name, &t, 0), file);
    refused_file("accel_save_sharded", accel_save_sharded_as(file, 1, &name, &t, 0, ACCEL_WEIGHTS_PYTORCH), file);
    refused_file("accel_save_sharded", accel_save_module(file, lin, 0), file);
    refused_file("accel_save_pretrained", accel_save_pretrained(llama, file, 0), file);
    refused_file("accel_bert_save_pretrained", accel_bert_save_pretrained(bert, file, 0), file);
    char *s = read_text(file);
    CHECK_MSG(s && !strcmp(s, "keep me"), "the file now %s", s ? s : "(gone)");
    free(s);
    CHECK(!exists(staged));
    accel_module_free(bert);
    accel_module_free(llama);
    accel_module_free(lin);
    accel_tensor_free(t);
    unlink(file);
}

static void expect_ck_error(const char *path, const char *needle) {
    accel_clear_error();
    accel_checkpoint *ck = accel_checkpoint_open(path);
    CHECK_MSG(ck == NULL, "%s opened", path);
    CHECK_STR_CONTAINS(accel_last_error(), needle);
    accel_checkpoint_close(ck);
    accel_clear_error();
}

static void test_index_errors(void) {
    mkdir(tmp_path("ix"), 0755);
    char ix[256]; /* tmp_path's buffers are reused */
    snprintf(ix, sizeof ix, "%s", tmp_path("ix/model.safetensors.index.json"));
    const char *t1 = "{\"weight_map\": {\"a\": \"../x.safetensors\"}}";
    write_file(ix, t1, strlen(t1));
    expect_ck_error(tmp_path("ix"), "weight_map entry 'a' names shard '../x.safetensors'");
    const char *t2 = "{\"weight_map\": {\"a\": \"/etc/passwd\"}}";
    write_file(ix, t2, strlen(t2));
    expect_ck_error(ix, "no '/', '..' or absolute paths");
    const char *t3 = "{\"weight_map\": {\"a\": \"..\"}}";
    write_file(ix, t3, strlen(t3));
    expect_ck_error(ix, "names shard '..'");
    const char *t4 = "{\"metadata\": {\"total_size\": 4}, \"weight_map\": {\"a\": \"missing.safetensors\"}}";
    write_file(ix, t4, strlen(t4));
    expect_ck_error(ix, "shard 'missing.safetensors' is missing");
    /* there, but no file to read: said as such, not "missing" */
    mkdir(tmp_path("ix/dir.safetensors"), 0755);
    const char *t4d = "{\"weight_map\": {\"a\": \"dir.safetensors\"}}";
    write_file(ix, t4d, strlen(t4d));
    expect_ck_error(ix, "shard 'dir.safetensors' is a directory");
    CHECK(mkfifo(tmp_path("ix/fifo.safetensors"), 0644) == 0);
    const char *t4f = "{\"weight_map\": {\"a\": \"fifo.safetensors\"}}";
    write_file(ix, t4f, strlen(t4f));
    expect_ck_error(ix, "shard 'fifo.safetensors' is not a regular file");
    const char *t5 = "{\"weight_map\": {\"a\": 3}}";
    write_file(ix, t5, strlen(t5));
    expect_ck_error(ix, "weight_map entry 'a' must be a file name");
    write_file(ix, "{\"weight_map\": ", 15);
    expect_ck_error(ix, "invalid JSON");
    /* the index lies: the shard exists but lacks the tensor */
    const char *t6 = "{\"weight_map\": {\"ghost\": \"s.safetensors\"}}";
    write_file(ix, t6, strlen(t6));
    write_st(tmp_path("ix/s.safetensors"), "{}      ", 0);
    accel_checkpoint *ck = accel_checkpoint_open(tmp_path("ix"));
    CHECK(ck != NULL);
    CHECK(ck && accel_checkpoint_find(ck, "ghost", NULL) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "places tensor 'ghost' in this shard but it is not there");
    accel_clear_error();
    accel_checkpoint_close(ck);
    /* two indexes / none; transformers' two names (a Hub folder such as Llama 2's): its safetensors one */
    write_file(tmp_path("ix/other.index.json"), "{}", 2);
    expect_ck_error(tmp_path("ix"), "containing more than one `.index.json` file, delete the irrelevant ones.");
    CHECK(rename(tmp_path("ix/other.index.json"), tmp_path("ix/pytorch_model.bin.index.json")) == 0);
    ck = accel_checkpoint_open(tmp_path("ix"));
    CHECK_MSG(ck != NULL, "%s", accel_last_error());
    CHECK(ck && accel_checkpoint_count(ck) == 1 && !strcmp(accel_checkpoint_name(ck, 0), "ghost"));
    accel_checkpoint_close(ck);
    write_file(tmp_path("ix/other.index.json"), "{}", 2);
    expect_ck_error(tmp_path("ix"), "containing more than one `.index.json` file, delete the irrelevant ones.");
    unlink(tmp_path("ix/pytorch_model.bin.index.json"));
    mkdir(tmp_path("empty"), 0755);
    expect_ck_error(tmp_path("empty"), "is not a folder containing a `.index.json` file or a model.safetensors file");
}

/* Checkpoints written by transformers (save_pretrained, 8 shards). */
static void test_hf_checkpoints(void) {
    accel_checkpoint *ck = accel_checkpoint_open("data/hf_llama_sharded");
    if (!ck && accel_last_status() == ACCEL_ERR_IO) { /* fixture not generated in this checkout */
        accel_clear_error();
        return;
    }
    CHECK_MSG(ck != NULL, "%s", accel_last_error());
    if (!ck) return;
    CHECK(accel_checkpoint_num_shards(ck) == 8);
    int64_t total = 0;
    for (int i = 0; i < accel_checkpoint_count(ck); i++) {
        const accel_st_info *in = accel_checkpoint_find(ck, accel_checkpoint_name(ck, i), NULL);
        CHECK_MSG(in != NULL, "%s", accel_last_error());
        if (in) total += (int64_t)in->nbytes;
    }
    CHECK(total == accel_checkpoint_total_size(ck));
    CHECK(accel_checkpoint_shard_of(ck, "model.embed_tokens.weight") >= 0);
    accel_checkpoint_close(ck);
}

static void test_parse_size(void) {
    static const struct { const char *s; int64_t v; } ok[] = {
        {"0MB", 0},          {"100MB", 100000000},     {"2GiB", 2147483648LL}, {"512KiB", 524288},
        {"1.5GB", 1500000000}, {"100KB", 100000},      {"500", 500},           {"10GB", 10000000000LL},
        {"1MiB", 1048576},   {"100Mb", 12500000},      {"5gb", 625000000},
        /* what Python's float() takes before the unit, as Accelerate reads it */
        {" 5GB", 5000000000LL}, {"5 GB", 5000000000LL}, {"+5GB", 5000000000LL}, {"1_000MB", 1000000000},
        {"5.MB", 5000000},   {".5KB", 500},            {"1e3KB", 1000000},     {"-0GB", 0}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int64_t v = -1;
        CHECK_MSG(accel_parse_size(ok[i].s, &v) == ACCEL_OK && v == ok[i].v, "%s -> %lld", ok[i].s, (long long)v);
    }
    static const char *bad[] = {"5MBB", "5k0MB", "-1GB", "", "GB", "12XB", "1e999GB", "nanGB", "infGB", "0x10MB",
                                "1__0MB", "_1MB", "1_MB", "1_.5MB", "+-5GB", "5GB ", " ", "e5MB", "1eMB", " 500"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t v;
        CHECK_MSG(accel_parse_size(bad[i], &v) == ACCEL_ERR_INVALID_ARG, "%s", bad[i]);
        CHECK_STR_CONTAINS(accel_last_error(), "is not in a valid format");
        accel_clear_error();
    }
    /* float() takes any length: 70 blanks before the number, 90 zeros in it (a 63-character cap refused both) */
    char padded[96], zeros[128];
    snprintf(padded, sizeof padded, "%70s5GB", "");
    snprintf(zeros, sizeof zeros, "%090d5.5MB", 0);
    int64_t v = -1;
    CHECK_MSG(accel_parse_size(padded, &v) == ACCEL_OK && v == 5000000000LL, "'%s' -> %lld (%s)", padded,
              (long long)v, accel_last_error());
    CHECK_MSG(accel_parse_size(zeros, &v) == ACCEL_OK && v == 5500000, "'%s' -> %lld (%s)", zeros, (long long)v,
              accel_last_error());
}

/* A byte count is exact up to INT64_MAX (it went through a double: 2^53 + 1
 * came back as 2^53, and 9.2e18..2^63 - 1 were refused), and a size past
 * int64 (Python takes any) is refused as too large, not as a bad format. */
static void test_parse_size_limits(void) {
    static const struct { const char *s; int64_t v; } ok[] = {
        {"9007199254740993", 9007199254740993LL}, {"9223372036854775807", INT64_MAX},
        {"9223372036854775000", 9223372036854775000LL}, {"8GiB", 8589934592LL}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int64_t v = -1;
        CHECK_MSG(accel_parse_size(ok[i].s, &v) == ACCEL_OK && v == ok[i].v, "%s -> %lld (%s)", ok[i].s,
                  (long long)v, accel_last_error());
        accel_clear_error();
    }
    static const char *big[] = {"9223372036854775808", "99999999999999999999999", "1e30GB", "9223372036854775807KB",
                                "8589934592GiB"};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        int64_t v = -1;
        CHECK_MSG(accel_parse_size(big[i], &v) == ACCEL_ERR_INVALID_ARG && v == -1, "%s -> %lld", big[i],
                  (long long)v);
        CHECK_STR_CONTAINS(accel_last_error(), big[i]);
        CHECK_STR_CONTAINS(accel_last_error(), "too large");
        accel_clear_error();
    }
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_st_XXXXXX");
    if (!mkdtemp(g_dir)) return 2;
    RUN(test_roundtrip);
    RUN(test_python_fixture);
    RUN(test_python_verdicts);
    RUN(test_corrupt_files);
    RUN(test_sharded);
    RUN(test_directory_writers_refuse_a_file);
    RUN(test_index_errors);
    RUN(test_hf_checkpoints);
    RUN(test_parse_size);
    RUN(test_parse_size_limits);
    rm_rf(g_dir);
    accel_thread_cleanup();
    return check_summary();
}
