/* Reading PyTorch files (torch.save's zip format) through accel_safetensors_open
 * and the checkpoint loaders: files torch wrote (tools/gen_torch_load_fixtures.py
 * -> data/torch_load/) against the same tensors saved by safetensors, every
 * storage type, tied weights, views, a transpose, a Parameter, OrderedDict
 * metadata, protocol 4; accel_torch_save's files read back; folder resolution;
 * transformers-style sharded .bin weights of a tiny Llama giving the logits of
 * its safetensors checkpoint; and hostile files: every truncation, bit flips,
 * crafted pickles and zips, each refused by name without a crash. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/bert.h"
#include "accel/bigmodel.h"
#include "accel/io.h"
#include "check.h"
#include "test_files.h"
#include "io/safetensors_internal.h"
#include "io/zip_internal.h"

static char g_dir[64];

static const char *tmp_path(const char *name) { return path_in(g_dir, name); }

static void write_all(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(p, 1, n, f);
    fclose(f);
}

static bool same_info(const accel_st_info *a, const accel_st_info *b) {
    if (!a || !b || a->dtype != b->dtype || a->ndim != b->ndim || a->nbytes != b->nbytes) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return memcmp(a->bytes, b->bytes, a->nbytes) == 0;
}

static bool in_file(const accel_st_info *in, const accel_st_info *any, size_t file_size) {
    const unsigned char *base = (const unsigned char *)any->bytes - any->begin; /* the mapping */
    return (const unsigned char *)in->bytes >= base && (const unsigned char *)in->bytes < base + file_size;
}

/* ---------------------------------------------------------------- files torch wrote */

static void test_mixed_like_safetensors(void) {
    accel_safetensors *st = accel_safetensors_open("data/torch_load/mixed.bin");
    accel_safetensors *ex = accel_safetensors_open("data/torch_load/mixed.expected.safetensors");
    CHECK_MSG(st && ex, "%s", accel_last_error());
    if (!st || !ex) return;
    CHECK(accel_safetensors_count(st) == 16 && accel_safetensors_count(ex) == 16);
    for (int i = 0; i < accel_safetensors_count(ex); i++) {
        const accel_st_info *want = accel_safetensors_at(ex, i);
        CHECK_MSG(same_info(accel_safetensors_find(st, want->name), want), "tensor '%s' differs", want->name);
    }
    struct stat sb;
    stat("data/torch_load/mixed.bin", &sb);
    const accel_st_info *a = accel_safetensors_find(st, "a"), *tied = accel_safetensors_find(st, "a_tied"),
                        *row = accel_safetensors_find(st, "row"), *t = accel_safetensors_find(st, "t");
    /* tied: two entries over the same bytes; a view at an offset: inside them; in place */
    CHECK(a && tied && row && t && a->bytes == tied->bytes && (const char *)row->bytes == (const char *)a->bytes + 12);
    CHECK(a && row && in_file(a, a, (size_t)sb.st_size) && in_file(row, a, (size_t)sb.st_size));
    CHECK(a && t && !in_file(t, a, (size_t)sb.st_size)); /* the transpose: a gathered copy */
    CHECK(accel_safetensors_metadata(st, "format") == NULL);
    accel_tensor *z = accel_safetensors_tensor(st, "a", -1);
    CHECK(z && (z->flags & ACCEL_TF_MMAP) && z->dtype == ACCEL_F32 && z->ndim == 2);
    accel_tensor_free(z);
    /* conversion through load_into: bf16 on disk into f32 */
    accel_tensor *bf = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){2, 2}, ACCEL_CPU_DEVICE);
    CHECK(accel_safetensors_load_into(st, "bf", bf) == ACCEL_OK);
    float v[4];
    accel_to_floats(bf, v);
    CHECK(v[0] == 1.0f && v[1] == -2.5f && v[2] == 3.140625f);
    accel_tensor_free(bf);
    accel_safetensors_close(st);
    accel_safetensors_close(ex);
}

static void test_protocol_4(void) {
    accel_safetensors *st = accel_safetensors_open("data/torch_load/proto4.bin");
    CHECK_MSG(st, "%s", accel_last_error());
    if (!st) return;
    const accel_st_info *w = accel_safetensors_find(st, "w"), *n = accel_safetensors_find(st, "n");
    CHECK(w && w->dtype == ACCEL_F32 && w->ndim == 2 && ((const float *)w->bytes)[1] == -2.0f);
    CHECK(n && n->dtype == ACCEL_I64 && ((const int64_t *)n->bytes)[0] == 3);
    accel_safetensors_close(st);
}

static void expect_open_error(const char *path, accel_status want, const char *msg) {
    accel_safetensors *st = accel_safetensors_open(path);
    CHECK_MSG(st == NULL, "%s opened", path);
    accel_safetensors_close(st);
    CHECK_MSG(accel_last_status() == want, "%s: status %d: %s", path, accel_last_status(), accel_last_error());
    CHECK_STR_CONTAINS(accel_last_error(), path);
    CHECK_STR_CONTAINS(accel_last_error(), msg);
    accel_clear_error();
}

static void test_refused_files(void) {
    expect_open_error("data/torch_load/expand.bin", ACCEL_ERR_UNSUPPORTED, "tensor 'big': shape [64, 64] is strided "
                      "over a smaller storage");
    expect_open_error("data/torch_load/nested.bin", ACCEL_ERR_UNSUPPORTED, "entry 'model' is a dict, not a tensor");
    /* the legacy (torch < 1.6) format starts with the pickled magic number */
    static const unsigned char legacy[16] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                             0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e, 0x80};
    write_all(tmp_path("legacy.pt"), legacy, sizeof legacy);
    expect_open_error(tmp_path("legacy.pt"), ACCEL_ERR_UNSUPPORTED, "legacy pickle format (torch < 1.6)");
}

/* ---------------------------------------------------------------- accel's own files */

typedef struct dict {
    int n;
    const char *names[8];
    accel_tensor *t[8];
} dict;

