/* Batch lists and accelerate's BatchSamplerShard (accelerate/data_loader.py), ported
 * line for line from data_loader.py (_iter_with_split / _iter_with_no_split)
 * over a materialised epoch of global batches. */
#include <stdint.h>
#include <string.h>

#include "accel/data.h"

void accel_batches_init(accel_batches *b) {
    if (b) memset(b, 0, sizeof *b);
}

void accel_batches_free(accel_batches *b) {
    if (!b) return;
    accel_free(b->offsets);
    accel_free(b->indices);
    accel_batches_init(b);
}

static void batches_clear(accel_batches *b) { b->n = 0; }

int64_t accel_batches_size(const accel_batches *b, int64_t i) {
    if (!b || i < 0 || i >= b->n) return 0;
    return b->offsets[i + 1] - b->offsets[i];
}

const int64_t *accel_batches_at(const accel_batches *b, int64_t i) {
    if (!b || i < 0 || i >= b->n) return NULL;
    return b->indices + b->offsets[i];
}

/* Grows *p (cap elements of elem bytes) to hold need. *src, when not NULL and
 * pointing into the old block, follows the move: a list appended to itself
 * (Python's `x += x`) must copy from the new block, the old one is freed. */
/* The most entries a list holds: past it the doubling in grow overflowed
 * int64 (a negative capacity doubled forever: a hang) and its byte size wrapped. */
#define MAX_ENTRIES ((int64_t)(SIZE_MAX / 4 / sizeof(int64_t)))

static bool too_many(int64_t need) {
    accel_set_error(ACCEL_ERR_OOM, "batch list: %lld entries do not fit in memory", (long long)need);
    return false;
}

static bool grow(void **p, int64_t *cap, int64_t need, size_t elem, const int64_t **src) {
    if (need <= *cap) return true;
    if (need > MAX_ENTRIES) return too_many(need);
    int64_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *q = accel_malloc((size_t)nc * elem);
    if (!q) return false;
    uintptr_t old = (uintptr_t)*p, s = src ? (uintptr_t)*src : 0;
    if (src && *p && s >= old && s < old + (size_t)*cap * elem) *src = (const int64_t *)((char *)q + (s - old));
    if (*p) memcpy(q, *p, (size_t)*cap * elem);
    accel_free(*p);
    *p = q;
    *cap = nc;
    return true;
}

accel_status accel_batches_push(accel_batches *b, int64_t n, const int64_t *idx) {
    if (!b || n < 0 || (n > 0 && !idx))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_batches_push: bad batch (n=%lld)",
                               (long long)n);
    int64_t used = b->n ? b->offsets[b->n] : 0;
    if (!grow((void **)&b->offsets, &b->cap_batches, b->n + 2, sizeof(int64_t), NULL) ||
        !grow((void **)&b->indices, &b->cap_indices, used + n + 1, sizeof(int64_t), &idx))
        return accel_last_status();
    b->offsets[0] = 0;
    if (n) memcpy(b->indices + used, idx, (size_t)n * sizeof(int64_t));
    b->offsets[b->n + 1] = used + n;
    b->n++;
    return ACCEL_OK;
}

accel_status accel_batches_from_order(accel_batches *b, int64_t n, const int64_t *order,
                                      int64_t batch_size, bool drop_last) {
    /* Each named apart: n < 0 was reported as a bad batch_size, and a NULL
     * list was written through. */
    if (!b) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_batches_from_order: the batch list is NULL");
    if (batch_size <= 0 || n < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_batches_from_order: %s must be %s (got %lld)", n < 0 ? "n" : "batch_size",
                               n < 0 ? ">= 0" : "> 0", (long long)(n < 0 ? n : batch_size));
    batches_clear(b);
    /* Reserved at once, so that a list too long for memory fails here with
     * an error: grown batch by batch, n = 2^62 ran until the system killed
     * the process. */
    if ((n >= MAX_ENTRIES && !too_many(n)) ||
        !grow((void **)&b->offsets, &b->cap_batches, n / batch_size + 2, sizeof(int64_t), NULL) ||
        !grow((void **)&b->indices, &b->cap_indices, n + 1, sizeof(int64_t), NULL))
        return accel_last_status();
    int64_t buf[256];
    for (int64_t s = 0; s < n; s += batch_size) {
        int64_t len = n - s < batch_size ? n - s : batch_size;
        if (len < batch_size && drop_last) break;
        const int64_t *src = order ? order + s : NULL;
        int64_t *tmp = buf;
        if (!src) {
            if (len > 256 && !(tmp = accel_malloc((size_t)len * sizeof(int64_t))))
                return accel_last_status();
            for (int64_t i = 0; i < len; i++) tmp[i] = s + i;
            src = tmp;
        }
        accel_status st = accel_batches_push(b, len, src);
        if (tmp != buf) accel_free(tmp);
        if (st) return st;
    }
    return ACCEL_OK;
}

