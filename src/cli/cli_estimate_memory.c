/* src/cli/cli_estimate_memory.c — `accel estimate-memory MODEL` (accelerate/commands/estimate.py).
 *
 * MODEL is a local directory holding config.json or a config.json path (no Hub
 * access here). The model is built on the meta device (no weight memory) and
 * measured with calculate_maximum_sizes (no_split: its decoder layer class): its
 * body, as Accelerate measures AutoModel (LlamaModel, Qwen2Model, ...: no lm_head); the
 * table is Accelerate's create_ascii_table, sizes formatted by convert_bytes.
 * accel's addition: --num_processes N, --batch_size B --seq_len T,
 * --mixed_precision, --activation_checkpointing and --strategy add the
 * per-rank training memory of each sharding strategy: weights, gradients,
 * Adam state, ZeRO-3's gathered units and the step's activations, counted
 * for the config's family (every decoder row of the architecture table,
 * BERT) (docs/bigmodel.md "Training memory"). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "accel/bert.h"
#include "accel/bigmodel.h"
#include "accel/io.h"
#include "cli/cli.h"
#include "core/str_to_bool.h"
#include "io/io_internal.h"
#include "bigmodel/mesh_memory.h"
#include "nn/arch.h"
#include "nn/decoder_cp.h"
#include "nn/tp_internal.h"

static const char *const DTYPES[] = {"float32", "float16", "int8", "int4"};

static void usage(FILE *f) {
    fprintf(f, "usage: accel estimate-memory [-h] [--library_name {timm,transformers}]\n"
               "                             [--dtypes {float32,float16,int8,int4} [{float32,float16,int8,int4} ...]]\n"
               "                             [--trust_remote_code] [--num_processes N]\n"
               "                             [--batch_size B --seq_len T [--num_choices N]]\n"
               "                             [--mixed_precision {no,fp16,bf16}]\n"
               "                             [--activation_checkpointing] [--strategy {DDP,ZERO1,ZERO2,ZERO3}]\n"
               "                             [--tp_size T] [--pp_size P] [--dp_shard_size S] [--dp_replicate_size R]\n"
               "                             [--cp_size C] [--cp_comm_strategy {allgather,alltoall}]\n"
               "                             [--num_micro_batches M] [--pp_schedule {1f1b,gpipe,interleaved}]\n"
               "                             [--pp_virtual_stages V] [--sequence_parallelism] model_name\n\n"
               "Model size estimator for fitting a model onto device memory. model_name is a local\n"
               "directory with a config.json (or the config.json itself). --num_processes N (or any of\n"
               "the options after it) adds the per-rank memory of training with Adam under DDP, ZeRO-1,\n"
               "ZeRO-2 (SHARD_GRAD_OP) and ZeRO-3 (FULL_SHARD): weights, gradients, optimizer state,\n"
               "ZeRO-3's gathered units, and with --batch_size B --seq_len T (per rank) the step's\n"
               "activations (the CPU step arena's peak; a multiple-choice model's examples of --num_choices N\n"
               "rows each), under autocast with --mixed_precision, with\n"
               "every decoder layer checkpointed with --activation_checkpointing. --strategy: one row.\n"
               "--tp_size, --pp_size, --dp_shard_size, --dp_replicate_size (also spelled\n"
               "--parallelism_config_tp_size, --megatron_lm_tp_degree, --megatron_lm_pp_degree, ...): the\n"
               "rank of that device mesh holding the most: its share of the layers (pipeline stages),\n"
               "of each layer's weights (tensor parallelism), ZeRO's shards over dp_shard\n"
               "(docs/bigmodel.md \"Per mesh\"), with a batch its activations on one tp rank; with\n"
               "--sequence_parallelism (--megatron_lm_sequence_parallelism) Megatron's split of the norms'\n"
               "and residual adds' along the sequence. --cp_size C (--parallelism_config_cp_size): context\n"
               "parallelism, the whole model on each cp rank, ZeRO's shards over dp_shard x cp, with a batch the\n"
               "activations of one cp rank's T / C positions (T a multiple of 2 C) and its attention's exchange,\n"
               "--cp_comm_strategy (--parallelism_config_cp_comm_strategy) allgather (the default: the whole\n"
               "sequence's K and V) or alltoall (Ulysses: its heads over the whole sequence). With pp above 1\n"
               "and a batch,\n"
               "each stage's row: its parameters, gradients, optimizer state and the micro-batch inputs\n"
               "its schedule holds (--num_micro_batches M, also --megatron_lm_num_micro_batches;\n"
               "--pp_schedule; --pp_virtual_stages V > 1: interleaved 1F1B).\n");
}

/* convert_bytes: powers of 1024, f"{round(size, 2)} {unit}" (Python prints a
 * rounded float with at least one decimal, an int without). */
void cli_convert_bytes(double size, bool is_int, char *out, size_t n) {
    static const char *units[] = {"bytes", "KB", "MB", "GB", "TB", "PB"};
    for (int u = 0; u < 6; u++) {
        if (size < 1024.0 || u == 5) { /* PB however large */
            if (is_int && u == 0) {
                snprintf(out, n, "%lld %s", (long long)size, units[u]);
                return;
            }
            char num[64];
            snprintf(num, sizeof num, "%.2f", size);
            size_t l = strlen(num);
            if (num[l - 1] == '0') num[--l] = 0;
            if (num[l - 1] == '0' && num[l - 2] != '.') num[--l] = 0;
            snprintf(out, n, "%s %s", num, units[u]);
            return;
        }
        size /= 1024.0;
        is_int = false;
    }
}

/* str.center(width): CPython puts the odd space left when width is odd. */
static void put_centered(FILE *out, const char *s, int width) {
    int len = (int)strlen(s), marg = width - len;
    if (marg <= 0) {
        fputs(s, out);
        return;
    }
    int left = marg / 2 + (marg & width & 1);
    fprintf(out, "%*s%s%*s", left, "", s, marg - left, "");
}

static void rule(FILE *out, int n) {
    for (int i = 0; i < n; i++) fputs("─", out);
}

static void make_row(FILE *out, const char *l, const char *mid, const char *r, const int *w, int nc, int diff) {
    fputs(l, out);
    for (int i = 0; i < nc; i++) {
        if (i) fputs(mid, out);
        rule(out, w[i]);
    }
    rule(out, diff);
    fputs(r, out);
    fputs("\n", out);
}