static accel_tensor *make(accel_dtype dt, int ndim, const int64_t *shape, const void *bytes) {
    accel_tensor *t = accel_tensor_new(dt, ndim, shape, ACCEL_CPU_DEVICE);
    if (t && accel_nbytes(t)) accel_tensor_from_host(t, bytes);
    return t;
}

/* f32 (and its tied alias), bf16, i64, bool, an empty f16 */
static void small_dict(dict *d) {
    float e[12];
    for (int i = 0; i < 12; i++) e[i] = (float)i / 4 - 0.5f;
    uint16_t nv[3] = {0x3f80, 0xc020, 0x4049}; /* bf16 1, -2.5, 3.140625 */
    int64_t iv[2] = {-7, 1LL << 40};
    bool bv[3] = {true, false, true};
    accel_tensor *embed = make(ACCEL_F32, 2, (int64_t[]){4, 3}, e);
    *d = (dict){6, {"embed.weight", "norm.weight", "ids", "mask", "lm_head.weight", "empty"},
                {embed, make(ACCEL_BF16, 1, (int64_t[]){3}, nv), make(ACCEL_I64, 1, (int64_t[]){2}, iv),
                 make(ACCEL_BOOL, 1, (int64_t[]){3}, bv), embed, make(ACCEL_F16, 2, (int64_t[]){0, 2}, NULL)}};
}

static void dict_free(dict *d) {
    for (int i = 0; i < d->n; i++)
        if (i != 4) accel_tensor_free(d->t[i]); /* 4 is 0 again (tied) */
}

static void check_against(accel_checkpoint *ck, const dict *d) {
    CHECK(ck && accel_checkpoint_count(ck) == d->n);
    for (int i = 0; ck && i < d->n; i++) {
        const accel_st_info *in = accel_checkpoint_find(ck, d->names[i], NULL);
        unsigned char want[64];
        accel_tensor_to_host(d->t[i], want);
        CHECK_MSG(in && in->dtype == d->t[i]->dtype && in->nbytes == accel_nbytes(d->t[i]) &&
                      memcmp(in->bytes, want, in->nbytes) == 0,
                  "%s differs", d->names[i]);
    }
}

static void test_accel_torch_save_read_back(void) {
    dict d;
    small_dict(&d);
    CHECK(accel_torch_save(tmp_path("own.bin"), d.n, d.names, d.t) == ACCEL_OK);
    accel_checkpoint *ck = accel_checkpoint_open(tmp_path("own.bin"));
    CHECK_MSG(ck, "%s", accel_last_error());
    check_against(ck, &d);
    if (ck) CHECK(accel_checkpoint_find(ck, "embed.weight", NULL)->bytes ==
                  accel_checkpoint_find(ck, "lm_head.weight", NULL)->bytes); /* one storage */
    accel_checkpoint_close(ck);
    /* sharded, in transformers' names: read through pytorch_model.bin.index.json */
    mkdir(tmp_path("own_sharded"), 0755);
    CHECK(accel_save_sharded_as(tmp_path("own_sharded"), d.n, d.names, d.t, 16, ACCEL_WEIGHTS_PYTORCH) == ACCEL_OK);
    ck = accel_checkpoint_open(tmp_path("own_sharded"));
    CHECK_MSG(ck && accel_checkpoint_num_shards(ck) > 1, "%s", accel_last_error());
    check_against(ck, &d);
    accel_checkpoint_close(ck);
    dict_free(&d);
}

/* ---------------------------------------------------------------- folders */

static void copy_file(const char *from, const char *to) {
    blob b = read_all(from);
    write_all(to, b.p, b.n);
    free(b.p);
}

static void test_folder_resolution(void) {
    /* pytorch_model.bin alone */
    mkdir(tmp_path("bin_only"), 0755);
    copy_file("data/torch_load/proto4.bin", tmp_path("bin_only/pytorch_model.bin"));
    accel_checkpoint *ck = accel_checkpoint_open(tmp_path("bin_only"));
    CHECK_MSG(ck && accel_checkpoint_count(ck) == 2 && !strcmp(accel_checkpoint_shard_path(ck, 0), "pytorch_model.bin"),
              "%s", accel_last_error());
    accel_checkpoint_close(ck);
    /* transformers prefers pytorch_model.bin to pytorch_model.bin.index.json */
    write_all(tmp_path("bin_only/pytorch_model.bin.index.json"), "{\"weight_map\": {\"x\": \"nothing.bin\"}}", 37);
    ck = accel_checkpoint_open(tmp_path("bin_only"));
    CHECK_MSG(ck && !strcmp(accel_checkpoint_shard_path(ck, 0), "pytorch_model.bin"), "%s", accel_last_error());
    accel_checkpoint_close(ck);
    /* and model.safetensors to both */
    copy_file("data/st_small.safetensors", tmp_path("bin_only/model.safetensors"));
    ck = accel_checkpoint_open(tmp_path("bin_only"));
    CHECK(ck && !strcmp(accel_checkpoint_shard_path(ck, 0), "model.safetensors"));
    accel_checkpoint_close(ck);
    /* the .bin index alone */
    ck = accel_checkpoint_open("data/torch_load/llama_bin");
    CHECK_MSG(ck && accel_checkpoint_num_shards(ck) == 3, "%s", accel_last_error());
    accel_checkpoint_close(ck);
    /* neither: the error as before */
    mkdir(tmp_path("neither"), 0755);
    CHECK(accel_checkpoint_open(tmp_path("neither")) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "is not a folder containing a `.index.json` file or a model.safetensors file");
    accel_clear_error();
}

/* ---------------------------------------------------------------- a model */

/* strided_big.bin: Linear(256, 256) whose weight was saved transposed (256
 * KiB, which the reader gathers into a copy of its own: no page of the
 * file). Loaded resident, offloaded to a host copy (offload_cpu) and left on
 * disk, each run twice through the model: y = x W^T + b of a ones row,
 * exactly. The loader released the pages it had read as pages of the file's
 * mapping: on the gathered copy that was madvise over heap memory (glibc
 * aborted at the free), and a disk entry's next forward read zeros. */
