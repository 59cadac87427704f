/* Storage versions and the prepared-weight cache (core/prepared.h).
 *
 * One lock guards the registry of tracked storages and their versions; it is
 * held only for bookkeeping, never across a kernel. A second lock serialises
 * building forms (a build writes its form through accel_copy_, which reports
 * the write and so takes the first lock). */
#include "core/prepared.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

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
    grave *spare;              /* allocated with t, so dropping t never allocates */
    const accel_arena *arena;  /* the step that last handed it out: its tape may read it */
    uint32_t gen;
} form;

struct accel__prepared {
    accel_tensor *owner;
    uintptr_t lo, hi;          /* the owner's storage bytes when tracking began */
    uint64_t version;
    int slot;                  /* index in the registry */
    form forms[ACCEL__PREPARED_FORMS];
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_build = PTHREAD_MUTEX_INITIALIZER;
static accel__prepared **g_reg;
static int g_n, g_cap;
static atomic_int g_tracked;
static _Atomic uintptr_t g_env_lo = UINTPTR_MAX, g_env_hi; /* covers every tracked range */
static grave *g_graves;
static atomic_llong g_bytes;
static atomic_ullong g_builds, g_hits;
static atomic_int g_enabled = -1; /* -1: not read from the environment yet */

/* ---- versions */

void accel__storage_written(const void *p, size_t n) {
    if (!atomic_load_explicit(&g_tracked, memory_order_acquire) || !p || !n) return;
    uintptr_t lo = (uintptr_t)p, hi = lo + n;
    if (hi <= atomic_load(&g_env_lo) || lo >= atomic_load(&g_env_hi)) return;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_n; i++)
        if (hi > g_reg[i]->lo && lo < g_reg[i]->hi) g_reg[i]->version++;
    pthread_mutex_unlock(&g_lock);
}

/* The bytes [*lo, *hi) that t's elements occupy; false when t has none. */
static bool tensor_span(const accel_tensor *t, uintptr_t *lo, uintptr_t *hi) {
    if (!t || !t->data || accel_numel(t) == 0) return false;
    int64_t first = 0, last = 0;
    for (int i = 0; i < t->ndim; i++) {
        int64_t reach = (t->shape[i] - 1) * t->stride[i];
        if (reach < 0) first += reach;
        else last += reach;
    }
    int64_t es = (int64_t)accel_dtype_size(t->dtype);
    *lo = (uintptr_t)((const char *)t->data + first * es);
    *hi = (uintptr_t)((const char *)t->data + (last + 1) * es);
    return true;
}

void accel__tensor_written(const accel_tensor *t) {
    uintptr_t lo, hi;
    if (atomic_load_explicit(&g_tracked, memory_order_acquire) && tensor_span(t, &lo, &hi))
        accel__storage_written((const void *)lo, hi - lo);
}

void accel_tensor_increment_version(accel_tensor *t) {
    if (accel_tensor_check(t, "accel_tensor_increment_version", "t")) accel__tensor_written(t);
}

/* ---- the registry (callers hold g_lock) */

/* A persistent tensor with a heap header (accel_tensor_new, a parameter, a
 * buffer, a mapping): never a stack header made by accel__tensor_header,
 * which would leave the registry pointing at a dead frame. */
static bool trackable(const accel_tensor *t) {
    const uint32_t heap = ACCEL_TF_OWNS_DATA | ACCEL_TF_PARAM | ACCEL_TF_BUFFER | ACCEL_TF_MMAP;
    return !(t->flags & ACCEL_TF_ARENA) && (t->flags & heap) && t->device.type != ACCEL_DEV_META && t->data &&
           accel_is_contiguous(t) && accel_numel(t) > 0;
}

static void envelope_widen(const accel__prepared *e) {
    if (e->lo < atomic_load(&g_env_lo)) atomic_store(&g_env_lo, e->lo);
    if (e->hi > atomic_load(&g_env_hi)) atomic_store(&g_env_hi, e->hi);
}

/* Starts tracking t (its entry, new if needed); NULL + error on OOM. */
static accel__prepared *track(accel_tensor *t) {
    if (t->prepared && t->prepared->owner == t) return t->prepared;
    if (g_n == g_cap) {
        int cap = g_cap ? 2 * g_cap : 64;
        accel__prepared **r = accel_malloc(sizeof *r * (size_t)cap);
        if (!r) return NULL;
        if (g_n) memcpy(r, g_reg, sizeof *r * (size_t)g_n);
        accel_free(g_reg);
        g_reg = r, g_cap = cap;
    }
    accel__prepared *e = accel_calloc(1, sizeof *e);
    if (!e) return NULL;
    e->owner = t;
    e->lo = (uintptr_t)t->data;
    e->hi = e->lo + accel_nbytes(t);
    e->slot = g_n;
    g_reg[g_n++] = e;
    envelope_widen(e);
    atomic_store_explicit(&g_tracked, g_n, memory_order_release);
    t->prepared = e;
    return e;
}

static void untrack(accel__prepared *e) {
    g_reg[e->slot] = g_reg[--g_n];
    g_reg[e->slot]->slot = e->slot;
    if (!g_n) {
        atomic_store(&g_env_lo, UINTPTR_MAX);
        atomic_store(&g_env_hi, 0);
        accel_free(g_reg);
        g_reg = NULL, g_cap = 0;
    }
    atomic_store_explicit(&g_tracked, g_n, memory_order_release);
}

/* A header copied from a tracked tensor (a stack view of it) must not take
 * the entry over: it is the original's. */
