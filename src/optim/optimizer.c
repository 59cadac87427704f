/* SGD, Adam and AdamW over f32 segments, with PyTorch's update rules. */
#include <math.h>
#include <string.h>
#include <strings.h>

#include "optim_internal.h"

static const char *KIND_NAMES[] = {"sgd", "adam", "adamw"};

accel_optim_hparams accel_optim_defaults(accel_optim_kind kind, double lr) {
    accel_optim_hparams h = {0};
    h.lr = lr;
    h.beta1 = 0.9;
    h.beta2 = 0.999;
    h.eps = 1e-8;
    h.weight_decay = kind == ACCEL_OPTIM_ADAMW ? 0.01 : 0.0;
    return h;
}

int accel_optim_kind_parse(const char *s) {
    for (int k = 0; s && k < 3; k++)
        if (strcasecmp(s, KIND_NAMES[k]) == 0) return k;
    return -1;
}

const char *accel_optim_kind_name(accel_optim_kind kind) {
    return (unsigned)kind < 3 ? KIND_NAMES[kind] : "?";
}

accel_optimizer *accel_optimizer_new(accel_optim_kind kind) {
    if ((unsigned)kind > ACCEL_OPTIM_ADAMW) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_optimizer_new: unknown optimizer kind %d",
                        (int)kind);
        return NULL;
    }
    accel_optimizer *opt = accel_calloc(1, sizeof *opt);
    if (!opt) return NULL;
    opt->kind = kind;
    opt->magic = ACCEL__MAGIC_OPTIMIZER;
    return opt;
}

accel__link **accel__optimizer_links(accel_optimizer *opt) { return &opt->links; }

void accel__optimizer_model_freed(void *owner, void *obj) {
    accel_optimizer *opt = owner;
    (void)obj;
    opt->model = NULL; /* its link went with it */
    opt->gone = true;
}

bool accel__optimizer_usable(const accel_optimizer *opt, const char *fn) {
    if (ACCEL__DEAD(opt, ACCEL__MAGIC_OPTIMIZER, fn, "optimizer")) return false;
    if (!opt || !opt->gone) return true;
    accel_set_error(ACCEL_ERR_STATE, "%s: the optimizer's model was freed before it (accel_module_free): its "
                    "parameters are gone, so it can only be freed (free the model after its optimizer, or make "
                    "a new optimizer for a new model)", fn);
    return false;
}

void accel_optimizer_free(accel_optimizer *opt) {
    if (!opt || ACCEL__DEAD(opt, ACCEL__MAGIC_OPTIMIZER, "accel_optimizer_free", "optimizer")) return;
    if (opt->model) accel__link_remove(&opt->model->links, opt);
    accel__link_detach_all(&opt->links, opt);
    for (int i = 0; i < opt->n_segs; i++) accel__seg_free_state(opt, &opt->segs[i]);
    accel__offload_free(opt->off);
    accel_free(opt->segs);
    accel_free(opt->groups);
    opt->magic = 0;
    accel_free(opt);
}

/* The state buffers a group of h needs: a momentum_buffer for SGD with momentum, two moments for Adam. */
static int n_state_for(accel_optim_kind kind, const accel_optim_hparams *h) {
    if (kind == ACCEL_OPTIM_SGD) return h->momentum != 0.0 ? 1 : 0;
    return 2;
}

int accel__n_state(const accel_optimizer *opt, int group) { return opt->groups[group].n_state; }

accel_device accel__seg_device(const accel__segment *s) {
    return s->param ? s->param->device : s->flat_data.device;
}

void accel__seg_tensors(accel__segment *s, accel_tensor **p, accel_tensor **g) {
    *p = s->param ? s->param : &s->flat_data;
    *g = s->param ? s->param->grad : &s->flat_grad;
}

/* A flat run (params, grads) the optimizer can update: contiguous f32 pairs
 * of one numel on one device with memory. False + error naming segment k. */