static void test_strided_big(void) {
    static const struct { const char *map; bool offload_cpu; } runs[] = {{NULL, false}, {":cpu", true}, {":disk", false}};
    float want[256];
    for (int i = 0; i < 256; i++) {
        double sum = i - 128;
        for (int j = 0; j < 256; j++) sum += (256 * j + i) % 251;
        want[i] = (float)sum;
    }
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        const char *how = runs[r].map ? runs[r].map : "resident";
        accel_module *m = accel_linear_new(256, 256, true, ACCEL_CPU_DEVICE, ACCEL_F32);
        accel_device_map *map = runs[r].map ? accel_device_map_parse(runs[r].map) : NULL;
        accel_load_opts o = {.offload_cpu = runs[r].offload_cpu};
        accel_dispatched *d = m ? accel_load_checkpoint_and_dispatch(m, "data/torch_load/strided_big.bin", map, NULL,
                                                                     NULL, &o)
                                : NULL;
        accel_device_map_free(map);
        CHECK_MSG(d, "%s: %s", how, accel_last_error());
        accel_dispatch_stats s = {0};
        if (d) accel_dispatched_stats(d, &s);
        CHECK_MSG(s.n_offloaded_cpu == (r == 1 ? 2 : 0) && s.n_offloaded_disk == (r == 2 ? 2 : 0),
                  "%s: %lld on cpu, %lld on disk", how, (long long)s.n_offloaded_cpu, (long long)s.n_offloaded_disk);
        for (int pass = 0; d && pass < 2; pass++) {
            accel_tensor *y = accel_module_call(m, accel_full(ACCEL_F32, ACCEL_SHAPE(1, 256), 1.0));
            float got[256];
            CHECK_MSG(y && accel_to_floats(y, got) == ACCEL_OK, "%s", accel_last_error());
            if (y) CHECK_MSG(!memcmp(got, want, sizeof got), "%s, pass %d: y[0] %g, want %g", how, pass, got[0], want[0]);
            accel_step_reset();
        }
        accel_dispatched_free(d);
        accel_module_free(m);
    }
}

static accel_tensor *llama_logits(const char *dir, accel_tensor *ids, const char *map_spec) {
    accel_dispatched *d = NULL;
    accel_device_map *map = map_spec ? accel_device_map_parse(map_spec) : NULL;
    accel_module *m = accel_llama_from_pretrained(dir, map, NULL, NULL, NULL, &d);
    accel_device_map_free(map);
    CHECK_MSG(m, "%s: %s", dir, accel_last_error());
    accel_tensor *y = m ? accel_llama_forward(m, ids, NULL) : NULL;
    accel_tensor *out = y ? accel_tensor_clone_persistent(y, ACCEL_CPU_DEVICE) : NULL; /* outlives the step */
    if (d && map_spec) {
        accel_dispatch_stats s;
        accel_dispatched_stats(d, &s);
        CHECK(s.n_offloaded_disk > 0 && s.n_missing == 0 && s.n_unexpected == 0);
    }
    accel_step_reset();
    accel_dispatched_free(d);
    accel_module_free(m);
    return out;
}

static void test_llama_from_bin(void) {
    accel_safetensors *ex = accel_safetensors_open("data/hf_llama_tied/expected.safetensors");
    CHECK(ex);
    if (!ex) return;
    accel_tensor *ids = accel_safetensors_tensor(ex, "ids", -1), *want = accel_safetensors_tensor(ex, "logits", -1);
    accel_tensor *from_bin = llama_logits("data/torch_load/llama_bin", ids, NULL);
    accel_tensor *from_st = llama_logits("data/hf_llama_tied", ids, NULL);
    /* the layers offloaded to disk, from the .bin shards */
    accel_tensor *offloaded = llama_logits("data/torch_load/llama_bin", ids, "model.embed_tokens:cpu,model.layers:disk,"
                                           "model.norm:cpu,lm_head:cpu");
    CHECK(offloaded && from_bin && accel_same_shape(offloaded, from_bin));
    CHECK(from_bin && from_st && want && accel_same_shape(from_bin, want) && accel_same_shape(from_st, want));
    if (from_bin && from_st && want && accel_same_shape(from_bin, want)) {
        int64_t n = accel_numel(want);
        float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n),
              *c = malloc(sizeof(float) * (size_t)n);
        accel_to_floats(from_bin, a);
        accel_to_floats(from_st, b);
        accel_to_floats(want, c);
        if (offloaded) {
            float *o = malloc(sizeof(float) * (size_t)n);
            accel_to_floats(offloaded, o);
            CHECK_MSG(memcmp(a, o, sizeof(float) * (size_t)n) == 0, "logits with disk offload differ");
            free(o);
        }
        double err = 0;
        for (int64_t i = 0; i < n; i++) err = fmax(err, fabs((double)a[i] - c[i]));
        CHECK_MSG(memcmp(a, b, sizeof(float) * (size_t)n) == 0, "logits from .bin and from safetensors differ");
        CHECK_MSG(err <= 1e-4, "max logits error against transformers %g", err);
        free(a);
        free(b);
        free(c);
    }
    accel_tensor_free(from_bin);
    accel_tensor_free(from_st);
    accel_tensor_free(offloaded);
    accel_tensor_free(ids);
    accel_tensor_free(want);
    accel_safetensors_close(ex);
}

/* accel_bert_from_pretrained(dir) holds the n weights ts (named names, or
 * "bert." + names), not fresh ones. */
static void bert_has_weights(const char *dir, const char *const *names, accel_tensor *const *ts, int n) {
    accel_module *m = accel_bert_from_pretrained(dir, ACCEL_CPU_DEVICE);
    CHECK_MSG(m, "%s", accel_last_error());
    int compared = 0;
    for (int i = 0; m && i < n; i++) {
        char full[256]; /* a bare BertModel's checkpoint: the model's names have "bert." first */
        snprintf(full, sizeof full, "bert.%s", names[i]);
        accel_tensor *w = accel_module_get_tensor(m, names[i]);
        if (!w) w = accel_module_get_tensor(m, full);
        if (!w || w->dtype != ts[i]->dtype || accel_nbytes(w) != accel_nbytes(ts[i])) continue;
        unsigned char *a = malloc(accel_nbytes(w) + 1), *b = malloc(accel_nbytes(w) + 1);
        accel_tensor_to_host(w, a);
        accel_tensor_to_host(ts[i], b);
        CHECK_MSG(memcmp(a, b, accel_nbytes(w)) == 0, "%s differs", names[i]);
        compared++;
        free(a);
        free(b);
    }
    CHECK_MSG(compared > 10, "%d weights compared", compared);
    accel_module_free(m);
}

