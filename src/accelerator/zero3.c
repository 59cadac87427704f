/* ZeRO-3 (FSDP FULL_SHARD): parameters sharded too. The model's flat f32
 * buffer is laid out unit by unit (a unit: a transformer block, or a module
 * holding parameters of its own, e.g. an embedding or the head); each rank
 * keeps only its piece of every unit's parameters (zparams, the masters the
 * optimizer updates), gradients (zgrad) and optimizer state.
 *
 * The full buffers are reserved address space of the model's device (its
 * backend's vm_* entries: mmap'd pages on the cpu, CUDA's
 * cuMemAddressReserve/cuMemMap on a GPU): a unit's range gets memory when
 * it is gathered and gives it back when it is released, so the tensors (and
 * the views autograd saved in forward) keep their addresses: a unit's forward
 * hook maps its range and all-gathers its parameters back in place, its
 * post-forward unmaps it again (reshard_after_forward) and records a node on
 * its output whose backward gathers them once more, before any of the unit's
 * own backward nodes run. Its gradients' range is mapped (and zeroed) from
 * its backward until its reduction: when every leaf of a unit has its
 * gradient, the unit's gradients are reduce-scattered (AVG) asynchronously,
 * added to zgrad, and the range unmapped. So between uses a unit's full
 * parameters and gradients occupy no memory, and a rank holds its shards
 * plus the units in use (params/N + one or two units gathered), on the host
 * and on a device alike.
 * The next unit in execution order is prefetched asynchronously while the
 * current one computes (backward: before the current unit's backward, or
 * with BACKWARD_POST once its gradients exist; forward with
 * ACCEL_FSDP_FORWARD_PREFETCH), if it fits stage3_prefetch_bucket_size.
 *
 * Gradient accumulation reduces every micro-batch (no full gradients are kept
 * between them), as DeepSpeed's stage 3 does.
 *
 * Under offload_param nvme the shard (zparams) is a file under nvme_path
 * mapped MAP_SHARED; its pages are written back and dropped, from the process
 * and from the page cache, after each use (a unit's gather read its piece,
 * the optimizer step wrote the shard), so its resident memory between uses
 * is a few pages whatever its size.
 *
 * A model on a device the host cannot address (cuda, hostless) keeps all of
 * it in device memory: the full buffers, the shard, the gradient shard (and
 * so the optimizer state). Unmapped memory is not readable there (the cpu's
 * reads as zeros, backend.h): a parameter of a released unit may be held
 * (its header, its address) but not read or written until its unit is
 * gathered again (the checkpoint and save functions gather unit by unit;
 * accel_accelerator_clear gives each tensor memory of its own back, unit by
 * unit). What differs on such a device is how its bytes reach the group and
 * the casts: the collectives move device memory when the
 * group takes it (NCCL), else go through host copies (staging.c's helpers,
 * into host buffers made at layout); bf16 gathers land in a device buffer,
 * also made at layout, that a cast widens into the unit's range. A step
 * allocates nothing from the system (under autocast, but for the weights'
 * prepared forms, which go with their unit: forms_release).
 *
 * Under offload_param (cpu, nvme; fsdp_offload_params) a device model keeps
 * its shards in host memory instead (pm->zdev is the cpu: pinned staging
 * memory, or the nvme file): the optimizer steps there, each gather sends
 * from the host shard and each reduced piece is added into the host
 * gradient shard, so between steps the device holds no shard at all.
 *
 * A mapping can fail on one rank alone (a full device); the ranks agree on
 * each mapping before the collective that follows it ("Agreeing on a failed
 * mapping"), so they fail together instead of waiting for the timeout. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include "accelerator_internal.h"
#include "zero3.h"
#include "core/backend.h"
#include "core/core_internal.h"
#include "core/host_stage.h"
#include "core/prepared.h"
#include "nn/arch.h" /* accel__moe_forward: a mixture of experts' sparse block */

static int64_t page_elems(void) {
    long p = sysconf(_SC_PAGESIZE);
    return (p > 0 ? p : 4096) / (int64_t)sizeof(float);
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* ---------------------------------------------------------------- memory
 * Why reserved addresses, not buffers allocated at each gather with the
 * parameters rebound to them: the tensors keep their data pointers, so the
 * views autograd saved in forward (read again in backward after the
 * re-gather), the prepared-weight registry's byte ranges and any parameter a
 * user holds stay valid across releases; only the memory behind them comes
 * and goes. One path for every device: its backend's vm_* entries. */

static accel_device model_device(const accel__model *pm) { return pm->fp->buffers[ACCEL_F32].device; }

/* The model lives on a device the host cannot address: its bytes reach the
 * group and the casts through the device's functions (not its memory: that
 * is the same path everywhere). */
static bool on_device(const accel__model *pm) { return accel__needs_staging(model_device(pm)); }

static const accel_backend_mem *vm(const accel__model *pm) { return &accel__backend_of(model_device(pm))->mem; }

/* The alignment of a unit's range, in elements: the device's mapping granule (a page on the cpu). */
static int64_t granule_elems(const accel__model *pm) {
    return (int64_t)(vm(pm)->vm_granularity(model_device(pm).index) / sizeof(float));
}

/* Memory behind [p, p + n) floats of a full buffer, unless *mapped says it is there. */
static accel_status range_map(const accel__model *pm, float *p, int64_t n, bool *mapped) {
    if (*mapped) return ACCEL_OK;
    accel_status st = vm(pm)->vm_map(model_device(pm).index, p, (size_t)n * sizeof(float));
    *mapped = st == ACCEL_OK;
    return st;
}

static accel_status range_unmap(const accel__model *pm, float *p, int64_t n, bool *mapped) {
    if (!*mapped) return ACCEL_OK;
    *mapped = false;
    return vm(pm)->vm_unmap(model_device(pm).index, p, (size_t)n * sizeof(float));
}

/* A 1-d header over n elements of dtype dt at device pointer p of the model's device. */
static accel_tensor *device_view(accel_tensor *h, const accel__model *pm, void *p, accel_dtype dt, int64_t n) {
    accel__tensor_header(h, p, dt, 1, &n, model_device(pm));
    return h;
}

/* A full buffer of n floats (n a multiple of granule_elems): reserved
 * address space with no memory behind it yet. */
static float *full_alloc(const accel__model *pm, int64_t n) {
    return vm(pm)->vm_reserve(model_device(pm).index, (size_t)n * sizeof(float));
}

/* Every unit's range of p must be unmapped by now. */
static void full_free(const accel__model *pm, float *p, int64_t n) {
    if (p) vm(pm)->vm_release(model_device(pm).index, p, (size_t)n * sizeof(float));
}

/* ---------------------------------------------------------------- the shard
 * In the model's memory (host or device), or under offload_param in host
 * memory (cpu: pinned staging memory where the backend has it) or a file
 * (nvme): one of each per model. pm->zdev says where the shards live. */

/* A device model whose shards live in host memory (offload_param). */
static bool shard_on_host(const accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    return on_device(pm) && !accel__needs_staging(zm->zdev);
}

/* Shard-sized memory (zeroed) where pm->zdev says: the model's device, or
 * under offload_param host memory pinned for the device's copies. */
static void *shard_mem_alloc(const accel__model *pm, size_t bytes) {
    if (!shard_on_host(pm)) return accel__device_alloc(model_device(pm), bytes, true, "accel_accelerator_prepare");
    void *p = accel__stage_alloc(model_device(pm), bytes, "accel_accelerator_prepare");
    if (p) memset(p, 0, bytes); /* host memory of our own */
    return p;
}

static void shard_mem_free(const accel__model *pm, void *p) {
    if (shard_on_host(pm)) accel__stage_free(model_device(pm), p);
    else accel__device_free(model_device(pm), p);
}

/* n f32 elements from src (memory of device `from`) into dst (memory of device `to`). */
static accel_status copy_floats(accel_device to, void *dst, accel_device from, const void *src, int64_t n) {
    return accel__copy_bytes(to, dst, from, src, (size_t)n * sizeof(float));
}

static int64_t shard_bytes(const accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    int64_t page = page_elems() * (int64_t)sizeof(float);
    return round_up((zm->zn ? zm->zn : 1) * (int64_t)sizeof(float), page);
}

/* <nvme_path>/accel_param_shard_rank<R>_<pid>_<XXXXXX>.swp, its space reserved, mapped over pm->zparams. */
static accel_status shard_map_file(accel_accelerator *acc, accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    char tag[32];
    snprintf(tag, sizeof tag, "rank%d", acc->rank);
    int64_t bytes = shard_bytes(pm);
    zm->zfd = accel__swap_create(acc->offload.param_path, "accel_param_shard", tag, "offload_param",
                                 "parameter shard", &zm->zpath);
    if (zm->zfd < 0) return accel_last_status();
    accel_status st = accel__swap_reserve(zm->zfd, zm->zpath, 0, bytes, "offload_param", "parameter shard");
    if (st) return st;
    void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, zm->zfd, 0);
    if (p == MAP_FAILED)
        return accel_set_error(ACCEL_ERR_IO, "offload_param: cannot map the parameter shard file %s (%lld bytes): %s",
                               zm->zpath, (long long)bytes, strerror(errno));
    zm->zparams = p; /* zeros, as posix_fallocate left them */
    return ACCEL_OK;
}