static bool check_flat(const char *fn, int k, const accel_tensor *p, const accel_tensor *g) {
    if (!accel_tensor_check(p, fn, "params") || !accel_tensor_check(g, fn, "grads")) return false;
    char dp[32], dg[32];
    const char *bad = NULL;
    if (p->dtype != ACCEL_F32 || g->dtype != ACCEL_F32) bad = "both must be float32";
    else if (!accel_is_contiguous(p) || !accel_is_contiguous(g)) bad = "both must be contiguous";
    else if (accel_numel(p) != accel_numel(g)) bad = "they must have the same number of elements";
    else if (!accel_device_eq(p->device, g->device)) bad = "they must be on one device";
    else if (p->device.type == ACCEL_DEV_META) bad = "they are on meta (no data)";
    if (!bad) return true;
    accel_set_error(p->dtype != ACCEL_F32 || g->dtype != ACCEL_F32 ? ACCEL_ERR_DTYPE : ACCEL_ERR_INVALID_ARG,
                    "%s: flat segment %d: params %s [%lld] on %s, grads %s [%lld] on %s: %s", fn, k,
                    accel_dtype_name(p->dtype), (long long)accel_numel(p), accel_device_str(p->device, dp, sizeof dp),
                    accel_dtype_name(g->dtype), (long long)accel_numel(g), accel_device_str(g->device, dg, sizeof dg),
                    bad);
    return false;
}

/* s becomes a flat segment viewing p and g (checked by check_flat). */
static void set_flat(accel__segment *s, const accel_tensor *p, const accel_tensor *g) {
    s->numel = accel_numel(p);
    accel__tensor_header(&s->flat_data, accel__device_ptr(p), ACCEL_F32, 1, &s->numel, p->device);
    accel__tensor_header(&s->flat_grad, accel__device_ptr(g), ACCEL_F32, 1, &s->numel, g->device);
}

/* Why h is out of the range an optimizer of kind takes, NULL when it is in
 * it. Every value must be finite: an inf lr, weight decay, momentum or eps (or
 * a NaN dampening) was taken, made every parameter NaN at the first steps,
 * silently, and gave a state that accel_optimizer_load_state refuses. lr may
 * be 0 where lr0 (a schedule's start or end: the step), not where 0 is a
 * field left unset (construction). */
const char *accel__hparams_bad(accel_optim_kind kind, const accel_optim_hparams *h, bool lr0) {
    bool sgd = kind == ACCEL_OPTIM_SGD;
    if (!isfinite(h->lr) || h->lr < 0 || (h->lr == 0 && !lr0))
        return lr0 ? "lr must be a finite number >= 0"
                   : "lr must be a finite number > 0 (a zeroed accel_optim_hparams needs .lr)";
    if (!(h->weight_decay >= 0 && isfinite(h->weight_decay))) return "weight_decay must be a finite number >= 0";
    if (sgd && !(h->momentum >= 0 && isfinite(h->momentum))) return "momentum must be a finite number >= 0";
    if (sgd && !isfinite(h->dampening)) return "dampening must be a finite number";
    if (sgd && h->nesterov && (h->momentum <= 0 || h->dampening != 0))
        return "nesterov momentum requires a momentum and zero dampening";
    if (!sgd && !(h->beta1 >= 0 && h->beta1 < 1 && h->beta2 >= 0 && h->beta2 < 1)) return "betas must be in [0, 1)";
    if (!sgd && !(h->eps >= 0 && isfinite(h->eps))) return "eps must be a finite number >= 0";
    return NULL;
}

/* *out = *given with its zero betas/eps at their defaults (NULL given: torch.optim's
 * defaults for kind, lr 1e-3); false + error when a value is bad. */
static bool resolve_hparams(const char *fn, accel_optim_kind kind, const accel_optim_hparams *given,
                            accel_optim_hparams *out) {
    accel_optim_hparams *h = out;
    *h = given ? *given : accel_optim_defaults(kind, 1e-3);
    if (h->beta1 == 0) h->beta1 = 0.9;
    if (h->beta2 == 0) h->beta2 = 0.999;
    if (h->eps == 0) h->eps = 1e-8;
    const char *bad = accel__hparams_bad(kind, h, false);
    if (bad) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s", fn, bad);
        return false;
    }
    return true;
}

