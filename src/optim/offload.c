/* Where an optimizer keeps its state: on its parameters' device (the
 * default), in host memory, or in a file (DeepSpeed's ZeRO-Offload,
 * offload_optimizer.device cpu / nvme; docs/accelerator.md "Offload").
 *
 * Off the device the step runs on the host, one block of elements at a time:
 * the parameters and gradients of a device the host cannot address are
 * copied into host blocks and the updated parameters copied back; state in a
 * file is read into a host block (pread), updated and written back (pwrite).
 * The update kernels are elementwise, so a step in blocks equals the step in
 * one piece bit for bit, and the memory holding a file's state is the host
 * buffer of n_blocks blocks whatever the state's size. That buffer is
 * allocated once, pinned when the parameters' device can pin host memory
 * (accel__stage_alloc), so every step's copies run from pinned memory.
 *
 * The file (one per optimizer, named after its tag) is created in the
 * directory given and unlinked at once (so the space of a killed process's
 * state goes back to the disk with the process: no stale files), its space
 * reserved with posix_fallocate as segments are laid out (a full disk fails
 * there, before any step), and freed when the state leaves it. A segment's state is a range of it: kind k of segment s at
 * elements [s->file_off + k * numel, + numel). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/host_stage.h"
#include "optim_internal.h"

typedef struct accel__offload {
    accel__state_home home;
    int fd;                /* HOME_FILE, else -1 */
    char *path;
    int64_t file_elems;    /* elements laid out so far (ranges are never reused) */
    int64_t block;         /* elements per block */
    int n_blocks;
    accel_device stage_dev; /* the device whose copies buf serves (pinned for it where it can be) */
    float *buf;            /* n_blocks x block host floats, allocated once (core/host_stage.h) */
    accel_status broken;   /* a write failed in a step: the file no longer matches the parameters */
} accel__offload;

static const char *FN = "accel_optimizer_step";

static accel_device seg_home_device(const accel__offload *o, const accel__segment *s) {
    return o && o->home == ACCEL__HOME_HOST ? ACCEL_CPU_DEVICE : accel__seg_device(s);
}

/* ---------------------------------------------------------------- the file */

static accel_status file_error(const accel__offload *o, const char *what, int64_t elem, int err) {
    return accel_set_error(err == ENOSPC || err == EDQUOT ? ACCEL_ERR_OOM : ACCEL_ERR_IO,
                           "optimizer state file %s: %s at byte %lld: %s", o->path, what, (long long)elem * 4,
                           strerror(err));
}

