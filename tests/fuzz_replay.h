/* The replay driver of a fuzz target (tests/fuzz_*.c): without libFuzzer
 * (gcc builds, ASan included) main() runs LLVMFuzzerTestOneInput on each file
 * of the seed folder given as argv[1] (default FUZZ_DEFAULT_SEEDS). Include it
 * last, after the target's LLVMFuzzerTestOneInput, with FUZZ_NAME and
 * FUZZ_DEFAULT_SEEDS defined. */
#ifndef ACCEL_LIBFUZZER
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : FUZZ_DEFAULT_SEEDS;
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, FUZZ_NAME ": cannot open seed folder %s\n", dir);
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
    fprintf(stderr, FUZZ_NAME ": %d inputs replayed\n", n);
    return n > 0 ? 0 : 1;
}
#endif
