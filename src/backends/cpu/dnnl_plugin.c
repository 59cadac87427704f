/* The dnnl plug-in's entry (backends/plugin.h, dnnl_hooks.h): registers no
 * device; hands gemm_dnnl.c's and conv_dnnl.c's functions to the core. */
#include "backends/cpu/dnnl_hooks.h"
#include "backends/plugin.h"

static const accel__dnnl_hooks hooks = {
    .gemm = accel__onednn_gemm,
    .weight_layout = accel__onednn_weight_layout,
    .weight_pack = accel__onednn_weight_pack,
    .gemm_packed = accel__onednn_gemm_packed,
    .impl = accel__onednn_impl,
    .scratchpad = accel__onednn_scratchpad,
    .supports = accel__onednn_supports,
    .version = accel__onednn_version,
    .conv = accel__onednn_conv,
};

ACCEL__PLUGIN_EXPORT const accel__plugin_abi accel_backend_dnnl_abi = {
    ACCEL__PLUGIN_ABI_VERSION, ACCEL__PLUGIN_LAYOUT, ACCEL_VERSION_STRING};

ACCEL__PLUGIN_EXPORT accel_status accel_backend_dnnl_init(const accel__plugin_host *host, accel__plugin_info *info) {
    ACCEL__PLUGIN_SHIMS_INIT(host);
    *info = (accel__plugin_info){.hooks = &hooks};
    return ACCEL_OK;
}