/* Accelerate's create_ascii_table: nc columns, each as wide as its widest
 * cell; a title wider than the columns widens the last one. */
void cli_print_table(FILE *out, const char *title, const char *const *headers, int nc,
                     char rows[][CLI_TABLE_MAX_COLS][32], int nr) {
    int w[CLI_TABLE_MAX_COLS], sum = 0;
    for (int c = 0; c < nc; c++) {
        w[c] = (int)strlen(headers[c]);
        for (int r = 0; r < nr; r++)
            if ((int)strlen(rows[r][c]) > w[c]) w[c] = (int)strlen(rows[r][c]);
        sum += w[c];
    }
    int diff = 0, sep_len = sum + nc + 1, tl = (int)strlen(title);
    if (tl > sum) {
        diff = abs(tl - sep_len);
        w[nc - 1] += diff;
    }
    int sep2 = sum + (tl > sum ? diff : 0) + diff + nc + 1;
    make_row(out, "┌", "─", "┐", w, nc, diff);
    fputs("│", out);
    put_centered(out, title, sep2 - 2);
    fputs("│\n", out);
    make_row(out, "├", "┬", "┤", w, nc, diff);
    int sepw[CLI_TABLE_MAX_COLS];
    memcpy(sepw, w, sizeof w);
    w[nc - 1] += diff;
    fputs("│", out);
    for (int c = 0; c < nc; c++) {
        put_centered(out, headers[c], w[c]);
        fputs("│", out);
    }
    fputs("\n", out);
    make_row(out, "├", "┼", "┤", sepw, nc, diff);
    for (int r = 0; r < nr; r++) {
        fputs("│", out);
        for (int c = 0; c < nc; c++) {
            put_centered(out, rows[r][c], w[c]);
            fputs("│", out);
        }
        fputs("\n", out);
    }
    make_row(out, "└", "┴", "┘", w, nc, 0);
}

/* The per-rank request: world size, and the activation options when a
 * batch is given (--batch_size and --seq_len). */
enum { MESH_TP, MESH_PP, MESH_DP_SHARD, MESH_DP_REPLICATE, MESH_CP, MESH_SIZES };

typedef struct rank_request {
    int nproc;
    int strategy; /* one accel_shard_strategy, or -1: all */
    bool have_batch;
    accel_activation_opts act;
    int mesh[MESH_SIZES];            /* the sizes given (0: not given) */
    const char *mesh_flag[MESH_SIZES]; /* the flag that gave each, for the errors */
    accel__mesh_bytes rank;          /* the rank holding the most, when a size is given */
    int micro, virt;                 /* --num_micro_batches, --pp_virtual_stages (0: not given) */
    const char *schedule;            /* --pp_schedule, NULL: not given */
} rank_request;

/* Whether any mesh size was given. */
static bool mesh_given(const rank_request *q) {
    for (int k = 0; k < MESH_SIZES; k++)
        if (q->mesh_flag[k]) return true;
    return false;
}

/* The ranks ZeRO shards over: dp_shard x cp (the cp ranks hold the same
 * parameters: torch's dp_shard_cp, accelerator/zero_config.c). */
static int zero_world(const rank_request *q) { return q->mesh[MESH_DP_SHARD] * q->mesh[MESH_CP]; }

static const char *const STRATEGY_LABELS[ACCEL_SHARD_STRATEGIES] = {
    "DDP (NO_SHARD)", "ZeRO-1", "ZeRO-2 (SHARD_GRAD_OP)", "ZeRO-3 (FULL_SHARD)"};

static void rank_row(char row[][32], int *nc, accel_shard_strategy s, const accel_rank_memory *r, bool copies,
                     bool act) {
    int c = 0;
    snprintf(row[c++], 32, "%s", STRATEGY_LABELS[s]);
    cli_convert_bytes((double)r->weights, true, row[c++], 32);
    cli_convert_bytes((double)r->grads, true, row[c++], 32);
    cli_convert_bytes((double)r->optimizer, true, row[c++], 32);
    cli_convert_bytes((double)r->gathered, true, row[c++], 32);
    if (copies) cli_convert_bytes((double)r->prepared, true, row[c++], 32);
    if (act) cli_convert_bytes((double)r->activations, true, row[c++], 32);
    cli_convert_bytes((double)r->total, true, row[c++], 32);
    *nc = c;
}

/* The per-rank table: Adam on f32 parameters under each strategy (docs/
 * bigmodel.md "Training memory"), with the step's activations when a batch
 * is given: of the BERT bcfg when set, else of the decoder cfg (any family). */
