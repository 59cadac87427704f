/* tools/tok_sweep_harness.c: accel's side of tools/sweep_tokenizers.py, one
 * process for thousands of requests. Usage: tok_sweep_harness TOKENIZER_PATH
 * Requests on standard input, binary, little-endian:
 *     'E' u32 n, n bytes        encode with and without special tokens
 *     'D' u8 skip, u32 k, k i64 decode(ids, skip_special_tokens=skip)
 *     'V'                       every id's token and special flag
 * One answer line each on standard output:
 *     E <ids with specials, space-separated>|<ids without>
 *     D <the decoded text in hex>
 *     V <vocab size>, then per id "<id> <special 0/1> <token in hex, or ->"
 *     X <accel_last_error()> for a call that failed
 * Built by the sweep script against build/'s libaccel.so. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"

static void print_hex(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) printf("%02x", (unsigned char)s[i]);
}

static void print_error(void) {
    fputs("X ", stdout);
    for (const char *e = accel_last_error(); *e; e++) putchar(*e == '\n' ? ' ' : *e);
    putchar('\n');
}

static bool read_exact(void *p, size_t n) { return fread(p, 1, n, stdin) == n; }

static void encode(const accel_tokenizer *t, const char *text, uint32_t n) {
    int64_t *ids[2] = {NULL, NULL}, k[2] = {0, 0};
    for (int special = 1; special >= 0; special--)
        if (accel_tokenizer_encode(t, text, n, special, &ids[special], &k[special]) != ACCEL_OK) {
            free(ids[1]);
            print_error();
            return;
        }
    fputs("E ", stdout);
    for (int special = 1; special >= 0; special--) {
        for (int64_t i = 0; i < k[special]; i++) printf(i ? " %lld" : "%lld", (long long)ids[special][i]);
        fputs(special ? "|" : "\n", stdout);
        free(ids[special]);
    }
}

static void decode(const accel_tokenizer *t, const int64_t *ids, uint32_t k, bool skip) {
    char *s = NULL;
    size_t len = 0;
    if (accel_tokenizer_decode(t, ids, k, skip, &s, &len) != ACCEL_OK) {
        print_error();
        return;
    }
    fputs("D ", stdout);
    print_hex(s, len);
    putchar('\n');
    free(s);
}

static void vocab(const accel_tokenizer *t) {
    int64_t n = accel_tokenizer_vocab_size(t);
    printf("V %lld\n", (long long)n);
    for (int64_t id = 0; id < n; id++) {
        const char *tok = accel_tokenizer_id_to_token(t, id);
        printf("%lld %d ", (long long)id, accel_tokenizer_is_special(t, id));
        if (tok) print_hex(tok, strlen(tok));
        else putchar('-');
        putchar('\n');
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fputs("usage: tok_sweep_harness TOKENIZER_PATH < requests\n", stderr);
        return 2;
    }
    accel_tokenizer *t = accel_tokenizer_load(argv[1]);
    if (!t) {
        fprintf(stderr, "tok_sweep_harness: %s\n", accel_last_error());
        return 1;
    }
    char *buf = NULL;
    int op, rc = 0;
    while (!rc && (op = getchar()) != EOF) {
        uint32_t n = 0;
        uint8_t skip = 0;
        if (op == 'V') {
            vocab(t);
            continue;
        }
        if ((op != 'E' && op != 'D') || (op == 'D' && !read_exact(&skip, 1)) || !read_exact(&n, 4)) {
            rc = 2;
            break;
        }
        size_t size = op == 'E' ? n : (size_t)n * sizeof(int64_t);
        char *p = realloc(buf, size + 1);
        if (!p) {
            rc = 2;
            break;
        }
        buf = p;
        if (!read_exact(buf, size)) {
            rc = 2;
            break;
        }
        if (op == 'E') encode(t, buf, n);
        else decode(t, (const int64_t *)(void *)buf, n, skip);
    }
    if (rc) fputs("tok_sweep_harness: a malformed request\n", stderr);
    free(buf);
    accel_tokenizer_free(t);
    return fflush(stdout) != 0 || rc;
}
