/* src/core/checksum.c — CRC-32C, the SSE4.2 instruction or a portable table
 * (see checksum.h). The fast path runs three independent crc32 streams over
 * three adjacent blocks (the instruction's latency is 3 cycles, its throughput
 * 1 per cycle) and joins them with the CRC's linearity:
 *   crc(A B C) = shift(crc(A), |B C|) ^ shift(crc0(B), |C|) ^ crc0(C)
 * where crc0 starts from a zero register and shift(c, n) multiplies c by
 * x^(8n) modulo the polynomial (zlib's crc32_combine does the same). */
#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/checksum.h"

#define POLY 0x82F63B78u
#define BLOCK 4096 /* bytes per stream in the interleaved loop */

static uint32_t table[8][256];  /* slice-by-8 */
static uint32_t shift_1, shift_2; /* x^(8*BLOCK), x^(16*BLOCK) mod P */
static bool have_sse42, forced_table;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* a * b modulo P, both reflected (bit 31 is x^0). */
static uint32_t mult_mod_p(uint32_t a, uint32_t b) {
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0) break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

/* x^(8n) modulo P. */
static uint32_t x8n_mod_p(uint64_t n) {
    uint32_t x2k = 1u << 30, r = 1u << 31; /* x^1, x^0 */
    for (uint64_t e = 8 * n; e; e >>= 1) {
        if (e & 1) r = mult_mod_p(x2k, r);
        x2k = mult_mod_p(x2k, x2k);
    }
    return r;
}

static void init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][i] = c;
    }
    for (int s = 1; s < 8; s++)
        for (int i = 0; i < 256; i++) table[s][i] = (table[s - 1][i] >> 8) ^ table[0][table[s - 1][i] & 0xFF];
    shift_1 = x8n_mod_p(BLOCK);
    shift_2 = x8n_mod_p(2 * BLOCK);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
}

/* The register (no pre/post inversion) over n bytes, by table. */
static uint32_t crc_table(uint32_t c, const unsigned char *p, size_t n) {
    for (; n && ((uintptr_t)p & 7); n--) c = table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ /* else the byte loop */
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= c;
        c = table[7][w & 0xFF] ^ table[6][(w >> 8) & 0xFF] ^ table[5][(w >> 16) & 0xFF] ^
            table[4][(w >> 24) & 0xFF] ^ table[3][(w >> 32) & 0xFF] ^ table[2][(w >> 40) & 0xFF] ^
            table[1][(w >> 48) & 0xFF] ^ table[0][w >> 56];
    }
#endif
    while (n--) c = table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>

__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t c, const unsigned char *p, size_t n) {
    for (; n && ((uintptr_t)p & 7); n--) c = _mm_crc32_u8(c, *p++);
    uint64_t c0 = c;
    for (; n >= 3 * BLOCK; n -= 3 * BLOCK, p += 3 * BLOCK) {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < BLOCK; i += 8) {
            uint64_t a, b, d;
            memcpy(&a, p + i, 8);
            memcpy(&b, p + BLOCK + i, 8);
            memcpy(&d, p + 2 * BLOCK + i, 8);
            c0 = _mm_crc32_u64(c0, a);
            c1 = _mm_crc32_u64(c1, b);
            c2 = _mm_crc32_u64(c2, d);
        }
        c0 = mult_mod_p(shift_2, (uint32_t)c0) ^ mult_mod_p(shift_1, (uint32_t)c1) ^ (uint32_t)c2;
    }
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        c0 = _mm_crc32_u64(c0, a);
    }
    c = (uint32_t)c0;
    while (n--) c = _mm_crc32_u8(c, *p++);
    return c;
}
#endif

uint32_t accel__crc32c_update(uint32_t crc, const void *data, size_t n) {
    pthread_once(&init_once, init);
    uint32_t c = ~crc;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (have_sse42 && !forced_table) return ~crc_sse42(c, data, n);
#endif
    return ~crc_table(c, data, n);
}

uint32_t accel__crc32c(const void *data, size_t n) { return accel__crc32c_update(0, data, n); }

const char *accel__crc32c_impl(void) {
    pthread_once(&init_once, init);
    return have_sse42 && !forced_table ? "sse4.2" : "table";
}

void accel__crc32c_force_table(bool on) {
    pthread_once(&init_once, init);
    forced_table = on;
}

uint32_t accel__crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
    pthread_once(&init_once, init);
    return mult_mod_p(x8n_mod_p(len_b), crc_a) ^ crc_b;
}

/* CRC-32C of bytes [off, off + n) of fd, read in chunks into buf (CHUNK bytes). */
enum { CHUNK = 1 << 20 };
static accel_status crc_range(int fd, int64_t off, int64_t n, unsigned char *buf, uint32_t *out, const char *path) {
    uint32_t c = 0;
    while (n > 0) {
        ssize_t got = pread(fd, buf, (size_t)(n < CHUNK ? n : CHUNK), off);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return accel_set_error(ACCEL_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        if (got == 0) return accel_set_error(ACCEL_ERR_IO, "%s: shrank while it was read", path);
        c = accel__crc32c_update(c, buf, (size_t)got);
        off += got;
        n -= got;
    }
    *out = c;
    return ACCEL_OK;
}

/* A large file is split into one range per thread (the ranges' CRCs are
 * joined with accel__crc32c_combine): checksumming a checkpoint that sits in
 * the page cache is bound by memory bandwidth, not by one core. */
accel_status accel__file_crc32c(const char *path, uint32_t *crc, int64_t *bytes) {
    enum { MAX_PARTS = 64 };
    const int64_t PART_MIN = 64 << 20;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block: refused below */
    struct stat sb;
    const char *why = fd < 0 || fstat(fd, &sb) ? strerror(errno) : !S_ISREG(sb.st_mode) ? "not a regular file" : NULL;
    if (why) {
        if (fd >= 0) close(fd);
        return accel_set_error(ACCEL_ERR_IO, "%s: cannot be read: %s", path, why);
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    int64_t size = (int64_t)sb.st_size;
    int64_t parts64 = size / PART_MIN, threads = omp_get_max_threads();
    if (parts64 > threads) parts64 = threads;
    if (parts64 > MAX_PARTS) parts64 = MAX_PARTS;
    int parts = parts64 < 1 ? 1 : (int)parts64;
    uint32_t part_crc[MAX_PARTS];
    accel_status part_st[MAX_PARTS];
    char part_err[MAX_PARTS][256];
#pragma omp parallel for num_threads(parts) if (parts > 1) schedule(static, 1)
    for (int p = 0; p < parts; p++) {
        int64_t a = size * p / parts, b = size * (p + 1) / parts;
        unsigned char *buf = accel_malloc(CHUNK);
        part_st[p] = buf ? crc_range(fd, a, b - a, buf, &part_crc[p], path) : accel_last_status();
        snprintf(part_err[p], sizeof part_err[p], "%s", part_st[p] ? accel_last_error() : "");
        accel_free(buf);
    }
    close(fd);
    uint32_t c = 0;
    for (int p = 0; p < parts; p++) {
        if (part_st[p]) return accel_set_error(part_st[p], "%s", part_err[p]); /* the error of this thread */
        c = p == 0 ? part_crc[0] : accel__crc32c_combine(c, part_crc[p], (uint64_t)(size * (p + 1) / parts - size * p / parts));
    }
    *crc = c;
    if (bytes) *bytes = size;
    return ACCEL_OK;
}
