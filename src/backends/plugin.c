/* The backend plug-in loader (backends/plugin.h): finds libaccel-<name>.so,
 * checks its version symbol, calls its init with the host table, and keeps
 * why it did not load for accel env and the failing call's error. */
#include "backends/plugin.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/cpu/cpu_kernels.h"
#include "backends/vm_pool.h"
#include "dist/store.h"

#ifndef ACCEL_PLUGIN_INSTALL_DIR
#define ACCEL_PLUGIN_INSTALL_DIR "" /* a build that is not installed */
#endif

/* Plug-ins linked into the static library (ACCEL_BACKENDS_STATIC). */
#ifdef ACCEL_STATIC_CUDA
accel_status accel_backend_cuda_init(const accel__plugin_host *host, accel__plugin_info *info);
#define CUDA_BUILTIN accel_backend_cuda_init
#else
#define CUDA_BUILTIN NULL
#endif
#ifdef ACCEL_STATIC_MPI
accel_status accel_backend_mpi_init(const accel__plugin_host *host, accel__plugin_info *info);
#define MPI_BUILTIN accel_backend_mpi_init
#else
#define MPI_BUILTIN NULL
#endif
#ifdef ACCEL_STATIC_DNNL
accel_status accel_backend_dnnl_init(const accel__plugin_host *host, accel__plugin_info *info);
#define DNNL_BUILTIN accel_backend_dnnl_init
#else
#define DNNL_BUILTIN NULL
#endif
#ifdef ACCEL_STATIC_HOSTLESS
accel_status accel_backend_hostless_init(const accel__plugin_host *host, accel__plugin_info *info);
#define HOSTLESS_BUILTIN accel_backend_hostless_init
#else
#define HOSTLESS_BUILTIN NULL
#endif

/* The plug-ins accel knows by device type. `gate` is a library the plug-in
 * cannot work without (the driver): tried first, so that on a machine
 * without it the plug-in and its runtime are never mapped, and its absence
 * is the reason given. */
typedef struct known_plugin {
    const char *name; /* libaccel-<name>.so, accel_backend_<name>_{abi,init} */
    accel_device_type type; /* NO_DEVICE: a process group only */
    const char *pg;    /* the process-group backend it brings, or NULL */
    const char *label, *pg_label; /* for accel env: "CUDA", "NCCL" */
    const char *gate, *gate_missing;
    bool in_env;       /* described by accel env's device lines */
    accel__plugin_init_fn builtin;
} known_plugin;

#define NO_DEVICE ACCEL_DEV_TYPE_COUNT

static const known_plugin KNOWN[] = {
    {"cuda", ACCEL_DEV_CUDA, "nccl", "CUDA", "NCCL", "libcuda.so.1", "no NVIDIA driver is loaded", true, CUDA_BUILTIN},
    {"npu", ACCEL_DEV_NPU, "hccl", "NPU", "HCCL", "libascendcl.so", "no CANN runtime", true, NULL},
    {"hostless", ACCEL_DEV_HOSTLESS, NULL, NULL, NULL, NULL, NULL, false, HOSTLESS_BUILTIN},
    /* accel env says what it has of MPI itself (mpirun on PATH) */
    {"mpi", NO_DEVICE, "mpi", NULL, NULL, NULL, NULL, false, MPI_BUILTIN},
    /* the GEMM provider (backends/cpu/dnnl_hooks.h); accel env prints its choice */
    {"dnnl", NO_DEVICE, NULL, NULL, NULL, NULL, NULL, false, DNNL_BUILTIN},
};
enum { NKNOWN = sizeof KNOWN / sizeof *KNOWN };

enum { UNTRIED, LOADING, LOADED, FAILED };

typedef struct slot {
    int state; /* atomic: read without the lock once LOADED or FAILED; set under it */
    char reason[1024]; /* FAILED: why */
    accel__plugin_info info;
} slot;

static slot g_slot[NKNOWN];
/* Recursive: a plug-in's init may ask for device counts, which come back here. */
static pthread_mutex_t g_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;

static const accel__plugin_host HOST = {
#define HOST_FN(ret, name, params, args) .name = name,
#define HOST_VOID(name, params, args) .name = name,
    ACCEL__PLUGIN_HOST_FUNCS(HOST_FN) ACCEL__PLUGIN_HOST_VOIDS(HOST_VOID)
#undef HOST_FN
#undef HOST_VOID
};

static const known_plugin *known_of_type(accel_device_type t) {
    for (int i = 0; i < NKNOWN && (unsigned)t < ACCEL_DEV_TYPE_COUNT; i++)
        if (KNOWN[i].type == t) return &KNOWN[i];
    return NULL;
}

/* ---- where plug-ins are looked for */

/* The directory of the file holding this code: libaccel.so, or the program
 * that linked libaccel.a (whose link-map name is empty; *is_program). */