static accel_status shard_alloc(accel_accelerator *acc, accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    if (acc->offload.param == ACCEL__OFFLOAD_NVME) return shard_map_file(acc, pm);
    zm->zparams = shard_mem_alloc(pm, (size_t)(zm->zn ? zm->zn : 1) * sizeof(float));
    return zm->zparams ? ACCEL_OK : accel_last_status();
}

static void shard_free(accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    if (!zm->zpath) {
        shard_mem_free(pm, zm->zparams);
    } else {
        if (zm->zparams) munmap(zm->zparams, (size_t)shard_bytes(pm));
        if (zm->zfd >= 0) close(zm->zfd); /* unlinked when created */
        accel_free(zm->zpath);
        zm->zpath = NULL;
    }
    zm->zparams = NULL;
}

/* Under offload_param nvme, elements [at, at + n) of the shard leave memory:
 * written back (msync), unmapped from the process (MADV_DONTNEED keeps a
 * shared file mapping's data) and dropped from the page cache (fadvise), the
 * pages at the ends whole. They come back from the file on their next use.
 * A failed write-back keeps them (dropping them would lose the updates). */
static accel_status shard_evict(accel__model *pm, int64_t at, int64_t n) {
    accel__zero_model *zm = accel__zero_of(pm);
    if (!zm->zpath || n <= 0) return ACCEL_OK;
    int64_t page = page_elems() * (int64_t)sizeof(float);
    int64_t lo = at * (int64_t)sizeof(float) / page * page;
    int64_t hi = round_up((at + n) * (int64_t)sizeof(float), page);
    char *base = (char *)zm->zparams;
    if (msync(base + lo, (size_t)(hi - lo), MS_SYNC))
        return accel_set_error(ACCEL_ERR_IO, "offload_param: writing bytes %lld to %lld of the parameter shard file %s "
                               "back failed: %s", (long long)lo, (long long)hi, zm->zpath, strerror(errno));
    madvise(base + lo, (size_t)(hi - lo), MADV_DONTNEED);
    posix_fadvise(zm->zfd, (off_t)lo, (off_t)(hi - lo), POSIX_FADV_DONTNEED);
    return ACCEL_OK;
}

static void host_add(float *dst, const float *src, int64_t n) {
    for (int64_t k = 0; k < n; k++) dst[k] += src[k];
}

/* ---------------------------------------------------------------- units */

/* A module wrapped on its own by default: a transformer block (the decoder
 * layer class its model declares). */
static bool is_block(const accel_module *m) {
    const char *cls = accel_module_decoder_layer_class(m);
    return cls && !strcmp(m->ops->type_name, cls);
}

static bool owns_params(const accel_module *m) {
    for (int i = 0; i < m->n_tensors; i++)
        if (!m->tensors[i].is_buffer) return true;
    return false;
}

/* type_name is one of the comma-separated names of list. */
static bool type_listed(const char *list, const char *type_name) {
    size_t n = strlen(type_name);
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',') p++;
        size_t len = strcspn(p, ", ");
        if (len == n && !strncmp(p, type_name, n)) return true;
        p += len;
    }
    return false;
}

/* The wrapped modules (the root is implicitly one), collected by a policy. */
typedef struct wrap_set {
    int n, cap;
    accel_module **mods;
} wrap_set;

static bool wrap_add(wrap_set *w, accel_module *m) {
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        accel_module **mods = accel_calloc((size_t)cap, sizeof *mods);
        if (!mods) return false;
        if (w->n) memcpy(mods, w->mods, (size_t)w->n * sizeof *mods);
        accel_free(w->mods);
        w->mods = mods;
        w->cap = cap;
    }
    w->mods[w->n++] = m;
    return true;
}

static bool wrapped(const wrap_set *w, const accel_module *m) {
    for (int i = 0; i < w->n; i++)
        if (w->mods[i] == m) return true;
    return false;
}

/* Default: below m, the topmost modules that are blocks or hold parameters. */
static bool wrap_default(wrap_set *w, accel_module *m) {
    for (int i = 0; i < m->n_children; i++) {
        accel_module *c = m->children[i];
        bool ok = is_block(c) || owns_params(c) ? wrap_add(w, c) : wrap_default(w, c);
        if (!ok) return false;
    }
    return true;
}

/* TRANSFORMER_BASED_WRAP: every module of a listed type (nested ones too). */
static bool wrap_transformer(wrap_set *w, accel_module *m, const char *cls, int *found) {
    for (int i = 0; i < m->n_children; i++) {
        accel_module *c = m->children[i];
        if (type_listed(cls, c->ops->type_name)) {
            ++*found;
            if (!wrap_add(w, c)) return false;
        }
        if (!wrap_transformer(w, c, cls, found)) return false;
    }
    return true;
}

/* SIZE_BASED_WRAP (torch's size_based_auto_wrap_policy): bottom-up, a module
 * whose parameters not yet in a unit number at least min is wrapped;
 * ModuleList containers never are. Returns that count for m, or -1. */
static int64_t wrap_size(wrap_set *w, accel_module *m, int64_t min, bool is_root) {
    int64_t left = 0;
    for (int i = 0; i < m->n_tensors; i++)
        if (!m->tensors[i].is_buffer && m->tensors[i].owned) left += accel_numel(m->tensors[i].t);
    for (int i = 0; i < m->n_children; i++) {
        int64_t c = wrap_size(w, m->children[i], min, false);
        if (c < 0) return -1;
        left += c;
    }
    if (is_root || left < min || !left || !strcmp(m->ops->type_name, "ModuleList")) return left;
    return wrap_add(w, m) ? 0 : -1;
}

/* The sparse block whose expert m is or lies inside, else NULL (a block's
 * experts are the children of its `experts` list; Qwen2-MoE's shared expert,
 * which every token runs, is not one). */
static const accel_module *expert_block(const accel_module *m) {
    for (; m && m->parent && m->parent->parent; m = m->parent)
        if (m->parent->parent->ops->forward == accel__moe_forward && !strcmp(m->parent->name, "experts"))
            return m->parent->parent;
    return NULL;
}

/* A unit inside an expert is refused: the sparse block runs only the experts
 * its tokens chose, so the unit's gather and reduction would run on the
 * ranks whose tokens chose it and not on the others (collectives paired with
 * another unit's, or waiting forever). DeepSpeed's answer is the same: the
 * block is a leaf (set_z3_leaf_modules), its experts in one unit. */
static accel_status refuse_expert_units(const accel__fsdp_cfg *f, const wrap_set *w) {
    for (int i = 0; i < w->n; i++) {
        const accel_module *block = expert_block(w->mods[i]);
        if (!block) continue;
        char path[256];
        return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                               "accel_accelerator_prepare: ZeRO-3 / FSDP unit \"%s\" (%s, by %s) is inside an expert "
                               "of a mixture of experts (%s), which runs only on the ranks whose tokens choose it, "
                               "so its gathers and reductions would not run on every rank; wrap the sparse block or "
                               "the decoder layer instead (fsdp_transformer_layer_cls_to_wrap %s or %s, or a larger "
                               "min_num_params)",
                               accel_module_path(w->mods[i], path, sizeof path), w->mods[i]->ops->type_name,
                               f->wrap == ACCEL__WRAP_SIZE          ? "SIZE_BASED_WRAP"
                               : f->wrap == ACCEL__WRAP_TRANSFORMER ? "TRANSFORMER_BASED_WRAP"
                                                                    : "the default wrap policy",
                               block->ops->type_name, block->ops->type_name,
                               accel_module_decoder_layer_class(block) ? accel_module_decoder_layer_class(block)
                                                                       : "(the decoder layer)");
    }
    return ACCEL_OK;
}

static accel_status wrap_policy(const accel__fsdp_cfg *f, accel_module *root, wrap_set *w) {
    int found = 0;
    bool ok = true;
    switch (f->wrap) {
    case ACCEL__WRAP_DEFAULT: ok = wrap_default(w, root); break;
    case ACCEL__WRAP_TRANSFORMER: {
        /* unset: the model's own decoder layer class (its _no_split_modules) */
        const char *cls = f->wrap_cls[0] ? f->wrap_cls : accel_module_decoder_layer_class(root);
        ok = cls && wrap_transformer(w, root, cls, &found);
        if (!cls || (ok && !found))
            return accel_set_error(ACCEL_ERR_INVALID_ARG,
                                   "accel_accelerator_prepare: fsdp_transformer_layer_cls_to_wrap \"%s\": could not "
                                   "find the transformer layer class in the model (%s)",
                                   cls ? cls : "(unset, and the model declares no decoder layer class)",
                                   root->ops->type_name);
        break;
    }
    case ACCEL__WRAP_SIZE: ok = wrap_size(w, root, f->min_num_params, true) >= 0; break;
    case ACCEL__WRAP_NONE: break;
    }
    return ok ? refuse_expert_units(f, w) : accel_last_status();
}

/* The unit module of a tensor owned by `owner`: its innermost wrapped
 * ancestor (itself included), else the root. */
