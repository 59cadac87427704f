/* src/accelerator/pipeline_schedule.h — Megatron's interleaved 1F1B
 * schedule, planned as ticks (internal; pipeline.c runs the plan).
 *
 * p ranks, v model chunks each (virtual stages): rank r holds the global
 * chunks r, r + p, ..., r + (v - 1) p of the S = p v chunks the layers are
 * cut into; chunk 0 embeds, chunk S - 1 has the head and the loss. A hidden
 * state goes from chunk c to c + 1 (rank r to r + 1 mod p: the last rank
 * feeds rank 0's next chunk), a gradient from c to c - 1.
 *
 * Each rank's order of work is Megatron's (forward_backward_pipelining_with_
 * interleaving): the micro-batches in groups of p, each group through the
 * rank's chunks in turn (backwards: the chunks in reverse); (p - r - 1) 2 +
 * (v - 1) p forwards of warm-up (all of them when m = p), then one forward
 * and one backward in turn, then the remaining backwards. At most warm-up +
 * 1 (chunk, micro-batch) pairs are in flight on rank r.
 *
 * The plan runs that order as every rank runs it: in ticks (a forward lasts
 * one, a backward, which recomputes the forward first, three), each rank
 * starting its next op at a tick when it is free and the op's input arrived
 * at an earlier one; after each tick, a rank whose op ended then sends what
 * it made (a hidden state to the next rank, a gradient to the previous) and
 * receives what its neighbours' ops that ended then made - two exchanges,
 * one each way round the ring, which every rank makes tick after tick in the
 * same order, so none waits on a rank that waits on it, and a pair of ranks
 * (p = 2: each is the other's next and previous) sees its messages in the
 * order they were sent. A rank runs an op whole when it starts; the
 * exchanges of the ticks it spans follow. Every rank computes the whole plan alike (it is
 * a function of p, v, m) and keeps its own part. A received message waits in
 * a slot (a buffer of one micro-batch's hidden states) until the backward
 * that uses it last; slots are reused as they free. */
#ifndef ACCEL_ACCELERATOR_PIPELINE_SCHEDULE_H
#define ACCEL_ACCELERATOR_PIPELINE_SCHEDULE_H

#include <stdbool.h>

#include "accel/core.h"

typedef struct accel__pp_op {
    int chunk;      /* the rank's chunk j (global chunk j p + rank) */
    int micro;      /* micro-batch */
    bool backward;
    int in_slot;    /* the slot of its input hidden state; -1: chunk 0 (its input is the ids) */
    int grad_slot;  /* backward: the slot of its output's gradient; -1: the last chunk (the loss) or a forward */
} accel__pp_op;

typedef struct accel__pp_plan {
    int n_ops;          /* 2 m v: the rank's ops in order */
    accel__pp_op *ops;  /* [n_ops] */
    int n_ticks;        /* the whole pipeline's */
    int *tick_op;       /* [n_ticks]: the op the rank starts at tick t, -1: none (busy or waiting) */
    int *sends;         /* [n_ticks]: after tick t the rank sends its ended op's hidden state to the next rank (0),
                         * its gradient to the previous (1), or nothing (-1) */
    int *hidden_in;     /* [n_ticks]: the slot the hidden state from the previous rank arrives in after tick t, -1: none */
    int *grad_in;       /* [n_ticks]: the slot the gradient from the next rank arrives in after tick t, -1: none */
    int slots;          /* slots live at once, at most */
    int peak_in_flight; /* (chunk, micro-batch) pairs forwarded and not yet backwarded, at most */
} accel__pp_plan;

/* Rank `rank`'s plan of p ranks x v chunks x m micro-batches (p >= 2, v >= 1,
 * m >= 1 a multiple of p), its arrays in the step arena (until
 * accel_step_reset). ACCEL_ERR_INVALID_ARG for sizes out of range. */
accel_status accel__pp_interleaved_plan(int p, int v, int m, int rank, accel__pp_plan *out);

/* Megatron's warm-up forwards on rank r, plus the one of the first 1F1B pair:
 * the in-flight bound the plan meets (m v when all forwards come first). */
int accel__pp_interleaved_in_flight(int p, int v, int m, int rank);

#endif
