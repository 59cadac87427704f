/* Storage versions and the prepared-weight cache (core/prepared.h).
 *
 * The registry of tracked storages is an array of their byte ranges sorted by
 * first byte, under a reader-writer lock: a reported write takes it to read
 * (writes from several threads go on at once; the versions are atomic) and
 * finds the first range it may overlap by binary search; starting or
 * stopping tracking takes it to write. A write outside the envelope (the
 * lowest to the highest tracked byte), or into the calling thread's step
 * arena, takes no lock at all: no tracked storage lies in step memory (track
 * refuses one). Forms are built under their owner's own lock (a build
 * converts a whole weight), so threads building forms of different weights
 * do not wait for each other; the lock is never held across another
 * owner's build, and a build reports its form's write without holding the
 * registry's lock. Lock order: an owner's build lock, then the registry's,
 * then the graves' (each of those two held for bookkeeping only); a
 * writer's refresh (accel__prepared_rewrite) also takes its form's own
 * entry's build lock under the owner's (and rebuilds that entry's forms
 * there), never the other way: no build of the form's forms (oneDNN's
 * reorders) touches the owner.
 *
 * An entry is freed by its last reference: the registry holds one while the
 * entry is tracked, and every accel__prepared_get takes one, under the
 * registry's lock, for as long as it uses the entry. So a thread that found
 * the entry and waits for (or holds) its build lock keeps it alive while
 * another detaches it (the owner's storage moved or was released); the
 * build lock cannot be taken under the registry's instead, since a build
 * takes the registry's lock under its own (it reports its form's write). */
#include "core/prepared.h"
#include "core/env.h"
#include "core/step_casts.h"

#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core_internal.h"

/* A released form that a live tape may read: freed when its step ends. */
typedef struct grave {
    accel_tensor *t;
    const accel_arena *arena;
    struct grave *next;
} grave;

typedef struct form {
    accel__form_key key;
    uint64_t version;          /* the owner's version it was built from */
    accel_tensor *t;           /* persistent; NULL: slot free */
    accel__form_fill fill;     /* what built it, to build it again (refresh_forms) */
    accel_dtype form_dt;
    grave *spare;              /* allocated with t, so dropping t never allocates */
    const accel_arena *arena;  /* the step that last handed it out: its tape may read it */
    uint32_t gen;
    bool shared;               /* handed out to more than one thread since built: a tape
                                * other than the last one's may read it */
} form;

struct accel__prepared {
    accel_tensor *owner;
    uintptr_t lo, hi;          /* the owner's storage bytes when tracking began */
    _Atomic uint64_t version;  /* bumped under the registry's read lock, by any thread */
    atomic_int refs;           /* the registry's while tracked, and each get's in flight */
    pthread_mutex_t build;     /* guards forms[] */
    form forms[ACCEL__PREPARED_FORMS];
};

/* One tracked range; `reach` is the highest hi of it and every range before
 * it in the array (ranges may nest or overlap: a flat buffer and the
 * parameters rebound into it), so reach grows along the array and a binary
 * search on it finds the first range that can end after a write begins. */
typedef struct span {
    uintptr_t lo, hi, reach;
    accel__prepared *e;
} span;

static pthread_rwlock_t g_reg_lock = PTHREAD_RWLOCK_INITIALIZER;
static pthread_mutex_t g_grave_lock = PTHREAD_MUTEX_INITIALIZER;
static span *g_reg; /* sorted by lo; under g_reg_lock */
static int g_n, g_cap;
static atomic_int g_tracked;
static _Atomic uintptr_t g_env_lo = UINTPTR_MAX, g_env_hi; /* covers every tracked range */
static grave *g_graves;
static atomic_llong g_bytes;
static atomic_ullong g_builds, g_hits, g_rewrites;
static atomic_int g_enabled = -1; /* -1: not read from the environment yet */

/* ---- versions */

/* The first span whose reach passes lo: no span before it overlaps [lo, ...). */
static int first_reaching(uintptr_t lo) {
    int a = 0, b = g_n;
    while (a < b) {
        int m = a + (b - a) / 2;
        if (g_reg[m].reach > lo) b = m;
        else a = m + 1;
    }
    return a;
}

