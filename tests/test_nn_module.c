/* Module tree: naming, state dict order, tying, flatten, meta, hooks, Llama's tree. */
#include "accel/accel.h"
#include "check.h"

static const accel_module_ops BLOCK_OPS = {"Block", NULL, NULL};

/* Block: own param "scale" [2], buffer "count" [1], children fc (Linear 3->2)
 * and norm (RMSNorm 2). */
static accel_module *make_block(void) {
    accel_module *m = accel_module_new(&BLOCK_OPS, NULL);
    accel_module_add_param(m, "scale", accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE));
    accel_module_add_buffer(m, "count", accel_tensor_new(ACCEL_I64, ACCEL_SHAPE(1), ACCEL_CPU_DEVICE));
    accel_module_add_child(m, "fc", accel_linear_new(3, 2, true, ACCEL_CPU_DEVICE, ACCEL_F32));
    accel_module_add_child(m, "norm", accel_rms_norm_new(2, 1e-6, ACCEL_CPU_DEVICE, ACCEL_F32));
    return m;
}

static void test_state_dict_order(void) {
    accel_module *root = accel_module_new(&BLOCK_OPS, NULL);
    accel_module_add_child(root, "a", make_block());
    accel_module_add_child(root, "b", make_block());
    accel_state_dict *sd = accel_module_state_dict(root);
    const char *want[] = {"a.scale", "a.count", "a.fc.weight", "a.fc.bias", "a.norm.weight",
                          "b.scale", "b.count", "b.fc.weight", "b.fc.bias", "b.norm.weight"};
    CHECK(sd && sd->n == 10);
    for (int i = 0; sd && i < sd->n && i < 10; i++) {
        CHECK_MSG(strcmp(sd->entries[i].name, want[i]) == 0, "%s vs %s", sd->entries[i].name, want[i]);
        CHECK(!sd->entries[i].is_tied_alias);
    }
    CHECK(sd->entries[1].is_buffer && !sd->entries[1].t->requires_grad);
    CHECK(sd->entries[2].t->requires_grad && (sd->entries[2].t->flags & ACCEL_TF_PARAM));
    accel_state_dict_free(sd);

    accel_tensor **ps;
    int n = accel_module_parameters(root, &ps);
    CHECK(n == 8); /* buffers excluded */
    accel_free(ps);
    CHECK(accel_module_num_params(root) == 2 * (2 + 1 + 6 + 2 + 2));

    /* Linear's default init: U(-1/sqrt(3), 1/sqrt(3)), not all equal. */
    accel_tensor *w = accel_module_get_tensor(root, "b.fc.weight");
    float v[6];
    accel_to_floats(w, v);
    bool in_range = true, varied = false;
    for (int i = 0; i < 6; i++) {
        in_range &= fabsf(v[i]) <= 1.0f / sqrtf(3.0f);
        varied |= v[i] != v[0];
    }
    CHECK(in_range && varied);
    CHECK(accel_get(accel_module_get_tensor(root, "a.norm.weight"), (int64_t[]){1}) == 1.0);

    /* Paths and lookups. */
    accel_module *fc = accel_module_find(root, "b.fc");
    char buf[64];
    CHECK(fc && strcmp(fc->ops->type_name, "Linear") == 0);
    CHECK(strcmp(accel_module_path(fc, buf, sizeof buf), "b.fc") == 0);
    CHECK(strcmp(accel_module_path(root, buf, sizeof buf), "") == 0);
    CHECK(accel_module_find(root, "") == root);
    CHECK(accel_module_find(root, "b.nope") == NULL && accel_module_find(root, "b.f") == NULL);
    CHECK(accel_module_get_tensor(root, "a.fc.nope") == NULL);

    /* Naming errors: duplicates and dots; the rejected object is freed. */
    accel_clear_error();
    CHECK(accel_module_add_child(root, "a", accel_relu_module_new()) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "\"a\"");
    accel_clear_error();
    CHECK(accel_module_add_param(root, "x.y", accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(1),
                                                               ACCEL_CPU_DEVICE)) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "x.y");
    accel_clear_error();
    CHECK(accel_module_add_buffer(root, "tmp", accel_zeros(ACCEL_F32, ACCEL_SHAPE(1))) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "step tensor");
    accel_clear_error();
    CHECK(accel_module_call(root, NULL) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "Block has no single-tensor forward");
    accel_clear_error();
    accel_module_train(root, false);
    CHECK(!accel_module_find(root, "a.norm")->training);
    accel_module_free(root);
}