/* ------------------------------------------------------------ sharding */

/* A growable index list (Python list) used by the port. */
typedef struct ivec {
    int64_t *v;
    int64_t n, cap;
} ivec;

/* Appends x[0..n); x may point into a itself (`initial_data += initial_data`). */
static bool ivec_push(ivec *a, const int64_t *x, int64_t n) {
    if (!grow((void **)&a->v, &a->cap, a->n + n + 1, sizeof(int64_t), &x)) return false;
    if (n) memcpy(a->v + a->n, x, (size_t)n * sizeof(int64_t));
    a->n += n;
    return true;
}

/* o with its defaults filled in: NULL is the zeroed struct, 0 processes is 1. */
static accel_shard_opts resolve_opts(const accel_shard_opts *o) {
    accel_shard_opts r = {0};
    if (o) r = *o;
    if (r.num_processes == 0) r.num_processes = 1;
    return r;
}

static accel_status check_opts(const accel_shard_opts *o, const char *fn) {
    if (o->num_processes < 1 || o->process_index < 0 || o->process_index >= o->num_processes)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: process_index %d out of range for %d processes",
                               fn, o->process_index, o->num_processes);
    if (o->split_batches && (o->batch_size <= 0 || o->batch_size % o->num_processes != 0))
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "%s: to use split_batches, the batch size (%lld) needs to be a round "
                               "multiple of the number of processes (%d)",
                               fn, (long long)o->batch_size, o->num_processes);
    return ACCEL_OK;
}

int64_t accel_batch_sampler_shard_len(int64_t L, const accel_shard_opts *given) {
    accel_shard_opts r = resolve_opts(given), *o = &r;
    if (check_opts(o, "accel_batch_sampler_shard_len")) return 0; /* num_processes < 1 would divide by 0 */
    if (L < 0) { /* a count: -5 came back as a length of -5 (split_batches) or -2 */
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_batch_sampler_shard_len: %lld batches (a count, >= 0)",
                        (long long)L);
        return 0;
    }
    int64_t N = o->num_processes;
    if (o->split_batches) return L;
    if (L % N == 0) return L / N;
    if (o->drop_last) return L / N;
    if (!o->no_even_batches) return L / N + 1;
    return L / N + (o->process_index < L % N ? 1 : 0);
}

static accel_status shard_split(const accel_batches *g, const accel_shard_opts *o,
                                accel_batches *out) {
    int64_t bs = o->batch_size, bl = bs / o->num_processes, r = o->process_index;
    if (g->n == 0) return ACCEL_OK;
    for (int64_t i = 0; i < g->n; i++)
        if (accel_batches_size(g, i) == bs) {
            accel_status st = accel_batches_push(out, bl, accel_batches_at(g, i) + bl * r);
            if (st) return st;
        }
    int64_t last_n = accel_batches_size(g, g->n - 1);
    if (o->drop_last || last_n >= bs) return ACCEL_OK;
    const int64_t *last = accel_batches_at(g, g->n - 1);
    if (o->no_even_batches) {
        if (last_n > bl * r) {
            int64_t end = bl * (r + 1) < last_n ? bl * (r + 1) : last_n;
            return accel_batches_push(out, end - bl * r, last + bl * r);
        }
        return ACCEL_OK;
    }
    /* batch + initial_data (the first batch, doubled until >= bs), then slice r. */
    ivec init = {0}, cat = {0};
    accel_status st = ACCEL_ERR_OOM;
    if (bs > MAX_ENTRIES / 2) { /* the doubling reaches up to 2 bs entries */
        too_many(bs);
        goto done;
    }
    if (!ivec_push(&init, accel_batches_at(g, 0), accel_batches_size(g, 0))) goto done;
    while (init.n < bs)
        if (!ivec_push(&init, init.v, init.n)) goto done;
    if (!ivec_push(&cat, last, last_n) || !ivec_push(&cat, init.v, init.n)) goto done;
    st = accel_batches_push(out, bl, cat.v + bl * r);
done:
    accel_free(init.v);
    accel_free(cat.v);
    return st;
}