void accel__storage_written(const void *p, size_t n) {
    if (!p || !n) return;
    accel__step_casts_written(p, n);
    if (!atomic_load_explicit(&g_tracked, memory_order_acquire)) return;
    uintptr_t lo = (uintptr_t)p, hi = lo + n;
    if (hi <= atomic_load_explicit(&g_env_lo, memory_order_relaxed) ||
        lo >= atomic_load_explicit(&g_env_hi, memory_order_relaxed))
        return;
    if (accel__in_own_step_arena(p, n)) return; /* step copies: no tracked byte there (see host_address) */
    pthread_rwlock_rdlock(&g_reg_lock);
    for (int i = first_reaching(lo); i < g_n && g_reg[i].lo < hi; i++)
        if (g_reg[i].hi > lo) atomic_fetch_add_explicit(&g_reg[i].e->version, 1, memory_order_relaxed);
    pthread_rwlock_unlock(&g_reg_lock);
}

bool accel__tensor_span(const accel_tensor *t, uintptr_t *lo, uintptr_t *hi) {
    int64_t first, last;
    if (!t || !t->data || accel_numel(t) == 0 || !accel__element_span(t->ndim, t->shape, t->stride, 0, &first, &last))
        return false;
    int64_t es = (int64_t)accel_dtype_size(t->dtype);
    *lo = (uintptr_t)((const char *)t->data + first * es);
    *hi = (uintptr_t)((const char *)t->data + (last + 1) * es);
    return true;
}

void accel__tensor_written(const accel_tensor *t) {
    uintptr_t lo, hi;
    if ((atomic_load_explicit(&g_tracked, memory_order_acquire) || accel__step_casts_held()) &&
        accel__tensor_span(t, &lo, &hi))
        accel__storage_written((const void *)lo, hi - lo);
}

accel_status accel_tensor_increment_version(accel_tensor *t) {
    if (!accel_tensor_check(t, "accel_tensor_increment_version", "t")) return accel_last_status();
    accel__tensor_written(t);
    return ACCEL_OK;
}

/* ---- the registry (callers hold g_reg_lock to write) */

/* A persistent tensor with a heap header (accel_tensor_new, a parameter, a
 * buffer, a mapping): never a stack header made by accel__tensor_header,
 * which would leave the registry pointing at a dead frame. */
static bool trackable(const accel_tensor *t) {
    const uint32_t heap = ACCEL_TF_OWNS_DATA | ACCEL_TF_PARAM | ACCEL_TF_BUFFER | ACCEL_TF_MMAP;
    return !(t->flags & ACCEL_TF_ARENA) && (t->flags & heap) && t->device.type != ACCEL_DEV_META && t->data &&
           accel_is_contiguous(t) && accel_numel(t) > 0;
}

/* Recomputes every reach from index i on, and the envelope. */
static void reach_from(int i) {
    for (; i < g_n; i++) {
        uintptr_t before = i ? g_reg[i - 1].reach : 0;
        g_reg[i].reach = g_reg[i].hi > before ? g_reg[i].hi : before;
    }
    atomic_store(&g_env_lo, g_n ? g_reg[0].lo : UINTPTR_MAX);
    atomic_store(&g_env_hi, g_n ? g_reg[g_n - 1].reach : 0);
    atomic_store_explicit(&g_tracked, g_n, memory_order_release);
}

static bool reg_reserve(void) {
    if (g_n < g_cap) return true;
    int cap = g_cap ? 2 * g_cap : 64;
    span *r = accel_malloc(sizeof *r * (size_t)cap);
    if (!r) return false;
    if (g_n) memcpy(r, g_reg, sizeof *r * (size_t)g_n);
    accel_free(g_reg);
    g_reg = r, g_cap = cap;
    return true;
}

static void reg_insert(accel__prepared *e) {
    int i = g_n;
    while (i > 0 && g_reg[i - 1].lo > e->lo) i--;
    memmove(g_reg + i + 1, g_reg + i, sizeof *g_reg * (size_t)(g_n - i));
    g_reg[i] = (span){e->lo, e->hi, 0, e};
    g_n++;
    reach_from(i);
}

static void reg_remove(const accel__prepared *e) {
    int i = first_reaching(e->lo);
    while (g_reg[i].e != e) i++; /* e is tracked: it lies at or after i */
    memmove(g_reg + i, g_reg + i + 1, sizeof *g_reg * (size_t)(g_n - i - 1));
    g_n--;
    reach_from(i);
    if (!g_n) {
        accel_free(g_reg);
        g_reg = NULL, g_cap = 0;
    }
}