static bool own_dir(char *out, size_t n, bool *is_program) {
    Dl_info di;
    struct link_map *lm = NULL;
    char path[PATH_MAX] = "";
    *is_program = false;
    if (dladdr1((void *)&accel__plugin_load_type, &di, (void **)&lm, RTLD_DL_LINKMAP) && lm && lm->l_name[0]) {
        if (!realpath(lm->l_name, path)) return false;
    } else {
        *is_program = true;
        ssize_t k = readlink("/proc/self/exe", path, sizeof path - 1);
        if (k <= 0) return false;
        path[k] = '\0';
    }
    char *slash = strrchr(path, '/');
    if (!slash) return false;
    *slash = '\0';
    return snprintf(out, n, "%s", path) < (int)n;
}

/* The first readable `file` in the search path, into out; false (and the
 * directories searched, into `where`) when there is none. Only absolute
 * directories: a relative one would follow the working directory. A program
 * that linked libaccel.a looks in its ../lib/accel only (a build tree's bin/,
 * an install's), never beside itself: /tmp/train would run a
 * libaccel-cuda.so anyone planted in /tmp. */
static bool find_file(const char *file, char *out, size_t n, char *where, size_t wn) {
    char dirs[8][PATH_MAX];
    int nd = 0;
    const char *env = getenv("ACCEL_BACKEND_PATH");
    char own[PATH_MAX];
    bool is_program;
    bool have_own = own_dir(own, sizeof own, &is_program);
    where[0] = '\0';
    size_t used = 0;
    for (const char *p = env ? env : ""; *p && nd < 4;) {
        size_t len = strcspn(p, ":");
        if (len && p[0] == '/' && len < PATH_MAX) snprintf(dirs[nd++], PATH_MAX, "%.*s", (int)len, p);
        p += len + (p[len] == ':');
    }
    if (have_own && !is_program) {
        snprintf(dirs[nd++], PATH_MAX, "%s", own);
        snprintf(dirs[nd++], PATH_MAX, "%.*s/accel", PATH_MAX - 7, own);
    }
    if (have_own) snprintf(dirs[nd++], PATH_MAX, "%.*s/../lib/accel", PATH_MAX - 14, own);
    if (ACCEL_PLUGIN_INSTALL_DIR[0]) snprintf(dirs[nd++], PATH_MAX, "%s", ACCEL_PLUGIN_INSTALL_DIR);
    for (int i = 0; i < nd; i++) {
        if (snprintf(out, n, "%s/%s", dirs[i], file) < (int)n && access(out, R_OK) == 0) return true;
        if (used < wn) used += (size_t)snprintf(where + used, wn - used, "%s%s", i ? ", " : "", dirs[i]);
    }
    if (!nd) snprintf(where, wn, "no directory (ACCEL_BACKEND_PATH is unset and this library's own is unknown)");
    return false;
}

/* ---- opening one */

static accel_status open_plugin(const char *path, const known_plugin *k, accel__plugin_info *info, char *why,
                                size_t wn) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, wn, "%s cannot be loaded: %s", path, dlerror());
        return ACCEL_ERR_DEVICE;
    }
    char sym[64];
    snprintf(sym, sizeof sym, "accel_backend_%s_abi", k->name);
    const accel__plugin_abi *abi = dlsym(h, sym);
    if (!abi) {
        snprintf(why, wn, "%s is not an accel backend plug-in for %s (it has no symbol %s)", path, k->name, sym);
        dlclose(h);
        return ACCEL_ERR_DEVICE;
    }
    if (abi->version != ACCEL__PLUGIN_ABI_VERSION || abi->layout != ACCEL__PLUGIN_LAYOUT) {
        snprintf(why, wn,
                 "%s was built for another accel (plug-in ABI %u, layout %08x) than this library, accel %s "
                 "(ABI %u, layout %08x): rebuild the plug-in with this accel",
                 path, abi->version, abi->layout, ACCEL_VERSION_STRING, ACCEL__PLUGIN_ABI_VERSION,
                 (unsigned)ACCEL__PLUGIN_LAYOUT);
        dlclose(h);
        return ACCEL_ERR_DEVICE;
    }
    snprintf(sym, sizeof sym, "accel_backend_%s_init", k->name);
    accel__plugin_init_fn init = (accel__plugin_init_fn)dlsym(h, sym);
    if (!init) {
        snprintf(why, wn, "%s is not an accel backend plug-in for %s (it has no symbol %s)", path, k->name, sym);
        dlclose(h);
        return ACCEL_ERR_DEVICE;
    }
    /* From here on the plug-in's code may be registered: never unloaded. */
    if (init(&HOST, info) != ACCEL_OK) {
        snprintf(why, wn, "%s did not initialise: %s", path, accel_last_error());
        accel_clear_error();
        return ACCEL_ERR_DEVICE;
    }
    return ACCEL_OK;
}

accel_status accel__plugin_open(const char *path, accel_device_type t, char *why, size_t why_len) {
    const known_plugin *k = known_of_type(t);
    accel__plugin_info info = {0};
    if (!k) {
        snprintf(why, why_len, "no plug-in serves device type %s", accel_device_type_name(t));
        return ACCEL_ERR_INVALID_ARG;
    }
    return open_plugin(path, k, &info, why, why_len);
}