static accel_module *unit_module(const wrap_set *w, accel_module *root, accel_module *owner) {
    for (accel_module *m = owner; m && m != root; m = m->parent)
        if (wrapped(w, m)) return m;
    return root;
}

static int find_root(int *parent, int i) {
    while (parent[i] != i) i = parent[i] = parent[parent[i]];
    return i;
}

/* The distinct unit modules, each tensor's index among them; tied tensors
 * whose aliases live in another unit merge the two (union-find in parent). */
typedef struct unit_plan {
    int n_mods;
    accel_module **mods;
    int *parent;
    int *of_tensor; /* b->n */
} unit_plan;

static int plan_mod(unit_plan *p, accel_module *m) {
    for (int i = 0; i < p->n_mods; i++)
        if (p->mods[i] == m) return i;
    p->mods[p->n_mods] = m;
    p->parent[p->n_mods] = p->n_mods;
    return p->n_mods++;
}

static accel_status plan_units(accel_accelerator *acc, accel__model *pm, unit_plan *p) {
    accel_flat_buffer *b = &pm->fp->buffers[ACCEL_F32];
    wrap_set w = {0};
    accel_status st = wrap_policy(&acc->fsdp, pm->m, &w);
    accel_state_dict *sd = st ? NULL : accel_module_state_dict(pm->m);
    if (!sd) {
        accel_free(w.mods);
        return accel_last_status();
    }
    int cap = sd->n + 1;
    p->mods = accel_calloc((size_t)cap, sizeof *p->mods);
    p->parent = accel_calloc((size_t)cap, sizeof *p->parent);
    p->of_tensor = accel_calloc((size_t)(b->n + 1), sizeof *p->of_tensor);
    if (!p->mods || !p->parent || !p->of_tensor) {
        accel_free(w.mods);
        accel_state_dict_free(sd);
        return accel_last_status();
    }
    for (int t = 0; t < b->n; t++) {
        int e = 0;
        while (e < sd->n && sd->entries[e].t != b->tensors[t]) e++;
        ACCEL_ASSERT(e < sd->n);
        bool small = accel_numel(b->tensors[t]) < acc->fsdp.persistence_threshold;
        p->of_tensor[t] = plan_mod(p, small ? NULL : unit_module(&w, pm->m, sd->entries[e].owner)); /* NULL: persistent */
    }
    for (int e = 0; e < sd->n; e++) {
        const accel_state_entry *se = &sd->entries[e];
        if (!se->is_tied_alias || se->is_buffer) continue;
        int t = 0;
        while (t < b->n && b->tensors[t] != se->t) t++;
        if (t == b->n || !p->mods[p->of_tensor[t]]) continue; /* frozen: not flattened; persistent: always there */
        int a = find_root(p->parent, plan_mod(p, unit_module(&w, pm->m, se->owner)));
        int c = find_root(p->parent, p->of_tensor[t]);
        if (a != c) p->parent[a > c ? a : c] = a < c ? a : c;
    }
    accel_free(w.mods);
    accel_state_dict_free(sd);
    return ACCEL_OK;
}

static void plan_free(unit_plan *p) {
    accel_free(p->mods);
    accel_free(p->parent);
    accel_free(p->of_tensor);
}

static float *full_params(accel__model *pm) { return pm->fp->buffers[ACCEL_F32].params; }
static float *full_grads(accel__model *pm) { return pm->fp->buffers[ACCEL_F32].grads; }

/* The unit's range of the full buffers: its pieces, to whole granules. */
static int64_t unit_span(const accel_accelerator *acc, const accel__model *pm, const accel__unit *u) {
    return round_up(u->shard * acc->shard_world, granule_elems(pm));
}

/* Memory behind the parameters and gradients of units [0, nu) in the new
 * full buffers, for relayout to move the weights in. */
static accel_status map_all(const accel_accelerator *acc, accel__model *pm, float *params, float *grads, int nu) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel_status st = ACCEL_OK;
    for (int k = 0; k < nu && !st; k++) {
        accel__unit *u = &zm->units[k];
        st = range_map(pm, params + u->lo, unit_span(acc, pm, u), &u->params_mapped);
        if (!st) st = range_map(pm, grads + u->lo, unit_span(acc, pm, u), &u->grads_mapped);
    }
    return st;
}

/* Takes every mapping of units [0, nu) away (the buffers are then released). */
static void unmap_all(const accel_accelerator *acc, accel__model *pm, float *params, float *grads, int nu) {
    accel__zero_model *zm = accel__zero_of(pm);
    for (int k = 0; k < nu; k++) {
        accel__unit *u = &zm->units[k];
        range_unmap(pm, params + u->lo, unit_span(acc, pm, u), &u->params_mapped);
        range_unmap(pm, grads + u->lo, unit_span(acc, pm, u), &u->grads_mapped);
    }
}

/* Moves the f32 buffer into reserved address space (every unit's range
 * mapped for the move), unit after unit, each unit's range aligned to whole
 * mapping granules. */
static accel_status relayout(accel_accelerator *acc, accel__model *pm, unit_plan *p) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel_flat_buffer *b = &pm->fp->buffers[ACCEL_F32];
    int n = b->n, nu = 0;
    int *unit_of_mod = accel_calloc((size_t)(p->n_mods + 1), sizeof *unit_of_mod);
    accel_tensor **tensors = accel_calloc((size_t)(n + 1), sizeof *tensors);
    int64_t *offsets = accel_calloc((size_t)(n + 1), sizeof *offsets);
    zm->units = accel_calloc((size_t)(p->n_mods + 1), sizeof *zm->units);
    if (!unit_of_mod || !tensors || !offsets || !zm->units) goto fail;
    /* Units numbered by their first tensor, in buffer order. */
    for (int i = 0; i < p->n_mods; i++) unit_of_mod[i] = -1;
    for (int t = 0; t < n; t++) {
        int r = find_root(p->parent, p->of_tensor[t]);
        if (unit_of_mod[r] < 0) unit_of_mod[r] = nu++;
    }
    int64_t page = granule_elems(pm), pad = 16 * (int64_t)acc->shard_world, cursor = 0, zoff = 0;
    int k = 0;
    for (int u = 0; u < nu; u++) {
        accel__unit *un = &zm->units[u];
        un->lo = round_up(cursor, page);
        un->first = k;
        int64_t end = un->lo;
        for (int t = 0; t < n; t++) {
            if (unit_of_mod[find_root(p->parent, p->of_tensor[t])] != u) continue;
            tensors[k] = b->tensors[t];
            offsets[k++] = round_up(end, 16);
            end = offsets[k - 1] + accel_numel(b->tensors[t]);
            un->numel += accel_numel(b->tensors[t]);
        }
        un->count = k - un->first;
        un->shard = round_up(end - un->lo, pad) / acc->shard_world;
        un->zoff = zoff;
        un->state = ACCEL__UNIT_GATHERED;
        zoff += un->shard;
        cursor = un->lo + un->shard * acc->shard_world;
    }
    int64_t numel = round_up(cursor ? cursor : 1, page);
    float *params = full_alloc(pm, numel), *grads = params ? full_alloc(pm, numel) : NULL;
    if (!grads) {
        if (params) full_free(pm, params, numel);
        goto fail;
    }
    bool moved = !map_all(acc, pm, params, grads, nu);
    for (int t = 0; t < n && moved; t++)
        moved = !accel_tensor_rebind(tensors[t], params + offsets[t], true) &&
                !accel_tensor_rebind(tensors[t]->grad, grads + offsets[t], true);
    if (!moved) {
        /* a failed copy: every tensor back on the old buffer, which the copies
         * left as it was (live contiguous views, no copy: these cannot fail) */
        for (int t = 0; t < n; t++) {
            (void)accel_tensor_rebind(b->tensors[t], (float *)b->params + b->offsets[t], false);
            (void)accel_tensor_rebind(b->tensors[t]->grad, (float *)b->grads + b->offsets[t], false);
        }
        unmap_all(acc, pm, params, grads, nu);
        full_free(pm, params, numel);
        full_free(pm, grads, numel);
        goto fail;
    }
    accel__device_free(b->device, b->params);
    accel__device_free(b->device, b->grads);
    accel_free(b->tensors);
    accel_free(b->offsets);
    b->params = params;
    b->grads = grads;
    b->tensors = tensors;
    b->offsets = offsets;
    b->numel = numel;
    zm->n_units = nu;
    zm->zn = zoff;
    /* The hook points: every module of the plan, to its unit. */
    zm->hooked = accel_calloc((size_t)(p->n_mods + 1), sizeof *zm->hooked);
    zm->hooked_unit = accel_calloc((size_t)(p->n_mods + 1), sizeof *zm->hooked_unit);
    if (!zm->hooked || !zm->hooked_unit) goto fail_late;
    for (int i = 0; i < p->n_mods; i++) {
        int u = unit_of_mod[find_root(p->parent, i)];
        if (u < 0) continue;
        if (!p->mods[i]) { /* the persistent unit: no hook */
            zm->units[u].persistent = true;
            continue;
        }
        zm->hooked[zm->n_hooked] = p->mods[i];
        zm->hooked_unit[zm->n_hooked++] = u;
        if (p->mods[i] == pm->m) zm->units[u].is_root = true;
    }
    accel_free(unit_of_mod);
    return ACCEL_OK;
