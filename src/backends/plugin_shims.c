/* Inside a backend plug-in (backends/plugin.h): the core functions the backend
 * calls, by their own names, forwarded through the host table the loader
 * passed to init. Compiled into each plug-in, never into the core (nor into
 * the static library's built-in backends, which call the core directly).
 *
 * Hidden: a plug-in exports its two entry symbols only (cmake/plugin.map),
 * so these never interpose on the core's functions of the same names. */
#include "backends/plugin.h"

static const accel__plugin_host *g_host;

void accel__plugin_shims_init(const accel__plugin_host *host) { g_host = host; }

accel_status accel_set_error(accel_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    accel_status r = g_host->accel__set_errorv(st, fmt, ap);
    va_end(ap);
    return r;
}

#define SHIM(ret, name, params, args) \
    ret name params { return g_host->name args; }
#define SHIM_VOID(name, params, args) \
    void name params { g_host->name args; }
ACCEL__PLUGIN_HOST_FUNCS(SHIM)
ACCEL__PLUGIN_HOST_VOIDS(SHIM_VOID)