static bool reserve(accel_optimizer *opt, int extra_segs) {
    if (opt->n_groups == opt->cap_groups) {
        int cap = opt->cap_groups ? 2 * opt->cap_groups : 2;
        accel__group *g = accel_malloc((size_t)cap * sizeof *g);
        if (!g) return false;
        if (opt->n_groups) memcpy(g, opt->groups, (size_t)opt->n_groups * sizeof *g);
        accel_free(opt->groups);
        opt->groups = g;
        opt->cap_groups = cap;
    }
    if (opt->n_segs + extra_segs > opt->cap_segs) {
        int cap = opt->cap_segs ? opt->cap_segs : 8;
        while (cap < opt->n_segs + extra_segs) cap *= 2;
        accel__segment *s = accel_malloc((size_t)cap * sizeof *s);
        if (!s) return false;
        if (opt->n_segs) memcpy(s, opt->segs, (size_t)opt->n_segs * sizeof *s);
        accel_free(opt->segs);
        opt->segs = s;
        opt->cap_segs = cap;
    }
    return true;
}

/* Allocates the new segments' state; on failure frees what it made and
 * leaves the optimizer unchanged. */
static int commit_group(accel_optimizer *opt, const accel_optim_hparams *h, int first, int n) {
    int ns = n_state_for(opt->kind, h);
    /* before the state: freeing a segment's state reads its group */
    opt->groups[opt->n_groups] = (accel__group){.h = *h, .n_state = ns};
    for (int i = first; i < first + n; i++)
        if (!accel__seg_alloc_state(opt, &opt->segs[i], ns)) {
            for (int j = first; j < i; j++) accel__seg_free_state(opt, &opt->segs[j]);
            return -1;
        }
    opt->n_segs = first + n;
    return opt->n_groups++;
}

/* A parameter the optimizer can keep and update: a live, persistent,
 * contiguous f32 tensor with data. False + error naming parameter i. */
static bool check_param(const char *fn, int i, const accel_tensor *p) {
    if (!accel_tensor_check(p, fn, "parameter")) return false;
    if (p->flags & ACCEL_TF_ARENA) { /* kept and read at every step: it must outlive the step */
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "%s: parameter %d (\"%s\") is a step tensor, which dies at accel_step_reset; the "
                        "optimizer keeps its parameters: give it persistent ones (accel_tensor_new, a "
                        "module's parameters)", fn, i, p->name ? p->name : "?");
        return false;
    }
    if (p->dtype != ACCEL_F32 || !accel_is_contiguous(p) || p->device.type == ACCEL_DEV_META) {
        char d[32];
        accel_set_error(ACCEL_ERR_DTYPE,
                        "%s: parameter %d (\"%s\") is %s%s on %s; the optimizer needs contiguous "
                        "float32 parameters with data (keep f32 master weights for mixed precision)",
                        fn, i, p->name ? p->name : "?", accel_dtype_name(p->dtype),
                        accel_is_contiguous(p) ? "" : " non-contiguous", accel_device_str(p->device, d, sizeof d));
        return false;
    }
    return true;
}

/* The first segment of opt (only its flat ones with flat_only) whose
 * memory shares an element with t's (same device), or -1: the shared
 * elements would be updated twice per step, silently. Compares the memory
 * the segments view now. */
static int overlapping_segment(accel_optimizer *opt, const accel_tensor *t, bool flat_only) {
    const char *lo = accel__device_ptr(t), *hi = lo + accel_numel(t) * (int64_t)sizeof(float);
    for (int k = 0; k < opt->n_segs; k++) {
        if (flat_only && opt->segs[k].param) continue;
        accel_tensor *p, *g;
        accel__seg_tensors(&opt->segs[k], &p, &g);
        const char *a = accel__device_ptr(p), *b = a + opt->segs[k].numel * (int64_t)sizeof(float);
        if (accel_device_eq(p->device, t->device) && a < hi && lo < b && lo != hi && a != b) return k;
    }
    return -1;
}

