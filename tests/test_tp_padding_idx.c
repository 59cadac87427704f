/* padding_idx under tensor parallelism on 2 forked processes: embed_tokens
 * split by vocabulary (20 rows a rank of the tiny model's 40), the pad row
 * held by one rank. The tiny Llama untied with pad_token_id 22 (rank 1's)
 * and tied with 3 (rank 0's), a left-padded batch with the pad id also
 * inside the prompts: the loss and every gradient within 1e-5 of one
 * process, whose untied pad row gets none (tests/test_hf_padding_idx.c
 * checks one process against transformers). */
#include "check.h"
#include "dist_group.h"
#include "tiny_llama.h"
#include "tp_fixture.h"

enum { B = 2, T = 8 };

static const int64_t MASK[B * T] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1};

static accel_module *model_of(int64_t pad, bool tied) {
    accel_manual_seed(11);
    accel_llama_config c = tiny_llama_config();
    c.pad_token_id = pad, c.tie_word_embeddings = tied;
    return accel_llama_new(&c, ACCEL_CPU_DEVICE);
}

static void matches(accel_pg *pg, int64_t pad, bool tied) {
    accel_module *ref = model_of(pad, tied), *tp = model_of(pad, tied);
    CHECK_MSG(ref && tp && accel_llama_parallelize(tp, pg, false) == ACCEL_OK, "%s", accel_last_error());
    int64_t idv[B * T];
    for (int i = 0; i < B * T; i++) idv[i] = MASK[i] ? (i * 7 + 1) % 40 : pad;
    idv[2] = idv[13] = pad; /* kept positions */
    accel_tensor *ids = pi64(ACCEL_SHAPE(B, T), idv), *mask = pi64(ACCEL_SHAPE(B, T), MASK);
    accel_llama_inputs in = {.ids = ids, .attention_mask = mask};
    accel_tensor *lr = ref && tp ? accel_llama_loss_ex(ref, &in) : NULL;
    CHECK(lr && accel_backward(lr) == ACCEL_OK);
    double want = lr ? accel_item(lr) : NAN;
    accel_step_reset();
    accel_tensor *lt = lr ? accel_llama_loss_ex(tp, &in) : NULL;
    CHECK_MSG(lt && accel_backward(lt) == ACCEL_OK, "pad %lld: %s", (long long)pad, accel_last_error());
    if (lt) {
        CHECK_MSG(fabs(accel_item(lt) - want) <= 1e-5 * fmax(1, fabs(want)), "loss %.9g, want %.9g", accel_item(lt),
                  want);
        grads_match(tp, ref);
    }
    accel_tensor *w = ref ? accel_module_get_tensor(ref, "model.embed_tokens.weight") : NULL;
    float g[40 * 16];
    CHECK(w && w->grad && accel_to_floats(w->grad, g) == ACCEL_OK);
    bool zero = true;
    for (int j = 0; j < 16; j++) zero &= g[pad * 16 + j] == 0.0f;
    CHECK_MSG(zero == !tied, "pad %lld: the pad row's gradient is %szero", (long long)pad, zero ? "" : "not ");
    accel_step_reset();
    accel_tensor_free(ids), accel_tensor_free(mask);
    accel_module_free(ref), accel_module_free(tp);
}

static int body(int rank, int world) {
    (void)world;
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 1;
    }
    accel_pg *pg = accel_dist_default_group();
    matches(pg, 22, false);
    matches(pg, 3, true);
    accel_dist_finalize();
    return check_summary();
}

int main(void) {
    dist_group g = {.world = 2, .one_machine = true, .timeout = "60", .kill_after_s = 120};
    CHECK(dist_group_runs_ok(&g, body, "padding_idx, tp 2"));
    return check_summary();
}
