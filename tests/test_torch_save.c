/* The PyTorch-format writer (accel_torch_save, save_model with
 * safe_serialization off): accel's files against files torch.save wrote for
 * the same state dicts (tools/gen_torch_save_fixture.py -> data/torch_save/):
 * data.pkl byte for byte, every record's bytes, offsets and CRC, the local
 * headers and central directory entries; the sharded layout and index;
 * accel's loaders reading the files back; save_model's options. */
#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/io.h"
#include "check.h"
#include "test_files.h"

static char g_dir[64];

static const char *tmp_path(const char *name) { return path_in(g_dir, name); }

static bool exists(const char *path) { return access(path, F_OK) == 0; }

/* ---------------------------------------------------------------- a zip reader for the checks */

static uint32_t le(const unsigned char *p, int bytes) {
    uint32_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

typedef struct zentry {
    const unsigned char *central; /* its central directory entry */
    size_t central_len;
    char name[128];
    uint32_t crc, size, offset;
    const unsigned char *data;
} zentry;

/* The entries of a zip in central directory order (at most `max`); -1 when malformed. */
static int zip_entries(const blob *z, zentry *out, int max) {
    if (z->n < 22) return -1;
    const unsigned char *end = z->p + z->n - 22;
    if (le(end, 4) != 0x06054b50u) return -1;
    int n = (int)le(end + 10, 2);
    size_t at = le(end + 16, 4);
    for (int i = 0; i < n && i < max; i++) {
        const unsigned char *c = z->p + at;
        if (at + 46 > z->n || le(c, 4) != 0x02014b50u) return -1;
        zentry *e = &out[i];
        size_t name_len = le(c + 28, 2), extra = le(c + 30, 2), comment = le(c + 32, 2);
        if (name_len >= sizeof e->name) return -1;
        memcpy(e->name, c + 46, name_len);
        e->name[name_len] = 0;
        e->central = c;
        e->central_len = 46 + name_len + extra + comment;
        e->crc = le(c + 16, 4);
        e->size = le(c + 24, 4);
        e->offset = le(c + 42, 4);
        const unsigned char *l = z->p + e->offset;
        if (le(l, 4) != 0x04034b50u) return -1;
        e->data = l + 30 + le(l + 26, 2) + le(l + 28, 2);
        at += e->central_len;
    }
    return n;
}

/* accel's file equals torch's but for the .data/serialization_id record
 * (its last), which accel does not write: the bytes before that record's
 * local header are identical (local headers, padding, data, descriptors),
 * and so is every central directory entry. */
static void check_like_torch(const char *fixture, const char *mine) {
    blob t = read_all(fixture), a = read_all(mine);
    zentry te[1100], ae[1100];
    int nt = zip_entries(&t, te, 1100), na = zip_entries(&a, ae, 1100);
    CHECK_MSG(nt > 1 && na == nt - 1, "%s: %d entries, torch's %s: %d", mine, na, fixture, nt);
    if (nt > 1 && na == nt - 1) {
        CHECK(strstr(te[nt - 1].name, "/.data/serialization_id") != NULL);
        size_t prefix = te[nt - 1].offset;
        CHECK_MSG(a.n > prefix && memcmp(a.p, t.p, prefix) == 0, "%s differs from %s before byte %zu", mine,
                  fixture, prefix);
        for (int i = 0; i < na; i++) {
            CHECK_MSG(strcmp(ae[i].name, te[i].name) == 0, "entry %d: %s vs %s", i, ae[i].name, te[i].name);
            CHECK_MSG(ae[i].central_len == te[i].central_len &&
                          memcmp(ae[i].central, te[i].central, ae[i].central_len) == 0,
                      "%s: central directory entry %s differs", mine, ae[i].name);
            CHECK(ae[i].data - a.p == te[i].data - t.p && (ae[i].data - a.p) % 64 == 0);
        }
    }
    free(t.p);
    free(a.p);
}

static blob zip_member(const char *path, const char *suffix) {
    blob z = read_all(path), out = {0};
    zentry e[1100];
    int n = zip_entries(&z, e, 1100);
    for (int i = 0; i < n; i++)
        if (strlen(e[i].name) >= strlen(suffix) && !strcmp(e[i].name + strlen(e[i].name) - strlen(suffix), suffix)) {
            out.n = e[i].size;
            out.p = malloc(out.n + 1);
            memcpy(out.p, e[i].data, out.n);
        }
    free(z.p);
    return out;
}

/* ---------------------------------------------------------------- the fixtures' state dicts */

typedef struct dict {
    int n;
    const char *names[1001];
    accel_tensor *t[1001];
    accel_tensor *owned[1001];
    int n_owned;
} dict;

static accel_tensor *own(dict *d, accel_tensor *t) {
    d->owned[d->n_owned++] = t;
    return t;
}
static void add(dict *d, const char *name, accel_tensor *t) {
    d->names[d->n] = name;
    d->t[d->n++] = t;
}
static void dict_free(dict *d) {
    for (int i = 0; i < d->n_owned; i++) accel_tensor_free(d->owned[i]);
}

/* A persistent copy in dtype dt of floats v. */
static accel_tensor *make(accel_dtype dt, int ndim, const int64_t *shape, const float *v) {
    accel_tensor *f = accel_from_floats(ndim, shape, v);
    accel_tensor *c = accel_to_dtype(f, dt);
    accel_tensor *p = accel_tensor_clone_persistent(c, ACCEL_CPU_DEVICE);
    accel_step_reset();
    return p;
}

/* tools/gen_torch_save_fixture.py small(): f32, bf16, f16, a scalar, an
 * empty tensor, and lm_head.weight tied to embed.weight. */
static void small_dict(dict *d) {
    float e[12], norm[4] = {1.0f, -2.5f, 3.140625f, 1e-3f}, proj[4] = {0.5f, -1.25f, 65504.0f, 6.1e-05f},
                 step = 7.0f;
    for (int i = 0; i < 12; i++) e[i] = (float)i / 4 - 0.5f;
    accel_tensor *embed = own(d, make(ACCEL_F32, ACCEL_SHAPE(4, 3), e));
    add(d, "embed.weight", embed);
    add(d, "norm.weight", own(d, make(ACCEL_BF16, ACCEL_SHAPE(4), norm)));
    add(d, "proj.weight", own(d, make(ACCEL_F16, ACCEL_SHAPE(2, 2), proj)));
    add(d, "step", own(d, make(ACCEL_F32, 0, NULL, &step)));
    add(d, "empty", own(d, accel_tensor_clone_persistent(accel_zeros(ACCEL_F32, ACCEL_SHAPE(0, 4)), ACCEL_CPU_DEVICE)));
    accel_step_reset();
    add(d, "lm_head.weight", embed);
}

/* many(): 1001 one-element tensors (long memo indices, two SETITEMS batches).
 * Names of 16 bytes: room for any int, as gcc -O1 -fsanitize=address counts. */
static void many_dict(dict *d, char names[][16]) {
    for (int i = 0; i < 1001; i++) {
        float v = (float)i;
        snprintf(names[i], 16, "p%d", i);
        add(d, names[i], own(d, make(ACCEL_F32, ACCEL_SHAPE(1), &v)));
    }
}

static void test_small_like_torch(void) {
    dict d = {0};
    small_dict(&d);
    CHECK_MSG(accel_torch_save(tmp_path("small.bin"), d.n, d.names, d.t) == ACCEL_OK, "%s", accel_last_error());
    CHECK(!exists(tmp_path("small.bin.tmp")));
    blob mine = zip_member(tmp_path("small.bin"), "/data.pkl"), torch = zip_member("data/torch_save/small.bin", "/data.pkl");
    CHECK(mine.n > 0 && mine.n == torch.n && memcmp(mine.p, torch.p, mine.n) == 0);
    free(mine.p);
    free(torch.p);
    check_like_torch("data/torch_save/small.bin", tmp_path("small.bin"));
    /* the tied pair is one storage: 5 data records for 6 names */
    blob z = read_all(tmp_path("small.bin"));
    zentry e[16];
    int n = zip_entries(&z, e, 16), records = 0;
    for (int i = 0; i < n; i++) records += strstr(e[i].name, "small/data/") != NULL;
    CHECK(records == 5);
    free(z.p);
    dict_free(&d);
}

static void test_empty_one_many_like_torch(void) {
    CHECK(accel_torch_save(tmp_path("empty.bin"), 0, NULL, NULL) == ACCEL_OK);
    check_like_torch("data/torch_save/empty.bin", tmp_path("empty.bin"));
    float w[3] = {1.5f, -2.0f, 3.0f};
    accel_tensor *one = make(ACCEL_BF16, ACCEL_SHAPE(1, 3), w);
    const char *one_name[1] = {"w"};
    CHECK(accel_torch_save(tmp_path("one.bin"), 1, one_name, &one) == ACCEL_OK);
    check_like_torch("data/torch_save/one.bin", tmp_path("one.bin"));
    accel_tensor_free(one);
    dict d = {0};
    static char names[1001][16];
    many_dict(&d, names);
    CHECK(accel_torch_save(tmp_path("many.bin"), d.n, d.names, d.t) == ACCEL_OK);
    check_like_torch("data/torch_save/many.bin", tmp_path("many.bin"));
    dict_free(&d);
}

static void test_bad_input(void) {
    accel_tensor *t = accel_tensor_clone_persistent(accel_zeros(ACCEL_F32, ACCEL_SHAPE(2)), ACCEL_CPU_DEVICE);
    accel_step_reset();
    const char *dup[2] = {"a", "a"};
    accel_tensor *two[2] = {t, t};
    CHECK(accel_torch_save(tmp_path("dup.bin"), 2, dup, two) == ACCEL_ERR_INVALID_ARG);
    CHECK(strstr(accel_last_error(), "'a' given twice") != NULL);
    const char *unnamed[1] = {""};
    CHECK(accel_torch_save(tmp_path("unnamed.bin"), 1, unnamed, two) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_torch_save(tmp_path("no/such/dir/x.bin"), 1, dup, two) == ACCEL_ERR_IO);
    CHECK(!exists(tmp_path("dup.bin")) && !exists(tmp_path("unnamed.bin")));
    accel_clear_error();
    accel_tensor_free(t);
}

/* accel reads these files back (tests/test_torch_load.c covers the reader);
 * the legacy (torch < 1.6) format is refused by name, not misparsed. */
static void test_loaders_read_torch_files(void) {
    accel_safetensors *st = accel_safetensors_open("data/torch_save/small.bin");
    CHECK_MSG(st && accel_safetensors_count(st) == 6, "%s", accel_last_error());
    accel_safetensors_close(st);
    st = accel_safetensors_open("data/torch_save/empty.bin");
    CHECK_MSG(st && accel_safetensors_count(st) == 0, "%s", accel_last_error());
    accel_safetensors_close(st);
    /* 1001 entries: LONG_BINPUT / LONG_BINGET, two SETITEMS batches */
    st = accel_safetensors_open("data/torch_save/many.bin");
    const accel_st_info *last = st ? accel_safetensors_find(st, "p1000") : NULL;
    CHECK_MSG(st && accel_safetensors_count(st) == 1001 && last && *(const float *)last->bytes == 1000.0f, "%s",
              accel_last_error());
    accel_safetensors_close(st);
    /* the legacy (torch < 1.6) format starts with the pickled magic number */
    static const unsigned char legacy[16] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                             0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e, 0x80};
    FILE *f = fopen(tmp_path("legacy.pt"), "wb");
    fwrite(legacy, 1, sizeof legacy, f);
    fclose(f);
    CHECK(accel_safetensors_open(tmp_path("legacy.pt")) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_UNSUPPORTED && strstr(accel_last_error(), "legacy pickle"));
    mkdir(tmp_path("torch_dir"), 0755);
    dict d = {0};
    small_dict(&d);
    CHECK(accel_save_sharded_as(tmp_path("torch_dir"), d.n, d.names, d.t, 1 << 20, ACCEL_WEIGHTS_PYTORCH) == ACCEL_OK);
    accel_checkpoint *ck = accel_checkpoint_open(tmp_path("torch_dir"));
    CHECK_MSG(ck && accel_checkpoint_count(ck) == d.n && !strcmp(accel_checkpoint_shard_path(ck, 0), "pytorch_model.bin"),
              "%s", accel_last_error());
    accel_checkpoint_close(ck);
    accel_clear_error();
    dict_free(&d);
}

