/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), which TFRecord
 * framing uses. Debian 12 ships no C library for it (only Python, Go and
 * Rust ones; zlib's crc32 is the other polynomial), so it is this table-driven
 * version; event files are small, so speed does not matter. */
#include <pthread.h>

#include "tracking/tb_internal.h"

static uint32_t table[256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void make_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[i] = c;
    }
}

uint32_t accel__crc32c(const void *data, size_t n) {
    pthread_once(&table_once, make_table);
    const unsigned char *p = data;
    uint32_t c = 0xFFFFFFFFu;
    while (n--) c = table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t accel__crc32c_masked(const void *data, size_t n) {
    uint32_t c = accel__crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}