fail:
    accel_free(tensors);
    accel_free(offsets);
    accel_free(unit_of_mod);
    accel_free(zm->units);
    zm->units = NULL;
    return accel_last_status() ? accel_last_status() : ACCEL_ERR_OOM;
fail_late: /* the buffer is ours now: release() takes it back */
    accel_free(unit_of_mod);
    return accel_last_status();
}

/* The largest unit's piece, in elements. */
static int64_t largest_shard(const accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    int64_t n = 1;
    for (int k = 0; k < zm->n_units; k++)
        if (zm->units[k].shard > n) n = zm->units[k].shard;
    return n;
}

/* A device model's gather and reduction buffers, for its largest unit: the
 * bf16 landing buffer (under bf16), and the host copies when the group takes
 * host memory only (long-lived staging buffers: pinned where the backend
 * can). Made once, so a step allocates nothing. Under offload_param a
 * gather sends straight from the host shard, and a reduced piece that the
 * group left in device memory comes to the host through zstage_send. */
static accel_status device_buffers_alloc(accel_accelerator *acc, accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    size_t piece = (size_t)largest_shard(pm), full = piece * (size_t)acc->shard_world;
    const char *op = "accel_accelerator_prepare";
    if (zm->zsend16 && !(zm->zland16 = accel__device_alloc(model_device(pm), full * sizeof(uint16_t), false, op)))
        return accel_last_status();
    bool staged = acc->shard_world > 1 && !accel__pg_takes_device(acc->shard_pg, model_device(pm));
    if (staged != shard_on_host(pm) && !(zm->zstage_send = accel__stage_alloc(model_device(pm), piece * sizeof(float), op)))
        return accel_last_status();
    if (!staged) return ACCEL_OK;
    zm->zstage_recv = accel__stage_alloc(model_device(pm), full * sizeof(float), op);
    zm->zstage_grads = accel__stage_alloc(model_device(pm), full * sizeof(float), op);
    return zm->zstage_recv && zm->zstage_grads ? ACCEL_OK : accel_last_status();
}

static void device_buffers_free(accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel__device_free(model_device(pm), zm->zland16);
    accel__stage_free(model_device(pm), zm->zstage_send);
    accel__stage_free(model_device(pm), zm->zstage_recv);
    accel__stage_free(model_device(pm), zm->zstage_grads);
    zm->zland16 = zm->zstage_send = zm->zstage_recv = NULL;
    zm->zstage_grads = NULL;
}

accel_status accel__zero3_layout(accel_accelerator *acc, accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    for (int d = 0; d < ACCEL_DTYPE_COUNT; d++)
        if (d != ACCEL_F32 && pm->fp->buffers[d].n)
            return accel_set_error(ACCEL_ERR_DTYPE,
                                   "accel_accelerator_prepare: ZeRO stage 3 shards f32 parameters (mixed precision "
                                   "keeps f32 masters); this model has %s parameters",
                                   accel_dtype_name(pm->fp->buffers[d].dtype));
    if (!vm(pm)->vm_map) {
        char d[32];
        return accel_set_error(ACCEL_ERR_DEVICE,
                               "accel_accelerator_prepare: ZeRO stage 3 on %s needs its backend's virtual memory "
                               "(vm_map and the other vm_* entries) to release unit parameters; it has none",
                               accel_device_str(model_device(pm), d, sizeof d));
    }
    zm->gathering = -1;
    unit_plan p = {0};
    accel_status st = plan_units(acc, pm, &p);
    if (!st) st = relayout(acc, pm, &p);
    plan_free(&p);
    if (st) return st;
    /* offload_param on a device: the shards, and so the optimizer's step, on the host */
    if (on_device(pm) && acc->offload.param != ACCEL__OFFLOAD_NONE) zm->zdev = ACCEL_CPU_DEVICE;
    if ((st = shard_alloc(acc, pm))) return st;
    size_t zn = (size_t)(zm->zn ? zm->zn : 1);
    zm->zgrad = shard_mem_alloc(pm, zn * sizeof(float));
    zm->order = accel_calloc((size_t)(zm->n_units + 1), sizeof *zm->order);
    zm->reducing = -1;
    if (!zm->zgrad || !zm->order) return accel_last_status();
    if (acc->mp == ACCEL_MP_BF16 && !(zm->zsend16 = shard_mem_alloc(pm, zn * sizeof(uint16_t))))
        return accel_last_status();
    return on_device(pm) ? device_buffers_alloc(acc, pm) : ACCEL_OK;
}

/* ---------------------------------------------------------------- agreeing on a failed mapping
 * A device model's mappings (a unit's parameters when its gather starts,
 * its gradients when its backward starts) can fail on one rank alone: its
 * device is full; so can readying what a gather sends (device_send_ready: a
 * device copy or cast). That rank would skip the collective that follows while
 * the others waited in it until the group's timeout. Instead the ranks agree
 * at the same point: a 4-byte all-reduce (MAX) over the shard group of
 * (rank + 1) << 8 | status, 0 where the mapping worked, just before the
 * gather's collective. A gradient mapping is owed (pm->owing) and carried by
 * the next agreement: the prefetch gather that follows it in backward, else
 * one of its own. On a failure every rank undoes that mapping and returns
 * the failed rank's status, its message naming the rank (a mapping on the
 * cpu fails only when the host is out of memory, but then alike). */

static accel_status agree(accel_accelerator *acc, accel__model *pm, accel_status st) {
    accel__zero_model *zm = accel__zero_of(pm);
    if (zm->owing && !st) st = zm->owed;
    zm->owing = false;
    zm->owed = ACCEL_OK;
    if (acc->shard_world == 1) return st;
    char why[512];
    snprintf(why, sizeof why, "%s", st ? accel_last_error() : "");
    int32_t v = st ? (int32_t)((acc->rank + 1) << 8 | (int)st) : 0;
    accel_status ast = accel_pg_all_reduce(acc->shard_pg, &v, 1, ACCEL_I32, ACCEL_REDUCE_MAX);
    if (st) return accel_set_error(st, "ZeRO-3 on rank %d: %s (every rank of the shard group stops with it)",
                                   acc->rank, why);
    if (ast || !v) return ast;
    accel_status theirs = (accel_status)(v & 0xff);
    return accel_set_error(theirs, "ZeRO-3: rank %d could not %s (%s there), so every rank of the shard group stops "
                           "with it", (v >> 8) - 1, theirs == ACCEL_ERR_OOM ? "map device memory for a unit"
                           : "ready a unit's memory or what its gather sends", accel_status_name(theirs));
}

/* ---------------------------------------------------------------- gather / release */

/* Memory behind unit u's full parameters, for a gather to write. */
static accel_status params_map(const accel_accelerator *acc, accel__model *pm, accel__unit *u) {
    return range_map(pm, full_params(pm) + u->lo, unit_span(acc, pm, u), &u->params_mapped);
}

/* Unit u's full parameters give their memory back. */
static accel_status params_drop(const accel_accelerator *acc, accel__model *pm, accel__unit *u) {
    return range_unmap(pm, full_params(pm) + u->lo, unit_span(acc, pm, u), &u->params_mapped);
}

/* Zeroed memory behind unit u's full gradients, for its backward to
 * accumulate into: mapped and zeroed once, when its backward starts. */
static accel_status grads_map(const accel_accelerator *acc, accel__model *pm, accel__unit *u) {
    if (u->grads_mapped) return ACCEL_OK;
    int64_t n = unit_span(acc, pm, u);
    accel_status st = range_map(pm, full_grads(pm) + u->lo, n, &u->grads_mapped);
    accel_tensor h;
    return st ? st : accel_zero_(device_view(&h, pm, full_grads(pm) + u->lo, ACCEL_F32, n));
}

/* Unit u's full gradients, reduced, go: their memory back (the persistent
 * unit's, always there, back to zeros). */
static accel_status grads_drop(const accel_accelerator *acc, accel__model *pm, accel__unit *u) {
    int64_t n = unit_span(acc, pm, u);
    float *g = full_grads(pm) + u->lo;
    accel_tensor h;
    if (u->persistent) return accel_zero_(device_view(&h, pm, g, ACCEL_F32, n));
    return range_unmap(pm, g, n, &u->grads_mapped);
}

static float *my_piece(const accel_accelerator *acc, float *full, const accel__unit *u) {
    return full + u->lo + (int64_t)acc->shard_rank * u->shard;
}

/* A bf16 gather lands in the upper half of the unit's f32 range: h[k] at
 * byte 2n + 2k of the range's 4n. Widening upward in place never overwrites
 * what is still to be read (f[k] ends at byte 4k + 3 < 2n + 2(k + 1)). */
static uint16_t *bf16_landing(float *unit, int64_t n) { return (uint16_t *)unit + n; }

static void host_widen_bf16(float *unit, int64_t n) {
    const uint16_t *h = bf16_landing(unit, n);
    for (int64_t k = 0; k < n; k++) unit[k] = accel_bf16_to_f32(h[k]);
}

static void host_narrow_bf16(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t k = 0; k < n; k++) dst[k] = accel_f32_to_bf16(src[k]);
}