/* Parameter i must not be in the optimizer yet, nor earlier in this list:
 * given twice it was updated twice per step, silently. PyTorch refuses it
 * across groups ("some parameters appear in more than one parameter group")
 * and warns within one that this will become an error. */
static bool check_new_param(const char *fn, accel_optimizer *opt, int i, accel_tensor *const *params) {
    int group = -1;
    for (int j = 0; j < i && group < 0; j++)
        if (params[j] == params[i]) group = opt->n_groups;
    for (int k = 0; k < opt->n_segs && group < 0; k++)
        if (opt->segs[k].param == params[i]) group = opt->segs[k].group;
    /* a view into a flat run already here (a flat segment's memory): its elements too */
    int k = group < 0 ? overlapping_segment(opt, params[i], true) : -1;
    if (k >= 0) {
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "%s: parameter %d (\"%s\") lies in the flat parameters of segment %d (param group %d): "
                        "it would be updated twice per step", fn, i, params[i]->name ? params[i]->name : "?", k,
                        opt->segs[k].group);
        return false;
    }
    if (group < 0) return true;
    accel_set_error(ACCEL_ERR_INVALID_ARG,
                    "%s: parameter %d (\"%s\") appears more than once: it is already in param group %d%s (it would "
                    "be updated twice per step)",
                    fn, i, params[i]->name ? params[i]->name : "?", group,
                    group == opt->n_groups ? ", the one being added" : "");
    return false;
}

int accel_optimizer_add_params(accel_optimizer *opt, int n, accel_tensor *const *params,
                               const accel_optim_hparams *h) {
    const char *fn = "accel_optimizer_add_params";
    if (!opt || n < 0 || (n > 0 && !params)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: NULL optimizer or parameter list", fn);
        return -1;
    }
    if (!accel__optimizer_usable(opt, fn)) return -1;
    accel_optim_hparams rh;
    if (!resolve_hparams(fn, opt->kind, h, &rh)) return -1;
    for (int i = 0; i < n; i++)
        if (!check_param(fn, i, params[i]) || !check_new_param(fn, opt, i, params)) return -1;
    if (!reserve(opt, n)) return -1;
    for (int i = 0; i < n; i++) {
        accel__segment *s = &opt->segs[opt->n_segs + i];
        memset(s, 0, sizeof *s);
        s->param = params[i];
        s->numel = accel_numel(params[i]);
        s->group = opt->n_groups;
    }
    return commit_group(opt, &rh, opt->n_segs, n);
}

/* The flat run params must share no element with a segment of opt (two
 * groups' offsets computed wrong, one buffer added twice), as a parameter
 * given twice (check_new_param). */
static bool check_new_flat(const char *fn, accel_optimizer *opt, const accel_tensor *params) {
    int k = overlapping_segment(opt, params, false);
    if (k < 0) return true;
    accel_set_error(ACCEL_ERR_INVALID_ARG,
                    "%s: the flat parameters [%lld elements] overlap segment %d (param group %d) of the "
                    "optimizer: the shared elements would be updated twice per step",
                    fn, (long long)accel_numel(params), k, opt->segs[k].group);
    return false;
}

int accel_optimizer_add_flat(accel_optimizer *opt, const accel_tensor *params, const accel_tensor *grads,
                             const accel_optim_hparams *h) {
    const char *fn = "accel_optimizer_add_flat";
    if (!opt) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: optimizer is NULL", fn);
        return -1;
    }
    if (!accel__optimizer_usable(opt, fn)) return -1;
    accel_optim_hparams rh;
    if (!check_flat(fn, 0, params, grads) || !check_new_flat(fn, opt, params) ||
        !resolve_hparams(fn, opt->kind, h, &rh) || !reserve(opt, 1))
        return -1;
    accel__segment *s = &opt->segs[opt->n_segs];
    memset(s, 0, sizeof *s);
    set_flat(s, params, grads);
    s->group = opt->n_groups;
    return commit_group(opt, &rh, opt->n_segs, 1);
}