/* BERT's from_pretrained with pytorch_model.bin only, then with an index of
 * another name: the file's weights, not a freshly initialised model (it
 * looked for safetensors only, then for its own list of names). */
static void test_bert_from_bin(void) {
    mkdir(tmp_path("bert_bin"), 0755);
    copy_file("data/hf_bert_base/config.json", tmp_path("bert_bin/config.json"));
    accel_safetensors *st = accel_safetensors_open("data/hf_bert_base/model.safetensors");
    CHECK(st);
    if (!st) return;
    int n = accel_safetensors_count(st);
    const char **names = calloc((size_t)n, sizeof *names);
    accel_tensor **ts = calloc((size_t)n, sizeof *ts);
    for (int i = 0; i < n; i++) {
        names[i] = accel_safetensors_at(st, i)->name;
        ts[i] = accel_safetensors_tensor(st, names[i], -1);
    }
    CHECK(accel_torch_save(tmp_path("bert_bin/pytorch_model.bin"), n, names, ts) == ACCEL_OK);
    bert_has_weights(tmp_path("bert_bin"), names, ts, n);
    /* the weights behind an index of another name, which the loader opens: taken too (from_pretrained's own
     * list of file names missed it, and the model came back initialised) */
    mkdir(tmp_path("bert_ix"), 0755);
    copy_file("data/hf_bert_base/config.json", tmp_path("bert_ix/config.json"));
    CHECK(rename(tmp_path("bert_bin/pytorch_model.bin"), tmp_path("bert_ix/weights.bin")) == 0);
    FILE *f = fopen(tmp_path("bert_ix/weights.index.json"), "w");
    fprintf(f, "{\"weight_map\": {");
    for (int i = 0; i < n; i++) fprintf(f, "%s\"%s\": \"weights.bin\"", i ? ", " : "", names[i]);
    fprintf(f, "}}");
    fclose(f);
    bert_has_weights(tmp_path("bert_ix"), names, ts, n);
    for (int i = 0; i < n; i++) accel_tensor_free(ts[i]);
    free(ts);
    free(names);
    accel_safetensors_close(st);
    accel_clear_error();
}

/* ---------------------------------------------------------------- hostile files */

/* Parses the n bytes (an exact-size copy: ASan sees any overread) and, when
 * accepted, reads every tensor. */
static bool parse_bytes(const unsigned char *p, size_t n) {
    unsigned char *buf = malloc(n ? n : 1);
    memcpy(buf, p, n);
    accel_safetensors *st = accel__safetensors_parse("hostile.bin", buf, n);
    bool ok = st != NULL;
    for (int i = 0; st && i < accel_safetensors_count(st); i++) {
        accel_tensor *t = accel_safetensors_tensor(st, accel_safetensors_at(st, i)->name, ACCEL_F32);
        accel_tensor_free(t);
    }
    if (!ok) CHECK_STR_CONTAINS(accel_last_error(), "hostile.bin");
    accel_safetensors_close(st);
    accel_clear_error();
    free(buf);
    return ok;
}

static void test_truncations_and_flips(void) {
    blob b = read_all("data/torch_load/mixed.bin");
    CHECK(b.n > 1000);
    int accepted = 0;
    for (size_t n = 0; n < b.n; n++) accepted += parse_bytes(b.p, n);
    CHECK_MSG(accepted == 0, "%d truncations accepted", accepted);
    /* every byte with a low and a high bit flipped: accepted or refused by name, never a crash */
    for (size_t i = 0; i < b.n; i++)
        for (int bit = 0; bit < 8; bit += 7) {
            b.p[i] ^= (unsigned char)(1u << bit);
            parse_bytes(b.p, b.n);
            b.p[i] ^= (unsigned char)(1u << bit);
        }
    CHECK(parse_bytes(b.p, b.n));
    free(b.p);
}

/* A pickle under construction. */
typedef struct pk {
    unsigned char b[1 << 16];
    size_t n;
} pk;

static void put(pk *p, const void *s, size_t n) {
    memcpy(p->b + p->n, s, n);
    p->n += n;
}
static void op(pk *p, int c) { p->b[p->n++] = (unsigned char)c; }
static void u32(pk *p, uint32_t v) {
    for (int i = 0; i < 4; i++) op(p, (int)(v >> (8 * i) & 0xff));
}
static void str(pk *p, const char *s) {
    op(p, 'X');
    u32(p, (uint32_t)strlen(s));
    put(p, s, strlen(s));
}
static void glob(pk *p, const char *module, const char *name) {
    op(p, 'c');
    put(p, module, strlen(module));
    op(p, '\n');
    put(p, name, strlen(name));
    op(p, '\n');
}
static void tuple_of(pk *p, int n, const int *v) {
    op(p, '(');
    for (int i = 0; i < n; i++) {
        op(p, 'K');
        op(p, v[i]);
    }
    op(p, 't');
}

/* _rebuild_tensor_v2(('storage', torch.<cls>, key, 'cpu', numel), offset, size, stride, False, OrderedDict()) */
static void tensor(pk *p, const char *cls, const char *key, int numel, int offset, int ndim, const int *size,
                   const int *stride) {
    glob(p, "torch._utils", "_rebuild_tensor_v2");
    op(p, '(');
    op(p, '(');
    str(p, "storage");
    glob(p, "torch", cls);
    str(p, key);
    str(p, "cpu");
    op(p, 'K');
    op(p, numel);
    op(p, 't');
    op(p, 'Q');
    op(p, 'K');
    op(p, offset);
    tuple_of(p, ndim, size);
    tuple_of(p, ndim, stride);
    op(p, 0x89);
    glob(p, "collections", "OrderedDict");
    op(p, ')');
    op(p, 'R');
    op(p, 't');
    op(p, 'R');
}