static accel__prepared *entry_new(accel_tensor *t) {
    accel__prepared *e = accel_calloc(1, sizeof *e);
    if (!e) return NULL;
    if (pthread_mutex_init(&e->build, NULL) != 0) {
        accel_free(e);
        accel_set_error(ACCEL_ERR_OOM, "prepared weight: cannot create a lock");
        return NULL;
    }
    e->owner = t;
    atomic_init(&e->refs, 1); /* the registry's */
    e->lo = (uintptr_t)t->data;
    e->hi = e->lo + accel_nbytes(t);
    return e;
}

static void entry_free(accel__prepared *e) {
    pthread_mutex_destroy(&e->build);
    accel_free(e);
}

/* A header copied from a tracked tensor (a stack view of it) must not take
 * the entry over: it is the original's. Only under the registry's lock (to
 * read or write): t->prepared changes under it to write, and the entry it
 * points to is freed only after that, so a test made before the lock could
 * read a freed entry (another thread saw the owner's storage move and
 * detached it). */
static bool copied_header(const accel_tensor *t) { return t->prepared && t->prepared->owner != t; }

/* t's entry when it is the owner of one (the registry's lock held either way). */
static accel__prepared *own_entry(const accel_tensor *t) {
    return t->prepared && t->prepared->owner == t ? t->prepared : NULL;
}

/* A storage inside a step arena is host memory (accel__device_host_addressable).
 *
 * The registry keys storages by address alone, whatever their device, and
 * accel__storage_written returns before looking a write up when its bytes
 * lie in the writer's own step arena (host memory). Both are right only if
 * no device's memory has an address that is also a host one: true of the
 * backends there are (the cpu's memory is the host's; CUDA's unified
 * addressing gives device and pinned memory addresses of their own in the
 * process; the hostless device's pointers carry a tag in bits 48..55). A
 * device storage found inside a step arena would mean a backend whose
 * addresses alias the host's: its writes could be skipped, so that is an
 * assertion, not a silent miss.
 *
 * t's entry, tracking t if it was not: *out NULL with ACCEL_OK when t's
 * storage lies in step memory (it is a step buffer whatever its header says:
 * writes there are not looked up, see accel__storage_written). */
static accel_status track(accel_tensor *t, accel__prepared **out) {
    *out = own_entry(t);
    if (*out) return ACCEL_OK;
    if (accel__step_arena_overlaps(t->data, accel_nbytes(t))) {
        ACCEL_ASSERT(accel__device_host_addressable(t->device)); /* a device address that is a host one: above */
        return ACCEL_OK;
    }
    accel__prepared *e = reg_reserve() ? entry_new(t) : NULL;
    if (!e) return accel_last_status();
    reg_insert(e);
    t->prepared = e;
    *out = e;
    return ACCEL_OK;
}

uint64_t accel__tensor_version(accel_tensor *t) {
    if (!t || !trackable(t)) return 0;
    pthread_rwlock_rdlock(&g_reg_lock);
    bool copy = copied_header(t);
    accel__prepared *e = copy ? NULL : own_entry(t);
    uint64_t v = e ? atomic_load(&e->version) : 0;
    pthread_rwlock_unlock(&g_reg_lock);
    if (e || copy) return v; /* a copy is not tracked: 0 (an owner never becomes one) */
    pthread_rwlock_wrlock(&g_reg_lock);
    accel_status st = track(t, &e);
    v = st == ACCEL_OK && e ? atomic_load(&e->version) : 0;
    pthread_rwlock_unlock(&g_reg_lock);
    return v;
}

/* ---- forms */

/* Whether the calling thread's current step may hold f in its tape. */
static bool in_current_step(const form *f) {
    const accel_arena *a = accel_step_arena();
    return f->arena != a || f->gen == accel_arena_generation(a);
}

static void form_handed_out(form *f) {
    if (f->arena && f->arena != accel_step_arena()) f->shared = true;
    f->arena = accel_step_arena();
    f->gen = accel_arena_generation(f->arena);
}

/* Frees f's tensor now, or when the step that last handed it out ends. */
static void form_drop(form *f) {
    if (!f->t) return;
    atomic_fetch_sub(&g_bytes, (long long)accel_nbytes(f->t));
    grave *g = f->spare;
    if (f->arena && in_current_step(f)) {
        g->t = f->t, g->arena = f->arena;
        pthread_mutex_lock(&g_grave_lock);
        g->next = g_graves, g_graves = g;
        pthread_mutex_unlock(&g_grave_lock);
    } else {
        accel_tensor_free(f->t);
        accel_free(g);
    }
    memset(f, 0, sizeof *f);
}

