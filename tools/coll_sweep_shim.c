/* tools/coll_sweep_shim.c: accel's side of tools/sweep_collectives.py, which
 * compares the Accelerator's collectives with Accelerate's. Launched as
 *     accel launch --num_processes N build/bin/coll_sweep_shim CASES OUTDIR
 * every rank reads CASES (one case a line, all of them for this N) and writes
 * OUTDIR/rank<R>.txt, one line per result:
 *     ID SLOT ok DTYPE NDIM SHAPE... HEX     (HEX "-" when empty)
 *     ID SLOT err MESSAGE
 * A case line, whitespace-separated:
 *     ID OP DTYPE NDIM N  (SHAPE[NDIM] HEX) * N  DIM PAD_INDEX PAD_FIRST REDUCTION SCALE SRC LEN BS AT
 * OP: gather, gfm (gather_for_metrics: slot 0, and gather_for_metrics_n of
 * the tensor twice: slots 1 and 2; AT -1 with no data loader, 1 at the last
 * batch of a prepared loader of LEN samples in batches of BS, 0 at its first
 * batch), reduce, pad, broadcast. Built with the library: build/bin/coll_sweep_shim. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"

enum { MAX_RANKS = 8 };

typedef struct coll_case {
    char id[32], op[16], reduction[16];
    accel_dtype dtype;
    int ndim, world, dim, pad_first, src, at;
    int64_t shape[ACCEL_MAX_DIMS];
    char *hex; /* this rank's elements, "-" when there are none */
    double pad_index, scale;
    int64_t len, bs;
} coll_case;

static int hexval(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

/* This rank's input tensor of c (from its HEX). */
static accel_tensor *input_tensor(const coll_case *c) {
    size_t n = strcmp(c->hex, "-") ? strlen(c->hex) / 2 : 0;
    unsigned char *bytes = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) bytes[i] = (unsigned char)(hexval(c->hex[2 * i]) * 16 + hexval(c->hex[2 * i + 1]));
    accel_tensor *t = accel_from_data(c->dtype, c->ndim, c->shape, bytes);
    free(bytes);
    return t;
}

static void write_result(FILE *out, const coll_case *c, int slot, accel_tensor *t) {
    if (!t) {
        const char *msg = accel_last_error();
        fprintf(out, "%s %d err ", c->id, slot);
        for (const char *p = msg && *msg ? msg : "(no message)"; *p; p++) fputc(*p == '\n' ? ' ' : *p, out);
        fputc('\n', out);
        accel_clear_error();
        return;
    }
    accel_tensor *k = accel_contiguous(t);
    fprintf(out, "%s %d ok %s %d", c->id, slot, accel_dtype_name(t->dtype), t->ndim);
    for (int d = 0; d < t->ndim; d++) fprintf(out, " %lld", (long long)t->shape[d]);
    size_t nb = (size_t)accel_numel(t) * accel_dtype_size(t->dtype);
    fputc(' ', out);
    if (!nb) fputc('-', out);
    for (size_t i = 0; i < nb; i++) fprintf(out, "%02x", ((unsigned char *)k->data)[i]);
    fputc('\n', out);
}

/* gather_for_metrics of t (slot 0) and gather_for_metrics_n of {t, t}
 * (slots 1, 2), where c->at puts them. */
static void run_gfm(accel_accelerator *acc, const coll_case *c, accel_tensor *t, FILE *out) {
    accel_dataset *ds = NULL;
    accel_dataloader *dl = NULL;
    if (c->at >= 0) {
        accel_tensor *xs = accel_arange(ACCEL_I64, 0, c->len);
        ds = accel_tensor_dataset_new(1, &xs);
        accel_dataloader_opts o = accel_dataloader_opts_default();
        o.batch_size = c->bs;
        dl = accel_dataloader_new(ds, &o);
        if (accel_accelerator_prepare_dataloader(acc, dl) != ACCEL_OK) {
            write_result(out, c, 0, NULL);
            return;
        }
    }
    accel_batch b;
    bool done = false;
    while (!done && (!dl || accel_dataloader_next(dl, &b))) {
        if (!dl || c->at == 0 || accel_dataloader_end_of_dataloader(dl)) {
            write_result(out, c, 0, accel_accelerator_gather_for_metrics(acc, t));
            accel_tensor *outs[2];
            bool ok = accel_accelerator_gather_for_metrics_n(acc, 2, (accel_tensor *[]){t, t}, outs) == ACCEL_OK;
            write_result(out, c, 1, ok ? outs[0] : NULL);
            write_result(out, c, 2, ok ? outs[1] : NULL);
            done = true;
        }
    }
    if (dl) {
        while (accel_dataloader_next(dl, &b)) {} /* the epoch ends as the peer's does */
        accel_accelerator_clear(acc);
        accel_dataloader_free(dl);
        accel_dataset_free(ds);
    }
}

