/* Internals shared by the files of src/optim (not public API). */
#ifndef ACCEL_OPTIM_INTERNAL_H
#define ACCEL_OPTIM_INTERNAL_H

#include "accel/optim.h"
#include "backends/backend.h"
#include "core/core_internal.h"
#include "core/link.h"

/* A contiguous f32 run of parameters and its gradient on one device: a
 * parameter tensor, or a flat run (views of caller memory). */
typedef struct accel__segment {
    accel_tensor *param;   /* tensor segment (data/grad read at each step), or NULL */
    /* flat segment: 1-d headers viewing the caller's parameters and gradients
     * (device pointers; the memory is borrowed) */
    accel_tensor flat_data, flat_grad;
    int64_t numel;
    int group;
    int64_t step;          /* steps this segment has taken */
    /* exp_avg/exp_avg_sq, or momentum_buffer in [0]: persistent f32 [numel]
     * tensors on the segment's device; owned. */
    accel_tensor *state[2];
} accel__segment;

typedef struct accel__group {
    accel_optim_hparams h;
} accel__group;

struct accel_optimizer {
    accel_optim_kind kind;
    int n_groups, cap_groups;
    accel__group *groups;
    int n_segs, cap_segs;
    accel__segment *segs;
    int64_t steps;
    accel__link *links;    /* the accelerator that prepared it */
};

/* The links of an optimizer / a scheduler (core/link.h). */
accel__link **accel__optimizer_links(accel_optimizer *opt);
accel__link **accel__scheduler_links(accel_lr_scheduler *s);

/* The device a segment's parameters, gradients and state live on. */
accel_device accel__seg_device(const accel__segment *s);
/* The segment's parameters and gradient as tensors for a kernel: the
 * parameter tensor and its grad, or the flat run's headers. *g is NULL when
 * there is no gradient (yet). */
void accel__seg_tensors(accel__segment *s, accel_tensor **p, accel_tensor **g);
/* g *= c in place on g's device (contiguous f32). */
accel_status accel__grad_scale(accel_tensor *g, float c);
/* Allocates the segment's ns zeroed state tensors; false (state freed) on failure. */
bool accel__seg_alloc_state(accel__segment *s, int ns);
void accel__seg_free_state(accel__segment *s);
/* How many state buffers a segment of this optimizer holds (0, 1 or 2). */
int accel__n_state(const accel_optimizer *opt, const accel_optim_hparams *h);

#endif