/* PROTO 2, {name: tensor over storage '0' (numel 4, f32)}, STOP */
static void one_tensor(pk *p, int offset, int n) {
    p->n = 0;
    op(p, 0x80);
    op(p, 2);
    op(p, '}');
    str(p, "w");
    tensor(p, "FloatStorage", "0", 4, offset, 1, (int[]){n}, (int[]){1});
    op(p, 's');
    op(p, '.');
}

/* A zip as torch writes it: archive/data.pkl = p, archive/data/0 = 16 bytes, byteorder. */
static void write_zip(const char *path, const pk *p, const char *byteorder) {
    accel__zip z;
    float data[4] = {1, 2, 3, 4};
    CHECK(accel__zip_open(&z, path) == ACCEL_OK);
    CHECK(accel__zip_record(&z, "archive/data.pkl", p->b, p->n) == ACCEL_OK);
    if (byteorder) CHECK(accel__zip_record(&z, "archive/byteorder", byteorder, strlen(byteorder)) == ACCEL_OK);
    CHECK(accel__zip_record(&z, "archive/data/0", data, sizeof data) == ACCEL_OK);
    CHECK(accel__zip_commit(&z) == ACCEL_OK);
}

static void expect_pickle(const pk *p, accel_status want, const char *msg) {
    write_zip(tmp_path("crafted.bin"), p, "little");
    expect_open_error(tmp_path("crafted.bin"), want, msg);
    blob b = read_all(tmp_path("crafted.bin"));
    parse_bytes(b.p, b.n); /* the same bytes from an exact-size buffer */
    free(b.p);
}

