/* Internals shared by the files of src/optim (not public API). */
#ifndef ACCEL_OPTIM_INTERNAL_H
#define ACCEL_OPTIM_INTERNAL_H

#include "accel/optim.h"
#include "core/link.h"

/* A contiguous f32 run of parameters and its gradient. */
typedef struct accel__segment {
    accel_tensor *param;   /* tensor segment (data/grad read at each step), or NULL */
    float *data, *grad;    /* flat segment */
    int64_t numel;
    int group;
    int64_t step;          /* steps this segment has taken */
    float *state[2];       /* exp_avg/exp_avg_sq, or momentum_buffer in [0]; owned */
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

/* Current parameter and gradient memory of a segment (grad NULL: no gradient). */
float *accel__seg_data(const accel__segment *s);
float *accel__seg_grad(const accel__segment *s);
/* How many state buffers a segment of this optimizer holds (0, 1 or 2). */
int accel__n_state(const accel_optimizer *opt, const accel_optim_hparams *h);

#endif
