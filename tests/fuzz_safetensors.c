/* Fuzz target: the safetensors header parser and the checkpoint index parser.
 *
 * Input: a byte string. If it starts with 'I', the rest is parsed as a
 * model.safetensors.index.json document; otherwise the whole input is parsed
 * as a safetensors file, and every tensor it accepts is converted to f32 (so
 * every offset the validator let through is actually read).
 *
 * Built two ways (tests/io.cmake):
 *   - with clang and -DACCEL_LIBFUZZER: a libFuzzer target;
 *   - otherwise: a plain driver whose main() runs each file of the seed folder
 *     given as argv[1] (default data/fuzz_seeds), so gcc builds still replay
 *     the corpus under ASan/UBSan. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/io.h"
#include "io/safetensors_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 0 && data[0] == 'I') {
        accel__st_index ix;
        if (accel__st_index_parse("fuzz.index.json", (const char *)data + 1, size - 1, &ix) == ACCEL_OK)
            accel__st_index_free(&ix);
        accel_clear_error();
        return 0;
    }
    /* the parser borrows the buffer: give it its own exact-size copy so ASan sees overreads */
    unsigned char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    accel_safetensors *st = accel__safetensors_parse("fuzz.safetensors", buf, size);
    for (int i = 0; st && i < accel_safetensors_count(st); i++) {
        const accel_st_info *in = accel_safetensors_at(st, i);
        if (in->nbytes > (1u << 20)) continue;
        accel_tensor *t = accel_safetensors_tensor(st, in->name, ACCEL_F32);
        accel_tensor_free(t);
    }
    accel_safetensors_close(st);
    accel_clear_error();
    free(buf);
    return 0;
}

#ifndef ACCEL_LIBFUZZER
int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "data/fuzz_seeds";
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "fuzz_safetensors: cannot open seed folder %s\n", dir);
        return 1;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        rewind(f);
        uint8_t *data = malloc(len > 0 ? (size_t)len : 1);
        if (data && fread(data, 1, (size_t)len, f) == (size_t)len) {
            LLVMFuzzerTestOneInput(data, (size_t)len);
            n++;
        }
        free(data);
        fclose(f);
    }
    closedir(d);
    accel_thread_cleanup();
    fprintf(stderr, "fuzz_safetensors: %d inputs replayed\n", n);
    return n > 0 ? 0 : 1;
}
#endif
