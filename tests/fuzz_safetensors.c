/* Fuzz target: the safetensors header parser, the checkpoint index parser and
 * the PyTorch file reader (zip directory, restricted unpickler).
 *
 * Input: a byte string. If it starts with 'I', the rest is parsed as a
 * model.safetensors.index.json document; otherwise the whole input is parsed
 * as a safetensors file (or, starting "PK\3\4", a torch.save zip: seeds
 * torch_*.bin), and every tensor it accepts is converted to f32 (so every
 * offset the validator let through is actually read).
 *
 * Built two ways (tests/io.cmake):
 *   - with clang and -DACCEL_LIBFUZZER: a libFuzzer target;
 *   - otherwise: a plain driver whose main() runs each file of the seed folder
 *     given as argv[1] (default data/fuzz_seeds), so gcc builds still replay
 *     the corpus under ASan/UBSan (tests/fuzz_replay.h). */
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

#define FUZZ_NAME "fuzz_safetensors"
#define FUZZ_DEFAULT_SEEDS "data/fuzz_seeds"
#include "fuzz_replay.h"
