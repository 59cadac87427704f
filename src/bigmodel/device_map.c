/* src/bigmodel/device_map.c — device map containers, memory budgets,
 * clean_device_map and check_device_map. */
#include <ctype.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/bigmodel.h"
#include "accel/io.h"
#include "bigmodel/bigmodel_internal.h"
#include "core/core_internal.h"
#include "io/io_internal.h"
#include "tracking/tracking_internal.h"

bool accel__is_gpu_key(const char *s) {
    if (!s || !*s) return false;
    for (const char *p = s; *p; p++)
        if (!isdigit((unsigned char)*p)) return false;
    return strlen(s) < 6;
}

/* ------------------------------------------------------------ the map */

accel_device_map *accel_device_map_new(void) { return accel_calloc(1, sizeof(accel_device_map)); }

void accel_device_map_free(accel_device_map *m) {
    if (!m) return;
    for (int i = 0; i < m->n; i++) accel_free(m->e[i].prefix);
    accel_free(m->e);
    accel_free(m);
}

/* The entry of prefix, -1 when absent (a NULL prefix names none: remove
 * with one compared it and segfaulted). */
static int map_index(const accel_device_map *m, const char *prefix) {
    for (int i = 0; m && prefix && i < m->n; i++)
        if (strcmp(m->e[i].prefix, prefix) == 0) return i;
    return -1;
}

/* A map value is checked from its spelling when it is set: a GPU index, disk,
 * or a device name (accel__device_name). "gpu:9" or a typo used to be kept
 * and refused only by the load that read the map. Whether a backend serves
 * the type and the machine has that device is known only then. */
static accel_status check_value(const char *prefix, const char *device) {
    if (strcmp(device, "disk") == 0) return ACCEL_OK;
    char name[40];
    snprintf(name, sizeof name, "%s%s", accel__is_gpu_key(device) ? "cuda:" : "", device);
    accel_device d;
    if (accel__device_name(name, &d) == ACCEL_OK) return ACCEL_OK;
    char why[256];
    snprintf(why, sizeof why, "%s", accel_last_error());
    return accel_set_error(ACCEL_ERR_INVALID_ARG,
                           "accel_device_map_set: '%s' -> '%s' is not a device map value (an integer GPU index, "
                           "disk, or a device name): %s",
                           prefix, device, why);
}

accel_status accel_device_map_set(accel_device_map *m, const char *prefix, const char *device) {
    if (!m || !prefix || !device || strlen(device) >= sizeof m->e[0].device || !device[0])
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_device_map_set: bad prefix or device '%s'",
                               device ? device : "(null)");
    if (check_value(prefix, device) != ACCEL_OK) return accel_last_status();
    int i = map_index(m, prefix);
    if (i < 0) {
        if (m->n == m->cap) {
            int cap = m->cap ? m->cap * 2 : 16;
            accel_device_map_entry *e = accel_malloc(sizeof *e * (size_t)cap);
            if (!e) return accel_last_status();
            if (m->n) memcpy(e, m->e, sizeof *e * (size_t)m->n);
            accel_free(m->e);
            m->e = e;
            m->cap = cap;
        }
        char *p = accel_strdup(prefix);
        if (!p) return accel_last_status();
        i = m->n++;
        m->e[i].prefix = p;
    }
    snprintf(m->e[i].device, sizeof m->e[i].device, "%s", device);
    return ACCEL_OK;
}

void accel_device_map_remove(accel_device_map *m, const char *prefix) {
    int i = map_index(m, prefix);
    if (i < 0) return;
    accel_free(m->e[i].prefix);
    memmove(&m->e[i], &m->e[i + 1], sizeof m->e[0] * (size_t)(m->n - i - 1));
    m->n--;
}

const char *accel_device_map_get(const accel_device_map *m, const char *prefix) {
    int i = prefix ? map_index(m, prefix) : -1;
    return i < 0 ? NULL : m->e[i].device;
}

