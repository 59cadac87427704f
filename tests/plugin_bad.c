/* A broken backend plug-in for test_plugin (tests/plugin.cmake): with
 * BAD_ABI its version symbol names ABI 999; with NO_INIT it has a right
 * version symbol and no init (built with another ACCEL__PLUGIN_HEADERS_HASH:
 * a layout that is not the core's). */
#include "backends/plugin.h"

#ifdef BAD_ABI
ACCEL__PLUGIN_EXPORT const accel__plugin_abi accel_backend_hostless_abi = {999, 0, "0.0.0"};
ACCEL__PLUGIN_EXPORT accel_status accel_backend_hostless_init(const accel__plugin_host *host,
                                                               accel__plugin_info *info) {
    (void)host, (void)info;
    return ACCEL_OK;
}
#else
ACCEL__PLUGIN_EXPORT const accel__plugin_abi accel_backend_hostless_abi = {
    ACCEL__PLUGIN_ABI_VERSION, ACCEL__PLUGIN_LAYOUT, ACCEL_VERSION_STRING};
#endif