static int print_rank_table(FILE *out, const accel_llama_config *cfg, const accel_bert_config *bcfg,
                            int64_t total, int64_t largest, const rank_request *q) {
    char rows[ACCEL_SHARD_STRATEGIES][CLI_TABLE_MAX_COLS][32];
    int nr = 0, nc = 0;
    for (int s = 0; s < ACCEL_SHARD_STRATEGIES; s++) {
        if (q->strategy >= 0 && s != q->strategy) continue;
        /* ZeRO-3's units copy their outputs' gradients */
        accel_activation_opts o = q->act;
        o.zero3 = s == ACCEL_SHARD_ZERO3;
        accel_activation_bytes ab = {0};
        accel_rank_memory r;
        if ((q->have_batch && (bcfg ? accel_bert_activation_bytes(bcfg, &o, &ab)
                                    : accel_llama_activation_bytes(cfg, &o, &ab)) != ACCEL_OK) ||
            accel_rank_memory_estimate((accel_shard_strategy)s, total, largest, zero_world(q),
                                       q->act.autocast, ab.peak, &r) != ACCEL_OK) {
            fprintf(stderr, "accel estimate-memory: %s\n", accel_last_error());
            return 1;
        }
        rank_row(rows[nr++], &nc, (accel_shard_strategy)s, &r, q->act.autocast != ACCEL_F32, q->have_batch);
    }
    char title[256], choices[48] = ""; /* multiple choice's rows per example */
    if (q->act.num_choices) snprintf(choices, sizeof choices, "%lld choices x ", (long long)q->act.num_choices);
    int off = snprintf(title, sizeof title, "Training using Adam on %d process%s, per rank", q->nproc,
                       q->nproc == 1 ? "" : "es");
    if (q->have_batch)
        snprintf(title + off, sizeof title - (size_t)off, " (batch %lld x %s%lld, %s%s%s%s)",
                 (long long)q->act.batch_size, choices, (long long)q->act.seq_len,
                 q->act.autocast == ACCEL_F32 ? "f32" : q->act.autocast == ACCEL_BF16 ? "bf16" : "fp16",
                 q->act.checkpointing ? ", checkpointed" : "", q->act.sequence_parallel ? ", sequence parallel" : "",
                 q->act.cp_size < 2 ? "" : q->act.cp_alltoall ? ", cp all-to-all" : ", cp all-gather");
    /* bf16 and fp16 add the weights' autocast copies (accel_rank_memory.prepared) */
    const char *head[CLI_TABLE_MAX_COLS] = {"Strategy", "Weights", "Gradients", "Optimizer", "Gathered units"};
    int h = 5;
    if (q->act.autocast != ACCEL_F32) head[h++] = "Weight copies";
    if (q->have_batch) head[h++] = "Activations";
    head[h++] = "Total";
    cli_print_table(out, title, head, nc, rows, nr);
    if (!mesh_given(q)) return 0;
    bool cp = q->mesh[MESH_CP] > 1;
    char cps[32] = "";
    if (cp) snprintf(cps, sizeof cps, " x cp %d", q->mesh[MESH_CP]);
    fprintf(out, "Mesh: pp %d x dp_replicate %d x dp_shard %d%s x tp %d; ZeRO shards over dp_shard%s (%d)",
           q->mesh[MESH_PP], q->mesh[MESH_DP_REPLICATE], q->mesh[MESH_DP_SHARD], cps, q->mesh[MESH_TP],
           cp ? " x cp" : "", zero_world(q));
    if (q->mesh[MESH_PP] > 1)
        fprintf(out, "; the rank of pipeline stage %d (decoder layers %d-%d)", q->rank.stage, q->rank.first_layer,
               q->rank.first_layer + q->rank.n_layers - 1);
    if (q->mesh[MESH_TP] > 1)
        fprintf(out, "; 1/%d of each layer's weights and of the vocabulary%s", q->mesh[MESH_TP],
               !q->have_batch                ? ""
               : q->act.sequence_parallel ? ", activations of one tp rank with the norms' and residual adds' split "
                                            "along the sequence"
                                          : ", activations of one tp rank");
    if (cp)
        fprintf(out, "; the same weights on each of the %d cp ranks%s", q->mesh[MESH_CP],
               !q->have_batch ? ""
               : q->act.cp_alltoall ? ", activations of one cp rank's T / cp positions (all-to-all: its heads over "
                                      "the whole sequence in the attention)"
                                    : ", activations of one cp rank's T / cp positions (all-gather: the whole "
                                      "sequence's K and V in the attention)");
    fprintf(out, " (docs/bigmodel.md \"Per mesh\")\n");
    return 0;
}

/* The family model's config.json names: its "model_type". transformers'
 * AutoConfig, which Accelerate's estimate-memory reads it with, refuses a
 * config without that key ("Should have a `model_type` key in its
 * config.json"): taken for a Llama, it would be the estimate of a model the
 * user may not have. */
typedef enum config_family { FAMILY_NONE = -1, FAMILY_DECODER, FAMILY_BERT } config_family;

/* FAMILY_BERT for "bert", "roberta" or "xlm-roberta" (their own config and
 * model: accel/bert.h); FAMILY_DECODER for any other model_type, and where
 * the file cannot be read (the decoders' loader then says why); FAMILY_NONE
 * with an error naming the file where it has no "model_type". */
static config_family family_of(const char *model) {
    char *file = accel__is_dir(model) ? accel__path_join(model, "config.json") : accel_strdup(model);
    json_t *root = file ? accel__json_load_file(file) : NULL;
    accel_clear_error();
    config_family f = !root || !json_is_object(root)          ? FAMILY_DECODER
                      : !json_object_get(root, "model_type")    ? FAMILY_NONE
                      : accel__bert_model_type_of(root) >= 0 ? FAMILY_BERT
                                                               : FAMILY_DECODER;
    if (f == FAMILY_NONE)
        accel_set_error(ACCEL_ERR_FORMAT, "%s: no \"model_type\" key: the family of the model cannot be told (as "
                        "transformers' AutoConfig refuses it); add \"model_type\": \"llama\" (or the model's own)",
                        file);
    json_decref(root);
    accel_free(file);
    return f;
}

/* The head whose training step the activations count: the loader's (the
 * first task head "architectures" names), but where it names none and does
 * name the model type's masked LM or pre-training class (bert-base-uncased's
 * config says BertForMaskedLM), that one, the checkpoint's own head; the
 * loader builds those only when asked for (accel/bert.h). */
static accel_bert_head trained_head(const char *model, const accel_bert_config *c) {
    char *file = accel__is_dir(model) ? accel__path_join(model, "config.json") : accel_strdup(model);
    json_t *root = file ? accel__json_load_file(file) : NULL;
    json_t *arch = root ? json_object_get(root, "architectures") : NULL;
    accel_bert_head head = c->head, own = c->head;
    const char *seq = accel_bert_class_name(c->model_type, ACCEL_BERT_SEQUENCE_CLASSIFICATION);
    for (size_t i = 0; head == ACCEL_BERT_SEQUENCE_CLASSIFICATION && json_is_array(arch) && i < json_array_size(arch);
         i++) {
        const char *name = json_string_value(json_array_get(arch, i));
        if (!name || !strcmp(name, seq)) { /* the loader's pick stands */
            own = head;
            break;
        }
        for (int h = ACCEL_BERT_MASKED_LM; h <= ACCEL_BERT_PRETRAINING && own == head; h++) {
            const char *cls = accel_bert_class_name(c->model_type, (accel_bert_head)h);
            if (cls && !strcmp(name, cls)) own = (accel_bert_head)h;
        }
    }
    json_decref(root);
    accel_free(file);
    accel_clear_error();
    return own;
}