static void test_tie(void) {
    accel_module *root = accel_module_new(&BLOCK_OPS, NULL);
    accel_module_add_child(root, "emb", accel_embedding_new(5, 3, ACCEL_CPU_DEVICE, ACCEL_F32));
    accel_module_add_child(root, "head", accel_linear_new(3, 5, false, ACCEL_CPU_DEVICE, ACCEL_F32));
    CHECK(accel_module_num_params(root) == 30);
    CHECK(accel_module_tie(root, "head.weight", "emb.weight") == ACCEL_OK);
    CHECK(accel_module_get_tensor(root, "head.weight") == accel_module_get_tensor(root, "emb.weight"));
    accel_state_dict *sd = accel_module_state_dict(root);
    CHECK(sd->n == 2 && !sd->entries[0].is_tied_alias && sd->entries[1].is_tied_alias);
    accel_state_dict_free(sd);
    CHECK(accel_module_num_params(root) == 15);
    accel_tensor **ps;
    CHECK(accel_module_parameters(root, &ps) == 1);
    accel_free(ps);
    /* Re-tying the owner away: the alias inherits the tensor (no dangling, no leak). */
    accel_module_add_child(root, "emb2", accel_embedding_new(5, 3, ACCEL_CPU_DEVICE, ACCEL_F32));
    accel_tensor *shared = accel_module_get_tensor(root, "emb.weight");
    CHECK(accel_module_tie(root, "emb.weight", "emb2.weight") == ACCEL_OK);
    CHECK(accel_module_get_tensor(root, "head.weight") == shared);
    CHECK(accel_module_get_tensor(root, "emb.weight") == accel_module_get_tensor(root, "emb2.weight"));
    /* Shape mismatch and unknown names are errors. */
    accel_module_add_child(root, "other", accel_linear_new(2, 2, false, ACCEL_CPU_DEVICE, ACCEL_F32));
    CHECK(accel_module_tie(root, "other.weight", "emb.weight") == ACCEL_ERR_SHAPE);
    accel_clear_error();
    CHECK(accel_module_tie(root, "other.weight", "emb.nope") == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "emb.nope");
    accel_clear_error();
    accel_module_free(root); /* the tied tensor is freed once (ASan checks) */
}

/* As torch's nn.Parameter: an integer or bool tensor cannot require grad, so
 * it is refused as a parameter (and freed: the module took it); a buffer of
 * any dtype is taken. */