static json_t *load_json(const char *path) { return json_load_file(path, 0, NULL); }

/* transformers' layout: pytorch_model-0000i-of-0000N.bin + pytorch_model.bin.index.json
 * (tied names in the weight map, their storage counted once); stale files go. */
static void test_sharded_pytorch(void) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s", tmp_path("sharded"));
    mkdir(dir, 0755);
    FILE *f = fopen(tmp_path("sharded/pytorch_model-00001-of-00009.bin"), "wb");
    fclose(f);
    dict d = {0};
    small_dict(&d);
    /* 48-byte embed, 8, 8, 4, 0: shards of at most 16 bytes -> [embed, lm_head] [norm, proj] [step, empty] */
    CHECK_MSG(accel_save_sharded_as(dir, d.n, d.names, d.t, 16, ACCEL_WEIGHTS_PYTORCH) == ACCEL_OK, "%s",
              accel_last_error());
    CHECK(exists(tmp_path("sharded/pytorch_model-00001-of-00003.bin")) &&
          exists(tmp_path("sharded/pytorch_model-00003-of-00003.bin")));
    CHECK(!exists(tmp_path("sharded/pytorch_model-00001-of-00009.bin")) && !exists(tmp_path("sharded/pytorch_model.bin")));
    json_t *ix = load_json(tmp_path("sharded/pytorch_model.bin.index.json"));
    json_t *wm = json_object_get(ix, "weight_map");
    CHECK(json_object_size(wm) == 6);
    CHECK(!strcmp(json_string_value(json_object_get(wm, "lm_head.weight")), "pytorch_model-00001-of-00003.bin"));
    CHECK(!strcmp(json_string_value(json_object_get(wm, "proj.weight")), "pytorch_model-00002-of-00003.bin"));
    CHECK(json_integer_value(json_object_get(json_object_get(ix, "metadata"), "total_size")) == 68);
    json_decref(ix);
    /* the archive inside each shard is named after it, as torch names it */
    blob pkl = zip_member(tmp_path("sharded/pytorch_model-00001-of-00003.bin"), "pytorch_model-00001-of-00003/data.pkl");
    CHECK(pkl.n > 0);
    free(pkl.p);
    /* one shard again: the index and the old shards are removed */
    CHECK(accel_save_sharded_as(dir, d.n, d.names, d.t, 1 << 20, ACCEL_WEIGHTS_PYTORCH) == ACCEL_OK);
    CHECK(exists(tmp_path("sharded/pytorch_model.bin")) && !exists(tmp_path("sharded/pytorch_model.bin.index.json")) &&
          !exists(tmp_path("sharded/pytorch_model-00001-of-00003.bin")));
    CHECK(accel_save_sharded_as(dir, d.n, d.names, d.t, 16, (accel_weights_format)7) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    dict_free(&d);
}