/* The unit's n gathered parameters were written here, not only by the
 * collective (the widening, a group of one): what was prepared from them is
 * stale (core/prepared.h). */
static void unit_written(accel__model *pm, const accel__unit *u, int64_t n) {
    accel__storage_written(full_params(pm) + u->lo, (size_t)n * sizeof(float));
}

/* ---- on a device: the gather sends the piece (f32, or bf16 in zsend16) from
 * the shard and lands in the unit's range (mapped first), or for bf16 in
 * zland16, which a cast widens into it; a group that cannot take device
 * memory gets host copies of both sides (zstage_send, zstage_recv). Those
 * buffers serve one gather at a time: a unit whose gather starts while
 * another's is in flight (a prefetch out of order) finishes that one first. */

static accel_status finish_gather(accel_accelerator *acc, accel__model *pm, accel__unit *u);

/* Where unit u's device gather lands: its range, or zland16 for a bf16 gather. */
static void *gather_landing(accel__model *pm, const accel__unit *u) {
    return u->gather16 ? (void *)accel__zero_of(pm)->zland16 : (void *)(full_params(pm) + u->lo);
}

static accel_status device_finish_gather(accel_accelerator *acc, accel__model *pm, accel__unit *u) {
    accel__zero_model *zm = accel__zero_of(pm);
    int64_t n = u->shard * acc->shard_world;
    accel_dtype dt = u->gather16 ? ACCEL_BF16 : ACCEL_F32;
    accel_status st = ACCEL_OK;
    bool staged = u->gather != NULL && zm->zstage_recv != NULL;
    if (u->gather) {
        st = accel_work_wait(u->gather);
        accel_work_free(u->gather);
        u->gather = NULL;
    }
    accel_tensor full, landed;
    device_view(&landed, pm, gather_landing(pm, u), dt, n);
    if (staged) st = accel__stage_end(&landed, zm->zstage_recv, st, true, false);
    if (!st && u->gather16) st = accel_copy_(device_view(&full, pm, full_params(pm) + u->lo, ACCEL_F32, n), &landed);
    zm->gathering = -1;
    u->state = st ? ACCEL__UNIT_RELEASED : ACCEL__UNIT_GATHERED;
    accel_status est = shard_evict(pm, u->zoff, u->shard); /* offload_param nvme: the gather has read the piece */
    return st ? st : est;
}

/* The gather buffers for unit u: a gather in flight on another unit finishes first. */
static accel_status take_gather_buffers(accel_accelerator *acc, accel__model *pm, accel__unit *u) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel_status st = ACCEL_OK;
    if (zm->gathering >= 0 && &zm->units[zm->gathering] != u) st = finish_gather(acc, pm, &zm->units[zm->gathering]);
    zm->gathering = (int)(u - zm->units);
    return st;
}

/* The piece unit u's gather sends, in the dtype it moves (memory of
 * pm->zdev): the shard's piece, or under bf16 that piece rounded to bf16 in
 * zsend16 (a cast on the device, a loop over the host shard under offload_param). */
static const void *gather_send(accel__model *pm, const accel__unit *u, accel_status *st) {
    accel__zero_model *zm = accel__zero_of(pm);
    float *mine = zm->zparams + u->zoff;
    if (!u->gather16) return mine;
    uint16_t *mine16 = zm->zsend16 + u->zoff;
    if (shard_on_host(pm)) {
        host_narrow_bf16(mine16, mine, u->shard);
    } else {
        accel_tensor h, f;
        *st = accel_copy_(device_view(&h, pm, mine16, ACCEL_BF16, u->shard), device_view(&f, pm, mine, ACCEL_F32, u->shard));
    }
    return mine16;
}

/* The bytes unit u's collective sends, made ready before the ranks agree
 * (launch_gather), so that a failure here is agreed on with the mapping's
 * (after the agreement that rank alone would skip the collective, the others
 * waiting in it until the group's timeout): the piece, rounded to bf16 in
 * zsend16 for a bf16 gather; for a group that takes host memory only, a host
 * copy of it in zstage_send (unless the shard is on the host already); with
 * the shard on the host and a group that takes device memory, a copy in this
 * rank's block of the unit's landing, which the gather then sends in place.
 * NULL on failure. */
static const void *device_send_ready(accel_accelerator *acc, accel__model *pm, accel__unit *u) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel_dtype dt = u->gather16 ? ACCEL_BF16 : ACCEL_F32;
    accel_status st = ACCEL_OK;
    const void *send = gather_send(pm, u, &st);
    if (st) return NULL;
    if (acc->shard_world == 1 || (shard_on_host(pm) && zm->zstage_recv)) return send;
    accel_tensor sv;
    if (zm->zstage_recv) return accel__stage_to_host(device_view(&sv, pm, (void *)send, dt, u->shard), zm->zstage_send, true);
    if (!shard_on_host(pm)) return send;
    size_t bytes = (size_t)u->shard * accel_dtype_size(dt);
    char *block = (char *)gather_landing(pm, u) + (size_t)acc->shard_rank * bytes;
    return accel__copy_bytes(model_device(pm), block, zm->zdev, send, bytes) ? NULL : block;
}

/* Starts moving every rank's `send` (device_send_ready's) into the unit's
 * landing (its range, or zland16 for bf16): a copy on one process; a group
 * that takes host memory only gathers into zstage_recv. Leaves the unit
 * GATHERING (its range mapped): finish_gather completes it. */
static accel_status device_launch_gather(accel_accelerator *acc, accel__model *pm, accel__unit *u, const void *send) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel_dtype dt = u->gather16 ? ACCEL_BF16 : ACCEL_F32;
    void *recv = gather_landing(pm, u);
    accel_status st = ACCEL_OK;
    if (acc->shard_world == 1) {
        st = accel__copy_bytes(model_device(pm), recv, zm->zdev, send, (size_t)u->shard * accel_dtype_size(dt));
    } else {
        u->gather = accel_pg_all_gather_async(acc->shard_pg, send, zm->zstage_recv ? zm->zstage_recv : recv,
                                              (size_t)u->shard, dt);
        if (!u->gather) st = accel_last_status() ? accel_last_status() : ACCEL_ERR_DIST;
    }
    if (st) {
        zm->gathering = -1;
        return st;
    }
    u->state = ACCEL__UNIT_GATHERING;
    return ACCEL_OK;
}

/* ---- either */

static accel_status finish_gather(accel_accelerator *acc, accel__model *pm, accel__unit *u) {
    if (on_device(pm)) return device_finish_gather(acc, pm, u);
    accel_status st = accel_work_wait(u->gather);
    accel_work_free(u->gather);
    u->gather = NULL;
    if (!st && u->gather16) host_widen_bf16(full_params(pm) + u->lo, u->shard * acc->shard_world);
    unit_written(pm, u, u->shard * acc->shard_world);
    u->state = st ? ACCEL__UNIT_RELEASED : ACCEL__UNIT_GATHERED;
    accel_status est = shard_evict(pm, u->zoff, u->shard);
    return st ? st : est;
}

/* Whether a gather for compute moves bf16 (FSDP's MixedPrecision(param_dtype=
 * bf16)): the forward and backward then see the masters rounded to bf16. */
static bool gathers_bf16(const accel__model *pm) { return accel__zero_of(pm)->zsend16 != NULL; }

/* Starts unit u's all-gather (a no-op unless released): in bf16 when `exact`
 * is false and the run is bf16 (half the traffic), else the f32 masters.
 * The unit's range is mapped first, and the ranks agree on the mapping (and
 * on a mapping owed, pm->owing) before the collective, so a rank whose
 * memory is full fails with the others instead of leaving them in the
 * all-gather. */
static accel_status launch_gather(accel_accelerator *acc, accel__model *pm, accel__unit *u, bool exact) {
    accel__zero_model *zm = accel__zero_of(pm);
    if (u->state != ACCEL__UNIT_RELEASED) return ACCEL_OK;
    const float *mine = zm->zparams + u->zoff;
    float *dst = full_params(pm) + u->lo;
    u->gather16 = !exact && gathers_bf16(pm);
    accel_status st = on_device(pm) ? take_gather_buffers(acc, pm, u) : ACCEL_OK;
    if (!st) st = params_map(acc, pm, u);
    const void *send = NULL;
    if (!st && on_device(pm) && !(send = device_send_ready(acc, pm, u))) st = accel_last_status();
    if ((st = agree(acc, pm, st))) {
        params_drop(acc, pm, u);
        zm->gathering = -1;
        return st;
    }
    if (on_device(pm)) return device_launch_gather(acc, pm, u, send);
    if (u->gather16) host_narrow_bf16(zm->zsend16 + u->zoff, mine, u->shard);
    if (acc->shard_world == 1) {
        if (u->gather16) {
            memcpy(bf16_landing(dst, u->shard), zm->zsend16 + u->zoff, (size_t)u->shard * sizeof(uint16_t));
            host_widen_bf16(dst, u->shard);
        } else {
            memcpy(dst, mine, (size_t)u->shard * sizeof(float));
        }
        unit_written(pm, u, u->shard);
        u->state = ACCEL__UNIT_GATHERED;
        return shard_evict(pm, u->zoff, u->shard);
    }
    if (u->gather16)
        u->gather = accel_pg_all_gather_async(acc->shard_pg, zm->zsend16 + u->zoff,
                                              bf16_landing(dst, u->shard * acc->shard_world), (size_t)u->shard,
                                              ACCEL_BF16);
    else
        u->gather = accel_pg_all_gather_async(acc->shard_pg, mine, dst, (size_t)u->shard, ACCEL_F32);
    if (!u->gather) return accel_last_status() ? accel_last_status() : ACCEL_ERR_DIST;
    u->state = ACCEL__UNIT_GATHERING;
    return ACCEL_OK;
}

