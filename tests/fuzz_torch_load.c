/* Fuzz target: the PyTorch checkpoint reader (torch.save's zip files:
 * src/io/zip_read.c, torch_unpickle.c, torch_load.c), through what a user
 * calls on a pytorch_model.bin.
 *
 * Input: a byte string whose first byte says what the rest is:
 *   'F'  the whole file (seeds: files torch wrote, tests/data/torch_load and
 *        torch_save): mutations reach the zip's records and, where they keep
 *        its offsets, the pickle;
 *   'P'  data.pkl alone, put into a zip as torch lays one out (accel's
 *        writer: archive/data.pkl, byteorder "little", version, and storages
 *        archive/data/0 ... data/12 of 64 bytes each), so that every mutation
 *        reaches the unpickler and the storage checks.
 * Anything else is ignored.
 *
 * The file is read twice, from an exact-size heap copy (so ASan sees a read
 * past its end, which a mapping's page would hide) and by
 * accel_safetensors_open on the file: both must give the same verdict, a
 * refusal naming the file, or the same tensors, each of them converted to
 * f32 (every byte read), the copies the reader made of strided ones no
 * larger than the file. An accepted file must be the state dict torch.load
 * would give: accel_torch_save writes its tensors again, and that file reads
 * back equal; accel_checkpoint_open finds them all in the folder too.
 *
 * Built as fuzz_safetensors.c is (tests/torch_load.cmake): a libFuzzer
 * target with clang, else a replay driver over a seed folder
 * (tests/fuzz_replay.h). The files go to a temporary folder made once per
 * process (tests/fuzz_tmp.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/io.h"
#include "fuzz_tmp.h"
#include "io/safetensors_internal.h"
#include "io/zip_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { N_STORAGES = 13, STORAGE_BYTES = 64 }; /* keys "0" ... "12": the fixtures' pickles name up to 12 */
#define MAX_CONVERTED ((size_t)1 << 20) /* bytes of one tensor converted to f32 */

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_torch_load: %s: %s\n", what, detail ? detail : "");
    abort();
}

/* dir/name into out. */
static const char *in_dir(const char *dir, const char *name, char *out, size_t n) {
    snprintf(out, n, "%s/%s", dir, name);
    return out;
}

/* The folder of the file under test (dir/pytorch_model.bin), made once. */
static const char *model_dir(void) {
    static char dir[320];
    if (!dir[0] && mkdir(in_dir(fuzz_tmp_dir("fuzz_torch_load"), "model", dir, sizeof dir), 0755)) fail("mkdir", dir);
    return dir;
}

/* ---------------------------------------------------------------- P: a pickle in torch's zip */

/* The zip torch.save would write around the pickle, at path. */
static void zip_around(const char *path, const uint8_t *pkl, size_t n) {
    unsigned char bytes[STORAGE_BYTES];
    for (int i = 0; i < STORAGE_BYTES; i++) bytes[i] = (unsigned char)(i * 37 + 11);
    accel__zip z;
    if (accel__zip_open(&z, path) || accel__zip_record(&z, "archive/data.pkl", pkl, n) ||
        accel__zip_record(&z, "archive/byteorder", "little", 6))
        fail("writing the zip", accel_last_error());
    for (int k = 0; k < N_STORAGES; k++) {
        char name[32];
        snprintf(name, sizeof name, "archive/data/%d", k);
        if (accel__zip_record(&z, name, bytes, sizeof bytes)) fail("writing the zip", accel_last_error());
    }
    if (accel__zip_record(&z, "archive/version", "3\n", 2) || accel__zip_commit(&z))
        fail("writing the zip", accel_last_error());
}

/* ---------------------------------------------------------------- what an accepted file must hold */

/* in is what the reader promises: a shape of nbytes, bytes of the file's (or owned), findable by name. */
static void check_info(accel_safetensors *st, const accel_st_info *in, size_t file_size) {
    size_t esz = accel_dtype_size(in->dtype);
    if (!esz || in->ndim < 0 || in->ndim > ACCEL_MAX_DIMS) fail("a tensor of no dtype or rank", in->name);
    uint64_t bytes = esz;
    for (int d = 0; d < in->ndim; d++)
        if (in->shape[d] < 0 || __builtin_mul_overflow(bytes, (uint64_t)in->shape[d], &bytes))
            fail("a tensor's shape is negative or overflows", in->name);
    if (bytes != in->nbytes) fail("a tensor's bytes are not its shape's", in->name);
    if (in->begin > in->end || in->end > file_size || (in->end - in->begin < in->nbytes && in->nbytes))
        fail("a tensor's file range lies outside the file or is shorter than it", in->name);
    if (accel_safetensors_find(st, in->name) != in) fail("a tensor is not found under its name", in->name);
    if (in->nbytes > MAX_CONVERTED) return;
    accel_tensor *t = accel_safetensors_tensor(st, in->name, ACCEL_F32);
    if (!t) fail("an accepted tensor does not convert to f32", accel_last_error());
    accel_tensor_free(t);
}

/* Two handles over the same bytes: the same tensors, in the same order. */
static void check_same(const accel_safetensors *a, const accel_safetensors *b, const char *what) {
    if (accel_safetensors_count(a) != accel_safetensors_count(b)) fail(what, "another tensor count");
    for (int i = 0; i < accel_safetensors_count(a); i++) {
        const accel_st_info *x = accel_safetensors_at(a, i), *y = accel_safetensors_find(b, x->name);
        if (!y || x->dtype != y->dtype || x->ndim != y->ndim || x->nbytes != y->nbytes ||
            memcmp(x->shape, y->shape, sizeof(int64_t) * (size_t)x->ndim) ||
            (x->nbytes && memcmp(x->bytes, y->bytes, x->nbytes)))
            fail(what, x->name);
    }
}