static void test_crafted_pickles(void) {
    pk *p = calloc(1, sizeof *p);
    one_tensor(p, 0, 4); /* the valid one first */
    write_zip(tmp_path("crafted.bin"), p, "little");
    accel_safetensors *st = accel_safetensors_open(tmp_path("crafted.bin"));
    CHECK_MSG(st && accel_safetensors_count(st) == 1 && ((const float *)accel_safetensors_at(st, 0)->bytes)[3] == 4,
              "%s", accel_last_error());
    accel_safetensors_close(st);
    one_tensor(p, 1, 2); /* a view at offset 1 */
    write_zip(tmp_path("crafted.bin"), p, NULL); /* no byteorder record: older torch, little-endian */
    st = accel_safetensors_open(tmp_path("crafted.bin"));
    CHECK(st && ((const float *)accel_safetensors_at(st, 0)->bytes)[0] == 2);
    accel_safetensors_close(st);

    one_tensor(p, 2, 3);
    expect_pickle(p, ACCEL_ERR_FORMAT, "tensor 'w': shape [3] at offset 2 reaches element 4 of a storage of 4");
    one_tensor(p, 0, 4);
    p->b[p->n - 1] = 'N'; /* no STOP */
    expect_pickle(p, ACCEL_ERR_FORMAT, "ends without STOP");
    one_tensor(p, 0, 4);
    write_zip(tmp_path("crafted.bin"), p, "big");
    expect_open_error(tmp_path("crafted.bin"), ACCEL_ERR_UNSUPPORTED, "stored big-endian");
    /* the storage claims more than its record holds */
    p->n = 0;
    op(p, 0x80), op(p, 2), op(p, '}'), str(p, "w");
    tensor(p, "FloatStorage", "0", 100, 0, 1, (int[]){4}, (int[]){1});
    op(p, 's'), op(p, '.');
    expect_pickle(p, ACCEL_ERR_FORMAT, "its storage 'archive/data/0' should hold 100 float32 elements (400 bytes) but "
                  "the record has 16 bytes");
    p->n = 0;
    op(p, 0x80), op(p, 2), op(p, '}'), str(p, "w");
    tensor(p, "FloatStorage", "9", 4, 0, 1, (int[]){4}, (int[]){1});
    op(p, 's'), op(p, '.');
    expect_pickle(p, ACCEL_ERR_FORMAT, "tensor 'w': its storage record 'archive/data/9' is missing");
    p->n = 0;
    op(p, 0x80), op(p, 2), op(p, '}'), str(p, "w");
    tensor(p, "ComplexFloatStorage", "0", 2, 0, 1, (int[]){2}, (int[]){1});
    expect_pickle(p, ACCEL_ERR_UNSUPPORTED, "storage type torch.ComplexFloatStorage holds a dtype accel does not have");
    p->n = 0;
    op(p, 0x80), op(p, 2), op(p, '}'), str(p, "w");
    tensor(p, "FloatStorage", "0", 4, 0, 9, (int[]){1, 1, 1, 1, 1, 1, 1, 1, 4}, (int[]){4, 4, 4, 4, 4, 4, 4, 4, 1});
    expect_pickle(p, ACCEL_ERR_UNSUPPORTED, "a tensor of 9 dimensions");
    /* code execution: refused at the GLOBAL, before anything could call it */
    p->n = 0;
    op(p, 0x80), op(p, 2), glob(p, "os", "system"), str(p, "echo owned"), op(p, 0x85), op(p, 'R'), op(p, '.');
    expect_pickle(p, ACCEL_ERR_UNSUPPORTED, "global 'os.system' is not allowed");
    p->n = 0;
    op(p, 0x80), op(p, 2), glob(p, "torch", "FloatStorage"), op(p, ')'), op(p, 'R'), op(p, '.');
    expect_pickle(p, ACCEL_ERR_UNSUPPORTED, "REDUCE calls a storage class");
    p->n = 0;
    op(p, 0x80), op(p, 2), op(p, ']'), op(p, '.'); /* EMPTY_LIST: outside the subset */
    expect_pickle(p, ACCEL_ERR_UNSUPPORTED, "opcode 0x5d (']')");
    p->n = 0;
    op(p, 0x80), op(p, 7), op(p, '}'), op(p, '.');
    expect_pickle(p, ACCEL_ERR_UNSUPPORTED, "pickle protocol 7");
    /* bounds: nesting, memo, lengths, the stack */
    p->n = 0;
    op(p, 0x80), op(p, 2);
    for (int i = 0; i < 5000; i++) op(p, '(');
    expect_pickle(p, ACCEL_ERR_FORMAT, "more than 4096 nested MARKs");
    p->n = 0;
    /* a memo index far past the count stored (2^32 - 1 on an empty memo): refused, not an array of 64 GiB */
    op(p, 0x80), op(p, 2), op(p, '}'), op(p, 'r'), u32(p, 0xFFFFFFFFu), op(p, '.');
    expect_pickle(p, ACCEL_ERR_UNSUPPORTED, "memo index 4294967295 is far past the 0 stored");
    p->n = 0; /* out of order within the bound: taken, as Python takes any */
    op(p, 0x80), op(p, 2), op(p, '}'), op(p, 'r'), u32(p, 1000), op(p, 'j'), u32(p, 1000), op(p, '.');
    write_zip(tmp_path("crafted.bin"), p, "little");
    st = accel_safetensors_open(tmp_path("crafted.bin"));
    CHECK_MSG(st && accel_safetensors_count(st) == 0, "%s", accel_last_error());
    accel_safetensors_close(st);
    p->n = 0;
    op(p, 0x80), op(p, 2), op(p, '}'), op(p, 'r'), u32(p, 1000), op(p, 'j'), u32(p, 999), op(p, '.');
    expect_pickle(p, ACCEL_ERR_FORMAT, "memo index 999 was never stored");
    p->n = 0;
    op(p, 0x80), op(p, 2), op(p, 'h'), op(p, 5), op(p, '.');
    expect_pickle(p, ACCEL_ERR_FORMAT, "memo index 5 was never stored");
    p->n = 0; /* an empty tuple made before any item: its items are no offset of a NULL pool (UBSan) */
    op(p, 0x80), op(p, 2), op(p, ')'), op(p, 'Q'), op(p, '.');
    expect_pickle(p, ACCEL_ERR_FORMAT, "a persistent id must be ('storage', type, key, location, numel)");
    p->n = 0;
    op(p, 0x80), op(p, 2), op(p, 'X'), u32(p, 0xFFFFFFF0u), op(p, '.');
    expect_pickle(p, ACCEL_ERR_FORMAT, "needs 4294967280 bytes of operand but the pickle ends");
    p->n = 0;
    op(p, 0x80), op(p, 2), op(p, 's'), op(p, '.');
    expect_pickle(p, ACCEL_ERR_FORMAT, "SETITEM needs a key and a value");
    p->n = 0;
    op(p, 0x80), op(p, 2), op(p, 'N'), op(p, '('), op(p, 'N'), op(p, 'R'), op(p, '.'); /* REDUCE's callable below the MARK */
    expect_pickle(p, ACCEL_ERR_FORMAT, "pops from an empty stack (or past a MARK)");
    p->n = 0;
    op(p, 0x80), op(p, 2), op(p, 0x8a), op(p, 9), op(p, '.');
    expect_pickle(p, ACCEL_ERR_FORMAT, "an integer of 9 bytes");
    /* a dict holding itself: no walk, no hang; refused as a value that is no tensor */
    p->n = 0;
    op(p, 0x80), op(p, 2), op(p, '}'), op(p, 'q'), op(p, 0), str(p, "self"), op(p, 'h'), op(p, 0), op(p, 's'), op(p, '.');
    expect_pickle(p, ACCEL_ERR_UNSUPPORTED, "entry 'self' is a dict, not a tensor");
    /* the same name twice */
    p->n = 0;
    op(p, 0x80), op(p, 2), op(p, '}'), op(p, '(');
    str(p, "w");
    tensor(p, "FloatStorage", "0", 4, 0, 1, (int[]){4}, (int[]){1});
    str(p, "w");
    tensor(p, "FloatStorage", "0", 4, 0, 1, (int[]){4}, (int[]){1});
    op(p, 'u'), op(p, '.');
    expect_pickle(p, ACCEL_ERR_FORMAT, "tensor 'w' appears twice");
    /* not a dict at all */
    p->n = 0;
    op(p, 0x80), op(p, 2), op(p, 'N'), op(p, '.');
    expect_pickle(p, ACCEL_ERR_FORMAT, "the pickle holds a None, not a state dict");
    /* a key with a NUL byte: the name a C string would read is "w" */
    p->n = 0;
    op(p, 0x80), op(p, 2), op(p, '}'), op(p, 'X');
    u32(p, 3);
    put(p, "w\0x", 3);
    tensor(p, "FloatStorage", "0", 4, 0, 1, (int[]){4}, (int[]){1});
    op(p, 's'), op(p, '.');
    expect_pickle(p, ACCEL_ERR_FORMAT, "entry 'w' has a NUL byte in its name");
    /* a key that is not UTF-8: Python's unpickler fails to decode it, so torch.load refuses the file */
    p->n = 0;
    op(p, 0x80), op(p, 2), op(p, '}'), op(p, 'X');
    u32(p, 2);
    put(p, "w\xff", 2);
    tensor(p, "FloatStorage", "0", 4, 0, 1, (int[]){4}, (int[]){1});
    op(p, 's'), op(p, '.');
    expect_pickle(p, ACCEL_ERR_FORMAT, "a str of 2 bytes that is not valid UTF-8 (torch.load would fail to decode it)");
    free(p);
}

/* One transposed tensor (15 x 15 over storage '0', 900 bytes) under n names:
 * each name a strided copy of it. */
static void write_transposes(const char *path, int n) {
    pk *p = calloc(1, sizeof *p);
    op(p, 0x80), op(p, 2), op(p, '}'), op(p, '(');
    for (int i = 0; i < n; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        str(p, name);
        if (i) op(p, 'h'), op(p, 0); /* the same tensor again: a dozen bytes an entry */
        else tensor(p, "FloatStorage", "0", 225, 0, 2, (int[]){15, 15}, (int[]){1, 15}), op(p, 'q'), op(p, 0);
    }
    op(p, 'u'), op(p, '.');
    float data[225] = {0};
    accel__zip z;
    CHECK(accel__zip_open(&z, path) == ACCEL_OK);
    CHECK(accel__zip_record(&z, "archive/data.pkl", p->b, p->n) == ACCEL_OK);
    CHECK(accel__zip_record(&z, "archive/data/0", data, sizeof data) == ACCEL_OK);
    CHECK(accel__zip_commit(&z) == ACCEL_OK);
    free(p);
}