/* Frees a detached entry's forms and the entry. */
static void entry_drop(accel__prepared *e) {
    for (int i = 0; i < ACCEL__PREPARED_FORMS; i++) form_drop(&e->forms[i]);
    entry_free(e);
}

/* Drops a reference to e: the last one (e detached, no get using it) frees it. */
static void entry_put(accel__prepared *e) {
    if (atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1) entry_drop(e);
}

/* A reference to e for a get (the registry's lock held, so e is tracked). */
static accel__prepared *entry_get(accel__prepared *e) {
    if (e) atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
    return e;
}

void accel__prepared_release(accel_tensor *t) {
    if (!t || !t->prepared) return;
    pthread_rwlock_wrlock(&g_reg_lock);
    accel__prepared *e = own_entry(t); /* not a header copied from the owner (a stack matrix view) */
    if (e) reg_remove(e);
    t->prepared = NULL;
    pthread_rwlock_unlock(&g_reg_lock);
    if (e) entry_put(e);
}

/* Unlinks the graves of arena a (every one when a is NULL) and frees them. */
static void graves_free(const accel_arena *a) {
    grave *dead = NULL;
    pthread_mutex_lock(&g_grave_lock);
    for (grave **p = &g_graves; *p;) {
        grave *g = *p;
        if (a && g->arena != a) {
            p = &g->next;
            continue;
        }
        *p = g->next;
        g->next = dead, dead = g;
    }
    pthread_mutex_unlock(&g_grave_lock);
    while (dead) {
        grave *n = dead->next;
        accel_tensor_free(dead->t);
        accel_free(dead);
        dead = n;
    }
}

void accel__prepared_sweep(void) { graves_free(accel_step_arena()); }

__attribute__((destructor)) static void free_graves_at_exit(void) { graves_free(NULL); }

static bool same_kind(const accel__form_key *a, const accel__form_key *b) {
    return a->kind == b->kind && a->dt == b->dt;
}

static bool key_eq(const accel__form_key *a, const accel__form_key *b) {
    return same_kind(a, b) && a->tag == b->tag;
}

/* The version no build is made from: a form taken over for another tag is rebuilt. */
#define NO_VERSION UINT64_MAX

/* The slot of key in e, or a free one, or a form of key's kind under another
 * tag that this step cannot read (taken over: its bytes are rebuilt), or
 * NULL when every slot holds another key. */
static form *form_slot(accel__prepared *e, const accel__form_key *key) {
    form *free_slot = NULL, *other_tag = NULL;
    for (int i = 0; i < ACCEL__PREPARED_FORMS; i++) {
        form *f = &e->forms[i];
        if (f->t && key_eq(&f->key, key)) return f;
        if (!f->t && !free_slot) free_slot = f;
        if (f->t && key->tag && same_kind(&f->key, key) && !other_tag && !in_current_step(f)) other_tag = f;
    }
    if (free_slot || !other_tag) return free_slot;
    other_tag->key = *key;
    other_tag->version = NO_VERSION;
    return other_tag;
}

/* Builds (or rebuilds in place) f from owner at version v. */
static accel_status form_build(form *f, accel_tensor *owner, const accel__form_key *key, accel_dtype form_dt,
                               accel__form_fill fill, uint64_t v) {
    if (!f->t) {
        grave *spare = accel_malloc(sizeof *spare);
        accel_tensor *t = spare ? accel_tensor_new(form_dt, owner->ndim, owner->shape, owner->device) : NULL;
        if (!t) {
            accel_free(spare);
            return spare ? accel_last_status() : accel_set_error(ACCEL_ERR_OOM, "prepared weight: out of memory");
        }
        f->t = t, f->spare = spare;
        f->key = *key;
        atomic_fetch_add(&g_bytes, (long long)accel_nbytes(f->t));
    }
    accel_status st = fill(f->t, owner, key);
    if (st != ACCEL_OK) {
        form_drop(f);
        return st;
    }
    f->version = v;
    f->fill = fill, f->form_dt = form_dt;
    f->shared = false;
    atomic_fetch_add(&g_builds, 1);
    return ACCEL_OK;
}