static accel_status shard_no_split(const accel_batches *g, const accel_shard_opts *o,
                                   accel_batches *out) {
    const int64_t N = o->num_processes, r = o->process_index, bs = o->batch_size;
    const bool var = bs <= 0; /* batch_size None */
    accel_status st = ACCEL_OK;
    /* initial_data: a flat list (fixed size) or the first N batches (variable size). */
    ivec init = {0};
    int64_t n_init_batches = 0;
    int64_t yield_i = -1; /* batch_to_yield (global index), -1 = None */
    for (int64_t idx = 0; idx < g->n; idx++) {
        int64_t len = accel_batches_size(g, idx);
        if (!o->drop_last && idx < N) {
            if (!ivec_push(&init, accel_batches_at(g, idx), len)) goto oom;
            n_init_batches++;
        }
        if (idx % N == r) yield_i = idx;
        if (idx % N == N - 1 && (var || len == bs)) {
            if ((st = accel_batches_push(out, accel_batches_size(g, yield_i),
                                         accel_batches_at(g, yield_i))))
                goto done;
            yield_i = -1;
        }
    }
    if (o->drop_last || n_init_batches == 0 || (!var && init.n == 0)) goto done;
    if (o->no_even_batches) {
        if (yield_i >= 0 && accel_batches_size(g, yield_i) > 0)
            st = accel_batches_push(out, accel_batches_size(g, yield_i), accel_batches_at(g, yield_i));
        goto done;
    }
    if (yield_i >= 0 && (var || accel_batches_size(g, yield_i) == bs) &&
        accel_batches_size(g, yield_i) > 0)
        if ((st = accel_batches_push(out, accel_batches_size(g, yield_i), accel_batches_at(g, yield_i))))
            goto done;
    {
        /* Variable size: initial_data is a list of batches, doubled until it has
         * N of them; fixed size: a flat list doubled until N * bs indices. */
        int64_t init_count = var ? n_init_batches : init.n;
        int64_t need = N;
        /* N * bs past int64 is no list memory holds (it overflowed: the doubling went on to a huge allocation) */
        if (!var && __builtin_mul_overflow(N, bs, &need)) need = INT64_MAX;
        if (!var && need > MAX_ENTRIES) {
            too_many(need);
            goto oom;
        }
        /* batch offsets of the initial batches (variable-size case), doubled alongside. */
        ivec starts = {0};
        if (var) {
            int64_t off = 0;
            for (int64_t i = 0; i < n_init_batches; i++) {
                int64_t pair[2] = {off, accel_batches_size(g, i)};
                if (!ivec_push(&starts, pair, 2)) { accel_free(starts.v); goto oom; }
                off += pair[1];
            }
        }
        while (init_count < need) {
            if (var) {
                /* append copies of the batch descriptors, shifting the start by init.n */
                int64_t nb = init_count, shift = init.n;
                for (int64_t i = 0; i < nb; i++) {
                    int64_t pair[2] = {starts.v[2 * i] + shift, starts.v[2 * i + 1]};
                    if (!ivec_push(&starts, pair, 2)) { accel_free(starts.v); goto oom; }
                }
                if (!ivec_push(&init, init.v, init.n)) { accel_free(starts.v); goto oom; }
                init_count *= 2;
            } else {
                if (!ivec_push(&init, init.v, init.n)) { accel_free(starts.v); goto oom; }
                init_count = init.n;
            }
        }
        int64_t idx = g->n - 1;
        ivec batch = {0};
        int64_t last_n = accel_batches_size(g, idx);
        if (var || last_n == bs) {
            idx += 1; /* batch = [] */
        } else if (!ivec_push(&batch, accel_batches_at(g, idx), last_n)) {
            accel_free(starts.v);
            goto oom;
        }
        int64_t cycle = 0;
        while (idx % N != 0 || batch.n > 0) {
            if (var) {
                const int64_t *src = init.v + starts.v[2 * cycle];
                int64_t n = starts.v[2 * cycle + 1];
                if (idx % N == r && (st = accel_batches_push(out, n, src))) break;
                cycle += 1;
            } else {
                int64_t end = cycle + bs - batch.n;
                if (!ivec_push(&batch, init.v + cycle, end - cycle)) { st = ACCEL_ERR_OOM; break; }
                if (idx % N == r && (st = accel_batches_push(out, batch.n, batch.v))) break;
                cycle = end;
            }
            batch.n = 0;
            idx += 1;
        }
        accel_free(batch.v);
        accel_free(starts.v);
    }
    goto done;
oom:
    st = accel_last_status() ? accel_last_status() : ACCEL_ERR_OOM;
done:
    accel_free(init.v);
    return st;
}

accel_status accel_batch_sampler_shard(const accel_batches *global, const accel_shard_opts *given,
                                       accel_batches *out) {
    if (!global || !out)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_batch_sampler_shard: %s is NULL", global ? "out" : "global");
    accel_shard_opts r = resolve_opts(given), *o = &r;
    if (global == out) /* out is cleared before global is read */
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_batch_sampler_shard: out must be another list than global");
    accel_status st = check_opts(o, "accel_batch_sampler_shard");
    if (st) return st;
    batches_clear(out);
    if (out->cap_batches == 0 && (st = accel_batches_push(out, 0, NULL)) == ACCEL_OK)
        batches_clear(out); /* make offsets[0] valid for an empty result */
    if (st) return st;
    return o->split_batches ? shard_split(global, o, out) : shard_no_split(global, o, out);
}