static accel_status gather(accel_accelerator *acc, accel__model *pm, accel__unit *u, bool exact) {
    accel_status st = launch_gather(acc, pm, u, exact);
    if (!st && u->state == ACCEL__UNIT_GATHERING) st = finish_gather(acc, pm, u);
    return st;
}

/* The forms prepared from unit u's parameters (autocast's bf16 copies,
 * core/prepared.h) go with them: they are stale once the unit is gathered
 * again (the gather writes the range), and kept they would hold half the
 * model's f32 bytes between steps. A form this step's tape still reads is
 * freed when the step ends (accel_step_reset). */
static void forms_release(accel__model *pm, const accel__unit *u) {
    accel_flat_buffer *b = &pm->fp->buffers[ACCEL_F32];
    for (int t = u->first; t < u->first + u->count; t++) accel__prepared_release(b->tensors[t]);
}

/* Gives unit u's full parameters back (the persistent unit keeps them). */
static accel_status release(accel_accelerator *acc, accel__model *pm, accel__unit *u) {
    accel_status st = u->state == ACCEL__UNIT_GATHERING ? finish_gather(acc, pm, u) : ACCEL_OK;
    if (u->persistent) return st;
    forms_release(pm, u);
    accel_status dst = params_drop(acc, pm, u);
    u->state = ACCEL__UNIT_RELEASED;
    return st ? st : dst;
}

/* The unit that runs `step` places after u in forward order (-1 before u), or NULL. */
static accel__unit *order_neighbour(accel__model *pm, int u, int step) {
    accel__zero_model *zm = accel__zero_of(pm);
    if (!zm->order_done) return NULL;
    for (int i = 0; i < zm->n_order; i++)
        if (zm->order[i] == u) {
            int j = i + step;
            return j >= 0 && j < zm->n_order ? &zm->units[zm->order[j]] : NULL;
        }
    return NULL;
}

static void record_order(accel__model *pm, int u) {
    accel__zero_model *zm = accel__zero_of(pm);
    if (zm->order_done) return;
    for (int i = 0; i < zm->n_order; i++)
        if (zm->order[i] == u) return;
    zm->order[zm->n_order++] = u;
}

/* Starts the all-gather of `next`, the unit that runs after the current one,
 * ahead of its use: unless it is there already, or has more elements than
 * stage3_prefetch_bucket_size (0 turns prefetching off). */
static accel_status prefetch(accel_accelerator *acc, accel__model *pm, accel__unit *next) {
    accel__zero_model *zm = accel__zero_of(pm);
    if (!next || next->state != ACCEL__UNIT_RELEASED) return ACCEL_OK;
    if (acc->fsdp.prefetch_bucket >= 0 && next->numel > acc->fsdp.prefetch_bucket) return ACCEL_OK;
    zm->prefetches++;
    return launch_gather(acc, pm, next, false);
}

/* ---------------------------------------------------------------- hooks */

typedef struct hook_ctx {
    accel_accelerator *acc;
    accel_module *model;
    int unit;
    accel_module_hook chained; /* the hook the module had (autocast on the root), run outside ours */
} hook_ctx;

/* Before unit u's backward: its gradients' memory (the mapping owed to the
 * next agreement, "Agreeing on a failed mapping"), its parameters, the
 * prefetch of the unit before it (backward runs the units in reverse). */
static accel_status pre_backward(accel_node *n, accel_tensor *g) {
    hook_ctx *c = n->ctx;
    accel__model *pm = accel__find_model(c->acc, c->model);
    accel__zero_model *zm = accel__zero_of(pm);
    if (!pm) return accel_set_error(ACCEL_ERR_STATE, "ZeRO-3: backward after the model was released");
    accel__unit *u = &zm->units[c->unit];
    if (!u->grads_mapped) {
        zm->owing = true;
        zm->owed = grads_map(c->acc, pm, u);
    }
    accel_status st = gather(c->acc, pm, u, false);
    bool pre = c->acc->fsdp.backward_prefetch && !c->acc->fsdp.backward_post;
    if (!st && pre) st = prefetch(c->acc, pm, order_neighbour(pm, c->unit, -1));
    if (zm->owing) { /* no gather started to carry it */
        accel_status ast = agree(c->acc, pm, ACCEL_OK);
        if (!st) st = ast;
    }
    if (st) grads_drop(c->acc, pm, u); /* as on every rank */
    return st ? st : accel_grad_accumulate(n->inputs[0], g);
}

static accel_status hook_pre(accel_module *m, accel_tensor **x, void *ctx) {
    hook_ctx *c = ctx;
    accel_status st = c->chained.pre_forward ? c->chained.pre_forward(m, x, c->chained.ctx) : ACCEL_OK;
    accel__model *pm = accel__find_model(c->acc, c->model);
    accel__zero_model *zm = accel__zero_of(pm);
    if (st || !pm) return st;
    record_order(pm, c->unit);
    st = gather(c->acc, pm, &zm->units[c->unit], false);
    if (!st && c->acc->fsdp.forward_prefetch) st = prefetch(c->acc, pm, order_neighbour(pm, c->unit, 1));
    return st;
}

static accel_status hook_post(accel_module *m, accel_tensor **y, void *ctx) {
    hook_ctx *c = ctx;
    accel__model *pm = accel__find_model(c->acc, c->model);
    accel__zero_model *zm = accel__zero_of(pm);
    accel_status st = ACCEL_OK;
    if (pm && *y) {
        accel__unit *u = &zm->units[c->unit];
        accel_tensor *in = *y, *out = accel_alias(in);
        if (!out) return accel_last_status();
        accel_node *node = accel_tape_record("zero3_pre_backward", pre_backward, out, 1, &in);
        if (node) {
            /* a copy of the step: the module freed before the backward
             * frees c with its hooks, and its lookup then says released */
            hook_ctx *step = accel_arena_alloc(accel_step_arena(), sizeof *step, 8);
            if (!step) return accel_last_status();
            *step = *c;
            node->ctx = step;
            *y = out;
        }
        if (!u->is_root && c->acc->fsdp.reshard_after_forward) st = release(c->acc, pm, u);
    }
    if (!st && c->chained.post_forward) st = c->chained.post_forward(m, y, c->chained.ctx);
    return st;
}

static void hook_free(void *ctx) {
    hook_ctx *c = ctx;
    if (c->chained.free_ctx) c->chained.free_ctx(c->chained.ctx);
    accel_free(c);
}

static accel_status install_hooks(accel_accelerator *acc, accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    for (int i = 0; i < zm->n_hooked; i++) {
        accel_module *m = zm->hooked[i];
        hook_ctx *c = accel_calloc(1, sizeof *c);
        if (!c) return accel_last_status();
        *c = (hook_ctx){acc, pm->m, zm->hooked_unit[i], {0}};
        if (m->hook) { /* ours now: it runs (and is freed) through ours */
            c->chained = *m->hook;
            m->hook->free_ctx = NULL;
        }
        m->gradient_checkpointing |= acc->fsdp.activation_checkpointing && !zm->units[zm->hooked_unit[i]].is_root;
        accel_module_hook h = {hook_pre, hook_post, hook_free, c};
        accel_status st = accel_module_set_hook(m, &h);
        if (st) { /* out of memory: m has no hook now; c still holds the one it had, and frees it */
            hook_free(c);
            return st;
        }
    }
    return ACCEL_OK;
}

/* Takes our hooks off, giving each module back the hook it had. */
static void remove_hooks(accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    for (int i = 0; i < zm->n_hooked; i++) {
        accel_module *m = zm->hooked[i];
        if (!m->hook || m->hook->pre_forward != hook_pre) continue;
        hook_ctx *c = m->hook->ctx;
        accel_module_hook prev = c->chained;
        if (prev.pre_forward || prev.post_forward || prev.free_ctx) {
            *m->hook = prev; /* in the hook's own allocation: a set_hook would allocate, and could fail */
            accel_free(c);
        } else {
            /* removing allocates nothing: with m not NULL it cannot fail */
            (void)accel_module_set_hook(m, NULL);
        }
    }
}