/* Whether e was made from t's current storage. */
static bool entry_current(const accel__prepared *e, const accel_tensor *t) {
    return e->lo == (uintptr_t)t->data && e->hi - e->lo == accel_nbytes(t);
}

/* The entry of owner with its current storage, referenced for the caller
 * (entry_put when done; *out NULL when owner cannot be tracked or is a
 * header copied from a tracked tensor). The usual
 * case, an entry of the current storage, takes the registry's lock to read.
 * An entry whose owner's storage moved under it (its forms are of other
 * bytes) is detached under the same write lock that tracks the new one, so
 * two threads that both see the move drop the registry's reference once. */
static accel_status entry_for(accel_tensor *owner, accel__prepared **out) {
    pthread_rwlock_rdlock(&g_reg_lock);
    bool copy = copied_header(owner);
    accel__prepared *e = copy ? NULL : own_entry(owner);
    *out = entry_get(e && entry_current(e, owner) ? e : NULL);
    pthread_rwlock_unlock(&g_reg_lock);
    if (*out || copy) return ACCEL_OK; /* a copy's prepared is never another thread's to change */
    pthread_rwlock_wrlock(&g_reg_lock);
    accel__prepared *moved = own_entry(owner);
    if (moved && !entry_current(moved, owner)) {
        reg_remove(moved);
        owner->prepared = NULL;
    } else {
        moved = NULL;
    }
    accel_status st = track(owner, out);
    entry_get(*out);
    pthread_rwlock_unlock(&g_reg_lock);
    if (moved) entry_put(moved);
    return st;
}

/* The form `key` of e (its build lock held). */
static accel_status form_get(accel__prepared *e, const accel__form_key *key, accel_dtype form_dt,
                             accel__form_fill fill, accel_tensor **out, bool *built) {
    uint64_t v = atomic_load(&e->version);
    form *f = form_slot(e, key);
    if (!f) return ACCEL_OK;
    if (f->t && f->version == v) {
        atomic_fetch_add(&g_hits, 1);
    } else {
        if (f->t && in_current_step(f)) return ACCEL_OK; /* this step's tape may read the old values */
        accel_status st = form_build(f, e->owner, key, form_dt, fill, v);
        if (st != ACCEL_OK) return st;
        if (built) *built = true;
    }
    form_handed_out(f);
    *out = f->t;
    return ACCEL_OK;
}

bool accel__prepared_can_hold(const accel_tensor *owner) {
    return owner && accel__prepared_enabled() && trackable(owner);
}

bool accel__prepared_enabled(void) {
    int on = atomic_load(&g_enabled);
    if (on < 0) {
        bool v = true;
        if (accel__env_bool("ACCEL_WEIGHT_CACHE", true, &v) != ACCEL_OK) { /* a tuning switch: said, not refused (it changes no result) */
            fprintf(stderr, "accel: warning: %s; the weight cache stays on\n", accel_last_error());
            accel_clear_error();
            v = true;
        }
        on = v;
        atomic_store(&g_enabled, on);
    }
    return on;
}

bool accel__prepared_set_enabled(bool on) {
    bool was = accel__prepared_enabled();
    atomic_store(&g_enabled, on);
    return was;
}

accel_status accel__prepared_get(accel_tensor *owner, const accel__form_key *key, accel_dtype form_dt,
                                 accel__form_fill fill, accel_tensor **out, bool *built) {
    *out = NULL;
    if (built) *built = false;
    if (!accel__prepared_enabled() || !owner || !trackable(owner)) return ACCEL_OK;
    accel__prepared *e;
    accel_status st = entry_for(owner, &e);
    if (st != ACCEL_OK || !e) return st;
    pthread_mutex_lock(&e->build);
    st = form_get(e, key, form_dt, fill, out, built);
    pthread_mutex_unlock(&e->build);
    entry_put(e);
    return st;
}

/* ---- a writer's refresh of the autocast form */

/* Whether f may be overwritten now: no tape can read it (see
 * accel__prepared_rewrite). A form another thread was handed since it was
 * built never is: that thread's tape may still hold it, and only the last
 * thread to take it is remembered. Makes no step arena for a thread that has
 * none (an optimizer's own thread): no form can be of its steps then. */
static bool form_writable(const form *f, accel__tape_done tape_done) {
    const accel_arena *mine = accel__step_arena_if_made();
    if (f->shared || !mine || f->arena != mine) return false;
    return f->gen != accel_arena_generation(mine) || tape_done();
}