static bool copied_header(const accel_tensor *t) { return t->prepared && t->prepared->owner != t; }

uint64_t accel__tensor_version(accel_tensor *t) {
    if (!t || !trackable(t) || copied_header(t)) return 0;
    pthread_mutex_lock(&g_lock);
    accel__prepared *e = track(t);
    uint64_t v = e ? e->version : 0;
    pthread_mutex_unlock(&g_lock);
    return v;
}

/* ---- forms */

/* Whether the calling thread's current step may hold f in its tape. */
static bool in_current_step(const form *f) {
    const accel_arena *a = accel_step_arena();
    return f->arena != a || f->gen == accel_arena_generation(a);
}

static void form_handed_out(form *f) {
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
        pthread_mutex_lock(&g_lock);
        g->next = g_graves, g_graves = g;
        pthread_mutex_unlock(&g_lock);
    } else {
        accel_tensor_free(f->t);
        accel_free(g);
    }
    memset(f, 0, sizeof *f);
}

void accel__prepared_release(accel_tensor *t) {
    accel__prepared *e = t ? t->prepared : NULL;
    if (!e) return;
    t->prepared = NULL;
    if (e->owner != t) return; /* a header copied from the owner (a stack matrix view) */
    pthread_mutex_lock(&g_lock);
    untrack(e);
    pthread_mutex_unlock(&g_lock);
    for (int i = 0; i < ACCEL__PREPARED_FORMS; i++) form_drop(&e->forms[i]);
    accel_free(e);
}

/* Unlinks the graves of arena a (every one when a is NULL) and frees them. */
static void graves_free(const accel_arena *a) {
    grave *dead = NULL;
    pthread_mutex_lock(&g_lock);
    for (grave **p = &g_graves; *p;) {
        grave *g = *p;
        if (a && g->arena != a) {
            p = &g->next;
            continue;
        }
        *p = g->next;
        g->next = dead, dead = g;
    }
    pthread_mutex_unlock(&g_lock);
    while (dead) {
        grave *n = dead->next;
        accel_tensor_free(dead->t);
        accel_free(dead);
        dead = n;
    }
}

void accel__prepared_sweep(void) { graves_free(accel_step_arena()); }

__attribute__((destructor)) static void free_graves_at_exit(void) { graves_free(NULL); }

static bool key_eq(const accel__form_key *a, const accel__form_key *b) {
    return a->kind == b->kind && a->dt == b->dt;
}

/* The slot of key in e, or a free one, or NULL when every slot holds another key. */
static form *form_slot(accel__prepared *e, const accel__form_key *key) {
    form *free_slot = NULL;
    for (int i = 0; i < ACCEL__PREPARED_FORMS; i++) {
        form *f = &e->forms[i];
        if (f->t && key_eq(&f->key, key)) return f;
        if (!f->t && !free_slot) free_slot = f;
    }
    return free_slot;
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
    atomic_fetch_add(&g_builds, 1);
    return ACCEL_OK;
}

/* The entry of owner with its current storage, NULL + error on OOM. */
static accel__prepared *entry_for(accel_tensor *owner) {
    accel__prepared *e = owner->prepared;
    if (e && e->owner == owner && (e->lo != (uintptr_t)owner->data || e->hi - e->lo != accel_nbytes(owner)))
        accel__prepared_release(owner); /* storage moved under it: the forms are of other bytes */
    pthread_mutex_lock(&g_lock);
    e = track(owner);
    pthread_mutex_unlock(&g_lock);
    return e;
}

static accel_status get_locked(accel_tensor *owner, const accel__form_key *key, accel_dtype form_dt,
                               accel__form_fill fill, accel_tensor **out) {
    accel__prepared *e = entry_for(owner);
    if (!e) return accel_last_status();
    pthread_mutex_lock(&g_lock);
    uint64_t v = e->version;
    pthread_mutex_unlock(&g_lock);
    form *f = form_slot(e, key);
    if (!f) return ACCEL_OK;
    if (f->t && f->version == v) {
        atomic_fetch_add(&g_hits, 1);
    } else {
        if (f->t && in_current_step(f)) return ACCEL_OK; /* this step's tape may read the old values */
        accel_status st = form_build(f, owner, key, form_dt, fill, v);
        if (st != ACCEL_OK) return st;
    }
    form_handed_out(f);
    *out = f->t;
    return ACCEL_OK;
}

static bool enabled(void) {
    int on = atomic_load(&g_enabled);
    if (on < 0) {
        const char *e = getenv("ACCEL_WEIGHT_CACHE");
        on = !(e && strcmp(e, "0") == 0);
        atomic_store(&g_enabled, on);
    }
    return on;
}

bool accel__prepared_set_enabled(bool on) {
    bool was = enabled();
    atomic_store(&g_enabled, on);
    return was;
}

accel_status accel__prepared_get(accel_tensor *owner, const accel__form_key *key, accel_dtype form_dt,
                                 accel__form_fill fill, accel_tensor **out) {
    *out = NULL;
    if (!enabled() || !owner || !trackable(owner) || copied_header(owner)) return ACCEL_OK;
    pthread_mutex_lock(&g_build);
    accel_status st = get_locked(owner, key, form_dt, fill, out);
    pthread_mutex_unlock(&g_build);
    return st;
}

accel__prepared_stats accel__prepared_stats_get(void) {
    return (accel__prepared_stats){.bytes = atomic_load(&g_bytes), .builds = atomic_load(&g_builds),
                                   .hits = atomic_load(&g_hits)};
}
