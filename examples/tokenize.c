/* Tokenize a corpus with a model's own tokenizer, for training:
 *     tokenize MODEL_DIR [FILE|-] [--no-special] > ids.txt
 * MODEL_DIR holds tokenizer.json or a SentencePiece tokenizer.model (or name
 * the file itself). Each line of FILE
 * (standard input by default) is one document: its ids, with the tokenizer's
 * special tokens (BOS, [CLS] ... [SEP]) unless --no-special, go to standard
 * output as one line of space-separated numbers, the format examples/finetune
 * reads. Ends with "tokenize: N lines, M ids, X MB/s" on stderr: the rate of
 * the encode calls alone (not reading or printing), as bench/tokenizer_peer.py
 * times its peers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/core.h"
#include "accel/tokenizer.h"

int main(int argc, char **argv) {
    const char *model = NULL, *file = "-";
    bool special = true;
    int positional = 0;
    static const char USAGE[] = "usage: tokenize MODEL_DIR [FILE|-] [--no-special]\n";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-special")) special = false;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(USAGE, stdout);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) { /* "-" alone is standard input */
            fprintf(stderr, "tokenize: unknown option %s\n%s", argv[i], USAGE);
            return 2;
        } else if (positional == 0) model = argv[i], positional++;
        else if (positional == 1) file = argv[i], positional++;
        else model = NULL;
    }
    if (!model) {
        fputs(USAGE, stderr);
        return 2;
    }
    accel_tokenizer *t = accel_tokenizer_load(model);
    if (!t) {
        fprintf(stderr, "tokenize: %s\n", accel_last_error());
        return 1;
    }
    FILE *in = strcmp(file, "-") ? fopen(file, "rb") : stdin;
    if (!in) {
        perror(file);
        accel_tokenizer_free(t);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0, bytes = 0;
    ssize_t n;
    long long lines = 0, total = 0;
    int rc = 0;
    double s = 0; /* seconds in accel_tokenizer_encode */
    while (!rc && (n = getline(&line, &cap, in)) >= 0) {
        lines++;
        if (n && line[n - 1] == '\n') n--;
        bytes += (size_t)n;
        int64_t *ids = NULL, k = 0;
        double t0 = accel_now_seconds();
        accel_status st = accel_tokenizer_encode(t, line, (size_t)n, special, &ids, &k);
        s += accel_now_seconds() - t0;
        if (st != ACCEL_OK) {
            fprintf(stderr, "tokenize: %s line %lld: %s\n", file, lines, accel_last_error());
            rc = 1;
        }
        for (int64_t i = 0; i < k; i++) printf(i ? " %lld" : "%lld", (long long)ids[i]);
        if (!rc) putchar('\n');
        total += k;
        free(ids);
    }
    if (ferror(in)) {
        perror(file);
        rc = 1;
    }
    if (fflush(stdout) != 0) {
        perror("tokenize: standard output");
        rc = 1;
    }
    if (!rc) fprintf(stderr, "tokenize: %lld lines, %lld ids, %.2f MB/s\n", lines, total, s > 0 ? bytes / s / 1e6 : 0.0);
    free(line);
    if (in != stdin) fclose(in);
    accel_tokenizer_free(t);
    return rc;
}
