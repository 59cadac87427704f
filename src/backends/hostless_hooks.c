/* The core's side of the hostless test backend (backend.h's
 * accel__hostless_register & co., hostless.h's hooks): the backend is the
 * plug-in libaccel-hostless.so, loaded by the first of these calls; each
 * forwards to the hooks its init gave (hostless.h, accel__hostless_hooks).
 * Without the plug-in, register fails naming why and the others do nothing. */
#include "backends/registry.h"
#include "backends/hostless/hostless.h"
#include "backends/plugin.h"

static const accel__hostless_hooks *hooks(void) { return accel__plugin_hooks(ACCEL_DEV_HOSTLESS); }

accel_status accel__hostless_register(int n) {
    const accel__hostless_hooks *h = hooks();
    if (!h)
        return accel_set_error(ACCEL_ERR_DEVICE, "accel__hostless_register: no hostless test backend: %s",
                               accel__plugin_unavailable_reason(ACCEL_DEV_HOSTLESS));
    return h->register_devices(n);
}

accel__hostless_memory accel__hostless_memory_stats(int index) {
    const accel__hostless_hooks *h = hooks();
    return h ? h->memory_stats(index) : (accel__hostless_memory){0, 0};
}

void accel__hostless_host_stats(accel__hostless_host_counts *out) {
    const accel__hostless_hooks *h = hooks();
    if (h) h->host_stats(out);
    else *out = (accel__hostless_host_counts){0};
}

#define FORWARD(name, type)                                \
    void accel__hostless_##name(type v) {                  \
        const accel__hostless_hooks *h = hooks();          \
        if (h) h->name(v);                                 \
    }
FORWARD(reset_peak, int)
FORWARD(host_fail_next, int)
FORWARD(vm_fail_next, int)
FORWARD(vm_fail_unmap_next, int)
FORWARD(vm_fail_record_next, int)
FORWARD(vm_set_limit, size_t)
FORWARD(vm_lag_fences, bool)
FORWARD(vm_set_idle_cache, size_t)
FORWARD(alloc_fail_at, int)
FORWARD(copy_fail_next, int)
#undef FORWARD

void accel__hostless_call_counts(int index, accel__hostless_calls *out) {
    const accel__hostless_hooks *h = hooks();
    if (h && index >= 0) h->call_counts(index, out);
    else *out = (accel__hostless_calls){0};
}

int64_t accel__hostless_vm_idle_releases(void) {
    const accel__hostless_hooks *h = hooks();
    return h ? h->vm_idle_releases() : 0;
}

void accel__hostless_host_peak_reset(void) {
    const accel__hostless_hooks *h = hooks();
    if (h) h->host_peak_reset();
}