static bool covers(const char *prefix, const char *name) {
    size_t n = strlen(prefix);
    return n == 0 || (strncmp(name, prefix, n) == 0 && (name[n] == 0 || name[n] == '.'));
}

const char *accel_device_map_lookup(const accel_device_map *m, const char *name) {
    const char *best = NULL;
    size_t best_len = 0;
    for (int i = 0; m && name && i < m->n; i++) {
        size_t len = strlen(m->e[i].prefix);
        if (covers(m->e[i].prefix, name) && (!best || len > best_len)) {
            best = m->e[i].device;
            best_len = len;
        }
    }
    return best;
}

accel_device_map *accel_device_map_parse(const char *spec) {
    accel_device_map *m = accel_device_map_new();
    char *copy = spec ? accel_strdup(spec) : NULL;
    if (!m || !copy) {
        if (!spec) accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_device_map_parse: NULL spec");
        accel_device_map_free(m);
        accel_free(copy);
        return NULL;
    }
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(tok, ':');
        /* a value "type:N" (cuda:1, hostless:0): the separator is the first ':' */
        char *first = strchr(tok, ':');
        if (first != colon && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1)) colon = first;
        if (!colon) {
            accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_device_map_parse: '%s' is not prefix:device", tok);
            accel_device_map_free(m);
            m = NULL;
            break;
        }
        *colon = 0;
        if (accel_device_map_set(m, tok, colon + 1)) {
            accel_device_map_free(m);
            m = NULL;
            break;
        }
    }
    accel_free(copy);
    return m;
}

/* The most dotted parts of a module name in a device map file (real ones have
 * under 20); accel_clean_device_map recurses once per part. */
#define MAP_MAX_PARTS 256

/* Why key is no module name a device map file can hold, or NULL: "" (the
 * root) or dotted parts, none empty, at most MAP_MAX_PARTS. A key with an
 * empty part (".x", "x.", "a..b") names no module; ".x" had
 * accel_clean_device_map recurse forever. */
static const char *key_problem(const char *key) {
    size_t n = strlen(key);
    if (n == 0) return NULL;
    if (key[0] == '.' || key[n - 1] == '.' || strstr(key, ".."))
        return "a part of the name is empty (a module name is dotted names, as \"model.layers.0\")";
    int parts = 1;
    for (const char *p = key; *p; p++) parts += *p == '.';
    return parts > MAP_MAX_PARTS ? "the name has more than 256 dotted parts" : NULL;
}

accel_device_map *accel_device_map_load(const char *path) {
    if (!path) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_device_map_load: path is NULL");
        return NULL;
    }
    json_t *j = accel__json_load_file(path); /* unreadable, not JSON, a key twice: named by file */
    if (!j) return NULL;
    accel_device_map *m = json_is_object(j) ? accel_device_map_new() : NULL;
    if (!json_is_object(j))
        accel_set_error(ACCEL_ERR_FORMAT, "%s: a device map is a JSON object of prefix -> device, not a %s", path,
                        json_is_array(j) ? "list" : "scalar");
    void *it = m ? json_object_iter(j) : NULL; /* the file's order, as Python's dict keeps it */
    for (; m && it; it = json_object_iter_next(j, it)) {
        const char *key = json_object_iter_key(it), *dev = NULL;
        json_t *v = json_object_iter_value(it);
        char index[24];
        if (json_is_string(v)) dev = json_string_value(v);
        else if (json_is_integer(v) && json_integer_value(v) >= 0)
            snprintf(index, sizeof index, "%lld", (long long)json_integer_value(v)), dev = index;
        const char *bad_key = key_problem(key);
        accel_status st = bad_key ? accel_set_error(ACCEL_ERR_FORMAT, "%s", bad_key)
                          : dev   ? accel_device_map_set(m, key, dev)
                                  : accel_set_error(ACCEL_ERR_FORMAT, "the value is neither a device name nor a GPU index");
        if (st) {
            accel_set_error(st, "%s: key '%s': %s", path, key, accel_last_error()); /* formatted aside: no copy */
            accel_device_map_free(m);
            m = NULL;
        }
    }
    json_decref(j);
    return m;
}