accel_status accel__zero3_start(accel_accelerator *acc, accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel_status st = ACCEL_OK;
    /* Every unit's piece into the shard first, agreed, then the full
     * parameters released: a failure while filling leaves every rank's
     * model whole (not sharded: the undo gathers nothing), and one while
     * releasing finds every rank's pieces filled (the undo's gathers bring
     * the weights back). Filled and released unit by unit, a rank that
     * stopped at unit k had its pieces of the later units unfilled, and the
     * undo gathered those into every rank's weights. */
    for (int k = 0; k < zm->n_units && !st; k++) {
        accel__unit *u = &zm->units[k];
        st = copy_floats(zm->zdev, zm->zparams + u->zoff, model_device(pm), my_piece(acc, full_params(pm), u), u->shard);
    }
    st = accel__prepare_agree(acc, st, "fill its ZeRO-3 parameter shard");
    if (st) return st;
    zm->sharded = true; /* on every rank: a failed release from here on is undone by gathering */
    for (int k = 0; k < zm->n_units && !st; k++) {
        accel__unit *u = &zm->units[k];
        st = release(acc, pm, u);
        if (!st) st = grads_drop(acc, pm, u);
    }
    if (!st) st = shard_evict(pm, 0, zm->zn);
    return st ? st : install_hooks(acc, pm);
}

/* ---------------------------------------------------------------- backward */

void accel__zero3_begin_backward(accel_accelerator *acc, accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    for (int k = 0; k < zm->n_units; k++) zm->units[k].pending = zm->units[k].count, zm->units[k].reduced = false;
    zm->reducing = -1;
    zm->reduce_status = ACCEL_OK;
}

/* A unit waits for the leaves this walk reaches, not for all of them: one
 * that gets no gradient (an expert no token of this rank chose) would hold
 * its unit's reduction back to the end of backward, after units that come
 * later in the walk, while the ranks whose tokens chose it reduce the unit
 * in its place: collectives in another order on each rank. */
void accel__zero3_pass_begin(accel_accelerator *acc, accel__model *pm) {
    (void)acc;
    accel__zero_model *zm = accel__zero_of(pm);
    accel_tensor **t = pm->fp->buffers[ACCEL_F32].tensors;
    for (int k = 0; k < zm->n_units; k++) {
        accel__unit *u = &zm->units[k];
        if (u->pending != u->count) continue; /* leaves already reached (another walk in this backward) */
        u->pending = 0;
        for (int i = u->first; i < u->first + u->count; i++) u->pending += accel__leaf_in_pass(t[i]);
    }
}

/* This rank's averaged piece of unit u's gradients, where the group left
 * it: in the full buffer, or in the host copy of a staged reduction. */
static float *reduced_piece(const accel_accelerator *acc, accel__model *pm, const accel__unit *u) {
    accel__zero_model *zm = accel__zero_of(pm);
    if (u->grads_staged) return zm->zstage_grads + (int64_t)acc->shard_rank * u->shard;
    return my_piece(acc, full_grads(pm), u);
}

/* zgrad's piece of unit u += the averaged piece (in the full gradient
 * buffer by now, or in its host copy). A host shard (offload_param) adds on
 * the host, from a host copy of a piece the group left on the device. */
static accel_status add_to_shard(accel_accelerator *acc, accel__model *pm, const accel__unit *u) {
    accel__zero_model *zm = accel__zero_of(pm);
    float *mine = my_piece(acc, full_grads(pm), u);
    if (!on_device(pm)) {
        host_add(zm->zgrad + u->zoff, mine, u->shard);
        return ACCEL_OK;
    }
    if (shard_on_host(pm)) {
        const float *piece = reduced_piece(acc, pm, u);
        accel_status st = u->grads_staged ? ACCEL_OK
                                          : copy_floats(ACCEL_CPU_DEVICE, zm->zstage_send, model_device(pm), mine, u->shard);
        if (!u->grads_staged) piece = zm->zstage_send;
        if (!st) host_add(zm->zgrad + u->zoff, piece, u->shard);
        return st;
    }
    accel_status st = u->grads_staged ? accel__copy_bytes(model_device(pm), mine, ACCEL_CPU_DEVICE, reduced_piece(acc, pm, u),
                                                         (size_t)u->shard * sizeof(float))
                                     : ACCEL_OK;
    accel_tensor out, in;
    accel_k_accumulate k = {.out = device_view(&out, pm, zm->zgrad + u->zoff, ACCEL_F32, u->shard),
                            .in = device_view(&in, pm, mine, ACCEL_F32, u->shard)};
    return st ? st : ACCEL_KERNEL("accel_accelerator_backward", model_device(pm), accumulate, &k);
}

/* Waits for unit u's reduce-scatter, averages this rank's piece across the
 * machines under hybrid sharding, adds it into the gradient shard and unmaps
 * the unit's full gradients (zeroes the persistent unit's). */
static accel_status finish_reduce(accel_accelerator *acc, accel__model *pm, accel__unit *u) {
    accel_status st = ACCEL_OK;
    if (u->reduce) {
        st = accel_work_wait(u->reduce);
        accel_work_free(u->reduce);
        u->reduce = NULL;
    }
    bool unmapped = !u->grads_mapped; /* grads_map failed: no memory behind the piece */
    if (!st && unmapped) st = accel_last_status() ? accel_last_status() : ACCEL_ERR_OOM;
    /* even after a failure here, so the other machines' ranks are not left
     * waiting; but never over unmapped memory (a fault on the device): they
     * then fail by the group's timeout */
    accel_status rst = unmapped ? ACCEL_OK : accel__zero_replica_average(acc, reduced_piece(acc, pm, u), u->shard);
    if (!st) st = rst;
    if (!st) st = add_to_shard(acc, pm, u);
    u->grads_staged = false;
    accel_status dst = grads_drop(acc, pm, u);
    return st ? st : dst;
}

/* Starts unit u's reduce-scatter (AVG) in place: a group that cannot take
 * device memory reduces a host copy of the unit's gradients (zstage_grads:
 * one reduction is in flight at a time). */
static accel_work *launch_reduce_scatter(accel_accelerator *acc, accel__model *pm, accel__unit *u) {
    accel__zero_model *zm = accel__zero_of(pm);
    float *full = full_grads(pm) + u->lo;
    size_t n = (size_t)u->shard;
    if (zm->zstage_grads) {
        accel_tensor g;
        u->grads_staged = true;
        if (!accel__stage_to_host(device_view(&g, pm, full, ACCEL_F32, u->shard * acc->shard_world), zm->zstage_grads,
                                  true))
            return NULL;
        full = zm->zstage_grads;
    }
    return accel_pg_reduce_scatter_async(acc->shard_pg, full, full + (int64_t)acc->shard_rank * u->shard, n,
                                         ACCEL_F32, ACCEL_REDUCE_AVG);
}

/* Unit u's gradients are complete: its parameters go, its reduce-scatter
 * starts. At most one reduction is in flight, so at most two units' full
 * gradients exist at a time. */
static accel_status launch_reduce(accel_accelerator *acc, accel__model *pm, int k) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel__unit *u = &zm->units[k];
    accel_status st = release(acc, pm, u);
    bool mapping = !u->grads_mapped; /* a unit whose backward never ran reduces zeros */
    accel_status gst = grads_map(acc, pm, u);
    if (mapping) gst = agree(acc, pm, gst); /* so no rank alone skips the reduce-scatter */
    if (gst) grads_drop(acc, pm, u);
    if (!st) st = gst;
    u->pending = 0;
    u->reduced = true;
    if (zm->reducing >= 0) {
        accel_status st2 = finish_reduce(acc, pm, &zm->units[zm->reducing]);
        if (!st) st = st2;
        zm->reducing = -1;
    }
    if (acc->shard_world == 1) {
        accel_status st2 = finish_reduce(acc, pm, u);
        return st ? st : st2;
    }
    u->reduce = gst ? NULL : launch_reduce_scatter(acc, pm, u);
    if (!u->reduce) {
        u->grads_staged = false;
        return st ? st : accel_last_status() ? accel_last_status() : ACCEL_ERR_DIST;
    }
    zm->reducing = k;
    return st;
}

bool accel__zero3_grad_ready(accel_accelerator *acc, accel__model *pm, const accel_tensor *leaf) {
    accel__zero_model *zm = accel__zero_of(pm);
    const float *p = accel__device_ptr(leaf), *base = full_params(pm);
    if (p < base || p >= base + pm->fp->buffers[ACCEL_F32].numel) return false;
    int64_t pos = p - base;
    for (int k = zm->n_units - 1; k >= 0; k--) {
        accel__unit *u = &zm->units[k];
        if (pos < u->lo) continue;
        if (u->state != ACCEL__UNIT_GATHERED && !zm->unhooked) zm->unhooked = k + 1;
        if (u->pending > 0 && --u->pending == 0) {
            accel_status st = launch_reduce(acc, pm, k);
            /* BACKWARD_POST: the unit's gradients exist, the one before it comes next */
            if (!st && acc->fsdp.backward_prefetch && acc->fsdp.backward_post)
                st = prefetch(acc, pm, order_neighbour(pm, k, -1));
            if (st && !zm->reduce_status) zm->reduce_status = st;
        }
        break;
    }
    return true;
}

/* A unit used without its hooks running (a module called around
 * accel_module_call / enter / exit) computed with released parameters. */