static void test_param_must_be_float(void) {
    accel_module *m = make_block();
    CHECK(accel_module_add_param(m, "ids", accel_tensor_new(ACCEL_I64, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE)) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_module_add_param: \"ids\" is int64");
    CHECK_STR_CONTAINS(accel_last_error(), "floating-point");
    accel_clear_error();
    CHECK(accel_module_add_param(m, "flag", accel_tensor_new(ACCEL_BOOL, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE)) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    CHECK(accel_module_get_tensor(m, "ids") == NULL && accel_module_get_tensor(m, "flag") == NULL);
    accel_tensor *ids = accel_module_add_buffer(m, "ids", accel_tensor_new(ACCEL_I64, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE));
    CHECK(ids && !ids->requires_grad);
    accel_module_free(m); /* the refused tensors were freed (ASan checks) */
}

/* One tensor added under a second name, or to a second module, would be
 * freed by both owners: refused (accel_module_tie shares a tensor), and left
 * to its owner. */
static void test_member_owned_once(void) {
    accel_module *m = make_block(), *other = accel_linear_new(2, 2, false, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_tensor *scale = accel_module_get_tensor(m, "scale");
    CHECK(accel_module_add_param(m, "scale2", scale) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "already a parameter");
    CHECK_STR_CONTAINS(accel_last_error(), "accel_module_tie");
    accel_clear_error();
    CHECK(accel_module_add_param(other, "bias", scale) == NULL);
    accel_clear_error();
    CHECK(accel_module_add_buffer(other, "count", accel_module_get_tensor(m, "count")) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "already a buffer");
    accel_clear_error();
    CHECK(accel_module_get_tensor(m, "scale") == scale && scale->magic == ACCEL_TENSOR_MAGIC); /* not freed */
    /* Freeing a tensor handed to a module: the module frees it. */
    accel_tensor_free(scale);
    CHECK(accel_last_status() == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "\"scale\" is a parameter of a module");
    accel_clear_error();
    accel_tensor_free(accel_module_get_tensor(m, "count"));
    CHECK_STR_CONTAINS(accel_last_error(), "buffer");
    accel_clear_error();
    CHECK(scale->magic == ACCEL_TENSOR_MAGIC && accel_module_num_params(m) == 13);
    accel_module_free(other);
    accel_module_free(m); /* each tensor freed once (ASan checks) */
}

/* A module that is already in a tree, or that would close a cycle, is
 * refused and left where it is: adding it would free it twice, or make every
 * walk of the tree (free, forward, state dict) recurse until the stack ends. */
static void test_child_in_one_tree(void) {
    accel_module *m = make_block();
    accel_module *fc = accel_module_find(m, "fc");
    CHECK(accel_module_add_child(m, "self", m) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "cycle");
    accel_clear_error();
    CHECK(accel_module_add_child(fc, "up", m) == NULL); /* m is fc's parent */
    CHECK_STR_CONTAINS(accel_last_error(), "ancestors");
    accel_clear_error();
    accel_module *seq = accel_sequential_new(1, (accel_module *[]){fc}); /* fc has a parent */
    CHECK(seq == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "already has a parent");
    accel_clear_error();
    accel_module *lin = accel_linear_new(2, 2, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(accel_sequential_new(2, (accel_module *[]){lin, lin}) == NULL); /* the same layer twice */
    accel_clear_error();
    CHECK(accel_module_find(m, "fc") == fc && accel_module_num_params(m) == 2 + 1 + 8 + 2);
    accel_module_free(m); /* every module freed once (ASan checks) */
}

static void test_flatten(void) {
    accel_module *root = accel_module_new(&BLOCK_OPS, NULL);
    accel_module_add_child(root, "a", make_block());
    accel_module_add_child(root, "h", accel_linear_new(2, 3, false, ACCEL_CPU_DEVICE, ACCEL_BF16));
    accel_tensor *w = accel_module_get_tensor(root, "a.fc.weight");
    float before[6];
    accel_to_floats(w, before);
    /* A gradient from before flattening is carried into the flat buffer. */
    w->grad = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2, 3), ACCEL_CPU_DEVICE);
    ((float *)w->grad->data)[4] = 7.0f;

    /* Sizes past int64 wrapped to a small buffer the parameters were copied
     * past (heap overflow): refused, nothing rebound. */
    CHECK(accel_module_flatten(root, INT64_MAX, 1) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "more than 2^63 bytes");
    CHECK(accel_module_flatten(root, 4, INT64_MAX / 2) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "pad_multiple 4611686018427387903");
    accel_clear_error();
    CHECK(memcmp(w->data, before, sizeof before) == 0 && ((float *)w->grad->data)[4] == 7.0f);

    accel_flat_params *fp = accel_module_flatten(root, 4, 16);
    CHECK(fp && fp->n_buffers == 2);
    accel_flat_buffer *b = &fp->buffers[ACCEL_F32];
    /* f32 params in order: scale [2] @0, fc.weight [6] @4, fc.bias [2] @12, norm [2] @16 -> 18 -> 32 */
    CHECK(b->n == 4 && b->numel == 32);
    CHECK(b->offsets[0] == 0 && b->offsets[1] == 4 && b->offsets[2] == 12 && b->offsets[3] == 16);
    CHECK(b->tensors[1] == w && w->data == (float *)b->params + 4);
    CHECK(w->grad->data == (float *)b->grads + 4 && ((float *)b->grads)[8] == 7.0f);
    CHECK(memcmp(w->data, before, sizeof before) == 0);
    CHECK(fp->buffers[ACCEL_BF16].n == 1 && fp->buffers[ACCEL_BF16].numel == 16);
    /* Gradients accumulated by autograd land in the flat buffer. */
    accel_tensor *g = accel_full(ACCEL_F32, ACCEL_SHAPE(2, 3), 0.5);
    CHECK(accel_grad_accumulate(w, g) == ACCEL_OK);
    CHECK(((float *)b->grads)[4] == 0.5f && ((float *)b->grads)[8] == 7.5f);
    /* An optimizer over the flat buffer moves the module's parameters. */
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 1.0);
    accel_tensor *fp_params = accel_tensor_wrap(b->params, ACCEL_F32, 1, &b->numel, b->device);
    accel_tensor *fp_grads = accel_tensor_wrap(b->grads, ACCEL_F32, 1, &b->numel, b->device);
    accel_optimizer *opt = accel_optimizer_new_flat(ACCEL_OPTIM_SGD, fp_params, fp_grads, &h);
    accel_tensor_free(fp_params);
    accel_tensor_free(fp_grads);
    accel_optimizer_step(opt);
    CHECK_CLOSE(((float *)w->data)[4], before[4] - 7.5f, 1e-6, 0);
    accel_optimizer_free(opt);
    float after[6];
    accel_to_floats(w, after);
    accel_flat_params_free(fp);
    /* The module keeps its values and gradients in memory of its own. */
    CHECK((w->flags & ACCEL_TF_OWNS_DATA) && memcmp(w->data, after, sizeof after) == 0);
    CHECK(w->grad && ((float *)w->grad->data)[4] == 7.5f);
    accel_step_reset();
    accel_module_free(root);
}