accel_optimizer *accel_optimizer_new_params(accel_optim_kind kind, int n,
                                            accel_tensor *const *params,
                                            const accel_optim_hparams *h) {
    accel_optimizer *opt = accel_optimizer_new(kind);
    if (opt && accel_optimizer_add_params(opt, n, params, h) < 0) {
        accel_optimizer_free(opt);
        return NULL;
    }
    return opt;
}

accel_optimizer *accel_optimizer_new_flat(accel_optim_kind kind, const accel_tensor *params,
                                          const accel_tensor *grads, const accel_optim_hparams *h) {
    accel_optimizer *opt = accel_optimizer_new(kind);
    if (opt && accel_optimizer_add_flat(opt, params, grads, h) < 0) {
        accel_optimizer_free(opt);
        return NULL;
    }
    return opt;
}

/* ---- updates */

static bool tape_done(void) { return accel_tape_size() == 0; }

/* accel__form_rewrite of an Adam update (ctx: its accel_k_adam). */
static accel_status adam_write(accel_tensor *form, accel_dtype round_dt, void *ctx) {
    accel_k_adam *k = ctx;
    k->cast = form, k->cast_dt = round_dt;
    accel_status st = ACCEL_KERNEL("accel_optimizer_step", k->p->device, adam, k);
    accel__tensor_written(k->p); /* p: a parameter, a flat buffer or a host block of one: every view sees it */
    return st;
}

accel_status accel__seg_update(const accel_optimizer *opt, const accel__segment *s, accel_tensor *p, accel_tensor *g,
                               accel_tensor *m, accel_tensor *v) {
    const accel_optim_hparams *h = &opt->groups[s->group].h;
    if (opt->kind == ACCEL_OPTIM_SGD) {
        accel_k_sgd k = {.p = p, .g = g, .buf = m, .lr = (float)h->lr,
                         .weight_decay = (float)h->weight_decay, .momentum = (float)h->momentum,
                         .undamped = (float)(1.0 - h->dampening), .first = s->step == 1, .nesterov = h->nesterov};
        accel_status st = ACCEL_KERNEL("accel_optimizer_step", p->device, sgd, &k);
        accel__tensor_written(p);
        return st;
    }
    accel_k_adam k = {.p = p, .g = g, .m = m, .v = v, .lr = h->lr, .beta1 = h->beta1,
                      .beta2 = h->beta2, .eps = h->eps, .weight_decay = h->weight_decay, .step = s->step,
                      .decoupled = opt->kind == ACCEL_OPTIM_ADAMW};
    /* After a backward the tape is empty: the weight's autocast copy that the
     * step's forward read can take the new values in the update's pass. */
    return accel__prepared_rewrite(p, tape_done, adam_write, &k);
}

/* Every group's live hyperparameters (accel_optimizer_hparams hands them out
 * for writing) in range, its momentum on or off as when it was added: a
 * momentum switched on was ignored (no momentum_buffer; accel_optimizer_state
 * then crashed on the missing one), one switched off still applied its
 * dampening, a NaN lr turned every parameter NaN, silently. */
static accel_status check_groups(const accel_optimizer *opt) {
    for (int g = 0; g < opt->n_groups; g++) {
        const accel_optim_hparams *h = &opt->groups[g].h;
        const char *bad = accel__hparams_bad(opt->kind, h, true);
        if (!bad && n_state_for(opt->kind, h) != opt->groups[g].n_state)
            bad = "momentum was switched on or off after the group was added (its momentum_buffer is made, or "
                  "not, then); add a new param group for it";
        if (bad)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_optimizer_step: param group %d (written through "
                                   "accel_optimizer_hparams?): %s", g, bad);
    }
    return ACCEL_OK;
}

