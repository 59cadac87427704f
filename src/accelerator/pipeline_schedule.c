/* src/accelerator/pipeline_schedule.c — the interleaved 1F1B plan
 * (pipeline_schedule.h). */
#include <string.h>

#include "pipeline_schedule.h"

/* n ints or ops of the step arena, for the plan's arrays. */
static void *arena(size_t bytes) { return accel_arena_alloc(accel_step_arena(), bytes ? bytes : 1, 64); }

/* Megatron's warm-up forwards on rank r (get_num_warmup_microbatches). */
static int warmup(int p, int v, int m, int rank) {
    int total = m * v, w = (p - rank - 1) * 2 + (v - 1) * p;
    if (m == p) return total; /* Megatron: all forwards first when there are only p micro-batches */
    return w < total ? w : total;
}

int accel__pp_interleaved_in_flight(int p, int v, int m, int rank) {
    int w = warmup(p, v, m, rank);
    return w < m * v ? w + 1 : w;
}

/* The k-th forward (backward) of a rank: micro-batches in groups of p, each
 * group through the chunks in turn (in reverse for the backwards). */
static accel__pp_op nth(int p, int v, int k, bool backward) {
    int group = k / (p * v), in = k % (p * v);
    return (accel__pp_op){.chunk = backward ? v - 1 - in / p : in / p, .micro = group * p + in % p,
                          .backward = backward, .in_slot = -1, .grad_slot = -1};
}

/* Rank r's 2 m v ops in order: warm-up forwards, 1F1B pairs, the rest backwards. */
static void order(int p, int v, int m, int rank, accel__pp_op *ops) {
    int total = m * v, w = warmup(p, v, m, rank), n = 0, f = 0, b = 0;
    while (f < w) ops[n++] = nth(p, v, f++, false);
    while (f < total) {
        ops[n++] = nth(p, v, f++, false);
        ops[n++] = nth(p, v, b++, true);
    }
    while (b < total) ops[n++] = nth(p, v, b++, true);
}

/* An op's length in ticks: a backward recomputes its chunk's forward, then
 * runs the backward (about twice a forward), so it lasts three forwards.
 * The plan's exchanges happen when the ops end; with these lengths a stage
 * seldom waits for a neighbour's exchange it does not need yet. */
enum { FORWARD_TICKS = 1, BACKWARD_TICKS = 3 };

/* Whether an op whose output went out after tick `end` (-1: not yet) is there for tick t. */
static bool before(int end, int t) { return end >= 0 && end < t; }

