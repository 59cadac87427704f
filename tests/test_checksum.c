/* CRC-32C (src/core/checksum.c): the known check value, the fast path equal to
 * the table at every length and alignment around its block boundaries, the
 * running form equal to one call, and whole files. Holds on every CPU: where
 * SSE4.2 is missing both sides run the table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/checksum.h"

static void test_check_value(void) {
    CHECK(accel__crc32c("123456789", 9) == 0xE3069283u);
    CHECK(accel__crc32c("", 0) == 0);
    accel__crc32c_force_table(true);
    CHECK(accel__crc32c("123456789", 9) == 0xE3069283u);
    CHECK(!strcmp(accel__crc32c_impl(), "table"));
    accel__crc32c_force_table(false);
}

static void test_fast_equals_table(void) {
    enum { N = 3 * 4096 * 3 + 64 };
    unsigned char *buf = malloc(N);
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[i] = (unsigned char)x;
    }
    static const int lens[] = {0, 1, 7, 8, 9, 63, 4095, 4096, 12287, 12288, 12289, 24576, 24583, N - 8};
    int checked = 0;
    for (int a = 0; a < 8; a++)
        for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
            size_t n = (size_t)lens[k];
            uint32_t fast = accel__crc32c(buf + a, n);
            accel__crc32c_force_table(true);
            uint32_t slow = accel__crc32c(buf + a, n);
            accel__crc32c_force_table(false);
            CHECK_MSG(fast == slow, "offset %d length %zu: %s %08x, table %08x", a, n, accel__crc32c_impl(), fast,
                      slow);
            /* split anywhere: the running form gives the same */
            size_t cut = n / 3;
            CHECK(accel__crc32c_update(accel__crc32c(buf + a, cut), buf + a + cut, n - cut) == fast);
            checked++;
        }
    CHECK(checked == 8 * (int)(sizeof lens / sizeof *lens));
    free(buf);
}

static void test_file(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/accel_crc_%d", (int)getpid());
    FILE *f = fopen(path, "wb");
    unsigned char *buf = malloc(3 << 20);
    for (int i = 0; i < 3 << 20; i++) buf[i] = (unsigned char)(i * 7 + (i >> 9));
    CHECK(f && fwrite(buf, 1, 3 << 20, f) == 3 << 20);
    fclose(f);
    uint32_t crc = 0;
    int64_t bytes = 0;
    CHECK(accel__file_crc32c(path, &crc, &bytes) == ACCEL_OK);
    CHECK(bytes == 3 << 20 && crc == accel__crc32c(buf, 3 << 20));
    unlink(path);
    CHECK(accel__file_crc32c(path, &crc, &bytes) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), path);
    accel_clear_error();
    CHECK(accel__file_crc32c("/tmp", &crc, &bytes) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "not a regular file");
    accel_clear_error();
    free(buf);
}

/* Joining two CRCs equals the CRC of the joined bytes. */
static void test_combine(void) {
    const char *a = "checkpoint ", *b = "shard_1.safetensors";
    char ab[64];
    snprintf(ab, sizeof ab, "%s%s", a, b);
    CHECK(accel__crc32c_combine(accel__crc32c(a, strlen(a)), accel__crc32c(b, strlen(b)), strlen(b)) ==
          accel__crc32c(ab, strlen(ab)));
    CHECK(accel__crc32c_combine(accel__crc32c(a, strlen(a)), 0, 0) == accel__crc32c(a, strlen(a)));
}

/* A file large enough to be read in ranges by several threads (sparse: no
 * disk is written for its zeros) gives the CRC of its bytes in memory. */
static void test_large_file_in_ranges(void) {
    const size_t n = (size_t)137 << 20;
    char path[64];
    snprintf(path, sizeof path, "/tmp/accel_crc_big_%d", (int)getpid());
    unsigned char *buf = calloc(n, 1);
    FILE *f = fopen(path, "wb");
    CHECK(buf && f && ftruncate(fileno(f), (off_t)n) == 0);
    static const size_t at[] = {0, 1, (size_t)64 << 20, ((size_t)68 << 20) + 5, ((size_t)137 << 20) - 1};
    for (size_t i = 0; buf && f && i < sizeof at / sizeof *at; i++) {
        buf[at[i]] = (unsigned char)(0x5A + i);
        CHECK(fseek(f, (long)at[i], SEEK_SET) == 0 && fputc(buf[at[i]], f) != EOF);
    }
    if (f) fclose(f);
    uint32_t crc = 0;
    int64_t bytes = 0;
    CHECK(accel__file_crc32c(path, &crc, &bytes) == ACCEL_OK);
    CHECK(bytes == (int64_t)n && buf && crc == accel__crc32c(buf, n));
    unlink(path);
    free(buf);
}

int main(void) {
    RUN(test_check_value);
    RUN(test_fast_equals_table);
    RUN(test_file);
    RUN(test_combine);
    RUN(test_large_file_in_ranges);
    printf("crc32c implementation: %s\n", accel__crc32c_impl());
    return check_summary();
}
