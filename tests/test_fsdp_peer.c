/* Fine-tuning a non-Llama family (Qwen2, tests/data/hf_arch_qwen2) the way
 * transformers + Accelerate do it, on the same checkpoint and ids: the loss
 * of every step on every rank equals tools/gen_fsdp_peer_losses.py's
 * (tests/data/hf_fsdp_peer_qwen2.safetensors: Accelerate on 2 CPU processes,
 * gloo; its DDP, as Accelerate has no FSDP on CPU; the script checks torch's
 * own FSDP FULL_SHARD gives the same losses, bit for bit).
 *
 * Under `accel launch --num_processes 2 --use_fsdp` (tests/fsdp_peer.cmake)
 * each rank trains on its own batch under FSDP FULL_SHARD, the decoder layers
 * (Qwen2DecoderLayer, from the architecture table) the wrap units; also
 * under plain DDP. Run alone, one process does what the two ranks do
 * together: the mean of the two batches' losses, whose gradient is the one
 * the ranks' averaged gradients make (both batches have B x (T - 1) labels).
 *
 * Twice from the checkpoint, as the peer: AdamW(lr 1e-2, eps 1e-8, no
 * weight decay), and SGD(lr 0.5), whose step is proportional to the gradient
 * (Adam's nearly is not to its scale), so a sum where a mean belongs shows.
 * Tolerance 1e-5 relative: step 0 is one f32 forward of the same weights
 * (~1e-7); each later step's weights differ from the peer's by what the
 * gradients' last bits (another summation order: GEMM blocking,
 * reduce-scatter against all-reduce) become through the update, for Adam's
 * normalised one a few 1e-6 of the weights at most (test_accelerator_zero3
 * measured ~4e-6), which move the loss by less: 3.8e-7 measured here.
 * Prints "fsdp_peer world=W zero_stage=Z steps=S" on success. */
#include <math.h>
#include <stdlib.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/bigmodel.h"
#include "accel/io.h"
#include "accelerator/accelerator_internal.h" /* the wrap units FSDP made */
#include "accelerator/zero_state.h" /* the ZeRO state of a prepared model */
#include "check.h"

#define MODEL "data/hf_arch_qwen2"
#define PEER "data/hf_fsdp_peer_qwen2.safetensors"
#define RTOL 1e-5

static accel_tensor *batch(const int64_t *ids, int64_t B, int64_t T) {
    accel_tensor *t = accel_empty_on(ACCEL_I64, ACCEL_SHAPE(B, T), ACCEL_CPU_DEVICE);
    return t && accel_tensor_from_host(t, ids) == ACCEL_OK ? t : NULL;
}

/* Fine-tunes the checkpoint with optimizer `kind` (hparams h) on the fixture's
 * ids; every loss against the fixture's tensor `key`. Returns the largest
 * relative difference. */