/* Strided tensors are copies: in all at most the file's size, so that a
 * pickle naming one large strided tensor under many names (a few bytes each)
 * cannot make the reader allocate without bound. */
static void test_strided_copies_bounded(void) {
    write_transposes(tmp_path("transposes.bin"), 1); /* 900 bytes of copies, a file of 1.4 KB */
    accel_safetensors *st = accel_safetensors_open(tmp_path("transposes.bin"));
    CHECK_MSG(st && accel_safetensors_count(st) == 1, "%s", accel_last_error());
    accel_safetensors_close(st);
    write_transposes(tmp_path("transposes.bin"), 2);
    expect_open_error(tmp_path("transposes.bin"), ACCEL_ERR_UNSUPPORTED, "tensor 't1': its strided copy brings the "
                      "copies of strided tensors to 1800 bytes, more than the file's");
    write_transposes(tmp_path("transposes.bin"), 1000); /* 900 KB of copies from a file of 12 KB */
    expect_open_error(tmp_path("transposes.bin"), ACCEL_ERR_UNSUPPORTED, "its strided copy brings the copies");
}

/* The offset of the central directory entry and local header of `name` in a zip's bytes. */
static void patch_method(blob *b, const char *name, int method) {
    size_t nl = strlen(name);
    for (size_t i = 0; i + 46 + nl <= b->n; i++) {
        uint32_t sig = (uint32_t)b->p[i] | (uint32_t)b->p[i + 1] << 8 | (uint32_t)b->p[i + 2] << 16 |
                       (uint32_t)b->p[i + 3] << 24;
        if (sig == 0x04034b50u && !memcmp(b->p + i + 30, name, nl)) b->p[i + 8] = (unsigned char)method;
        if (sig == 0x02014b50u && !memcmp(b->p + i + 46, name, nl)) b->p[i + 10] = (unsigned char)method;
    }
}

static void test_crafted_zips(void) {
    blob b = read_all("data/torch_load/proto4.bin");
    patch_method(&b, "proto4/data/0", 8);
    write_all(tmp_path("deflated.bin"), b.p, b.n);
    expect_open_error(tmp_path("deflated.bin"), ACCEL_ERR_UNSUPPORTED,
                      "record 'proto4/data/0' (tensor 'w') is compressed (zip method 8)");
    free(b.p);
    b = read_all("data/torch_load/proto4.bin");
    patch_method(&b, "proto4/data.pkl", 8);
    write_all(tmp_path("deflated.bin"), b.p, b.n);
    expect_open_error(tmp_path("deflated.bin"), ACCEL_ERR_UNSUPPORTED, "record 'proto4/data.pkl' is compressed");
    /* data/0's sizes in the central directory past the records (both: stored sizes must agree) */
    free(b.p);
    b = read_all("data/torch_load/proto4.bin");
    for (size_t i = 0; i + 46 + 13 <= b.n; i++)
        if (!memcmp(b.p + i, "PK\1\2", 4) && !memcmp(b.p + i + 46, "proto4/data/0", 13))
            memset(b.p + i + 20, 0x7f, 8); /* compressed and uncompressed size: 0x7f7f7f7f */
    write_all(tmp_path("long.bin"), b.p, b.n);
    expect_open_error(tmp_path("long.bin"), ACCEL_ERR_FORMAT, "record 'proto4/data/0' (2139062143 bytes at offset");
    /* a local header whose name is a byte shorter than the central entry's: its data would shift */
    free(b.p);
    b = read_all("data/torch_load/proto4.bin");
    for (size_t i = 0; i + 30 + 13 <= b.n; i++)
        if (!memcmp(b.p + i, "PK\3\4", 4) && !memcmp(b.p + i + 30, "proto4/data/0", 13)) b.p[i + 26]--;
    write_all(tmp_path("shifted.bin"), b.p, b.n);
    expect_open_error(tmp_path("shifted.bin"), ACCEL_ERR_FORMAT,
                      "record 'proto4/data/0': its local header disagrees with the central directory");
    /* cut before its end records */
    write_all(tmp_path("cut.bin"), b.p, b.n - 30);
    expect_open_error(tmp_path("cut.bin"), ACCEL_ERR_FORMAT, "no end of central directory record");
    free(b.p);
    /* one central entry of data/0 patched at a time: the stored sizes apart,
     * a NUL in its name, the encryption flag */
    static const struct { size_t at; unsigned char byte; accel_status want; const char *msg; } cuts[] = {
        {24, 0x11, ACCEL_ERR_FORMAT, "record 'proto4/data/0' is stored but its sizes differ (8, 17)"},
        {46 + 7, 0, ACCEL_ERR_FORMAT, "a record name holds a NUL byte"},
        {8, 1, ACCEL_ERR_UNSUPPORTED, "record 'proto4/data/0' is encrypted"},
    };
    for (size_t k = 0; k < sizeof cuts / sizeof *cuts; k++) {
        b = read_all("data/torch_load/proto4.bin");
        for (size_t i = 0; i + 46 + 13 <= b.n; i++)
            if (!memcmp(b.p + i, "PK\1\2", 4) && !memcmp(b.p + i + 46, "proto4/data/0", 13))
                b.p[i + cuts[k].at] = cuts[k].byte;
        write_all(tmp_path("patched.bin"), b.p, b.n);
        expect_open_error(tmp_path("patched.bin"), cuts[k].want, cuts[k].msg);
        free(b.p);
    }
    /* a record named twice (which of the two would a reader take?) */
    accel__zip z;
    float four[4] = {1, 2, 3, 4};
    CHECK(accel__zip_open(&z, tmp_path("twice.bin")) == ACCEL_OK);
    CHECK(accel__zip_record(&z, "archive/data/0", four, sizeof four) == ACCEL_OK);
    CHECK(accel__zip_record(&z, "archive/data/0", four, sizeof four) == ACCEL_OK);
    CHECK(accel__zip_commit(&z) == ACCEL_OK);
    expect_open_error(tmp_path("twice.bin"), ACCEL_ERR_FORMAT, "record 'archive/data/0' appears twice in the zip");
    /* no data.pkl */
    CHECK(accel__zip_open(&z, tmp_path("nopickle.bin")) == ACCEL_OK);
    CHECK(accel__zip_record(&z, "archive/version", "3\n", 2) == ACCEL_OK);
    CHECK(accel__zip_commit(&z) == ACCEL_OK);
    expect_open_error(tmp_path("nopickle.bin"), ACCEL_ERR_FORMAT, "without a <archive>/data.pkl record");
}