/* n floats at element elem of the file into dst: all of them or an error. */
static accel_status file_read(const accel__offload *o, int64_t elem, float *dst, int64_t n) {
    size_t want = (size_t)n * sizeof(float), got = 0;
    while (got < want) {
        ssize_t r = pread(o->fd, (char *)dst + got, want - got, (off_t)(elem * 4 + (int64_t)got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return file_error(o, r == 0 ? "short read (was it truncated?)" : "read failed", elem, r ? errno : EIO);
        got += (size_t)r;
    }
    return ACCEL_OK;
}

static accel_status file_write(const accel__offload *o, int64_t elem, const float *src, int64_t n) {
    size_t want = (size_t)n * sizeof(float), put = 0;
    while (put < want) {
        ssize_t r = pwrite(o->fd, (const char *)src + put, want - put, (off_t)(elem * 4 + (int64_t)put));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return file_error(o, "write failed", elem, r ? errno : ENOSPC);
        put += (size_t)r;
    }
    return ACCEL_OK;
}

/* The next n elements of the file, their disk space reserved. */
static accel_status file_reserve(accel__offload *o, int64_t n, int64_t *at) {
    accel_status st = accel__swap_reserve(o->fd, o->path, o->file_elems * 4, n * 4, "offload_optimizer",
                                          "optimizer state");
    if (st) return st;
    *at = o->file_elems;
    o->file_elems += n;
    return ACCEL_OK;
}

/* Gives a range's disk space back (it is never used again). */
static void file_release(const accel__offload *o, int64_t elem, int64_t n) {
    if (n) (void)fallocate(o->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(elem * 4), (off_t)(n * 4));
}

static accel_status file_open(accel__offload *o, const char *dir, const char *tag) {
    o->fd = accel__swap_create(dir, "accel_optimizer_state", tag, "offload_optimizer", "optimizer state", &o->path);
    return o->fd < 0 ? accel_last_status() : ACCEL_OK;
}

/* ---------------------------------------------------------------- swap files
 * Shared with ZeRO-3's parameter shard under offload_param nvme (zero3.c). */

int accel__swap_create(const char *dir, const char *prefix, const char *tag, const char *section, const char *what,
                       char **path) {
    size_t len = strlen(dir) + strlen(prefix) + strlen(tag ? tag : "") + 64;
    *path = accel_malloc(len);
    if (!*path) return -1;
    /* a name of its own, new (O_EXCL), mode 0600: whatever else is in the
     * directory, and whichever thread asks */
    snprintf(*path, len, "%s/%s_%s_%ld_XXXXXX.swp", dir, prefix, tag ? tag : "", (long)getpid());
    int fd = mkostemps(*path, 4, O_CLOEXEC);
    if (fd < 0)
        accel_set_error(ACCEL_ERR_IO, "%s: cannot create the %s file %s: %s (nvme_path must be a writable "
                        "directory)", section, what, *path, strerror(errno));
    else /* nameless from here on: a killed process's space goes with it, as its memory would */
        unlink(*path);
    return fd;
}

accel_status accel__swap_reserve(int fd, const char *path, int64_t at, int64_t n, const char *section,
                                 const char *what) {
    int err = n ? posix_fallocate(fd, (off_t)at, (off_t)n) : 0;
    if (err)
        return accel_set_error(err == ENOSPC || err == EDQUOT ? ACCEL_ERR_OOM : ACCEL_ERR_IO,
                               "%s file %s: cannot reserve %lld bytes of %s (up to byte %lld): %s (%s.nvme_path "
                               "needs room for this rank's %s)", what, path, (long long)n, what, (long long)(at + n),
                               strerror(err), section, what);
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- homes */

void accel__offload_free(accel__offload *o) {
    if (!o) return;
    if (o->fd >= 0) close(o->fd);
    accel_free(o->path);
    accel__stage_free(o->stage_dev, o->buf);
    accel_free(o);
}

/* The device the host blocks are staged to and from: the first segment's
 * device the host cannot address (their copies then run from pinned memory),
 * else the cpu (plain memory). */
static accel_device staging_device(const accel_optimizer *opt) {
    for (int i = 0; i < opt->n_segs; i++) {
        accel_device d = accel__seg_device(&opt->segs[i]);
        if (accel__backend_of(d) && !accel__device_host_addressable(d)) return d;
    }
    return ACCEL_CPU_DEVICE;
}

static accel__offload *offload_new(const accel_optimizer *opt, const accel__offload_opts *oo) {
    const char *fn = "offload_optimizer";
    if (oo->block_bytes < (int64_t)sizeof(float) || oo->n_blocks < 1) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: the host buffer needs blocks of at least 4 bytes and at least one "
                        "block (got %lld bytes x %d)", fn, (long long)oo->block_bytes, oo->n_blocks);
        return NULL;
    }
    accel__offload *o = accel_calloc(1, sizeof *o);
    if (!o) return NULL;
    o->home = oo->home;
    o->fd = -1;
    o->block = oo->block_bytes / (int64_t)sizeof(float);
    o->n_blocks = oo->n_blocks;
    o->stage_dev = staging_device(opt);
    o->buf = accel__stage_alloc(o->stage_dev, (size_t)(o->block * o->n_blocks) * sizeof(float), fn);
    if (!o->buf || (o->home == ACCEL__HOME_FILE && file_open(o, oo->dir, oo->tag))) {
        accel__offload_free(o);
        return NULL;
    }
    return o;
}

bool accel__seg_alloc_state(accel_optimizer *opt, accel__segment *s, int ns) {
    accel__offload *o = opt->off;
    int64_t n = s->numel;
    if (o && o->home == ACCEL__HOME_FILE) return ns == 0 || file_reserve(o, ns * n, &s->file_off) == ACCEL_OK;
    for (int k = 0; k < ns; k++)
        if (!(s->state[k] = accel_tensor_new(ACCEL_F32, 1, &n, seg_home_device(o, s)))) {
            accel__seg_free_state(opt, s);
            return false;
        }
    return true;
}

void accel__seg_free_state(accel_optimizer *opt, accel__segment *s) {
    accel__offload *o = opt->off;
    if (o && o->home == ACCEL__HOME_FILE) file_release(o, s->file_off, accel__n_state(opt, s->group) * s->numel);
    for (int k = 0; k < 2; k++) {
        accel_tensor_free(s->state[k]);
        s->state[k] = NULL;
    }
}

/* Elements [at, at + n) of state kind k of s, between its home (o) and host memory. */
static accel_status state_read(const accel__offload *o, const accel__segment *s, int k, int64_t at, float *dst,
                               int64_t n) {
    if (o && o->home == ACCEL__HOME_FILE) return file_read(o, s->file_off + k * s->numel + at, dst, n);
    return accel__tensor_read_bytes(s->state[k], (size_t)at * sizeof(float), dst, (size_t)n * sizeof(float));
}

static accel_status state_write(const accel__offload *o, accel__segment *s, int k, int64_t at, const float *src,
                                int64_t n) {
    if (o && o->home == ACCEL__HOME_FILE) return file_write(o, s->file_off + k * s->numel + at, src, n);
    return accel__tensor_write_bytes(s->state[k], (size_t)at * sizeof(float), src, (size_t)n * sizeof(float));
}

/* Copies state kind k of `from` (in home a) into `to` (in home b), one block at a time through bounce. */
static accel_status state_move(const accel__offload *a, const accel__segment *from, const accel__offload *b,
                               accel__segment *to, int k, float *bounce, int64_t block) {
    accel_status st = ACCEL_OK;
    for (int64_t at = 0; at < from->numel && !st; at += block) {
        int64_t n = from->numel - at < block ? from->numel - at : block;
        st = state_read(a, from, k, at, bounce, n);
        if (!st) st = state_write(b, to, k, at, bounce, n);
    }
    return st;
}

accel_status accel__optimizer_set_offload(accel_optimizer *opt, const accel__offload_opts *oo) {
    if (!opt) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel__optimizer_set_offload: optimizer is NULL");
    bool to_device = !oo || oo->home == ACCEL__HOME_DEVICE;
    if (to_device && !opt->off) return ACCEL_OK;
    accel__offload *old = opt->off, *nu = to_device ? NULL : offload_new(opt, oo);
    if (!to_device && !nu) return accel_last_status();
    /* The new home's state for every segment, filled from the old one. */
    accel__segment *moved = accel_calloc((size_t)(opt->n_segs + 1), sizeof *moved);
    accel_status st = moved ? ACCEL_OK : accel_last_status();
    const accel__offload *via = nu ? nu : old; /* whose buffer bounces the blocks */
    int made = 0;
    for (int i = 0; i < opt->n_segs && !st; i++) {
        accel__segment *s = &opt->segs[i];
        int ns = accel__n_state(opt, s->group);
        moved[i] = *s;
        moved[i].state[0] = moved[i].state[1] = NULL;
        opt->off = nu;
        bool ok = accel__seg_alloc_state(opt, &moved[i], ns);
        opt->off = old;
        if (!ok) {
            st = accel_last_status();
            break;
        }
        made = i + 1;
        for (int k = 0; k < ns && !st; k++) st = state_move(old, s, nu, &moved[i], k, via->buf, via->block);
    }
    if (st) { /* the optimizer as it was */
        opt->off = nu;
        for (int i = 0; i < made; i++) accel__seg_free_state(opt, &moved[i]);
        opt->off = old;
        accel__offload_free(nu);
    } else {
        for (int i = 0; i < opt->n_segs; i++) {
            accel__seg_free_state(opt, &opt->segs[i]);
            opt->segs[i] = moved[i];
        }
        opt->off = nu;
        accel__offload_free(old);
    }
    accel_free(moved);
    return st;
}

/* ---------------------------------------------------------------- the step */

accel_status accel__offload_check(const accel_optimizer *opt) {
    const accel__offload *o = opt->off;
    if (!o) return ACCEL_OK;
    if (o->broken)
        return accel_set_error(o->broken, "%s: an earlier step failed part-way, so the optimizer state (in %s) no "
                               "longer matches the parameters; load the last checkpoint (load_state)", FN,
                               o->path ? o->path : "host memory");
    return ACCEL_OK;
}

static accel_tensor *host_header(accel_tensor *h, float *p, int64_t n) {
    accel__tensor_header(h, p, ACCEL_F32, 1, &n, ACCEL_CPU_DEVICE);
    return h;
}

/* Elements [at, at + n) of the segment's parameters p and gradients g on the
 * host: their own memory on a host device, else blocks staged from it. */
static float *host_range(accel_tensor *t, int64_t at, int64_t n, float *block, accel_status *st) {
    if (accel__device_host_addressable(t->device)) return (float *)accel__host_ptr(t, FN) + at;
    if (!*st) *st = accel__tensor_read_bytes(t, (size_t)at * sizeof(float), block, (size_t)n * sizeof(float));
    return block;
}

accel_status accel__offload_update(accel_optimizer *opt, accel__segment *s, accel_tensor *p, accel_tensor *g) {
    accel__offload *o = opt->off;
    int ns = accel__n_state(opt, s->group);
    bool staged = !accel__device_host_addressable(p->device), in_file = o->home == ACCEL__HOME_FILE;
    int need = (in_file ? ns : 0) + (staged ? 2 : 0);
    if (need > o->n_blocks)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: the offload buffer has %d blocks, the step needs %d (%d "
                               "state kinds%s): raise offload_optimizer.buffer_count", FN, o->n_blocks, need,
                               in_file ? ns : 0, staged ? " + parameters and gradients" : "");
    accel_status st = ACCEL_OK;
    for (int64_t at = 0; at < s->numel && !st; at += o->block) {
        int64_t n = s->numel - at < o->block ? s->numel - at : o->block;
        float *blocks = o->buf, *hs[2] = {NULL, NULL};
        float *hp = host_range(p, at, n, blocks, &st), *hg = host_range(g, at, n, blocks + o->block, &st);
        blocks += staged ? 2 * o->block : 0;
        for (int k = 0; k < ns && !st; k++) {
            if (in_file) st = file_read(o, s->file_off + k * s->numel + at, hs[k] = blocks + k * o->block, n);
            else hs[k] = (float *)accel__host_ptr(s->state[k], FN) + at;
        }
        if (st) break;
        accel_tensor tp, tg, tm, tv;
        st = accel__seg_update(opt, s, host_header(&tp, hp, n), host_header(&tg, hg, n),
                               ns > 0 ? host_header(&tm, hs[0], n) : NULL, ns > 1 ? host_header(&tv, hs[1], n) : NULL);
        for (int k = 0; k < ns && in_file && !st; k++) st = file_write(o, s->file_off + k * s->numel + at, hs[k], n);
        if (!st && staged) st = accel__tensor_write_bytes(p, (size_t)at * sizeof(float), hp, (size_t)n * sizeof(float));
    }
    if (st) o->broken = st; /* blocks before the failure took the step, the others did not */
    return st;
}

/* ---------------------------------------------------------------- state access */

accel_tensor *accel__seg_state_tensor(accel_optimizer *opt, accel__segment *s, int k) {
    accel__offload *o = opt->off;
    if (!o || o->home != ACCEL__HOME_FILE)
        return accel_tensor_wrap(accel__device_ptr(s->state[k]), ACCEL_F32, 1, &s->numel, s->state[k]->device);
    accel_tensor *t = accel_tensor_new(ACCEL_F32, 1, &s->numel, ACCEL_CPU_DEVICE);
    if (t && file_read(o, s->file_off + k * s->numel, accel__host_ptr(t, "accel_optimizer_state"), s->numel)) {
        accel_tensor_free(t);
        return NULL;
    }
    return t;
}

accel_status accel__seg_state_load(accel_optimizer *opt, accel__segment *s, int k, accel_tensor *src) {
    accel__offload *o = opt->off;
    if (!o || o->home != ACCEL__HOME_FILE) {
        if (accel__device_ptr(src) == accel__device_ptr(s->state[k])) return ACCEL_OK; /* its own view */
        return accel_copy_(s->state[k], accel_reshape(src, 1, &s->numel));
    }
    accel_tensor *c = accel_contiguous(src);
    accel_status st = c ? ACCEL_OK : accel_last_status();
    for (int64_t at = 0; at < s->numel && !st; at += o->block) {
        int64_t n = s->numel - at < o->block ? s->numel - at : o->block;
        st = accel__tensor_read_bytes(c, (size_t)at * sizeof(float), o->buf, (size_t)n * sizeof(float));
        if (!st) st = file_write(o, s->file_off + k * s->numel + at, o->buf, n);
    }
    return st;
}

accel_status accel__seg_state_zero(accel_optimizer *opt, accel__segment *s) {
    accel__offload *o = opt->off;
    int ns = accel__n_state(opt, s->group);
    if (!o || o->home != ACCEL__HOME_FILE) {
        for (int k = 0; k < ns; k++)
            if (accel_zero_(s->state[k]) != ACCEL_OK) return accel_last_status();
        return ACCEL_OK;
    }
    memset(o->buf, 0, (size_t)o->block * sizeof(float));
    accel_status st = ACCEL_OK;
    for (int64_t at = 0; at < ns * s->numel && !st; at += o->block) {
        int64_t n = ns * s->numel - at < o->block ? ns * s->numel - at : o->block;
        st = file_write(o, s->file_off + at, o->buf, n);
    }
    if (!st) o->broken = ACCEL_OK; /* every segment restarts from here (load_state zeroes them all first) */
    return st;
}

int64_t accel__optimizer_state_bytes(const accel_optimizer *opt) {
    if (!opt) return 0;
    const accel__offload *o = opt->off;
    if (o && o->home == ACCEL__HOME_FILE) return o->block * o->n_blocks * (int64_t)sizeof(float);
    int64_t bytes = 0;
    for (int i = 0; i < opt->n_segs; i++)
        for (int k = 0; k < 2; k++)
            if (opt->segs[i].state[k]) bytes += accel_nbytes(opt->segs[i].state[k]);
    return bytes;
}

const char *accel__optimizer_state_path(const accel_optimizer *opt) {
    return opt && opt->off && opt->off->home == ACCEL__HOME_FILE ? opt->off->path : NULL;
}