/* The accepted state dict written again by accel_torch_save reads back equal. */
static void check_resaved(accel_safetensors *st) {
    int n = accel_safetensors_count(st);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += accel_safetensors_at(st, i)->nbytes;
    if (total > MAX_CONVERTED) return;
    const char **names = calloc((size_t)n + 1, sizeof *names);
    accel_tensor **tensors = calloc((size_t)n + 1, sizeof *tensors);
    if (!names || !tensors) fail("resave", "out of memory");
    for (int i = 0; i < n; i++) {
        names[i] = accel_safetensors_at(st, i)->name;
        if (!(tensors[i] = accel_safetensors_tensor(st, names[i], -1))) fail("an accepted tensor", accel_last_error());
    }
    char path[400];
    in_dir(fuzz_tmp_dir("fuzz_torch_load"), "resaved.bin", path, sizeof path);
    if (accel_torch_save(path, n, names, tensors)) fail("an accepted state dict does not save", accel_last_error());
    accel_safetensors *back = accel_safetensors_open(path);
    if (!back) fail("a resaved state dict does not open", accel_last_error());
    check_same(st, back, "a resaved state dict reads back otherwise");
    accel_safetensors_close(back);
    for (int i = 0; i < n; i++) accel_tensor_free(tensors[i]);
    free(names);
    free(tensors);
}

/* The folder as a checkpoint (what from_pretrained opens): every tensor through it. */
static void check_checkpoint(const char *dir, const accel_safetensors *st) {
    accel_checkpoint *ck = accel_checkpoint_open(dir);
    if (!ck) fail("an accepted pytorch_model.bin does not open as a checkpoint", accel_last_error());
    if (accel_checkpoint_count(ck) != accel_safetensors_count(st)) fail("the checkpoint", "another tensor count");
    for (int i = 0; i < accel_checkpoint_count(ck); i++) {
        const accel_st_info *in = accel_safetensors_at(st, i);
        if (in->nbytes > MAX_CONVERTED) continue;
        accel_tensor *t = accel_checkpoint_tensor(ck, in->name, -1);
        if (!t) fail("a tensor of the file is not in its checkpoint", accel_last_error());
        accel_tensor_free(t);
    }
    accel_checkpoint_close(ck);
}

/* ---------------------------------------------------------------- the file */

static void fuzz_file(const char *dir, const char *path, const unsigned char *bytes, size_t size) {
    /* the parser borrows the buffer: its own exact-size copy, so ASan sees overreads */
    unsigned char *buf = malloc(size ? size : 1);
    if (!buf) fail("buffer", "out of memory");
    if (size) memcpy(buf, bytes, size);
    accel_safetensors *mem = accel__safetensors_parse(path, buf, size);
    char why[1024];
    snprintf(why, sizeof why, "%s", mem ? "" : accel_last_error());
    accel_clear_error();
    accel_safetensors *file = accel_safetensors_open(path);
    if (!mem != !file) {
        fprintf(stderr, "fuzz_torch_load: from memory: %s\nfrom the file: %s\n", mem ? "accepted" : why,
                file ? "accepted" : accel_last_error());
        fail("the same bytes from memory and from the file", "two verdicts");
    }
    if (!mem) {
        /* a refusal names the file and says why, the same from either */
        if (!strstr(why, path) || strlen(why) <= strlen(path) + 2) fail("a refusal that does not name the file", why);
        if (strcmp(why, accel_last_error())) fail("two refusals of the same bytes", why);
    } else {
        size_t copied = 0; /* bytes of the tensors that are not in the file: its strided copies */
        for (int i = 0; i < accel_safetensors_count(mem); i++) {
            const accel_st_info *in = accel_safetensors_at(mem, i);
            check_info(mem, in, size);
            uintptr_t at = (uintptr_t)in->bytes, lo = (uintptr_t)buf;
            if (in->nbytes && (at < lo || at - lo > size - in->nbytes)) copied += in->nbytes;
        }
        if (copied > size) fail("the strided copies of an accepted file exceed its size", path);
        check_same(mem, file, "the same bytes from memory and from the file differ");
        check_resaved(file);
        check_checkpoint(dir, file);
    }
    accel_safetensors_close(file);
    accel_safetensors_close(mem);
    free(buf);
    accel_clear_error();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0 || (data[0] != 'F' && data[0] != 'P')) return 0;
    const char *dir = model_dir();
    char path[400];
    in_dir(dir, "pytorch_model.bin", path, sizeof path);
    if (data[0] == 'F') {
        fuzz_write_file(path, data + 1, size - 1);
        fuzz_file(dir, path, data + 1, size - 1);
    } else {
        zip_around(path, data + 1, size - 1);
        blob b = read_all(path);
        if (!b.p || !b.n) fail("reading the zip back", path);
        fuzz_file(dir, path, b.p, b.n);
        free(b.p);
    }
    return 0;
}

#define FUZZ_NAME "fuzz_torch_load"
#define FUZZ_DEFAULT_SEEDS "data/fuzz_seeds_torch"
#include "fuzz_replay.h"