/* --strategy: accel's names and FSDP's, any case. */
static int strategy_index(const char *s) {
    static const char *const NAMES[][2] = {{"DDP", "NO_SHARD"}, {"ZERO1", "ZeRO-1"},
                                           {"ZERO2", "SHARD_GRAD_OP"}, {"ZERO3", "FULL_SHARD"}};
    for (int i = 0; i < ACCEL_SHARD_STRATEGIES; i++)
        if (!strcasecmp(s, NAMES[i][0]) || !strcasecmp(s, NAMES[i][1]) ||
            !strcasecmp(s, accel_shard_strategy_name((accel_shard_strategy)i)))
            return i;
    return -1;
}

static int dtype_index(const char *s) {
    for (int i = 0; i < 4; i++)
        if (strcmp(s, DTYPES[i]) == 0) return i;
    return -1;
}

/* A positive integer option value (at most max), or -1 after printing the
 * error naming the option. */
static int64_t count_arg(const char *opt, const char *v, int64_t max) {
    char *end = NULL;
    errno = 0;
    long long n = v ? strtoll(v, &end, 10) : 0;
    if (!v || end == v || *end || errno || n < 1 || n > max) {
        usage(stderr);
        fprintf(stderr, "accel estimate-memory: error: argument %s: expected a count >= 1%s (got %s)\n", opt,
                max < INT64_MAX ? " and <= 2^20" : " (at most 2^63 - 1)", v ? v : "nothing");
        return -1;
    }
    return n;
}

/* --foo_bar or --foo-bar. */
static bool is_opt(const char *a, const char *name) {
    if (strncmp(a, "--", 2)) return false;
    a += 2;
    for (; *a && *name; a++, name++)
        if (*a != *name && !(*a == '-' && *name == '_')) return false;
    return !*a && !*name;
}

/* The mesh size an option gives (--tp_size and Accelerate's spellings of
 * it), or -1. */
static int mesh_index(const char *a) {
    static const struct { const char *name; int k; } NAMES[] = {
        {"tp_size", MESH_TP}, {"parallelism_config_tp_size", MESH_TP}, {"megatron_lm_tp_degree", MESH_TP},
        {"pp_size", MESH_PP}, {"megatron_lm_pp_degree", MESH_PP},
        {"dp_shard_size", MESH_DP_SHARD}, {"parallelism_config_dp_shard_size", MESH_DP_SHARD},
        {"dp_replicate_size", MESH_DP_REPLICATE}, {"parallelism_config_dp_replicate_size", MESH_DP_REPLICATE},
        {"cp_size", MESH_CP}, {"parallelism_config_cp_size", MESH_CP}};
    for (size_t i = 0; i < sizeof NAMES / sizeof *NAMES; i++)
        if (is_opt(a, NAMES[i].name)) return NAMES[i].k;
    return -1;
}

/* The sizes against --num_processes (dp_shard: what the others leave of it
 * when not given; the processes: their product when not given). false after
 * printing the error naming the flags. */
static bool resolve_mesh(rank_request *q, bool nproc_given) {
    for (int k = 0; k < MESH_SIZES; k++)
        if (!q->mesh[k] && k != MESH_DP_SHARD) q->mesh[k] = 1;
    /* each size is at most 2^20, so their products (up to five) are taken
     * in double, exact to 2^53, and checked before they are used */
    double rest = (double)q->mesh[MESH_TP] * q->mesh[MESH_PP] * q->mesh[MESH_DP_REPLICATE] * q->mesh[MESH_CP];
    const char *cp = q->mesh[MESH_CP] > 1 ? " x cp" : "";
    if (!q->mesh[MESH_DP_SHARD]) {
        if (nproc_given && fmod(q->nproc, rest) != 0) {
            usage(stderr);
            fprintf(stderr, "accel estimate-memory: error: tp x pp x dp_replicate%s = %.0f does not divide "
                            "--num_processes %d\n", cp, rest, q->nproc);
            return false;
        }
        q->mesh[MESH_DP_SHARD] = nproc_given ? (int)(q->nproc / rest) : 1;
    }
    double total = rest * q->mesh[MESH_DP_SHARD];
    if (nproc_given && total != q->nproc) {
        char cps[32] = "";
        if (*cp) snprintf(cps, sizeof cps, " x cp %d", q->mesh[MESH_CP]);
        usage(stderr);
        fprintf(stderr, "accel estimate-memory: error: tp %d x pp %d x dp_replicate %d x dp_shard %d%s = %.0f, not "
                        "--num_processes %d\n", q->mesh[MESH_TP], q->mesh[MESH_PP], q->mesh[MESH_DP_REPLICATE],
                q->mesh[MESH_DP_SHARD], cps, total, q->nproc);
        return false;
    }
    if (total > 1 << 20) {
        usage(stderr);
        fprintf(stderr, "accel estimate-memory: error: the mesh makes %.0f processes (at most 2^20)\n", total);
        return false;
    }
    q->nproc = (int)total;
    return true;
}


/* argparse's "--option=value" as "--option" "value" (argv's pointers, the
 * names copied after them in the one allocation; NULL when out of memory).
 * (*joined)[i] says that args[i] is the value of such an "=": it is the
 * option's one value (argparse takes no more after it, even for --dtypes'
 * nargs="+"), and an on/off flag refuses it. */
static char **split_assignments(int argc, char **argv, int *n, bool **joined) {
    size_t bytes = 0;
    for (int i = 0; i < argc; i++) bytes += strlen(argv[i]) + 1;
    char **out = malloc(2 * (size_t)argc * (sizeof *out + sizeof **joined) + bytes);
    if (!out) return NULL;
    *joined = (bool *)(out + 2 * (size_t)argc);
    char *names = (char *)(*joined + 2 * (size_t)argc);
    *n = 0;
    for (int i = 0; i < argc; i++) {
        const char *eq = strncmp(argv[i], "--", 2) ? NULL : strchr(argv[i], '=');
        if (!eq) {
            (*joined)[*n] = false;
            out[(*n)++] = argv[i];
            continue;
        }
        size_t len = (size_t)(eq - argv[i]);
        memcpy(names, argv[i], len);
        names[len] = 0;
        (*joined)[*n] = false, (*joined)[*n + 1] = true;
        out[(*n)++] = names;
        out[(*n)++] = (char *)eq + 1;
        names += len + 1;
    }
    return out;
}

static int estimate_memory(int argc, char **argv, const bool *joined, FILE *out);