const char *accel_device_map_str(const accel_device_map *m, char *buf, size_t n) {
    if (!buf || n == 0) return buf;
    size_t used = 0;
    buf[0] = 0;
#define PUT(...)                                                                   \
    do {                                                                           \
        int w_ = used < n ? snprintf(buf + used, n - used, __VA_ARGS__) : 0;       \
        if (w_ > 0) used += (size_t)w_;                                            \
    } while (0)
    PUT("{");
    for (int i = 0; m && i < m->n; i++) {
        const char *d = m->e[i].device;
        bool q = !accel__is_gpu_key(d);
        PUT("%s\"%s\": %s%s%s", i ? ", " : "", m->e[i].prefix, q ? "\"" : "", d, q ? "\"" : "");
    }
    PUT("}");
#undef PUT
    if (used >= n) buf[n - 1] = 0;
    return buf;
}

accel_status accel_device_map_device(const char *value, accel_device *out) {
    if (!value || !out) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_device_map_device: NULL argument");
    if (accel__is_gpu_key(value)) {
        *out = (accel_device){ACCEL_DEV_CUDA, atoi(value)};
        return ACCEL_OK;
    }
    if (strcmp(value, "disk") == 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "device map value 'disk' is a storage, not a device");
    return accel_device_parse(value, out);
}

/* clean_device_map(device_map, module_name) — recursion over child prefixes,
 * visited in order of first appearance. */
static void clean_rec(accel_device_map *m, const char *module) {
    size_t ml = strlen(module);
    char *prefix = accel_malloc(ml + 2);
    if (!prefix) return;
    memcpy(prefix, module, ml);
    if (ml) prefix[ml++] = '.';
    prefix[ml] = 0;
    const char *first = NULL;
    int count = 0;
    bool same = true;
    for (int i = 0; i < m->n; i++)
        if (strncmp(m->e[i].prefix, prefix, ml) == 0) {
            if (!first) first = m->e[i].device;
            else if (strcmp(first, m->e[i].device) != 0) same = false;
            count++;
        }
    if (count > 1 && same) {
        char dev[sizeof m->e[0].device];
        snprintf(dev, sizeof dev, "%s", first);
        for (int i = m->n - 1; i >= 0; i--)
            if (strncmp(m->e[i].prefix, prefix, ml) == 0) accel_device_map_remove(m, m->e[i].prefix);
        accel_device_map_set(m, module, dev);
    }
    /* children: the next dotted component under module */
    int n_child = 0;
    char **child = accel_malloc(sizeof(char *) * ((size_t)m->n + 1));
    for (int i = 0; child && i < m->n; i++) {
        const char *k = m->e[i].prefix;
        if (strncmp(k, prefix, ml) != 0 || strlen(k) <= strlen(module)) continue;
        const char *dot = strchr(k + ml, '.');
        size_t cl = dot ? (size_t)(dot - k) : strlen(k);
        if (cl <= strlen(module)) continue; /* ".x" at the root (a program's set): its child would be "" again */
        bool seen = false;
        for (int j = 0; j < n_child && !seen; j++) seen = strlen(child[j]) == cl && strncmp(child[j], k, cl) == 0;
        if (seen) continue;
        char *c = accel_malloc(cl + 1);
        if (!c) break;
        memcpy(c, k, cl);
        c[cl] = 0;
        child[n_child++] = c;
    }
    for (int j = 0; j < n_child; j++) {
        clean_rec(m, child[j]);
        accel_free(child[j]);
    }
    accel_free(child);
    accel_free(prefix);
}

void accel_clean_device_map(accel_device_map *m) {
    if (m) clean_rec(m, "");
}

/* ------------------------------------------------------------ budgets */