accel_status accel_optimizer_step(accel_optimizer *opt) {
    if (!opt) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_optimizer_step: optimizer is NULL");
    if (!accel__optimizer_usable(opt, "accel_optimizer_step")) return accel_last_status();
    accel_status ok = accel__offload_check(opt);
    if (ok || (ok = check_groups(opt))) return ok;
    /* a model moved after its optimizer was made (accel_module_to): the
     * state follows at the next step, as PyTorch's lazily made state does */
    if ((ok = accel__optimizer_follow_params(opt))) return ok;
    for (int i = 0; i < opt->n_segs; i++) {
        accel__segment *s = &opt->segs[i];
        accel_tensor *p, *g;
        accel__seg_tensors(s, &p, &g);
        if (!g) continue;
        if (p->device.type == ACCEL_DEV_META)
            return accel_set_error(ACCEL_ERR_STATE,
                                   "accel_optimizer_step: parameter %d has no data (on meta?)", i);
        if (!accel_device_eq(g->device, p->device) || g->dtype != ACCEL_F32 || !accel_is_contiguous(g)) {
            char a[32], b[32];
            return accel_set_error(ACCEL_ERR_DEVICE,
                                   "accel_optimizer_step: the grad of parameter %d is %s on %s, the parameter "
                                   "float32 on %s", i, accel_dtype_name(g->dtype),
                                   accel_device_str(g->device, b, sizeof b), accel_device_str(p->device, a, sizeof a));
        }
        s->step++;
        accel_status st = opt->off ? accel__offload_update(opt, s, p, g)
                                   : accel__seg_update(opt, s, p, g, s->state[0], s->state[1]);
        if (st != ACCEL_OK) return st;
    }
    opt->steps++;
    return ACCEL_OK;
}

accel_status accel__optimizer_follow_params(accel_optimizer *opt) {
    if (opt->gone) return ACCEL_OK; /* no parameters to follow (refused by its own calls) */
    for (int i = 0; i < opt->n_segs && !opt->off; i++) {
        accel__segment *s = &opt->segs[i];
        for (int k = 0; k < 2 && s->param; k++)
            if (s->state[k] && !accel_device_eq(s->state[k]->device, s->param->device)) {
                accel_status st = accel_tensor_to_device_(s->state[k], s->param->device);
                if (st != ACCEL_OK) return st;
            }
    }
    return ACCEL_OK;
}

accel_status accel_optimizer_zero_grad(accel_optimizer *opt) {
    if (!opt) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_optimizer_zero_grad: optimizer is NULL");
    if (!accel__optimizer_usable(opt, "accel_optimizer_zero_grad")) return accel_last_status();
    for (int i = 0; i < opt->n_segs; i++) {
        accel_tensor *p, *g;
        accel__seg_tensors(&opt->segs[i], &p, &g);
        /* read next by the next backward, a forward later: out of the caches */
        if (g) accel__zero_cold_(g);
    }
    return ACCEL_OK;
}

/* ---- accessors */

/* Whether opt is a live optimizer; else the error, naming fn (a query then
 * gives its neutral value: docs/contract.md). */
static bool queried(const accel_optimizer *opt, const char *fn) {
    if (!opt) accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: optimizer is NULL", fn);
    return opt && !ACCEL__DEAD(opt, ACCEL__MAGIC_OPTIMIZER, fn, "optimizer");
}

int accel_optimizer_num_groups(const accel_optimizer *opt) {
    return queried(opt, "accel_optimizer_num_groups") ? opt->n_groups : 0;
}
int accel_optimizer_num_segments(const accel_optimizer *opt) {
    return queried(opt, "accel_optimizer_num_segments") ? opt->n_segs : 0;
}
accel_optim_kind accel_optimizer_kind(const accel_optimizer *opt) {
    return queried(opt, "accel_optimizer_kind") ? opt->kind : ACCEL_OPTIM_SGD;
}
int64_t accel_optimizer_step_count(const accel_optimizer *opt) {
    return queried(opt, "accel_optimizer_step_count") ? opt->steps : 0;
}