static void test_meta_and_to_empty(void) {
    accel_init_empty_weights_begin();
    accel_init_empty_weights_begin(); /* nestable */
    accel_module *m = make_block();
    accel_init_empty_weights_end();
    CHECK(accel_default_param_device(ACCEL_CPU_DEVICE).type == ACCEL_DEV_META);
    CHECK(accel_init_empty_weights_end() == ACCEL_OK);
    CHECK(accel_default_param_device(ACCEL_CPU_DEVICE).type == ACCEL_DEV_CPU);
    /* an end with no open begin is reported (it was ignored silently) */
    CHECK(accel_init_empty_weights_end() == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "not inside init_empty_weights");
    accel_clear_error();
    CHECK(accel_default_param_device(ACCEL_CPU_DEVICE).type == ACCEL_DEV_CPU);
    accel_tensor *w = accel_module_get_tensor(m, "fc.weight");
    CHECK(w->device.type == ACCEL_DEV_META && w->data == NULL);
    /* Buffers were created explicitly on cpu by make_block; parameters on meta. */
    CHECK(accel_module_num_params(m) == 13);
    CHECK(accel_module_to(m, ACCEL_CPU_DEVICE) == ACCEL_ERR_DEVICE);
    CHECK_STR_CONTAINS(accel_last_error(), "to_empty");
    accel_clear_error();
    CHECK(accel_module_flatten(m, 1, 1) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "on meta");
    accel_clear_error();
    CHECK(accel_module_to_empty(m, ACCEL_CPU_DEVICE, ACCEL_BF16) == ACCEL_OK);
    CHECK(w->device.type == ACCEL_DEV_CPU && w->dtype == ACCEL_BF16 && w->data);
    CHECK(accel_module_get_tensor(m, "count")->dtype == ACCEL_I64); /* was not on meta */
    CHECK(accel_module_to(m, ACCEL_META_DEVICE) == ACCEL_OK && w->data == NULL);
    accel_device cuda = {ACCEL_DEV_CUDA, 0};
    CHECK(accel_module_to(m, cuda) == ACCEL_ERR_DEVICE);
    accel_clear_error();
    accel_module_free(m);
}

typedef struct hook_log {
    int pre, post;
    char order[16];
} hook_log;

static accel_status pre(accel_module *m, accel_tensor **x, void *ctx) {
    hook_log *l = ctx;
    l->order[strlen(l->order)] = m->ops->type_name[0];
    l->pre++;
    return ACCEL_OK;
}

static accel_status post(accel_module *m, accel_tensor **y, void *ctx) {
    hook_log *l = ctx;
    l->post++;
    *y = accel_mul_scalar(*y, 2.0); /* a hook may replace the output */
    return ACCEL_OK;
}

static int freed_ctx;
static void free_ctx(void *ctx) { freed_ctx++; }