/* e's untagged autocast form (CAST or ROUNDED_F32) that may be overwritten now, or NULL. */
static form *cast_form(accel__prepared *e, accel__tape_done tape_done) {
    for (int i = 0; i < ACCEL__PREPARED_FORMS; i++) {
        form *f = &e->forms[i];
        bool cast = f->key.kind == ACCEL__FORM_CAST || f->key.kind == ACCEL__FORM_ROUNDED_F32;
        if (f->t && cast && !f->key.tag && form_writable(f, tape_done)) return f;
    }
    return NULL;
}

/* The entry of owner with its current storage, referenced for the caller,
 * or NULL: never starts tracking (a writer needs no entry to write). */
static accel__prepared *entry_if_tracked(accel_tensor *owner) {
    pthread_rwlock_rdlock(&g_reg_lock);
    accel__prepared *e = copied_header(owner) ? NULL : own_entry(owner);
    e = entry_get(e && entry_current(e, owner) ? e : NULL);
    pthread_rwlock_unlock(&g_reg_lock);
    return e;
}

/* The slots of e's forms built from its current version, as a bit mask
 * (e's build lock taken here). */
static unsigned current_forms(accel__prepared *e) {
    unsigned mask = 0;
    pthread_mutex_lock(&e->build);
    uint64_t v = atomic_load(&e->version);
    for (int i = 0; i < ACCEL__PREPARED_FORMS; i++)
        if (e->forms[i].t && e->forms[i].version == v) mask |= 1u << i;
    pthread_mutex_unlock(&e->build);
    return mask;
}

/* Builds again, from e's owner as it is now, the forms of mask that a
 * write left behind, where no tape can read them (form_writable); the
 * others rebuild at their next get, as after any write. A build that fails
 * drops its form (rebuilt at its next get too): the writer's call, which
 * succeeded, does not fail for it and leaves no error. */
static void refresh_forms(accel__prepared *e, unsigned mask, accel__tape_done tape_done) {
    pthread_mutex_lock(&e->build);
    uint64_t v = atomic_load(&e->version);
    for (int i = 0; i < ACCEL__PREPARED_FORMS; i++) {
        form *g = &e->forms[i];
        if (!(mask >> i & 1u) || !g->t || g->version == v || !form_writable(g, tape_done)) continue;
        accel__form_key key = g->key;
        if (form_build(g, e->owner, &key, g->form_dt, g->fill, v) != ACCEL_OK) accel_clear_error();
    }
    pthread_mutex_unlock(&e->build);
}

accel_status accel__prepared_rewrite(accel_tensor *owner, accel__tape_done tape_done, accel__form_rewrite write,
                                     void *ctx) {
    accel__prepared *e = owner && accel__prepared_enabled() && trackable(owner) ? entry_if_tracked(owner) : NULL;
    if (!e) return write(NULL, ACCEL_F32, ctx);
    pthread_mutex_lock(&e->build);
    form *f = cast_form(e, tape_done);
    /* the form's own forms (oneDNN's layouts of it) current before the
     * write: built again right after it, while the form's new bytes are
     * still in cache (at the next forward they were read from memory) */
    accel__prepared *fe = f ? entry_if_tracked(f->t) : NULL;
    unsigned fresh = fe ? current_forms(fe) : 0;
    accel_status st = write(f ? f->t : NULL, f ? f->key.dt : ACCEL_F32, ctx);
    if (f) {
        accel__tensor_written(f->t); /* forms of the form (oneDNN's layouts) are of the old values */
        /* the owner's version after write's report of its writes; a failed
         * write may have left the form half-written: rebuilt at its next get */
        f->version = st == ACCEL_OK ? atomic_load(&e->version) : NO_VERSION;
        if (st == ACCEL_OK) atomic_fetch_add(&g_rewrites, 1);
    }
    /* still under e's build lock: f's tensor (fe's owner) cannot be dropped
     * by another thread's failed rebuild of f meanwhile */
    if (fe && st == ACCEL_OK) refresh_forms(fe, fresh, tape_done);
    pthread_mutex_unlock(&e->build);
    if (fe) entry_put(fe);
    entry_put(e);
    return st;
}

accel__prepared_stats accel__prepared_stats_get(void) {
    return (accel__prepared_stats){.bytes = atomic_load(&g_bytes), .builds = atomic_load(&g_builds),
                                   .hits = atomic_load(&g_hits), .rewrites = atomic_load(&g_rewrites)};
}