static accel_status unhooked_error(accel__model *pm, int u) {
    accel__zero_model *zm = accel__zero_of(pm);
    char path[256] = "(root)";
    for (int i = 0; i < zm->n_hooked; i++)
        if (zm->hooked_unit[i] == u && zm->hooked[i] != pm->m) accel_module_path(zm->hooked[i], path, sizeof path);
    return accel_set_error(ACCEL_ERR_STATE,
                           "accel_accelerator_backward: ZeRO-3 unit \"%s\" was used without its forward hooks "
                           "running (its module is not called through accel_module_call or accel_module_enter/exit), "
                           "so it computed with sharded-away parameters; choose another fsdp_auto_wrap_policy",
                           path);
}

accel_status accel__zero3_end_backward(accel_accelerator *acc, accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel_status first = zm->reduce_status;
    for (int k = 0; k < zm->n_units; k++) { /* units whose leaves got no gradient: same order everywhere */
        if (zm->units[k].reduced) continue;
        accel_status st = launch_reduce(acc, pm, k);
        if (!first) first = st;
    }
    if (zm->reducing >= 0) {
        accel_status st = finish_reduce(acc, pm, &zm->units[zm->reducing]);
        if (!first) first = st;
        zm->reducing = -1;
    }
    for (int k = 0; k < zm->n_units; k++) { /* a prefetch that found no use: no gather outlives backward */
        accel_status st = zm->units[k].state == ACCEL__UNIT_RELEASED ? ACCEL_OK : release(acc, pm, &zm->units[k]);
        if (!first) first = st;
    }
    zm->order_done = true;
    if (!first && zm->unhooked) first = unhooked_error(pm, zm->unhooked - 1);
    return first;
}

accel_status accel__zero3_after_step(accel_accelerator *acc, accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel_status first = shard_evict(pm, 0, zm->zn); /* the step wrote it */
    for (int k = 0; k < zm->n_units; k++) {
        accel__unit *u = &zm->units[k];
        accel_status st = release(acc, pm, u);
        if (!st && u->persistent) { /* the updated shards, to every rank now */
            u->state = ACCEL__UNIT_RELEASED;
            st = gather(acc, pm, u, false);
        }
        if (!first) first = st;
    }
    return first;
}

/* Unit u's f32 masters into its range of the full buffer, whatever its
 * reduction or gather left (collective). The gather's status: on a broken
 * group, or a mapping that failed on any rank (agreed), the range holds no
 * weights. (A reduction or earlier gather that failed leaves the masters
 * as they are: the gather here still brings them.) */
static accel_status gather_masters(accel_accelerator *acc, accel__model *pm, accel__unit *u) {
    accel__zero_model *zm = accel__zero_of(pm);
    if (u->reduce) finish_reduce(acc, pm, u);
    if (u->state == ACCEL__UNIT_GATHERING) finish_gather(acc, pm, u);
    u->state = ACCEL__UNIT_RELEASED; /* a unit gathered in bf16 comes back as its f32 masters */
    return zm->zparams ? gather(acc, pm, u, true) : ACCEL_OK;
}

/* Tensor t of the flat buffer into memory of its own on the model's device,
 * with a zeroed gradient of its own, as accel_flat_params_free gives a
 * tensor: its values copied from its gathered unit, or zeros when the unit
 * could not be gathered (`copy` false). False when out of memory (or the
 * copy failed): t is left as it was. */
static bool own_storage(accel__model *pm, accel_tensor *t, bool copy) {
    accel_device dev = model_device(pm);
    void *own = accel__device_alloc(dev, accel_nbytes(t), !copy, "accel_accelerator_clear");
    accel_tensor *g = own ? accel_tensor_new(t->dtype, t->ndim, t->shape, dev) : NULL;
    if (!g || accel_zero_(g) || (copy && accel__copy_bytes(dev, own, dev, accel__device_ptr(t), accel_nbytes(t))) ||
        accel_tensor_rebind(t, own, false)) {
        accel_tensor_free(g);
        accel__device_free(dev, own);
        return false;
    }
    t->flags |= ACCEL_TF_OWNS_DATA;
    accel__tensor_free_grad(t->grad, true); /* a view of the full gradient buffer */
    g->flags |= ACCEL_TF_GRAD;
    t->grad = g;
    return true;
}

/* The first unit clear could not gather (its index, status and error) and
 * the count of tensors left without data, for the error clear reports. */
typedef struct clear_loss {
    int unit, tensors;
    accel_status st;
    char why[384]; /* the failed gather's error */
} clear_loss;

/* Out of memory for t of unit `there` or not: a tensor of a gathered unit
 * stays in it, kept at b's slot *kept for accel_flat_params_free to copy
 * out; one of a unit whose range holds nothing (unmapped on a device) gets
 * no data, better than a copy from memory that is not there. Either way
 * without a gradient. */
static void no_own_storage(accel_flat_buffer *b, int t, bool there, int *kept, clear_loss *loss) {
    accel_tensor *x = b->tensors[t];
    accel__tensor_drop_grad(x); /* a view of the full gradient buffer */
    if (!there) {
        /* a parameter of the flat buffer, contiguous and persistent: cannot fail */
        (void)accel_tensor_rebind(x, NULL, false);
        loss->tensors++;
        return;
    }
    b->offsets[*kept] = b->offsets[t];
    b->tensors[(*kept)++] = x;
}

/* What the release lost, as its error (accel_accelerator_clear returns
 * it): a unit whose gather failed, on every rank alike, comes back as zeros
 * (or, out of memory, without data). */
static accel_status report_clear_loss(accel_accelerator *acc, const clear_loss *loss) {
    if (!loss->st && !loss->tensors) return ACCEL_OK;
    return accel_set_error(loss->st ? loss->st : ACCEL_ERR_OOM,
                           "ZeRO-3 release: rank %d: unit %d could not be gathered (%s): its parameters came back "
                           "as zeros, %d tensor(s) without data",
                           acc->rank, loss->unit, loss->st ? loss->why : "out of device memory", loss->tensors);
}

/* The full weights back into memory of each tensor's own, for
 * accel_flat_params_free, unit by unit: each unit is gathered, its tensors
 * copied out, and it is released, so the device holds one unit gathered
 * beside the tensors' own memory (parameters and gradients: 2P + L; every
 * unit gathered and then a plain copy of both full buffers made 4P). A unit
 * that a broken group (or a failed mapping) could not gather comes back as
 * zeros, and the release says so (report_clear_loss). Out of memory, the tensors
 * not yet moved stay in their gathered units (no_own_storage: the reserved
 * memory then stays, the flat buffer forgets it and keeps only them), those
 * of a unit not gathered get no data. Every unit is still gathered, on
 * every rank: the gathers are collectives. */
static accel_status to_own_storage(accel_accelerator *acc, accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel_flat_buffer *b = &pm->fp->buffers[ACCEL_F32];
    int kept = 0;
    bool oom = false;
    clear_loss loss = {.unit = -1};
    for (int k = 0; k < zm->n_units; k++) {
        accel__unit *u = &zm->units[k];
        accel_status st = zm->sharded ? gather_masters(acc, pm, u) : ACCEL_OK;
        if (st && !loss.st) {
            loss.unit = k;
            loss.st = st;
            snprintf(loss.why, sizeof loss.why, "%s", accel_last_error());
        }
        bool there = u->params_mapped;
        for (int t = u->first; t < u->first + u->count; t++) {
            if (!oom && own_storage(pm, b->tensors[t], there)) continue;
            oom = true;
            if (loss.unit < 0 && !there) loss.unit = k;
            no_own_storage(b, t, there, &kept, &loss);
        }
        if (!oom) release(acc, pm, u);
    }
    b->n = kept;
    if (!kept) {
        unmap_all(acc, pm, b->params, b->grads, zm->n_units);
        full_free(pm, b->params, b->numel);
        full_free(pm, b->grads, b->numel);
    }
    b->params = b->grads = NULL;
    return report_clear_loss(acc, &loss);
}

accel_status accel__zero3_release(accel_accelerator *acc, accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    remove_hooks(pm);
    accel_flat_buffer *b = &pm->fp->buffers[ACCEL_F32];
    accel_free(zm->hooked);
    accel_free(zm->hooked_unit);
    accel_free(zm->order);
    zm->hooked = NULL;
    zm->hooked_unit = NULL;
    zm->order = NULL;
    zm->n_hooked = zm->n_order = 0;
    zm->order_done = false;
    accel_status st = zm->units && b->params ? to_own_storage(acc, pm) : ACCEL_OK; /* the full weights */
    shard_free(pm);
    shard_mem_free(pm, zm->zsend16);
    shard_mem_free(pm, zm->zgrad);
    zm->zsend16 = NULL;
    zm->zgrad = NULL;
    device_buffers_free(pm);
    return st;
}

accel_status accel__zero3_gather_unit(accel_accelerator *acc, accel__model *pm, int u) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel__unit *un = &zm->units[u];
    accel_status st = un->state == ACCEL__UNIT_GATHERING ? finish_gather(acc, pm, un) : ACCEL_OK;
    un->state = ACCEL__UNIT_RELEASED; /* the f32 masters, even where a bf16 gather left rounded values */
    accel_status st2 = gather(acc, pm, un, true);
    return st ? st : st2;
}

accel_status accel__zero3_release_unit(accel_accelerator *acc, accel__model *pm, int u) {
    accel__zero_model *zm = accel__zero_of(pm);
    return release(acc, pm, &zm->units[u]);
}