/* The tables are held in memory and printed only when every one of them could be made: an error found
 * while making a later one (activations past 2^62 bytes, a batch that does not split into the
 * micro-batches) printed the first tables and then the error, exit 1 after output that read as an answer. */
int accel_cli_estimate_memory(int argc, char **argv) {
    int n;
    bool *joined;
    char **args = split_assignments(argc, argv, &n, &joined);
    char *tables = NULL;
    size_t len = 0;
    FILE *out = args ? open_memstream(&tables, &len) : NULL;
    if (!out) {
        fprintf(stderr, "accel estimate-memory: out of memory\n");
        free(args);
        return 1;
    }
    int rc = estimate_memory(n, args, joined, out);
    free(args);
    if (fclose(out) != 0 && !rc) {
        fprintf(stderr, "accel estimate-memory: out of memory for the tables\n");
        rc = 1;
    }
    /* (flushed here: tables of a few KB sit in stdio's buffer, and a write failing at exit is never seen) */
    if (!rc && (fwrite(tables, 1, len, stdout) != len || fflush(stdout) != 0)) {
        fprintf(stderr, "accel estimate-memory: cannot write the tables: %s\n", strerror(errno));
        rc = 1;
    }
    free(tables);
    return rc;
}

/* argparse's refusal of a value given to an on/off flag by "=" (name: the
 * flag's canonical spelling). */
static int refuse_flag_value(const char *name, const char *value) {
    usage(stderr);
    fprintf(stderr, "accel estimate-memory: error: argument %s: ignored explicit argument '%s'\n", name, value);
    return 2;
}