static double fine_tune(accel_optim_kind kind, accel_optim_hparams h, const char *key) {
    accel_accelerator *acc = accel_accelerator_new(NULL); /* what `accel launch` set */
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    if (!acc) return INFINITY;
    int world = accel_accelerator_num_processes(acc), rank = accel_accelerator_process_index(acc);
    CHECK_MSG(world == 1 || world == 2, "run alone or on 2 processes, not %d", world);
    accel_safetensors *st = accel_safetensors_open(PEER);
    accel_tensor *ids = st ? accel_safetensors_tensor(st, "ids", -1) : NULL;
    accel_tensor *want = st ? accel_safetensors_tensor(st, key, -1) : NULL;
    CHECK_MSG(ids && want, "%s: %s", PEER, accel_last_error());
    if (!ids || !want || ids->ndim != 4 || ids->shape[1] != 2 || want->ndim != 2) {
        CHECK(!"fixture shapes: ids [STEPS, 2, B, T], losses [STEPS, 2]");
        accel_safetensors_close(st);
        accel_accelerator_free(acc);
        return INFINITY;
    }
    int64_t steps = ids->shape[0], B = ids->shape[2], T = ids->shape[3];
    int64_t *host = malloc(sizeof *host * (size_t)accel_numel(ids));
    float *peer = malloc(sizeof *peer * (size_t)accel_numel(want));
    CHECK(host && peer && accel_to_int64s(ids, host) == ACCEL_OK && accel_to_floats(want, peer) == ACCEL_OK);

    accel_dispatched *loaded = NULL;
    accel_module *model = accel_llama_from_pretrained(MODEL, NULL, NULL, NULL, NULL, &loaded);
    CHECK_MSG(model != NULL, "%s", accel_last_error());
    accel_optimizer *opt = model ? accel_optimizer_new_module(kind, model, &h) : NULL;
    CHECK_MSG(opt && accel_accelerator_prepare(acc, model, opt) == ACCEL_OK, "%s", accel_last_error());
    if (opt && accel_accelerator_zero_stage(acc) == 3) { /* a unit per Qwen2DecoderLayer, and the root's */
        const accel__zero_model *zm = accel__zero_of(accel__find_model(acc, model));
        int64_t layers = accel_llama_config_of(model)->num_hidden_layers;
        CHECK_MSG(zm && zm->n_units == layers + 1, "%d FSDP units, want %lld", zm ? zm->n_units : -1,
                  (long long)layers + 1);
    }
    double worst = 0;
    for (int64_t s = 0; s < steps && opt && !check_failures_; s++) {
        /* the ranks this process plays: its own, or both when alone */
        int first = world == 2 ? rank : 0, last = world == 2 ? rank : 1;
        accel_tensor *loss = NULL;
        for (int r = first; r <= last; r++) {
            accel_tensor *x = batch(host + ((s * 2 + r) * B * T), B, T);
            accel_tensor *l = x ? accel_llama_loss(model, x) : NULL;
            CHECK_MSG(l != NULL, "step %lld rank %d: %s", (long long)s, r, accel_last_error());
            if (!l) break;
            double got = accel_item(l), exp = peer[s * 2 + r], rel = fabs(got - exp) / fabs(exp);
            if (rel > worst) worst = rel;
            CHECK_MSG(rel <= RTOL, "%s step %lld rank %d: loss %.9g, transformers + Accelerate %.9g (rel %.3g)",
                      key, (long long)s, r, got, exp, rel);
            loss = loss ? accel_add(loss, l) : l;
            accel_tensor_free(x);
        }
        if (loss && world == 1) loss = accel_mul_scalar(loss, 0.5);
        CHECK_MSG(loss && accel_accelerator_backward(acc, loss) == ACCEL_OK &&
                      accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK,
                  "step %lld: %s", (long long)s, accel_last_error());
        accel_accelerator_zero_grad(acc, opt);
        accel_step_reset();
    }
    accel_accelerator_print(acc, "%s: max relative loss difference %.3g over %lld steps\n", key, worst,
                            (long long)steps);
    if (!check_failures_ && kind == ACCEL_OPTIM_SGD)
        accel_accelerator_print(acc, "fsdp_peer world=%d zero_stage=%d steps=%lld\n", world,
                                accel_accelerator_zero_stage(acc), (long long)steps);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_dispatched_free(loaded);
    accel_tensor_free(ids);
    accel_tensor_free(want);
    accel_safetensors_close(st);
    free(host);
    free(peer);
    accel_accelerator_free(acc);
    return worst;
}

static void test_losses_equal_peer(void) {
    accel_optim_hparams adamw = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-2);
    adamw.weight_decay = 0.0; /* betas (0.9, 0.999) and eps 1e-8: torch's */
    CHECK(fine_tune(ACCEL_OPTIM_ADAMW, adamw, "losses_adamw") <= RTOL);
    CHECK(fine_tune(ACCEL_OPTIM_SGD, accel_optim_defaults(ACCEL_OPTIM_SGD, 0.5), "losses_sgd") <= RTOL);
}

int main(void) {
    RUN(test_losses_equal_peer);
    accel_thread_cleanup();
    return check_summary();
}
