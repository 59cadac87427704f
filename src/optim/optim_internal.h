/* Internals shared by the files of src/optim (not public API). */
#ifndef ACCEL_OPTIM_INTERNAL_H
#define ACCEL_OPTIM_INTERNAL_H

#include "accel/optim.h"
#include "core/backend.h"
#include "core/core_internal.h"
#include "core/handle.h"
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
     * tensors on the segment's device (in host memory under an offload to
     * the host); owned. NULL when the state lives in a file. */
    accel_tensor *state[2];
    int64_t file_off;      /* state in a file: element offset of kind 0 (kind k at file_off + k * numel) */
} accel__segment;

typedef struct accel__group {
    accel_optim_hparams h; /* live: accel_optimizer_hparams hands it out, the step checks it */
    int n_state;           /* state buffers each of its segments holds, fixed when the group was added */
} accel__group;

/* Moves, in place, the state of every parameter segment whose parameter
 * is on another device than its state (the model was moved after the
 * optimizer was made over it: the Accelerator's device placement, or
 * accel_module_to; every step checks); state under an offload stays where
 * the offload keeps it. */
accel_status accel__optimizer_follow_params(accel_optimizer *opt);

struct accel_optimizer {
    accel_optim_kind kind;
    int n_groups, cap_groups;
    accel__group *groups;
    int n_segs, cap_segs;
    accel__segment *segs;
    int64_t steps;
    accel__link *links;    /* the accelerator that prepared it, its schedulers (observers) */
    /* accel_optimizer_new_module's model, linked (its free tells this
     * optimizer, accel__optimizer_model_freed), else NULL; gone: set once that
     * model was freed: the segments' parameters are freed memory then, and
     * every call that would read them refuses (accel__optimizer_usable). */
    accel_module *model;
    bool gone;
    struct accel__offload *off; /* where the state lives when not on the segments' device (offload.c); owned */
    uint32_t magic;             /* ACCEL__MAGIC_OPTIMIZER while alive (core/handle.h) */
};

/* Whether opt's parameters can be read: false + ACCEL_ERR_STATE naming fn
 * when opt is not a live optimizer (freed), or once the model it was made
 * over (accel_optimizer_new_module) was freed before it (a NULL opt: true,
 * the caller's own check names it). */
bool accel__optimizer_usable(const accel_optimizer *opt, const char *fn);
/* accel_optimizer_new_module's link on its model (core/link.h): the model
 * is being freed (owner: the optimizer, obj: the model). */
void accel__optimizer_model_freed(void *owner, void *obj);

/* The links of an optimizer / a scheduler (core/link.h). */
accel__link **accel__optimizer_links(accel_optimizer *opt);
accel__link **accel__scheduler_links(accel_lr_scheduler *s);
/* False (and ACCEL_ERR_STATE naming fn) when s (not NULL) is not a live
 * scheduler (freed), or once its optimizer was freed: its lrs are gone, so s
 * can only be freed. */
bool accel__scheduler_alive(const accel_lr_scheduler *s, const char *fn);
/* The optimizer s steps (borrowed), NULL once it was freed. */
accel_optimizer *accel__scheduler_optimizer(const accel_lr_scheduler *s);

/* The device a segment's parameters, gradients and state live on. */
accel_device accel__seg_device(const accel__segment *s);
/* The segment's parameters and gradient as tensors for a kernel: the
 * parameter tensor and its grad, or the flat run's headers. *g is NULL when
 * there is no gradient (yet). */
void accel__seg_tensors(accel__segment *s, accel_tensor **p, accel_tensor **g);
/* g *= c in place on g's device (contiguous f32). */
accel_status accel__grad_scale(accel_tensor *g, float c);
/* The arguments of a clip_grad_norm: norm_type > 0 (or INFINITY) and
 * max_norm >= 0; false + error naming fn otherwise. */
bool accel__check_clip_args(const char *fn, double max_norm, double norm_type);
/* The error of a clip_grad_norm whose total norm is NaN (a gradient holds a
 * NaN, nothing clipped), naming fn; returns NAN. */
double accel__nan_norm_error(const char *fn);
/* Allocates the segment's ns zeroed state buffers where opt keeps its state
 * (offload.c); false (state freed) on failure. */
bool accel__seg_alloc_state(accel_optimizer *opt, accel__segment *s, int ns);
void accel__seg_free_state(accel_optimizer *opt, accel__segment *s);
/* Why h is out of the range an optimizer of kind takes, NULL when it is in
 * it (optimizer.c; lr may be 0 where lr0). */
const char *accel__hparams_bad(accel_optim_kind kind, const accel_optim_hparams *h, bool lr0);
/* How many state buffers each segment of param group `group` holds (0, 1 or
 * 2): fixed when the group was added, whatever its live momentum says now. */
int accel__n_state(const accel_optimizer *opt, int group);
/* One update of segment s (its step already counted) with its state buffers
 * m (momentum_buffer or exp_avg) and v (exp_avg_sq), on p's device's kernel. */
accel_status accel__seg_update(const accel_optimizer *opt, const accel__segment *s, accel_tensor *p, accel_tensor *g,
                               accel_tensor *m, accel_tensor *v);