accel_status accel__pp_interleaved_plan(int p, int v, int m, int rank, accel__pp_plan *out) {
    memset(out, 0, sizeof *out);
    if (p < 2 || v < 1 || m < 1 || m % p || rank < 0 || rank >= p)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "interleaved pipeline schedule: %d ranks x %d chunks x %d "
                               "micro-batches (rank %d): needs >= 2 ranks, >= 1 chunk, micro-batches a multiple of "
                               "the ranks", p, v, m, rank);
    int S = p * v, n = 2 * m * v, max_ticks = p * n * BACKWARD_TICKS;
    accel__pp_op *all = arena((size_t)p * (size_t)n * sizeof *all);
    /* per rank: its next op, the tick its current op ends (-1: none), that op's chunk x m + micro-batch, kind */
    int *next = arena((size_t)p * sizeof *next), *end = arena((size_t)p * sizeof *end);
    int *cur = arena((size_t)p * sizeof *cur), *cur_bwd = arena((size_t)p * sizeof *cur_bwd);
    int *fwd = arena((size_t)S * (size_t)m * sizeof *fwd), *bwd = arena((size_t)S * (size_t)m * sizeof *bwd);
    int *free_slots = arena((size_t)n * sizeof *free_slots);
    int *fidx = arena((size_t)m * (size_t)v * sizeof *fidx), *bidx = arena((size_t)m * (size_t)v * sizeof *bidx);
    int *tick_op = arena((size_t)max_ticks * sizeof *tick_op), *sends = arena((size_t)max_ticks * sizeof *sends);
    int *hidden_in = arena((size_t)max_ticks * sizeof *hidden_in), *grad_in = arena((size_t)max_ticks * sizeof(int));
    if (!all || !next || !end || !cur || !cur_bwd || !fwd || !bwd || !free_slots || !fidx || !bidx || !tick_op ||
        !sends || !hidden_in || !grad_in)
        return accel_last_status();
    for (int q = 0; q < p; q++) order(p, v, m, q, all + (size_t)q * n);
    accel__pp_op *ops = all + (size_t)rank * n;
    for (int k = 0; k < n; k++) (ops[k].backward ? bidx : fidx)[ops[k].chunk * m + ops[k].micro] = k;
    memset(next, 0, (size_t)p * sizeof *next);
    memset(end, 0xff, (size_t)p * sizeof *end); /* -1 */
    memset(fwd, 0xff, (size_t)S * (size_t)m * sizeof *fwd); /* -1: not done */
    memset(bwd, 0xff, (size_t)S * (size_t)m * sizeof *bwd);
    int left = p * n, n_free = 0, slots = 0, in_flight = 0, prev = (rank + p - 1) % p, nxt = (rank + 1) % p;
    int t = 0, last_end = -1;
    for (; left > 0 || last_end >= t; t++) { /* until every op's output went out */
        if (t == max_ticks) /* some op ends every BACKWARD_TICKS ticks: cannot happen for Megatron's order */
            return accel_set_error(ACCEL_ERR_STATE, "interleaved pipeline schedule: %d ranks x %d chunks x %d "
                                   "micro-batches stalls", p, v, m);
        tick_op[t] = sends[t] = hidden_in[t] = grad_in[t] = -1;
        for (int q = 0; q < p; q++) {
            if (next[q] == n || end[q] >= t) continue; /* done, or busy */
            accel__pp_op *o = &all[(size_t)q * n + (size_t)next[q]];
            int c = o->chunk * p + q, at = c * m + o->micro;
            bool ready = o->backward ? before(fwd[at], t) && (c == S - 1 || before(bwd[at + m], t))
                                     : c == 0 || before(fwd[at - m], t);
            if (!ready) continue;
            end[q] = t + (o->backward ? BACKWARD_TICKS : FORWARD_TICKS) - 1;
            if (end[q] > last_end) last_end = end[q];
            (o->backward ? bwd : fwd)[at] = end[q];
            cur[q] = at, cur_bwd[q] = o->backward;
            if (q == rank) tick_op[t] = next[q];
            next[q]++;
            left--;
        }
        if (tick_op[t] >= 0) { /* this rank's op starts: a backward frees its slots (it copies them first) */
            accel__pp_op *o = &ops[tick_op[t]];
            in_flight += o->backward ? -1 : 1;
            if (in_flight > out->peak_in_flight) out->peak_in_flight = in_flight;
            if (o->backward && o->in_slot >= 0) free_slots[n_free++] = o->in_slot;
            if (o->backward && o->grad_slot >= 0) free_slots[n_free++] = o->grad_slot;
        }
        /* what goes out after the tick: an ending op's hidden state for chunk c + 1 (not past the last), its
         * gradient for chunk c - 1 (not before the first) */
        if (end[rank] == t && cur[rank] / m < S - 1 && !cur_bwd[rank]) sends[t] = 0;
        if (end[rank] == t && cur[rank] / m > 0 && cur_bwd[rank]) sends[t] = 1;
        int from_prev = end[prev] == t && !cur_bwd[prev] && cur[prev] / m < S - 1 ? cur[prev] + m : -1;
        int from_next = end[nxt] == t && cur_bwd[nxt] && cur[nxt] / m > 0 ? cur[nxt] - m : -1;
        if (from_prev >= 0) {
            int slot = hidden_in[t] = n_free ? free_slots[--n_free] : slots++, j = from_prev / m / p;
            int micro = from_prev % m;
            ops[fidx[j * m + micro]].in_slot = ops[bidx[j * m + micro]].in_slot = slot;
        }
        if (from_next >= 0) {
            int slot = grad_in[t] = n_free ? free_slots[--n_free] : slots++, j = from_next / m / p;
            ops[bidx[j * m + from_next % m]].grad_slot = slot;
        }
    }
    *out = (accel__pp_plan){.n_ops = n, .ops = ops, .n_ticks = t, .tick_op = tick_op, .sends = sends,
                            .hidden_in = hidden_in, .grad_in = grad_in, .slots = slots,
                            .peak_in_flight = out->peak_in_flight};
    return ACCEL_OK;
}