static int mm_index(const accel_max_memory *mm, const char *device) {
    for (int i = 0; i < mm->n; i++)
        if (strcmp(mm->e[i].device, device) == 0) return i;
    return -1;
}

accel_status accel_max_memory_set_bytes(accel_max_memory *mm, const char *device, int64_t bytes) {
    if (!mm || !device || !device[0] || strlen(device) >= sizeof mm->e[0].device || bytes < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_max_memory_set: bad device or size");
    /* Keys are compared as strings, GPUs by atoi: "0" and "00" would be two
     * budgets of the one cuda:0 (Accelerate's int keys cannot differ so), and
     * a map inferred from them overcommits it. */
    if (accel__is_gpu_key(device) && device[0] == '0' && device[1])
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_max_memory_set: GPU index '%s' has a leading zero; write it as '%d'", device,
                               atoi(device));
    /* Refused here, as Accelerate's get_max_memory refuses it, rather than
     * kept until accel_get_max_memory refused the whole budget later */
    if (!accel__is_gpu_key(device) && strcmp(device, "cpu") && strcmp(device, "disk"))
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_max_memory_set: device '%s' is not recognized; the devices are GPU indices "
                               "('0', '1', ...), 'cpu' and 'disk'", device);
    int i = mm_index(mm, device);
    if (i < 0) {
        if (mm->n == ACCEL_MAX_MEMORY_DEVICES)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_max_memory_set: more than %d devices",
                                   ACCEL_MAX_MEMORY_DEVICES);
        i = mm->n++;
        snprintf(mm->e[i].device, sizeof mm->e[i].device, "%s", device);
    }
    mm->e[i].bytes = bytes;
    return ACCEL_OK;
}

accel_status accel_max_memory_set(accel_max_memory *mm, const char *device, const char *size) {
    int64_t b;
    if (accel_parse_size(size, &b)) return accel_last_status();
    return accel_max_memory_set_bytes(mm, device, b);
}

int64_t accel_max_memory_get(const accel_max_memory *mm, const char *device) {
    int i = mm && device ? mm_index(mm, device) : -1;
    return i < 0 ? -1 : mm->e[i].bytes;
}

static int64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    long long kb = -1;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb < 0 ? 0 : (int64_t)kb * 1024;
}

/* Accelerate's default budgets of the GPUs: {i: free bytes of cuda:i}, as
 * torch.cuda.mem_get_info reports them (the driver's cudaMemGetInfo, through
 * the backend's mem_info); a GPU that cannot answer is left out, as
 * Accelerate skips a device it cannot allocate on. None without a GPU. */
static void add_gpu_budgets(accel_max_memory *r) {
    int n = accel_device_count(ACCEL_DEV_CUDA);
    for (int i = 0; i < n && r->n < ACCEL_MAX_MEMORY_DEVICES - 1; i++) {
        size_t free_bytes = 0, total = 0;
        if (accel_device_mem_info((accel_device){ACCEL_DEV_CUDA, i}, &free_bytes, &total) != ACCEL_OK) {
            accel_clear_error();
            continue;
        }
        char key[16];
        snprintf(key, sizeof key, "%d", i);
        accel_max_memory_set_bytes(r, key, (int64_t)free_bytes);
    }
}