/* ---- offload.c: optimizer state off the parameters' device (ZeRO-Offload) */

typedef enum {
    ACCEL__HOME_DEVICE, /* on each segment's device (the default) */
    ACCEL__HOME_HOST,   /* host memory; the step runs on the host, parameters and gradients staged in blocks */
    ACCEL__HOME_FILE,   /* a file, paged through a host buffer of n_blocks blocks in the step */
} accel__state_home;

typedef struct accel__offload_opts {
    accel__state_home home;
    const char *dir;     /* HOME_FILE: the directory the state file is created in (removed when the state leaves it) */
    const char *tag;     /* in the file's name, e.g. "rank1" */
    int64_t block_bytes; /* one block: this many bytes of one state kind, or of the staged parameters / gradients */
    int n_blocks;        /* blocks of the host buffer: at least the state kinds (+ 2 on a device the host cannot address) */
} accel__offload_opts;

/* A swap file for state kept on disk (offload_optimizer / offload_param
 * nvme): creates <dir>/<prefix>_<tag>_<pid>_<6 random>.swp, new, mode 0600, and
 * unlinks it (its space is freed when the descriptor closes, also when the
 * process is killed); returns its descriptor with the name it had in *path
 * (for messages; owned by the caller, set even on failure), or -1 and an
 * error naming section ("offload_optimizer"), what ("optimizer state") and
 * the file. */
int accel__swap_create(const char *dir, const char *prefix, const char *tag, const char *section, const char *what,
                       char **path);
/* Reserves bytes [at, at + n) of the file (posix_fallocate), so a full disk
 * (ENOSPC, EDQUOT: ACCEL_ERR_OOM) or a size limit (EFBIG) fails here. */
accel_status accel__swap_reserve(int fd, const char *path, int64_t at, int64_t n, const char *section,
                                 const char *what);

/* Moves every segment's state to o's home (NULL: back onto the segments'
 * devices) and keeps it there for segments set later. On failure nothing
 * changed. */
accel_status accel__optimizer_set_offload(accel_optimizer *opt, const accel__offload_opts *o);
void accel__offload_free(struct accel__offload *o);
/* The step of segment s through its home: block by block on the host. */
accel_status accel__offload_update(accel_optimizer *opt, accel__segment *s, accel_tensor *p, accel_tensor *g);
/* Before a step: no earlier step failed part-way (the state still matches the parameters). */
accel_status accel__offload_check(const accel_optimizer *opt);
/* State kind k of segment s as a tensor: a view of its buffer, or (in a
 * file) a host copy of its own. NULL + error. */
accel_tensor *accel__seg_state_tensor(accel_optimizer *opt, accel__segment *s, int k);
/* src (f32, s->numel elements, any device) into state kind k of s; all state of s to zero. */
accel_status accel__seg_state_load(accel_optimizer *opt, accel__segment *s, int k, accel_tensor *src);
accel_status accel__seg_state_zero(accel_optimizer *opt, accel__segment *s);
/* accel_optimizer_load_state's check of every entry against opt, writing
 * nothing: ACCEL_OK where the load would take them all, else its error
 * (load_state checks every object before the first is loaded). */
accel_status accel__optimizer_check_state(accel_optimizer *opt, int n, const accel_named_state *st);
/* The field of a param group's parameter count in a saved state,
 * "param_groups.<g>.num_params": torch's param_groups[g]["params"] lists the
 * parameters' numbers, which run group after group, so its length says
 * which parameters the group holds. */
#define ACCEL__GROUP_SIZE "num_params"
/* Parses "<prefix><int>.<rest>" (decimal by strtol: "state.4294967296.x"
 * is no wrapped 0, as sscanf's %d made it); returns the int (LONG_MAX when
 * beyond) or -1, and sets *rest. */
long accel__parse_indexed(const char *name, const char *prefix, const char **rest);
/* Whether name is "param_groups.<g>.num_params" (*group: g; may be NULL). */
bool accel__group_size_entry(const char *name, int *group);
/* The parameter count of each of ng groups (calloc'd [ng]; NULL + error)
 * of the `members` parameters whose groups are group_of[]: the values of
 * "param_groups.<g>.num_params". One pass: groups x parameters was
 * quadratic in a model of per-parameter groups. */
int *accel__group_sizes(const int *group_of, int members, int ng);
/* Checks st's "param_groups.<g>.num_params" entries against an optimizer of
 * ng groups whose parameters are in groups group_of[0..members) (in whatever
 * numbering the state has: the user's under ZeRO, the whole model's under
 * pp): a count that differs, a group beyond ng, or a state recording some
 * groups but not all is ACCEL_ERR_FORMAT in fn's name, naming the group and
 * both counts. A state with no such entry (saved before they were written)
 * passes: nothing to check. */
accel_status accel__check_group_sizes(const char *fn, int n, const accel_named_state *st, int ng, const int *group_of,
                                      int members);
/* Bytes of memory holding opt's state: its state buffers, or the paging buffer of a file home. */
int64_t accel__optimizer_state_bytes(const accel_optimizer *opt);
/* The state file's path, or NULL when the state is not in a file. */
const char *accel__optimizer_state_path(const accel_optimizer *opt);

#endif