static void run_case(accel_accelerator *acc, const coll_case *c, FILE *out) {
    accel_tensor *t = input_tensor(c);
    if (!t) write_result(out, c, 0, NULL);
    else if (!strcmp(c->op, "gather")) write_result(out, c, 0, accel_accelerator_gather(acc, t));
    else if (!strcmp(c->op, "gfm")) run_gfm(acc, c, t, out);
    else if (!strcmp(c->op, "reduce")) write_result(out, c, 0, accel_accelerator_reduce(acc, t, c->reduction, c->scale));
    else if (!strcmp(c->op, "pad"))
        write_result(out, c, 0, accel_accelerator_pad_across_processes(acc, t, c->dim, c->pad_index, c->pad_first));
    else if (!strcmp(c->op, "broadcast")) write_result(out, c, 0, accel_accelerator_broadcast(acc, t, c->src));
    else {
        fprintf(stderr, "coll_sweep_shim: unknown op %s\n", c->op);
        exit(2);
    }
}

/* Parses one case line for rank `rank`; false on a malformed line. */
static bool parse_case(char *line, int rank, coll_case *c) {
    char *save = NULL, *tok;
#define NEXT() ((tok = strtok_r(save ? NULL : line, " \t\n", &save)) != NULL)
    char dtype[16];
    if (!NEXT()) return false;
    snprintf(c->id, sizeof c->id, "%s", tok);
    if (!NEXT()) return false;
    snprintf(c->op, sizeof c->op, "%s", tok);
    if (!NEXT()) return false;
    snprintf(dtype, sizeof dtype, "%s", tok);
    int dt = accel_dtype_parse(dtype);
    if (dt < 0 || !NEXT()) return false;
    c->dtype = (accel_dtype)dt;
    c->ndim = atoi(tok);
    if (c->ndim < 0 || c->ndim > ACCEL_MAX_DIMS || !NEXT()) return false;
    c->world = atoi(tok);
    if (c->world < 1 || c->world > MAX_RANKS) return false;
    for (int r = 0; r < c->world; r++) {
        int64_t shape[ACCEL_MAX_DIMS];
        for (int d = 0; d < c->ndim; d++) {
            if (!NEXT()) return false;
            shape[d] = atoll(tok);
        }
        if (!NEXT()) return false;
        if (r == rank) {
            memcpy(c->shape, shape, sizeof shape);
            c->hex = tok;
        }
    }
    double v[9];
    for (int k = 0; k < 9; k++) {
        if (!NEXT()) return false;
        if (k == 3) snprintf(c->reduction, sizeof c->reduction, "%s", tok);
        else v[k] = strtod(tok, NULL);
    }
#undef NEXT
    c->dim = (int)v[0];
    c->pad_index = v[1];
    c->pad_first = (int)v[2];
    c->scale = v[4];
    c->src = (int)v[5];
    c->len = (int64_t)v[6];
    c->bs = (int64_t)v[7];
    c->at = (int)v[8];
    return true;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: coll_sweep_shim CASES OUTDIR (under accel launch)\n");
        return 2;
    }
    accel_accelerator *acc = accel_accelerator_new(NULL);
    if (!acc) {
        fprintf(stderr, "coll_sweep_shim: %s\n", accel_last_error());
        return 1;
    }
    const int rank = accel_accelerator_process_index(acc);
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d.txt", argv[2], rank);
    FILE *in = fopen(argv[1], "r"), *out = fopen(path, "w");
    if (!in || !out) {
        fprintf(stderr, "coll_sweep_shim: cannot open %s or %s\n", argv[1], path);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, in) > 0) {
        coll_case c;
        memset(&c, 0, sizeof c);
        if (!parse_case(line, rank, &c) || c.world != accel_accelerator_num_processes(acc)) {
            fprintf(stderr, "coll_sweep_shim: bad case line (or not for %d processes)\n",
                    accel_accelerator_num_processes(acc));
            return 2;
        }
        run_case(acc, &c, out);
        fflush(out);
        accel_step_reset();
    }
    free(line);
    fclose(in);
    fclose(out);
    accel_accelerator_free(acc);
    return 0;
}
