/* accel_optimizer_new_module: an optimizer over a module's parameters. */
#include "accel/nn.h"
#include "accel/optim.h"
#include "optim_internal.h"

accel_optimizer *accel_optimizer_new_module(accel_optim_kind kind, accel_module *model,
                                            const accel_optim_hparams *h) {
    if (!model) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_optimizer_new_module: model is NULL");
        return NULL;
    }
    accel_tensor **params = NULL;
    int n = accel_module_parameters(model, &params);
    if (n < 0) return NULL;
    accel_optimizer *opt = accel_optimizer_new_params(kind, n, params, h); /* NULL h: the kind's defaults */
    accel_free(params);
    /* linked to the model, whose free then marks the optimizer: stepped
     * after it, the optimizer refuses rather than write freed memory */
    if (opt && accel__link_observe(&model->links, accel__optimizer_model_freed, opt)) {
        accel_optimizer_free(opt);
        return NULL;
    }
    if (opt) opt->model = model;
    return opt;
}