static void test_hooks(void) {
    accel_module *kids[2] = {accel_linear_new(2, 2, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                             accel_relu_module_new()};
    accel_module *seq = accel_sequential_new(2, kids);
    CHECK(accel_module_find(seq, "1") == kids[1]);
    hook_log log = {0};
    accel_module_hook h = {pre, post, free_ctx, &log};
    CHECK(accel_module_set_hook(kids[0], &h) == ACCEL_OK && accel_module_set_hook(seq, &h) == ACCEL_OK);
    CHECK(accel_module_set_hook(NULL, &h) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_module_set_hook");
    accel_clear_error();
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(1, 2), (float[]){1, -1});
    accel_tensor *y = accel_module_call(seq, x);
    CHECK(y && log.pre == 2 && log.post == 2 && strcmp(log.order, "SL") == 0);
    /* Expected: relu(2 * (W x + b)) * 2 */
    accel_tensor *W = accel_module_get_tensor(seq, "0.weight"), *b = accel_module_get_tensor(seq, "0.bias");
    for (int i = 0; i < 2 && y; i++) {
        double v = accel_get(W, (int64_t[]){i, 0}) - accel_get(W, (int64_t[]){i, 1}) +
                   accel_get(b, (int64_t[]){i});
        CHECK_CLOSE(accel_get(y, (int64_t[]){0, i}), 4 * fmax(v, 0), 1e-6, 1e-7);
    }
    accel_module_set_hook(kids[0], NULL);
    CHECK(freed_ctx == 1);
    accel_step_reset();
    accel_module_free(seq);
    CHECK(freed_ctx == 2);
}

/* Hooks that record what they were handed (a hook may read *x and *y: these
 * count a NULL instead of reading through it); drop: they drop the tensor. */
typedef struct seen_log {
    int pre, post, null_x, null_y;
    bool drop;
} seen_log;

static accel_status seen_pre(accel_module *m, accel_tensor **x, void *ctx) {
    seen_log *l = ctx;
    l->pre++;
    if (!x || !*x) l->null_x++;
    else if (l->drop) *x = NULL;
    return ACCEL_OK;
}

static accel_status seen_post(accel_module *m, accel_tensor **y, void *ctx) {
    seen_log *l = ctx;
    l->post++;
    if (!y) l->null_y++;
    else if (l->drop) *y = NULL;
    return ACCEL_OK;
}

/* enter/exit hand the hooks what the API promises them: an input tensor (a
 * NULL x, or *x, reached them), an address for the output (a NULL y did); a
 * hook that drops the tensor and says OK made the model return NULL with no
 * error. */
static void test_enter_exit_refuse_null(void) {
    accel_module *m = accel_relu_module_new();
    seen_log log = {0};
    accel_module_hook h = {seen_pre, seen_post, NULL, &log};
    CHECK(accel_module_set_hook(m, &h) == ACCEL_OK);
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(2), (float[]){1, -1}), *none = NULL;
    accel_clear_error();
    CHECK(accel_module_enter(m, NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_module_enter (ReLU): x is NULL");
    accel_clear_error();
    CHECK(accel_module_enter(m, &none) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "the input tensor is NULL");
    CHECK(accel_module_call(m, NULL) == NULL);
    CHECK(log.pre == 0 && log.post == 0 && log.null_x == 0);
    /* an earlier failure's NULL keeps that failure's error */
    accel_set_error(ACCEL_ERR_DTYPE, "an earlier failure");
    CHECK(accel_module_enter(m, &none) == ACCEL_ERR_DTYPE);
    CHECK_STR_CONTAINS(accel_last_error(), "an earlier failure");
    accel_clear_error();
    /* exit with no address for the output: refused after the post hook ran
     * with no output (it undoes what the pre hook set up) */
    CHECK(accel_module_enter(m, &x) == ACCEL_OK && log.pre == 1);
    CHECK(accel_module_exit(m, NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_module_exit (ReLU): y is NULL");
    CHECK(log.post == 1 && log.null_y == 0);
    accel_clear_error();
    /* a failed call's NULL output is what exit expects: no error */
    CHECK(accel_module_exit(m, &none) == ACCEL_OK && log.post == 2);
    /* hooks that drop the tensor and return OK */
    log.drop = true;
    accel_tensor *in = x;
    CHECK(accel_module_enter(m, &in) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "pre_forward hook returned OK and left no input");
    CHECK(log.pre == 2 && log.post == 3); /* the post hook undid it: no exit follows a failed enter */
    accel_clear_error();
    CHECK(accel_module_call(m, x) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_STATE);
    accel_clear_error();
    log.drop = false;
    accel_tensor *out = x;
    CHECK(accel_module_enter(m, &out) == ACCEL_OK);
    log.drop = true;
    CHECK(accel_module_exit(m, &out) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "post_forward hook returned OK and dropped the output");
    accel_clear_error();
    CHECK(log.null_x == 0 && log.null_y == 0);
    accel_step_reset();
    accel_module_free(m);
}

/* The seed config: transformers' LlamaForCausalLM(vocab 32, hidden 64,
 * intermediate 64, 1 layer, 1 head, max_pos 64) has 32960 state_dict elements
 * untied (30912 unique when tied), and these names in this order. */
static void test_llama_tree_on_meta(void) {
    accel_llama_config c = accel_llama_config_default();
    CHECK(c.vocab_size == 32000 && c.hidden_size == 4096 && c.rms_norm_eps == 1e-6);
    c.vocab_size = 32;
    c.hidden_size = 64;
    c.intermediate_size = 64;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 1;
    c.num_key_value_heads = 0;
    c.max_position_embeddings = 64;
    accel_init_empty_weights_begin();
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    accel_init_empty_weights_end();
    CHECK(m && accel_module_num_params(m) == 32960);
    const char *names[] = {
        "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
        "model.norm.weight", "lm_head.weight"};
    accel_state_dict *sd = accel_module_state_dict(m);
    CHECK(sd->n == 12);
    for (int i = 0; i < sd->n && i < 12; i++) {
        CHECK_MSG(strcmp(sd->entries[i].name, names[i]) == 0, "%s", sd->entries[i].name);
        CHECK(sd->entries[i].t->device.type == ACCEL_DEV_META);
    }
    accel_state_dict_free(sd);
    const char *types[][2] = {{"", "LlamaForCausalLM"}, {"model", "LlamaModel"},
                              {"model.layers.0", "LlamaDecoderLayer"},
                              {"model.layers.0.self_attn", "LlamaAttention"},
                              {"model.layers.0.mlp", "LlamaMLP"},
                              {"model.layers.0.input_layernorm", "LlamaRMSNorm"},
                              {"model.layers.0.mlp.up_proj", "Linear"},
                              {"model.embed_tokens", "Embedding"}, {"lm_head", "Linear"}};
    for (int i = 0; i < 9; i++) {
        accel_module *s = accel_module_find(m, types[i][0]);
        CHECK_MSG(s && strcmp(s->ops->type_name, types[i][1]) == 0, "%s", types[i][0]);
    }
    CHECK(accel_llama_config_of(m)->head_dim == 64 && accel_llama_config_of(m)->num_key_value_heads == 1);
    accel_module_free(m);

    c.tie_word_embeddings = true;
    c.attention_bias = true;
    m = accel_llama_new(&c, ACCEL_CPU_DEVICE); /* on cpu, initialised */
    CHECK(m && accel_module_num_params(m) == 30912 + 4 * 64);
    sd = accel_module_state_dict(m);
    CHECK(sd->n == 16 && strcmp(sd->entries[2].name, "model.layers.0.self_attn.q_proj.bias") == 0);
    CHECK(strcmp(sd->entries[15].name, "lm_head.weight") == 0 && sd->entries[15].is_tied_alias);
    CHECK(sd->entries[15].t == sd->entries[0].t);
    /* transformers' init: biases 0, norms 1, weights N(0, 0.02). */
    CHECK(accel_get(sd->entries[2].t, (int64_t[]){5}) == 0.0);
    CHECK(accel_get(accel_module_get_tensor(m, "model.norm.weight"), (int64_t[]){3}) == 1.0);
    double s2 = 0;
    accel_tensor *q = accel_module_get_tensor(m, "model.layers.0.self_attn.q_proj.weight");
    for (int64_t i = 0; i < 64; i++)
        for (int64_t j = 0; j < 64; j++) s2 += pow(accel_get(q, (int64_t[]){i, j}), 2);
    CHECK_CLOSE(sqrt(s2 / 4096), 0.02, 0.05, 0);
    accel_state_dict_free(sd);
    accel_module_free(m);

    c.num_attention_heads = 3; /* 64 % 3 != 0 */
    CHECK(accel_llama_new(&c, ACCEL_CPU_DEVICE) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "head_dim");
    accel_clear_error();
}

int main(void) {
    RUN(test_state_dict_order);
    RUN(test_tie);
    RUN(test_member_owned_once);
    RUN(test_param_must_be_float);
    RUN(test_child_in_one_tree);
    RUN(test_flatten);
    RUN(test_meta_and_to_empty);
    RUN(test_hooks);
    RUN(test_enter_exit_refuse_null);
    RUN(test_llama_tree_on_meta);
    accel_thread_cleanup();
    return check_summary();
}