double accel_optimizer_get_lr(const accel_optimizer *opt, int group) {
    if (!queried(opt, "accel_optimizer_get_lr")) return NAN;
    if (group < 0 || group >= opt->n_groups) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_optimizer_get_lr: no param group %d", group);
        return NAN;
    }
    return opt->groups[group].h.lr;
}

accel_status accel_optimizer_set_lr(accel_optimizer *opt, int group, double lr) {
    if (!opt) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_optimizer_set_lr: optimizer is NULL");
    if (ACCEL__DEAD(opt, ACCEL__MAGIC_OPTIMIZER, "accel_optimizer_set_lr", "optimizer")) return accel_last_status();
    /* -1 is every group; -2 (an index computed wrong) set them all too, silently */
    if (group < -1 || group >= opt->n_groups)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_optimizer_set_lr: no param group %d (%d groups; -1 is all of them)", group,
                               opt->n_groups);
    /* 0 is a schedule's start or end; a NaN turned every parameter into NaN
     * at the next step, a negative lr climbed the loss, silently */
    if (!(lr >= 0 && isfinite(lr)))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_optimizer_set_lr: lr must be a finite number >= 0 (got %g)",
                               lr);
    for (int g = 0; g < opt->n_groups; g++)
        if (group < 0 || g == group) opt->groups[g].h.lr = lr;
    return ACCEL_OK;
}

accel_optim_hparams *accel_optimizer_hparams(accel_optimizer *opt, int group) {
    if (!queried(opt, "accel_optimizer_hparams")) return NULL;
    if (group < 0 || group >= opt->n_groups) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_optimizer_hparams: no param group %d", group);
        return NULL;
    }
    return &opt->groups[group].h;
}

/* ---- re-targeting (ZeRO) */

accel_tensor *accel_optimizer_segment_param(const accel_optimizer *opt, int i, int *group) {
    if (!opt || i < 0 || i >= opt->n_segs || !accel__optimizer_usable(opt, "accel_optimizer_segment_param")) return NULL;
    if (group) *group = opt->segs[i].group;
    return opt->segs[i].param;
}

accel_status accel_optimizer_set_segments(accel_optimizer *opt, int n, accel_tensor *const *params,
                                          const accel_tensor *const *flat_params,
                                          const accel_tensor *const *flat_grads, const int *groups) {
    const char *fn = "accel_optimizer_set_segments";
    if (!opt || n < 0 || (n > 0 && !groups))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: NULL optimizer or groups, or n < 0", fn);
    if (!accel__optimizer_usable(opt, fn)) return accel_last_status();
    for (int k = 0; k < n; k++) {
        if (groups[k] < 0 || groups[k] >= opt->n_groups)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: segment %d: no param group %d", fn, k, groups[k]);
        if (params && params[k]) continue;
        if (!flat_params || !flat_grads)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: segment %d has no parameter tensor and no flat run",
                                   fn, k);
        if (!check_flat(fn, k, flat_params[k], flat_grads[k])) return accel_last_status();
    }
    accel__segment *segs = accel_calloc((size_t)(n ? n : 1), sizeof *segs);
    if (!segs) return accel_last_status();
    for (int k = 0; k < n; k++) {
        accel__segment *s = &segs[k];
        if (params && params[k]) {
            s->param = params[k];
            s->numel = accel_numel(params[k]);
        } else {
            set_flat(s, flat_params[k], flat_grads[k]);
        }
        s->group = groups[k];
        if (!accel__seg_alloc_state(opt, s, accel__n_state(opt, groups[k]))) {
            for (int i = 0; i < k; i++) accel__seg_free_state(opt, &segs[i]);
            accel_free(segs);
            return accel_last_status();
        }
    }
    for (int i = 0; i < opt->n_segs; i++) accel__seg_free_state(opt, &opt->segs[i]);
    accel_free(opt->segs);
    opt->segs = segs;
    opt->cap_segs = n ? n : 1;
    opt->n_segs = n;
    return ACCEL_OK;
}