/* Little-endian fields into a growing zip. */
typedef struct zbuf {
    unsigned char b[1 << 16];
    size_t n;
} zbuf;
static void le_put(zbuf *z, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) z->b[z->n++] = (unsigned char)(v >> (8 * i));
}

/* A zip written by hand whose every size and offset is deferred to ZIP64
 * extra fields (as torch's writer does past 4 GiB: a pytorch_model.bin of a
 * 7B model), with only the ZIP64 end record holding the directory's place. */
static void test_zip64_fields(void) {
    pk *p = calloc(1, sizeof *p);
    zbuf *z = calloc(1, sizeof *z);
    one_tensor(p, 0, 4);
    float data[4] = {1, 2, 3, 4};
    const char *names[2] = {"archive/data.pkl", "archive/data/0"};
    const void *bodies[2] = {p->b, data};
    uint64_t sizes[2] = {p->n, sizeof data}, offs[2];
    for (int i = 0; i < 2; i++) {
        offs[i] = z->n;
        le_put(z, 0x04034b50u, 4), le_put(z, 45, 2), le_put(z, 0, 2), le_put(z, 0, 2), le_put(z, 0, 4);
        le_put(z, 0, 4), le_put(z, 0xFFFFFFFFu, 4), le_put(z, 0xFFFFFFFFu, 4);
        le_put(z, strlen(names[i]), 2), le_put(z, 20, 2);
        memcpy(z->b + z->n, names[i], strlen(names[i]));
        z->n += strlen(names[i]);
        le_put(z, 1, 2), le_put(z, 16, 2), le_put(z, sizes[i], 8), le_put(z, sizes[i], 8);
        memcpy(z->b + z->n, bodies[i], sizes[i]);
        z->n += sizes[i];
    }
    uint64_t cd_at = z->n;
    for (int i = 0; i < 2; i++) {
        le_put(z, 0x02014b50u, 4), le_put(z, 45, 2), le_put(z, 45, 2), le_put(z, 0, 2), le_put(z, 0, 2);
        le_put(z, 0, 4), le_put(z, 0, 4), le_put(z, 0xFFFFFFFFu, 4), le_put(z, 0xFFFFFFFFu, 4);
        le_put(z, strlen(names[i]), 2), le_put(z, 28, 2), le_put(z, 0, 2), le_put(z, 0, 2), le_put(z, 0, 2);
        le_put(z, 0, 4), le_put(z, 0xFFFFFFFFu, 4);
        memcpy(z->b + z->n, names[i], strlen(names[i]));
        z->n += strlen(names[i]);
        le_put(z, 1, 2), le_put(z, 24, 2), le_put(z, sizes[i], 8), le_put(z, sizes[i], 8), le_put(z, offs[i], 8);
    }
    uint64_t cd_size = z->n - cd_at, end64_at = z->n;
    le_put(z, 0x06064b50u, 4), le_put(z, 44, 8), le_put(z, 45, 2), le_put(z, 45, 2), le_put(z, 0, 4), le_put(z, 0, 4);
    le_put(z, 2, 8), le_put(z, 2, 8), le_put(z, cd_size, 8), le_put(z, cd_at, 8);
    le_put(z, 0x07064b50u, 4), le_put(z, 0, 4), le_put(z, end64_at, 8), le_put(z, 1, 4);
    le_put(z, 0x06054b50u, 4), le_put(z, 0, 2), le_put(z, 0, 2), le_put(z, 0xFFFF, 2), le_put(z, 0xFFFF, 2);
    le_put(z, 0xFFFFFFFFu, 4), le_put(z, 0xFFFFFFFFu, 4), le_put(z, 0, 2);
    write_all(tmp_path("zip64.bin"), z->b, z->n);
    accel_safetensors *st = accel_safetensors_open(tmp_path("zip64.bin"));
    const accel_st_info *w = st ? accel_safetensors_find(st, "w") : NULL;
    float got[4] = {0}; /* not aligned in this zip: copied out */
    if (w && w->nbytes == 16) memcpy(got, w->bytes, 16);
    CHECK_MSG(w && w->nbytes == 16 && got[3] == 4, "%s", accel_last_error());
    accel_safetensors_close(st);
    parse_bytes(z->b, z->n);
    /* the first entry's ZIP64 field cut to hold the sizes but not the offset it defers to (its length 24 -> 16;
     * the entry's extra length stays 28, so nothing else shifts) */
    z->b[cd_at + 46 + strlen(names[0]) + 2] = 16;
    write_all(tmp_path("zip64.bin"), z->b, z->n);
    CHECK(accel_safetensors_open(tmp_path("zip64.bin")) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "a ZIP64 extra field lacks a size or offset it defers to");
    accel_clear_error();
    free(p);
    free(z);
}

int main(void) {
    RUN(test_strided_big);
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_torch_load_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    RUN(test_mixed_like_safetensors);
    RUN(test_protocol_4);
    RUN(test_refused_files);
    RUN(test_accel_torch_save_read_back);
    RUN(test_folder_resolution);
    RUN(test_llama_from_bin);
    RUN(test_bert_from_bin);
    RUN(test_truncations_and_flips);
    RUN(test_crafted_pickles);
    RUN(test_strided_copies_bounded);
    RUN(test_crafted_zips);
    RUN(test_zip64_fields);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) return 1;
    return check_summary();
}