static void load_slot(int i) {
    const known_plugin *k = &KNOWN[i];
    slot *s = &g_slot[i];
    accel_status st = ACCEL_ERR_DEVICE;
    if (k->builtin) {
        st = k->builtin(&HOST, &s->info);
        if (st != ACCEL_OK) snprintf(s->reason, sizeof s->reason, "%s", accel_last_error()), accel_clear_error();
    } else if (k->gate && !dlopen(k->gate, RTLD_LAZY | RTLD_LOCAL)) {
        /* the handle stays open: the plug-in would load it again anyway */
        snprintf(s->reason, sizeof s->reason, "%s: %s", k->gate_missing, dlerror());
    } else {
        char file[64], path[PATH_MAX], where[768]; /* the reason holds it whole */
        snprintf(file, sizeof file, "libaccel-%s.so", k->name);
        if (!find_file(file, path, sizeof path, where, sizeof where))
            snprintf(s->reason, sizeof s->reason, "the %s backend plug-in %s is not installed (looked in %.768s)",
                     k->name, file, where);
        else st = open_plugin(path, k, &s->info, s->reason, sizeof s->reason);
    }
    __atomic_store_n(&s->state, st == ACCEL_OK ? LOADED : FAILED, __ATOMIC_RELEASE);
}

/* Another thread that finds the slot LOADING waits on the lock until the
 * loading thread is done (the CUDA plug-in's init takes ~80 ms); only the
 * loading thread itself, re-entering from init, gets past the recursive lock
 * to see LOADING and fail. */
static accel_status load_index(int i) {
    int state = __atomic_load_n(&g_slot[i].state, __ATOMIC_ACQUIRE);
    if (state == UNTRIED || state == LOADING) {
        pthread_mutex_lock(&g_lock);
        if (__atomic_load_n(&g_slot[i].state, __ATOMIC_ACQUIRE) == UNTRIED) {
            __atomic_store_n(&g_slot[i].state, LOADING, __ATOMIC_RELEASE); /* a re-entry from init sees it and returns */
            load_slot(i);
        }
        state = __atomic_load_n(&g_slot[i].state, __ATOMIC_ACQUIRE);
        pthread_mutex_unlock(&g_lock);
    }
    return state == LOADED ? ACCEL_OK : ACCEL_ERR_DEVICE;
}

accel_status accel__plugin_load_type(accel_device_type t) {
    const known_plugin *k = known_of_type(t);
    return k ? load_index((int)(k - KNOWN)) : ACCEL_ERR_DEVICE;
}

static int index_of_pg(const char *pg_name) {
    for (int i = 0; i < NKNOWN; i++)
        if (KNOWN[i].pg && !strcmp(KNOWN[i].pg, pg_name)) return i;
    return -1;
}

bool accel__plugin_knows_pg(const char *pg_name) { return index_of_pg(pg_name) >= 0; }

bool accel__plugin_load_pg(const char *pg_name) {
    int i = index_of_pg(pg_name);
    return i >= 0 && load_index(i) == ACCEL_OK;
}

/* Why slot i has no device: why it did not load, or what the loaded
 * plug-in says now (its devices may come later: hostless). */
static const char *slot_reason(int i) {
    if (load_index(i) != ACCEL_OK) return g_slot[i].reason;
    const char *why = g_slot[i].info.unavailable ? g_slot[i].info.unavailable() : NULL;
    return why ? why : "";
}

const char *accel__plugin_unavailable_reason(accel_device_type t) {
    const known_plugin *k = known_of_type(t);
    return k ? slot_reason((int)(k - KNOWN)) : "no backend serves this device type";
}

const char *accel__plugin_pg_reason(const char *pg_name) {
    int i = index_of_pg(pg_name);
    if (i < 0) return "";
    return load_index(i) == ACCEL_OK ? "" : g_slot[i].reason;
}

const void *accel__plugin_hooks(accel_device_type t) {
    const known_plugin *k = known_of_type(t);
    if (!k || load_index((int)(k - KNOWN)) != ACCEL_OK) return NULL;
    return g_slot[k - KNOWN].info.hooks;
}

static int index_of_name(const char *name) {
    for (int i = 0; i < NKNOWN; i++)
        if (!strcmp(KNOWN[i].name, name)) return i;
    return -1;
}

const void *accel__plugin_hooks_named(const char *name) {
    int i = index_of_name(name);
    return i >= 0 && load_index(i) == ACCEL_OK ? g_slot[i].info.hooks : NULL;
}

const char *accel__plugin_reason_named(const char *name) {
    int i = index_of_name(name);
    return i < 0 ? "no such plug-in" : slot_reason(i);
}

void accel__plugins_describe(FILE *out) {
    for (int i = 0; i < NKNOWN; i++) {
        const known_plugin *k = &KNOWN[i];
        if (!k->in_env) continue;
        if (load_index(i) == ACCEL_OK && g_slot[i].info.describe) {
            g_slot[i].info.describe(out);
            continue;
        }
        const char *why = slot_reason(i);
        fprintf(out, "- %s available: False (%s)\n", k->label, *why ? why : "it found no device");
        if (k->pg_label)
            fprintf(out, "- %s available: False (it comes with the %s plug-in, not loaded)\n", k->pg_label, k->name);
    }
}