static int estimate_memory(int argc, char **argv, const bool *joined, FILE *out) {
    const char *model = NULL;
    int dts[16], ndt = 0;
    rank_request q = {.strategy = -1, .act = {.autocast = ACCEL_F32}};
    bool have_seq = false;
    const char *cp_strategy = NULL; /* the flag that gave it */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool valued = i + 1 < argc && joined[i + 1]; /* "--a=v": argv[i + 1] is v */
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (valued) return refuse_flag_value("-h/--help", argv[i + 1]);
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--dtypes")) {
            ndt = 0; /* argparse's store: a later --dtypes replaces an earlier one's list */
            if (valued && dtype_index(argv[i + 1]) >= 0 && ndt < 16) /* the one value: what follows is positional */
                dts[ndt++] = dtype_index(argv[++i]);
            else
                while (!valued && i + 1 < argc && argv[i + 1][0] != '-' && dtype_index(argv[i + 1]) >= 0 && ndt < 16)
                    dts[ndt++] = dtype_index(argv[++i]);
            if (ndt == 16 && !valued && i + 1 < argc && dtype_index(argv[i + 1]) >= 0) {
                usage(stderr);
                fprintf(stderr, "accel estimate-memory: error: argument --dtypes: at most 16 values (a table row "
                                "each)\n");
                return 2;
            }
            if (ndt == 0 || (!valued && i + 1 < argc && argv[i + 1][0] != '-' && model)) {
                usage(stderr);
                fprintf(stderr, "accel estimate-memory: error: argument --dtypes: expected one or more of float32, "
                                "float16, int8, int4\n");
                return 2;
            }
        } else if (is_opt(a, "library_name")) {
            if (i + 1 >= argc || (strcmp(argv[i + 1], "transformers") && strcmp(argv[i + 1], "timm"))) {
                usage(stderr);
                fprintf(stderr, "accel estimate-memory: error: argument --library_name: invalid choice (choose from "
                                "'timm', 'transformers')\n");
                return 2;
            }
            if (!strcmp(argv[++i], "timm")) {
                fprintf(stderr, "accel estimate-memory: error: timm models are not available in accel (only "
                                "transformers configs)\n");
                return 1;
            }
        } else if (is_opt(a, "num_processes")) {
            int64_t v = count_arg("--num_processes", i + 1 < argc ? argv[++i] : NULL, 1 << 20);
            if (v < 0) return 2;
            q.nproc = (int)v;
        } else if (is_opt(a, "batch_size")) {
            if ((q.act.batch_size = count_arg("--batch_size", i + 1 < argc ? argv[++i] : NULL, INT64_MAX)) < 0)
                return 2;
            q.have_batch = true;
        } else if (is_opt(a, "num_choices")) { /* multiple choice: each --batch_size example is N rows */
            if ((q.act.num_choices = count_arg("--num_choices", i + 1 < argc ? argv[++i] : NULL, 1 << 20)) < 0)
                return 2;
        } else if (is_opt(a, "seq_len")) {
            if ((q.act.seq_len = count_arg("--seq_len", i + 1 < argc ? argv[++i] : NULL, INT64_MAX)) < 0) return 2;
            have_seq = true;
        } else if (is_opt(a, "mixed_precision")) {
            const char *v = i + 1 < argc ? argv[++i] : "";
            if (!strcmp(v, "no")) q.act.autocast = ACCEL_F32;
            else if (!strcmp(v, "bf16")) q.act.autocast = ACCEL_BF16;
            else if (!strcmp(v, "fp16")) q.act.autocast = ACCEL_F16;
            else {
                usage(stderr);
                fprintf(stderr, "accel estimate-memory: error: argument --mixed_precision: invalid choice: '%s' "
                                "(choose from 'no', 'fp16', 'bf16')\n", v);
                return 2;
            }
        } else if (is_opt(a, "activation_checkpointing")) {
            if (valued) return refuse_flag_value("--activation_checkpointing", argv[i + 1]);
            q.act.checkpointing = true;
        } else if (is_opt(a, "strategy")) {
            const char *v = i + 1 < argc ? argv[++i] : "";
            if ((q.strategy = strategy_index(v)) < 0) {
                usage(stderr);
                fprintf(stderr, "accel estimate-memory: error: argument --strategy: invalid choice: '%s' (choose "
                                "from DDP/NO_SHARD, ZERO1, ZERO2/SHARD_GRAD_OP, ZERO3/FULL_SHARD)\n", v);
                return 2;
            }
        } else if (is_opt(a, "num_micro_batches") || is_opt(a, "megatron_lm_num_micro_batches") ||
                   is_opt(a, "pp_virtual_stages")) {
            int64_t v = count_arg(a, i + 1 < argc ? argv[++i] : NULL, 1 << 20);
            if (v < 0) return 2;
            *(is_opt(a, "pp_virtual_stages") ? &q.virt : &q.micro) = (int)v;
        } else if (is_opt(a, "pp_schedule")) {
            const char *v = i + 1 < argc ? argv[++i] : "";
            if (strcmp(v, "1f1b") && strcmp(v, "gpipe") && strcmp(v, "interleaved")) {
                usage(stderr);
                fprintf(stderr, "accel estimate-memory: error: argument --pp_schedule: invalid choice: '%s' (choose "
                                "from '1f1b', 'gpipe', 'interleaved')\n", v);
                return 2;
            }
            q.schedule = v;
        } else if (mesh_index(a) >= 0) {
            int k = mesh_index(a);
            int64_t v = count_arg(a, i + 1 < argc ? argv[++i] : NULL, 1 << 20);
            if (v < 0) return 2;
            if (q.mesh_flag[k] && q.mesh[k] != v) {
                usage(stderr);
                fprintf(stderr, "accel estimate-memory: error: %s %d and %s %lld disagree\n", q.mesh_flag[k],
                        q.mesh[k], a, (long long)v);
                return 2;
            }
            q.mesh[k] = (int)v;
            q.mesh_flag[k] = a;
        } else if (is_opt(a, "cp_comm_strategy") || is_opt(a, "parallelism_config_cp_comm_strategy")) {
            const char *v = i + 1 < argc ? argv[++i] : "";
            if (strcmp(v, "allgather") && strcmp(v, "alltoall")) {
                usage(stderr);
                fprintf(stderr, "accel estimate-memory: error: argument %s: invalid choice: '%s' (choose from "
                                "'allgather', 'alltoall')\n", a, v);
                return 2;
            }
            cp_strategy = a;
            q.act.cp_alltoall = !strcmp(v, "alltoall");
        } else if (is_opt(a, "sequence_parallelism") || is_opt(a, "megatron_lm_sequence_parallelism")) {
            /* a flag, or Accelerate's --megatron_lm_sequence_parallelism {true,false} (str_to_bool's words);
             * a value given by "=" is one of those (else it was taken for the model) */
            const char *v = i + 1 < argc ? argv[i + 1] : "";
            int b = accel__str_to_bool(v, strlen(v));
            if (valued && b < 0) {
                usage(stderr);
                fprintf(stderr, "accel estimate-memory: error: argument %s: invalid str_to_bool value: '%s'\n",
                        is_opt(a, "sequence_parallelism") ? "--sequence_parallelism"
                                                          : "--megatron_lm_sequence_parallelism", v);
                return 2;
            }
            i += b >= 0;
            q.act.sequence_parallel = b != 0;
        } else if (is_opt(a, "trust_remote_code")) {
            if (valued) return refuse_flag_value("--trust_remote_code", argv[i + 1]);
            /* nothing runs remote code here */
        } else if (a[0] == '-' || model) {
            usage(stderr);
            fprintf(stderr, "accel estimate-memory: error: unrecognized arguments: %s\n", a);
            return 2;
        } else {
            model = a;
        }
    }
    if (!model) {
        usage(stderr);
        fprintf(stderr, "accel estimate-memory: error: the following arguments are required: model_name\n");
        return 2;
    }
    if (q.have_batch != have_seq) {
        usage(stderr);
        fprintf(stderr, "accel estimate-memory: error: --batch_size and --seq_len go together (the activations "
                        "need both)\n");
        return 2;
    }
    if (q.act.num_choices && !q.have_batch) {
        usage(stderr);
        fprintf(stderr, "accel estimate-memory: error: --num_choices goes with --batch_size and --seq_len (multiple "
                        "choice's activations: each example is num_choices rows)\n");
        return 2;
    }
    bool mesh = mesh_given(&q);
    bool per_rank = q.nproc || q.have_batch || q.strategy >= 0 || mesh;
    if (!q.nproc && !mesh) q.nproc = 1;
    if (mesh && !resolve_mesh(&q, q.nproc > 0)) return 2;
    if (!mesh) { /* ZeRO shards over every process */
        for (int k = 0; k < MESH_SIZES; k++) q.mesh[k] = 1;
        q.mesh[MESH_DP_SHARD] = q.nproc;
    }
    q.act.tp_size = q.mesh[MESH_TP];
    q.act.cp_size = q.mesh[MESH_CP];
    char tp_bad[192] = "";
    if (q.act.sequence_parallel && q.act.tp_size < 2)
        snprintf(tp_bad, sizeof tp_bad, "--sequence_parallelism splits the sequence over the tp ranks: give it with "
                 "--tp_size above 1");
    else if (q.have_batch && q.act.sequence_parallel && q.act.seq_len % q.act.tp_size)
        snprintf(tp_bad, sizeof tp_bad, "--seq_len %lld is not a multiple of --tp_size %d: sequence parallelism "
                 "splits the sequence over the tp ranks", (long long)q.act.seq_len, q.act.tp_size);
    else if (cp_strategy && q.act.cp_size < 2)
        snprintf(tp_bad, sizeof tp_bad, "%s chooses how context parallelism's ranks exchange K and V: give it with "
                 "--cp_size above 1", cp_strategy);
    else if (q.have_batch && q.act.cp_size > 1 && q.act.seq_len % (2 * q.act.cp_size))
        snprintf(tp_bad, sizeof tp_bad, "--seq_len %lld is not a multiple of 2 x --cp_size = %d: each of the cp "
                 "ranks holds 2 of the 2 x cp equal chunks of the sequence (the load-balanced causal split)",
                 (long long)q.act.seq_len, 2 * q.act.cp_size);
    if (tp_bad[0]) {
        usage(stderr);
        fprintf(stderr, "accel estimate-memory: error: %s\n", tp_bad);
        return 2;
    }
    /* the pipeline's per-stage table: pp above 1 with a batch */
    bool pipeline = q.have_batch && q.mesh[MESH_PP] > 1;
    bool interleaved = q.schedule ? !strcmp(q.schedule, "interleaved") : q.virt > 1;
    const char *pp_bad = (q.micro || q.virt || q.schedule) && !pipeline
                             ? "--num_micro_batches, --pp_schedule and --pp_virtual_stages shape the pipeline's "
                               "per-stage table: give them with --pp_size above 1 and --batch_size / --seq_len"
                         : interleaved != (q.virt > 1)
                             ? "virtual stages are the interleaved schedule's: give --pp_virtual_stages above 1 "
                               "with --pp_schedule interleaved (or alone)"
                         : pipeline && q.strategy == ACCEL_SHARD_ZERO3
                             ? "ZeRO-3 is not built with pipeline parallelism (its units are gathered around every "
                               "micro-batch's forward and backward): --strategy DDP, ZERO1 or ZERO2"
                             : NULL;
    if (pp_bad) {
        usage(stderr);
        fprintf(stderr, "accel estimate-memory: error: %s\n", pp_bad);
        return 2;
    }
    if (ndt == 0)
        for (ndt = 0; ndt < 4; ndt++) dts[ndt] = ndt;
    config_family family = family_of(model);
    if (family == FAMILY_NONE) {
        fprintf(stderr, "accel estimate-memory: %s\n", accel_last_error());
        return 1;
    }
    bool bert = family == FAMILY_BERT;
    if (bert && (q.mesh[MESH_TP] > 1 || q.mesh[MESH_PP] > 1 || q.mesh[MESH_CP] > 1)) {
        usage(stderr);
        fprintf(stderr, "accel estimate-memory: error: %s: tensor, pipeline and context parallelism of bert models "
                        "are not implemented (nor of roberta and xlm-roberta: --tp_size / --pp_size / --cp_size "
                        "above 1)\n", model);
        return 2;
    }
    accel_llama_config cfg = {0};
    accel_bert_config bcfg = {0};
    if (bert ? accel_bert_config_load(model, &bcfg) != ACCEL_OK : accel_llama_config_load(model, &cfg) != ACCEL_OK) {
        /* the decoders' loader lists the decoder families only: an unknown
         * model_type is told the encoders this command reads too */
        bool unknown = !bert && accel_last_status() == ACCEL_ERR_UNSUPPORTED &&
                       strstr(accel_last_error(), "model_type is ");
        fprintf(stderr, "accel estimate-memory: %s%s\n", accel_last_error(),
                unknown ? "; and the encoders \"bert\", \"roberta\", \"xlm-roberta\"" : "");
        return 1;
    }
    /* (only for the training tables, which hold the head's weights and step: the loading table is the body's,
     * the same whatever the head, and a masked LM accel cannot build, an untied decoder, must not cost it) */
    if (bert && per_rank) bcfg.head = trained_head(model, &bcfg);
    if (q.act.num_choices && !(bert && bcfg.head == ACCEL_BERT_MULTIPLE_CHOICE)) {
        usage(stderr);
        fprintf(stderr, "accel estimate-memory: error: %s: --num_choices is for a multiple-choice model (%s); this "
                        "one is a %s\n", model,
                bert ? accel_bert_class_name(bcfg.model_type, ACCEL_BERT_MULTIPLE_CHOICE) : "BertForMultipleChoice",
                bert ? accel_bert_class_name(bcfg.model_type, bcfg.head) : "decoder (causal LM)");
        return 2;
    }
    if (bert && q.have_batch && bcfg.head == ACCEL_BERT_MULTIPLE_CHOICE && !q.act.num_choices) {
        usage(stderr);
        fprintf(stderr, "accel estimate-memory: error: %s: a %s runs each of the --batch_size examples as one row "
                        "per choice: give --num_choices N\n", model,
                accel_bert_class_name(bcfg.model_type, bcfg.head));
        return 2;
    }
    /* Accelerate builds the model in float32 whatever config.json's (torch_)dtype says (its table's
     * float32 row), and training keeps f32 parameters: a bfloat16 config (every real checkpoint's, Mixtral's
     * and Qwen3-MoE's) measured in its own dtype printed half of both tables */
    cfg.torch_dtype = bcfg.torch_dtype = ACCEL_F32;
    /* a tp or cp the runtime refuses at prepare (nn/decoder_tp.c, nn/decoder_cp.c) has no per-rank memory to
     * estimate, batch or not */
    accel_cp_strategy exchange = q.act.cp_alltoall ? ACCEL_CP_ALLTOALL : ACCEL_CP_ALLGATHER;
    if (!bert && ((q.mesh[MESH_TP] > 1 && accel__llama_tp_check(&cfg, q.mesh[MESH_TP], q.mesh_flag[MESH_TP])) ||
                  (q.act.cp_size > 1 && accel__llama_cp_check(&cfg, q.mesh[MESH_TP], q.act.cp_size, exchange,
                                                              q.mesh_flag[MESH_CP])))) {
        fprintf(stderr, "accel estimate-memory: error: %s: %s\n", model, accel_last_error());
        return 2;
    }
    accel_init_empty_weights_begin();
    accel_module *m = bert ? accel_bert_new(&bcfg, ACCEL_CPU_DEVICE) : accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    accel_init_empty_weights_end();
    /* Accelerate builds AutoModel, Llama's body without lm_head (its table's
     * weights), BertModel without the classifier; training (the per-rank
     * table) also holds the head (an untied lm_head, the classifier). */
    /* the body: model, transformer (the root's first child); bert, roberta (XLM-RoBERTa's comes second) */
    accel_module *base = !m ? NULL : bert ? accel_module_find(m, accel_bert_base_model_prefix(bcfg.model_type))
                                          : m->children[0];
    /* transformers' _no_split_modules: the block class, and BertModel's BertEmbeddings (RobertaEmbeddings, ...) */
    const char *no_split[ACCEL_MAX_NO_SPLIT] = {""};
    int n_no_split = m ? accel_module_no_split_classes(m, no_split) : 0;
    int64_t total = 0, largest = 0, body = 0, body_largest = 0;
    accel_module_sizes *body_sizes = NULL;
    const accel__arch *arch = bert ? NULL : accel__arch_find(cfg.model_type);
    bool gemma = arch && arch->gemma_blocks;
    if (!m || accel_calculate_maximum_sizes(m, no_split, 1, &total, &largest) != ACCEL_OK ||
        accel_calculate_maximum_sizes(base, no_split, n_no_split, &body, &body_largest) != ACCEL_OK ||
        ((bert || gemma) && !(body_sizes = accel_compute_module_sizes(base, NULL, false)))) {
        fprintf(stderr, "accel estimate-memory: %s\n", accel_last_error());
        accel_module_free(m);
        return 1;
    }
    /* a rank of tp x pp holds its stage's layers and its share of each (bigmodel/mesh_memory.h) */
    if ((q.mesh[MESH_TP] > 1 || q.mesh[MESH_PP] > 1) &&
        accel__mesh_param_bytes(m, &cfg, q.mesh[MESH_TP], q.mesh[MESH_PP], &q.rank) != ACCEL_OK) {
        fprintf(stderr, "accel estimate-memory: %s\n", accel_last_error());
        accel_module_sizes_free(body_sizes);
        accel_module_free(m);
        return 1;
    }
    if (q.mesh[MESH_TP] > 1 || q.mesh[MESH_PP] > 1) total = q.rank.param_bytes, largest = q.rank.largest_unit;
    /* Buffers transformers keeps and accel computes instead. LlamaRotaryEmbedding's inv_freq and
     * original_inv_freq (rotary_dim / 2 f32 each: the head_dim rotated, Phi-3's partial_rotary_factor of it;
     * GPT-2 has no RoPE; Gemma 3's rotary embedding holds a pair for each layer type its layers have); Gemma's
     * embedding scale, one f32 (GemmaTextScaledWordEmbedding.embed_scale);
     * BertEmbeddings' position_ids and token_type_ids, [1, max_position_embeddings] int64 each (BertEmbeddings
     * is a layer of its own, unsplit). The loader bounds the weights, not these: weights just under 2^63
     * bytes and the buffers wrapped the total negative. */
    int64_t buffers = 0, emb = 0;
    bool wraps = false;
    if (arch && arch->blocks == ACCEL__BLOCKS_LLAMA) {
        accel_llama_config rc = cfg;
        if (!rc.head_dim) rc.head_dim = cfg.hidden_size / cfg.num_attention_heads;
        bool types = arch->window == ACCEL__WINDOW_TYPES, local = false, full = !types;
        for (int64_t i = 0; types && i < cfg.num_hidden_layers; i++)
            *(accel__arch_layer_local(arch, &cfg, i) ? &local : &full) = true;
        buffers = 2 * (local + full) * (accel__rotary_dim(&rc) / 2) * 4;
    }
    /* the scale is the embedding layer's buffer: that layer, often the largest, is 4 bytes larger
     * (a vocabulary of 1000 x 32 read 15.62 KB in int4 where Accelerate reads 15.63) */
    if (gemma) buffers += 4, emb = accel_module_sizes_get(body_sizes, "embed_tokens") + 4;
    if (bert)
        wraps = __builtin_mul_overflow(bcfg.max_position_embeddings, 16, &buffers) ||
                __builtin_add_overflow(accel_module_sizes_get(body_sizes, "embeddings"), buffers, &emb);
    /* Accelerate's AutoModel is a BertModel (RobertaModel) with its pooler, which the body of the token, QA and
     * masked-LM heads (and of every RoBERTa head but multiple choice) lacks */
    int64_t pooler = 0;
    if (bert && !accel_module_find(base, "pooler"))
        wraps = wraps || __builtin_mul_overflow(bcfg.hidden_size + 1, bcfg.hidden_size, &pooler) ||
                __builtin_mul_overflow(pooler, (int64_t)accel_dtype_size(bcfg.torch_dtype), &pooler) ||
                __builtin_add_overflow(body, pooler, &body);
    wraps = wraps || __builtin_add_overflow(body, buffers, &body);
    accel_module_sizes_free(body_sizes);
    if (wraps) {
        fprintf(stderr, "accel estimate-memory: %s: the weights and buffers would take more than 2^63 bytes", model);
        if (bert) fprintf(stderr, " (max_position_embeddings %lld)", (long long)bcfg.max_position_embeddings);
        fprintf(stderr, "\n");
        accel_module_free(m);
        return 1;
    }
    if (emb > body_largest) body_largest = emb;
    static const double div[] = {1, 2, 4, 8};
    char rows[16][CLI_TABLE_MAX_COLS][32];
    for (int r = 0; r < ndt; r++) {
        int k = dts[r];
        snprintf(rows[r][0], 32, "%s", DTYPES[k]);
        cli_convert_bytes((double)body_largest / div[k], k == 0, rows[r][1], 32);
        cli_convert_bytes((double)body / div[k], k == 0, rows[r][2], 32);
        /* Training using Adam: max(model, optimizer, gradients, step) */
        if (k == 0) cli_convert_bytes(4.0 * (double)body, true, rows[r][3], 32);
        else if (k == 1) cli_convert_bytes(2.0 * (double)body, true, rows[r][3], 32);
        else snprintf(rows[r][3], 32, "N/A");
    }
    /* the whole name: model was opened, so it is shorter than PATH_MAX (600 bytes cut a longer one and its
     * closing backquote without a word) */
    char title[PATH_MAX + 32];
    snprintf(title, sizeof title, "Memory Usage for loading `%s`", model);
    const char *headers[4] = {"dtype", "Largest Layer", "Total Size", "Training using Adam"};
    cli_print_table(out, title, headers, 4, rows, ndt);
    /* under pp the activations are the stages' (the pipeline's table), not the whole model's */
    rank_request whole = q;
    whole.have_batch = q.have_batch && !pipeline;
    int rc = per_rank ? print_rank_table(out, &cfg, bert ? &bcfg : NULL, total, largest, &whole) : 0;
    cli_pipeline_request pq = {.pp = q.mesh[MESH_PP], .virt = q.virt ? q.virt : 1, .micro = q.micro ? q.micro : 1,
                               .gpipe = q.schedule && !strcmp(q.schedule, "gpipe"), .batch = q.act.batch_size,
                               .seq = q.act.seq_len, .strategy = q.strategy >= 0 ? q.strategy : ACCEL_SHARD_DDP,
                               .dp_shard = zero_world(&q), .autocast = q.act.autocast,
                               .tp = q.mesh[MESH_TP], .sp = q.act.sequence_parallel, .cp = q.mesh[MESH_CP],
                               .cfg = &cfg};
    if (!rc && pipeline) rc = cli_pipeline_table(out, m, &pq);
    accel_module_free(m);
    return rc;
}