accel_status accel_get_max_memory(const accel_max_memory *in, accel_max_memory *out) {
    if (!out) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_get_max_memory: out is NULL");
    accel_max_memory r = {0};
    if (!in) {
        add_gpu_budgets(&r);
        accel_max_memory_set_bytes(&r, "cpu", mem_available());
        *out = r;
        return ACCEL_OK;
    }
    for (int i = 0; i < in->n; i++) {
        const char *d = in->e[i].device;
        if (!accel__is_gpu_key(d) && strcmp(d, "cpu") && strcmp(d, "disk"))
            return accel_set_error(ACCEL_ERR_INVALID_ARG,
                                   "Device %s is not recognized, available devices are integers(for "
                                   "GPU/XPU), 'mps', 'cpu' and 'disk'",
                                   d);
    }
    /* integer keys ascending, then cpu, then disk */
    for (;;) {
        int best = -1;
        for (int i = 0; i < in->n; i++)
            if (accel__is_gpu_key(in->e[i].device) && mm_index(&r, in->e[i].device) < 0 &&
                (best < 0 || atoi(in->e[i].device) < atoi(in->e[best].device)))
                best = i;
        if (best < 0) break;
        accel_max_memory_set_bytes(&r, in->e[best].device, in->e[best].bytes);
    }
    for (int i = 0; i < in->n; i++)
        if (strcmp(in->e[i].device, "cpu") == 0) accel_max_memory_set_bytes(&r, "cpu", in->e[i].bytes);
    for (int i = 0; i < in->n; i++)
        if (strcmp(in->e[i].device, "disk") == 0) accel_max_memory_set_bytes(&r, "disk", in->e[i].bytes);
    *out = r;
    return ACCEL_OK;
}

/* ------------------------------------------------------------ check_device_map */

void accel__bm_log(const accel_device_map_opts *o, bool warning, const char *fmt, ...) {
    FILE *f = o && o->log ? o->log : (warning || (o && o->verbose) ? stderr : NULL);
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    if (warning && f == stderr) { /* no stream of the caller's: the library's logger */
        accel__warnv(fmt, ap);
        va_end(ap);
        return;
    }
    fputs(warning ? "accel: warning: " : "accel: ", f);
    vfprintf(f, fmt, ap);
    fputc('\n', f);
    va_end(ap);
}

/* Is `key` the path of a module of the tree? */
static bool is_module_path(accel_module *root, const char *key) {
    accel_module *m = accel_module_find(root, key);
    if (!m) return false;
    /* accel_module_find may resolve a tensor name to its owner: require the full path */
    char buf[1024];
    const char *p = accel_module_path(m, buf, sizeof buf);
    return p && strcmp(p, key) == 0;
}

accel_status accel_check_device_map(accel_module *root, const accel_device_map *map,
                                    const accel_device_map_opts *opts) {
    if (!root || !map) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_check_device_map: NULL argument");
    char *msg = NULL;
    size_t len = 0;
    FILE *ms = open_memstream(&msg, &len);
    if (!ms) return accel_set_error(ACCEL_ERR_OOM, "accel_check_device_map: out of memory");
    int bad = 0;
    for (int i = 0; i < map->n; i++)
        if (map->e[i].prefix[0] && !is_module_path(root, map->e[i].prefix))
            fprintf(ms, "%s'%s'", bad++ ? ", " : "", map->e[i].prefix);
    fclose(ms);
    if (bad)
        accel__bm_log(opts, true, "The following device_map keys do not match any submodules in the model: [%s]",
                      msg);
    free(msg);
    if (accel_device_map_get(map, "")) return ACCEL_OK;
    accel_state_dict *sd = accel_module_state_dict(root);
    if (!sd) return accel_last_status();
    msg = NULL;
    ms = open_memstream(&msg, &len);
    int uncovered = 0;
    for (int i = 0; ms && i < sd->n; i++) {
        bool cov = false;
        for (int j = 0; j < map->n && !cov; j++) cov = covers(map->e[j].prefix, sd->entries[i].name);
        if (!cov) fprintf(ms, "%s%s", uncovered++ ? ", " : "", sd->entries[i].name);
    }
    if (ms) fclose(ms);
    accel_state_dict_free(sd);
    accel_status st = ACCEL_OK;
    if (!ms) st = accel_set_error(ACCEL_ERR_OOM, "accel_check_device_map: out of memory");
    else if (uncovered)
        st = accel_set_error(ACCEL_ERR_INVALID_ARG,
                             "The device_map provided does not give any device for the following parameters: %s",
                             msg);
    free(msg);
    return st;
}