/* ---------------------------------------------------------------- save_model's options */

static accel_module *tied_llama(void) {
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 32;
    c.hidden_size = 8;
    c.intermediate_size = 16;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 16;
    c.tie_word_embeddings = true;
    accel_manual_seed(3);
    return accel_llama_new(&c, ACCEL_CPU_DEVICE);
}

static int count_files(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t len = strlen(e->d_name), sl = strlen(suffix);
        n += len >= sl && !strcmp(e->d_name + len - sl, suffix);
    }
    if (d) closedir(d);
    return n;
}

static bool has_bytes(const blob *b, const char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i + n <= b->n; i++)
        if (!memcmp(b->p + i, s, n)) return true;
    return false;
}

static void test_save_model_options(void) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    accel_module *m = tied_llama();
    CHECK(acc && m);
    /* default: safetensors, the tied alias dropped as Accelerate drops it */
    char safe[256];
    snprintf(safe, sizeof safe, "%s", tmp_path("safe"));
    CHECK_MSG(accel_accelerator_save_model_with(acc, m, safe, NULL) == ACCEL_OK, "%s", accel_last_error());
    accel_checkpoint *ck = accel_checkpoint_open(safe);
    CHECK(ck && accel_checkpoint_shard_of(ck, "model.embed_tokens.weight") == 0 &&
          accel_checkpoint_shard_of(ck, "lm_head.weight") == -1);
    accel_checkpoint_close(ck);
    /* safe_serialization=False: pytorch_model.bin with both names over one storage */
    char bin[256];
    snprintf(bin, sizeof bin, "%s", tmp_path("bin"));
    CHECK(accel_accelerator_save_model_with(acc, m, bin, &(accel_save_model_opts){.no_safe_serialization = true}) ==
          ACCEL_OK);
    char path[300];
    snprintf(path, sizeof path, "%s/pytorch_model.bin", bin);
    blob pkl = zip_member(path, "pytorch_model/data.pkl");
    CHECK(pkl.n > 0);
    CHECK(has_bytes(&pkl, "lm_head.weight") && has_bytes(&pkl, "model.embed_tokens.weight"));
    free(pkl.p);
    CHECK(!exists(tmp_path("bin/model.safetensors")));
    /* max_shard_size as an int (bytes): several shards + the index */
    char ints[256];
    snprintf(ints, sizeof ints, "%s", tmp_path("ints"));
    CHECK(accel_accelerator_save_model_with(
              acc, m, ints, &(accel_save_model_opts){.max_shard_bytes = 600, .no_safe_serialization = true}) ==
          ACCEL_OK);
    CHECK(count_files(ints, ".bin") > 1 && exists(tmp_path("ints/pytorch_model.bin.index.json")));
    /* the string form ("500MB") and parents created as os.makedirs does */
    CHECK(accel_accelerator_save_model_with(acc, m, tmp_path("a/b/c"), &(accel_save_model_opts){.max_shard_size = "500MB"}) ==
          ACCEL_OK);
    CHECK(exists(tmp_path("a/b/c/model.safetensors")));
    CHECK(accel_accelerator_save_model_with(acc, m, ints, &(accel_save_model_opts){.max_shard_size = "1GB", .max_shard_bytes = 5}) ==
          ACCEL_ERR_INVALID_ARG);
    CHECK(strstr(accel_last_error(), "not both") != NULL);
    CHECK(accel_accelerator_save_model_with(acc, m, ints, &(accel_save_model_opts){.max_shard_bytes = -1}) ==
          ACCEL_ERR_INVALID_ARG);
    CHECK(accel_accelerator_save_model_with(acc, m, ints, &(accel_save_model_opts){.max_shard_size = "10XB"}) ==
          ACCEL_ERR_INVALID_ARG);
    CHECK(accel_accelerator_save_model(acc, m, tmp_path("small.bin"), NULL) == ACCEL_ERR_IO);
    CHECK(strstr(accel_last_error(), "should be a directory, not a file") != NULL);
    accel_clear_error();
    accel_module_free(m);
    accel_accelerator_free(acc);
}

int main(void) {
    /* ACCEL_TORCH_SAVE_KEEP=DIR: write there and keep the files, for
     * tools/check_torch_loads_accel.py to load them with torch */
    const char *keep = getenv("ACCEL_TORCH_SAVE_KEEP");
    snprintf(g_dir, sizeof g_dir, "%s", keep ? keep : "/tmp/accel_torch_save_XXXXXX");
    if (!keep && !mkdtemp(g_dir)) return 1;
    RUN(test_small_like_torch);
    RUN(test_empty_one_many_like_torch);
    RUN(test_bad_input);
    RUN(test_loaders_read_torch_files);
    RUN(test_sharded_pytorch);
    RUN(test_save_model_options);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (!keep && system(cmd) != 0) return 1;
    return check_summary();
}
