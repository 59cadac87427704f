/*
 * accel/accelerator.h — Accelerate's Accelerator in C: the same training
 * script runs on one process or N (under `accel launch`), in f32, bf16 or fp16,
 * with gradient accumulation and checkpoints.
 *
 * The four-line conversion (docs/accelerator.md shows it side by side):
 *
 *     accel_accelerator *acc = accel_accelerator_new(NULL);          // 1: reads the launch env
 *     accel_accelerator_prepare(acc, model, opt, dl, NULL);           // 2: DDP + sharding + autocast
 *     accel_batch b;
 *     while (accel_dataloader_next(dl, &b)) {
 *         accel_tensor *loss = accel_mse_loss(accel_module_call(model, b.fields[0]), b.fields[1]);
 *         accel_accelerator_backward(acc, loss);                      // 3: instead of accel_backward
 *         accel_accelerator_optimizer_step(acc, opt);                 // 4: instead of accel_optimizer_step
 *         accel_accelerator_zero_grad(acc, opt);
 *         accel_step_reset();
 *     }
 *     accel_accelerator_free(acc);                                    // any order
 *
 * prepare works in place: the model's parameters are flattened into one
 * buffer per dtype (gradients too, in memory shared by the local ranks so the
 * all-reduce is zero-copy), rank 0's weights are broadcast, a forward hook
 * runs the model under autocast (bf16/fp16) and returns f32 outputs, the
 * data loader is sharded (data.h), and the optimizer/scheduler get
 * accumulation and loss-scaling semantics through the accelerator's
 * step/zero_grad/scheduler_step functions.
 *
 * Gradient synchronisation (DDP): during accel_accelerator_backward the
 * autograd grad-ready hook counts finished parameters per bucket (~25 MB,
 * parameters in reverse order); a complete bucket starts an asynchronous
 * all-reduce (AVG) while backward continues; buckets are launched in a fixed
 * order on every rank; all are waited for before backward returns. No
 * all-reduce on non-sync accumulation steps or inside no_sync.
 *
 * Ownership: the accelerator borrows everything it prepares. Any free order
 * is safe: freeing the accelerator first un-prepares everything (models get
 * parameters that own their memory back); freeing a prepared object first
 * detaches it from the accelerator (docs/contract.md "Lifetimes").
 * Every collective here must be called by every rank in the same order.
 */
#ifndef ACCEL_ACCELERATOR_H
#define ACCEL_ACCELERATOR_H

#include <stdarg.h>

#include "core.h"
#include "data.h"
#include "dist.h"
#include "nn.h"
#include "optim.h"
#include "tracking.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum accel_mixed_precision {
    ACCEL_MP_NO = 0,
    ACCEL_MP_FP16,
    ACCEL_MP_BF16,
    ACCEL_MP_FP8, /* TransformerEngine's delayed scaling on the Linears, bf16 autocast elsewhere */
} accel_mixed_precision;

/* A tri-state option: 0 (the zeroed struct) leaves it to the environment or
 * the default. */
enum { ACCEL_FALSE = -1, ACCEL_TRUE = 1 };

/* ParallelismConfig and the Megatron-LM plugin's degrees: how the world's
 * ranks are laid out over the device mesh (docs/parallelism.md). Every zero
 * field means "not set": a size then comes from what the others leave of the
 * world (dp_shard_size) or is 1 (the rest). The product of the sizes must be
 * the world size; a size that does not divide it, or a combination accel
 * does not run, fails accel_accelerator_new naming the field. */
typedef struct accel_parallelism_opts {
    int dp_replicate_size;        /* replicas the gradients are averaged across (DDP / HSDP's outer dimension) */
    int dp_shard_size;            /* ranks the ZeRO/FSDP shards spread over; 0: what the other sizes leave */
    int tp_size;                  /* tensor parallelism (Megatron's tp_degree) */
    int cp_size;                  /* context parallelism: the sequence split for attention */
    const char *cp_comm_strategy; /* "allgather" (the default) or "alltoall" */
    int sp_size;                  /* DeepSpeed-style (Ulysses) sequence parallelism */
    int pp_size;                  /* pipeline stages (Megatron's pp_degree) */
    int num_micro_batches;        /* pipeline micro-batches per step; 0: 1 */
    const char *pp_schedule;      /* "1f1b" (the default), "gpipe" or "interleaved" (the default when
                                   * pp_virtual_stages > 1) */
    int pp_virtual_stages;        /* interleaved 1F1B: model chunks per stage (Megatron's
                                   * virtual_pipeline_model_parallel_size); 0: 1 */
    int sequence_parallelism;     /* tri-state: Megatron's sequence parallelism inside the tp group */
} accel_parallelism_opts;

/* Every zero field means its default, so `{0}` and designated initialisers
 * work: `accel_accelerator_opts o = {.mixed_precision = "fp16"};`. Accelerate's
 * options that default to True are spelled negated here (no_X = true is
 * Accelerate's X=False). */
typedef struct accel_accelerator_opts {
    /* "no", "fp16", "bf16", "fp8" (a CUDA GPU of compute capability >= 8.9
     * only; its recipe from the fp8_* fields below, docs/cuda.md). NULL: ACCEL_MIXED_PRECISION /
     * ACCELERATE_MIXED_PRECISION from the environment, else "no". */
    const char *mixed_precision;
    /* TERecipeKwargs / FP8RecipeKwargs (TransformerEngine's DelayedScaling)
     * for "fp8": a field set here wins over its ACCELERATE_FP8_<NAME> (or
     * ACCEL_FP8_<NAME>) variable, a zero / NULL field reads it, else
     * Accelerate's default. Bad values fail accel_accelerator_new naming the
     * field (or the variable) and the value: a field whatever mixed_precision
     * is, a variable under "fp8" alone. Booleans are tri-state:
     * ACCEL_TRUE, ACCEL_FALSE, 0 = unset. */
    const char *fp8_backend;           /* BACKEND: "TE" (any case); AO and MSAMP refused */
    const char *fp8_format;            /* FORMAT: "HYBRID" (E5M2 gradients; default) or "E4M3"; E5M2 refused */
    int fp8_amax_history_len;          /* AMAX_HISTORY_LEN: >= 1 (default 1024) */
    const char *fp8_amax_compute_algo; /* AMAX_COMPUTE_ALGO: "most_recent" (default) or "max" */
    int fp8_margin;                    /* MARGIN: > 0, or -1 = 0 whatever the variable says (default 0) */
    int fp8_interval;                  /* INTERVAL: >= 1 (default 1); no effect: TE deprecated it */
    int fp8_use_autocast_during_eval;  /* USE_AUTOCAST_DURING_EVAL: fp8 in eval forwards too (default false) */
    /* OVERRIDE_FPROP, _DGRAD, _WGRAD: ACCEL_TRUE runs that GEMM of the fp8
     * Linear (fprop, dgrad, wgrad) in the autocast dtype instead of fp8
     * (default false: all three in fp8). */
    int fp8_override_linear_precision[3];
    /* 0: ACCEL_GRADIENT_ACCUMULATION_STEPS / ACCELERATE_GRADIENT_ACCUMULATION_STEPS, else 1. */
    int gradient_accumulation_steps;
    bool cpu;                       /* force cpu (also ACCEL_USE_CPU / ACCELERATE_USE_CPU) */
    /* device_placement=False: a prepared data loader's batches stay in host
     * memory (default: they are moved to the accelerator's device) */
    bool no_device_placement;
    /* DataLoaderConfiguration */
    bool split_batches;
    bool no_even_batches;           /* even_batches=False: ranks may get fewer batches */
    /* GradientAccumulationPlugin */
    bool no_sync_with_dataloader;   /* sync_with_dataloader=False: no sync at the loader's last batch */
    bool sync_each_batch;           /* all-reduce every micro-batch anyway */
    bool no_step_scheduler_with_optimizer; /* step_scheduler_with_optimizer=False: step every call */
    /* ProjectConfiguration */
    const char *project_dir;        /* copied; NULL = ACCEL_PROJECT_DIR, else "."; "" = "." */
    bool automatic_checkpoint_naming;
    int total_limit;                /* keep at most this many checkpoints (0 = all; < 0 refused) */
    /* DDP */
    int64_t bucket_cap_bytes;       /* 0: the DeepSpeed JSON's reduce_bucket_size, else 25 MiB */
    /* GradScalerKwargs (fp16); 0: the default. torch.amp.GradScaler's ranges:
     * growth_factor > 1, backoff_factor in (0, 1), init_scale at most FLT_MAX
     * (else refused, naming the option); the scale is kept in float32, as
     * GradScaler's tensor: each growth or backoff rounded to it, a growth to
     * inf not taken. */
    double init_scale;              /* 65536 */
    double growth_factor;           /* 2 */
    double backoff_factor;          /* 0.5 */
    int64_t growth_interval;        /* 2000 */
    /* ZeRO sharding (docs/accelerator.md "Sharding (ZeRO / FSDP)"). zero_stage:
     * 0 = from the environment/config (off when nothing is set; below -1 refused), 1 (optimizer
     * state sharded), 2 (+ gradients reduce-scattered), -1 = off whatever the
     * environment says; 3 (+ parameters sharded per wrap unit, FSDP
     * FULL_SHARD). Resolution order: zero_stage,
     * fsdp_sharding_strategy, the DeepSpeed JSON, ACCEL_ZERO_STAGE,
     * ACCEL_FSDP_SHARDING_STRATEGY. */
    int zero_stage;
    /* NO_SHARD -> 0, SHARD_GRAD_OP / HYBRID_SHARD_ZERO2 -> 2, FULL_SHARD /
     * HYBRID_SHARD -> 3 (HYBRID: sharded within a machine, replicated across
     * machines); also 1..5 (torch's enum values). NULL: env. */
    const char *fsdp_sharding_strategy;
    /* DeepSpeed JSON (zero_optimization.stage, bf16/fp16.enabled,
     * gradient_accumulation_steps, gradient_clipping, offload_optimizer,
     * offload_param).
     * NULL: ACCEL_DEEPSPEED_CONFIG_FILE. */
    const char *deepspeed_config_file;
    /* ZeRO-Offload (docs/accelerator.md "Offload"), ZeRO stages 1-3 only.
     * offload_optimizer_device: "none"; "cpu" (a model on a device keeps its
     * optimizer state in host memory and steps there; a no-op on the cpu); or
     * "nvme" (the state of each rank in a file under
     * offload_optimizer_nvme_path, a directory, paged through a host buffer of
     * bounded size). NULL: the DeepSpeed JSON's offload_optimizer, else
     * ACCEL_OFFLOAD_OPTIMIZER_DEVICE / ACCEL_OFFLOAD_OPTIMIZER_NVME_PATH. */
    const char *offload_optimizer_device;
    const char *offload_optimizer_nvme_path;
    /* offload_param, stage 3 only: "none" or "cpu" (the parameter and
     * gradient shards and the optimizer step in host memory: a no-op for a
     * model on the cpu, where they are already); "nvme" (each rank's shard in
     * a file under offload_param_nvme_path, a directory, mapped and its pages
     * released after each use). NULL: the JSON's offload_param, else
     * ACCEL_OFFLOAD_PARAM_DEVICE / ACCEL_OFFLOAD_PARAM_NVME_PATH. */
    const char *offload_param_device;
    const char *offload_param_nvme_path;
    /* FSDP's fsdp_offload_params=true (also ACCEL_FSDP_OFFLOAD_PARAMS):
     * FULL_SHARD as offload_param "cpu", SHARD_GRAD_OP as offload_optimizer
     * "cpu" (the step on the host, as torch's CPUOffload). */
    bool fsdp_offload_params;
    /* The other fsdp_config keys, as FullyShardedDataParallelPlugin's
     * arguments: a field set here wins over its ACCEL_FSDP_* variable (what
     * `accel launch` sets), a zero / NULL field reads it; bad values get the
     * same errors as the variables, naming the field (docs/accelerator.md
     * "ZeRO-3").
     * Booleans. C's zero initialiser cannot tell `false` from "not set", so
     * each boolean here is spelled so that false is Accelerate's default and
     * `{.field = false}` means what it says: the keys that default to True
     * (reshard_after_forward, sync_module_states, use_orig_params,
     * cpu_ram_efficient_loading) are negated bools, `fsdp_no_X = true` being
     * Accelerate's `X=False` (as no_even_batches above); false leaves X to its
     * ACCEL_FSDP_X variable, else True. The config file, the variables and
     * `accel launch --fsdp_X` keep Accelerate's names and senses. The two
     * that default to False stay tri-state ints: ACCEL_TRUE, ACCEL_FALSE
     * (false whatever the variable says), 0 (`false` too) = the variable,
     * else False.
     * fsdp_auto_wrap_policy: "TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP",
     * "NO_WRAP" (NULL and no variable: one unit per transformer block);
     * fsdp_transformer_layer_cls_to_wrap: comma-separated module types
     * (default: the model's decoder layer class, accel_module_decoder_layer_class,
     * e.g. "LlamaDecoderLayer"); fsdp_min_num_params: > 0 (default 1e8;
     * 0 = unset). */
    const char *fsdp_auto_wrap_policy;
    const char *fsdp_transformer_layer_cls_to_wrap;
    int64_t fsdp_min_num_params;
    /* "BACKWARD_PRE" (the default), "BACKWARD_POST" or "NO_PREFETCH". */
    const char *fsdp_backward_prefetch;
    int fsdp_forward_prefetch;             /* tri-state, default false */
    bool fsdp_no_reshard_after_forward;    /* reshard_after_forward=False: keep gathered units to backward */
    /* "SHARDED_STATE_DICT" (the default) or "FULL_STATE_DICT". */
    const char *fsdp_state_dict_type;
    int fsdp_activation_checkpointing;     /* tri-state, default false; FULL_SHARD only */
    /* cpu_ram_efficient_loading=False; while it is on (the default),
     * fsdp_no_sync_module_states is refused */
    bool fsdp_no_cpu_ram_efficient_loading;
    bool fsdp_no_sync_module_states;       /* sync_module_states=False */
    bool fsdp_no_use_orig_params;          /* use_orig_params=False; either way the parameters stay the user's */
    int fsdp_version;                   /* 1 or 2; 0 = unset */
    /* Clip the global gradient norm to this in optimizer_step (DeepSpeed's
     * gradient_clipping); 0: ACCEL_GRADIENT_CLIPPING or the JSON, else none. */
    double gradient_clipping;
    /* The device mesh (see accel_parallelism_opts above): `{.parallelism = {.tp_size = 2}}`. */
    accel_parallelism_opts parallelism;
    /* Trackers for init_trackers (accelerate's log_with): a comma list of
     * "tensorboard", "jsonl", "csv", or "all". NULL: ACCEL_LOG_WITH /
     * ACCELERATE_LOG_WITH, else none. Unknown names fail accel_accelerator_new. */
    const char *log_with;
} accel_accelerator_opts;

/* Every option at its default: the zeroed struct. */
accel_accelerator_opts accel_accelerator_opts_default(void);

typedef struct accel_accelerator accel_accelerator;

/* Initialises the process group from the launch environment (dist.h) and
 * reads the options. NULL opts = defaults. NULL + error: unknown precision
 * ("Unknown mixed_precision mode: x. Choose between ['no', 'fp8', 'fp16', 'bf16']"),
 * fp8 where the device has none or with a bad recipe, bad accumulation steps,
 * rendezvous failure. */
accel_accelerator *accel_accelerator_new(const accel_accelerator_opts *opts);
/* Un-prepares (models get their own parameter memory back), then tears the
 * process group down. NULL is a no-op. A release that fails (see
 * accel_accelerator_clear, which returns it: call it first to check) is
 * printed as a warning on stderr. */
void accel_accelerator_free(accel_accelerator *acc);

/* ---------------------------------------------------------------- state */

accel_device accel_accelerator_device(const accel_accelerator *acc);
int accel_accelerator_num_processes(const accel_accelerator *acc);
int accel_accelerator_process_index(const accel_accelerator *acc);
int accel_accelerator_local_process_index(const accel_accelerator *acc);
bool accel_accelerator_is_main_process(const accel_accelerator *acc);
bool accel_accelerator_is_local_main_process(const accel_accelerator *acc);
bool accel_accelerator_is_last_process(const accel_accelerator *acc);
accel_mixed_precision accel_accelerator_mixed_precision(const accel_accelerator *acc);
const char *accel_mixed_precision_name(accel_mixed_precision mp); /* "no", "fp16", "bf16", "fp8" */
int accel_accelerator_gradient_accumulation_steps(const accel_accelerator *acc);
accel_status accel_accelerator_set_gradient_accumulation_steps(accel_accelerator *acc, int steps);
bool accel_accelerator_sync_gradients(const accel_accelerator *acc);
/* accelerator.step: the micro-step counter of accumulate (one per call, back
 * to 0 on a loader's last batch); not the number of optimizer updates
 * (accel_optimizer_step_count). */
int64_t accel_accelerator_step(const accel_accelerator *acc);
/* True when any prepared optimizer skipped its last step (fp16 overflow in
 * its gradients). */
bool accel_accelerator_optimizer_step_was_skipped(const accel_accelerator *acc);
/* Current fp16 loss scale, a float32 value (1 when not fp16). */
double accel_accelerator_loss_scale(const accel_accelerator *acc);
/* The ZeRO stage in effect (0: plain DDP) and the clipping norm applied in
 * optimizer_step (0: none). */
int accel_accelerator_zero_stage(const accel_accelerator *acc);
/* The tensor-parallel group of this rank (opts.parallelism.tp_size ranks,
 * consecutive: docs/parallelism.md), owned by the accelerator; a group of
 * one without tp. Made on the first call (a collective over every rank:
 * all call it, in the same order). A model of your own is parallelized over
 * it before prepare: accel_module_parallelize(model, plan, n,
 * accel_accelerator_tp_group(acc)) (accel/parallel.h); the decoder families
 * get their own plan at prepare. NULL + error for a NULL accelerator. */
accel_pg *accel_accelerator_tp_group(accel_accelerator *acc);
/* The data-parallel group of this rank: the ranks that hold different
 * batches (data-parallel replicas and shards, and context-parallel ranks;
 * not tensor- or pipeline-parallel ones), owned by the accelerator and made
 * at accel_accelerator_new; every rank without parallelism. The group a
 * SyncBatchNorm converted with a NULL group takes at prepare
 * (accel/parallel.h). NULL + error for a NULL accelerator. */
accel_pg *accel_accelerator_dp_group(accel_accelerator *acc);
double accel_accelerator_gradient_clipping(const accel_accelerator *acc);
/* This rank's shard [*lo, *hi) of the prepared model's flat f32 parameter
 * buffer (*padded: its padded length). Without ZeRO the whole buffer; under
 * stage 3 an error (a rank's shard is one piece per wrap unit). */
accel_status accel_accelerator_zero_shard(accel_accelerator *acc, const accel_module *model,
                                          int64_t *lo, int64_t *hi, int64_t *padded);
/* "Distributed environment: MULTI_CPU  Backend: shm\nNum processes: 2\n...",
 * then the GEMM and CPU lines, into buf: cut at n - 1 bytes as snprintf
 * would (4096 bytes hold it all). */
const char *accel_accelerator_describe(const accel_accelerator *acc, char *buf, size_t n);

/* ---------------------------------------------------------------- process control */

/* printf on the local main process only (accelerate's accelerator.print), flushed. */
void accel_accelerator_print(const accel_accelerator *acc, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Barrier (no-op on one process). */
accel_status accel_accelerator_wait_for_everyone(accel_accelerator *acc);
/* main_process_first: others wait at begin, main waits at end; every rank
 * calls both, paired (an end without a begin, or a second begin, is
 * ACCEL_ERR_STATE: unpaired, the main process's barrier would meet none). */
accel_status accel_accelerator_main_process_first_begin(accel_accelerator *acc);
accel_status accel_accelerator_main_process_first_end(accel_accelerator *acc);

/* split_between_processes over n items: this rank's [start, end); first n % N
 * ranks get one extra. With apply_padding every rank gets `padded` items, the
 * missing ones being repeats of the last item of the whole input (n - 1). */
typedef struct accel_process_split {
    int64_t start, end;   /* this rank's items */
    int64_t padded;       /* items with padding: q + (r > 0) */
} accel_process_split;
accel_process_split accel_accelerator_split_between_processes(const accel_accelerator *acc, int64_t n);

/* set_seed: the default generator gets seed (+ process index if device_specific;
 * under tensor parallelism + the index of the rank's tp group, process index /
 * tp_size, so the ranks of a tp group draw the same replicated dropout masks).
 * A NULL acc is Accelerate's set_seed(seed) before any Accelerator exists
 * (no no-op, unlike other setters of a NULL handle, docs/contract.md: ported
 * code seeds so before making the accelerator): accel_manual_seed(seed), +
 * the launcher's rank when device_specific (RANK, PMI_RANK,
 * OMPI_COMM_WORLD_RANK, MV2_COMM_WORLD_RANK or srun's SLURM_PROCID, as
 * accel_dist_init reads it; 0 when none is set), divided by the tp size the
 * environment gives accel_accelerator_new (PARALLELISM_CONFIG_TP_SIZE,
 * MEGATRON_LM_TP_DEGREE, docs/parallelism.md) as with an accelerator.
 * ACCEL_OK; a rank variable that is no integer from 0 to 10^6, or a
 * variable accel_accelerator_new refuses, is ACCEL_ERR_INVALID_ARG naming
 * it, the generator left as it was. */
accel_status accel_set_seed(const accel_accelerator *acc, uint64_t seed, bool device_specific);

/* ---------------------------------------------------------------- prepare */

/* accelerator.prepare(*args): any number (up to 12) of models, optimizers,
 * data loaders and schedulers, in any order, NULL ones skipped:
 *
 *     accel_accelerator_prepare(acc, model, opt, train_dl, eval_dl, sched);
 *
 * As Accelerate's, in passes: the models and data loaders, then the
 * optimizers, then the schedulers, each in the call's order (so
 * prepare(opt, model) is prepare(model, opt), which ZeRO needs).
 *
 * Data loaders are sharded in place (their shuffle seed is rank 0's), models
 * flattened/wrapped, optimizers and schedulers registered. Under tensor
 * parallelism a model's plan replaces its parameters with their slices: an
 * optimizer made over the whole model and given in the same call
 * is re-targeted to them (prepared alone later, it is not). A data loader that
 * is not prepared is not sharded (as in Accelerate): on N processes every
 * process iterates all of it, and gather_for_metrics returns every sample N
 * times. Preparing an object twice returns ACCEL_OK and does nothing; an
 * object prepared by another accelerator is refused (ACCEL_ERR_STATE). On a
 * failure the objects taken before the failing one stay prepared. The macro maps
 * each argument by its type (C11 _Generic); C++ or longer lists use the array
 * form. */
typedef enum accel_prepare_kind {
    ACCEL_PREPARE_NONE = 0, /* a NULL argument */
    ACCEL_PREPARE_MODEL,
    ACCEL_PREPARE_OPTIMIZER,
    ACCEL_PREPARE_DATALOADER,
    ACCEL_PREPARE_SCHEDULER,
} accel_prepare_kind;
typedef struct accel_preparable {
    accel_prepare_kind kind;
    void *obj;              /* NULL: skipped */
} accel_preparable;
accel_status accel_accelerator_prepare_array(accel_accelerator *acc, int n, const accel_preparable *objs);
#define accel_accelerator_prepare(acc, ...)                                                         \
    accel_accelerator_prepare_array((acc),                                                          \
                                    (int)(sizeof((accel_preparable[]){ACCEL__PREP_ALL(__VA_ARGS__)}) / \
                                          sizeof(accel_preparable)),                                \
                                    (accel_preparable[]){ACCEL__PREP_ALL(__VA_ARGS__)})
accel_status accel_accelerator_prepare_model(accel_accelerator *acc, accel_module *model);
accel_status accel_accelerator_prepare_optimizer(accel_accelerator *acc, accel_optimizer *opt);
accel_status accel_accelerator_prepare_scheduler(accel_accelerator *acc, accel_lr_scheduler *s);
accel_status accel_accelerator_prepare_dataloader(accel_accelerator *acc, accel_dataloader *dl);
/* free_memory / clear: un-prepares every model and forgets every prepared
 * object, resets step and the scaler state. Collective under ZeRO (every
 * rank calls it): a sharded optimizer gets its consolidated state back, a
 * ZeRO-3 model its full parameters. The whole clear runs whatever fails
 * (nothing stays prepared, acc can be cleared again or freed); the status is
 * the first release that failed, its error naming what was lost (an
 * optimizer back with fresh state, a ZeRO-3 unit back as zeros).
 * ACCEL_ERR_INVALID_ARG when acc is NULL. */
accel_status accel_accelerator_clear(accel_accelerator *acc);
/* unwrap_model: the plain model, to save or inspect (Accelerate calls it at
 * every checkpoint). prepare works in place, so this is `model` itself, and it
 * stays prepared. NULL + error when acc or model is NULL. */
accel_module *accel_accelerator_unwrap_model(const accel_accelerator *acc, accel_module *model);
/* Un-prepares a model: removes the accelerator's forward hook and flat-buffer
 * wiring (it keeps its current weights and stays usable; its gradients are no
 * longer all-reduced). ACCEL_ERR_STATE when acc did not prepare it; a release
 * that failed as in accel_accelerator_clear (the model is un-prepared all
 * the same). */
accel_status accel_accelerator_unprepare_model(accel_accelerator *acc, accel_module *model);

/* Autocast for code outside the model's forward (accelerator.autocast()):
 * begin returns the previous autocast dtype to give to end. No-op without
 * mixed precision. */
accel_dtype accel_accelerator_autocast_begin(const accel_accelerator *acc);
accel_status accel_accelerator_autocast_end(const accel_accelerator *acc, accel_dtype previous);

/* ---------------------------------------------------------------- training */

/* loss / gradient_accumulation_steps (x loss scale with fp16), backward, and
 * the gradient all-reduce when this is a sync step. */
accel_status accel_accelerator_backward(accel_accelerator *acc, accel_tensor *loss);
/* accumulate(model): call once per micro-batch, before forward, after the
 * batch was fetched. Advances step and sets sync_gradients (Accelerate's GradientState). */
accel_status accel_accelerator_accumulate(accel_accelerator *acc);
/* no_sync(model): no gradient all-reduce between begin and end. They nest
 * (the all-reduce resumes at the outermost end); an end with no open begin is
 * ACCEL_ERR_STATE and changes nothing. */
accel_status accel_accelerator_no_sync_begin(accel_accelerator *acc, accel_module *model);
accel_status accel_accelerator_no_sync_end(accel_accelerator *acc, accel_module *model);
/* The prepared optimizer's step / zero_grad: no-ops unless sync_gradients.
 * fp16 (GradScaler.step then update, as Accelerate's optimizer step calls
 * them): unscales this optimizer's gradients (unless done since its last
 * step), skips its step when they hold an inf/nan, then updates the scale;
 * with several optimizers each unscales and skips on its own gradients (the
 * optimizers of one ZeRO model together: its gradients are one buffer, one
 * inf/nan verdict), and the scale is updated after each one's step. A step
 * that fails (an error returned) leaves its gradients unscaled and the scale
 * as they were: made again, it steps with them as they are (where the
 * ranks' agreement on inf/nan failed, that counts as one found: made again,
 * the step is skipped). zero_grad clears the optimizer's gradients, and with
 * them its unscaled state. */
accel_status accel_accelerator_optimizer_step(accel_accelerator *acc, accel_optimizer *opt);
accel_status accel_accelerator_zero_grad(accel_accelerator *acc, accel_optimizer *opt);
/* AcceleratedScheduler.step (§5.2): only on sync steps whose optimizer step
 * was not skipped; num_processes times unless split_batches. */
accel_status accel_accelerator_scheduler_step(accel_accelerator *acc, accel_lr_scheduler *s);
/* Unscales (fp16: every prepared optimizer's gradients, as
 * unscale_gradients) then clips the model's gradients; returns the global norm
 * before clipping (gradients are identical on every rank after the
 * all-reduce), NAN + error on failure (norm_type as accel_clip_grad_norm's,
 * max_norm >= 0). */
double accel_accelerator_clip_grad_norm(accel_accelerator *acc, accel_module *model,
                                        double max_norm, double norm_type);
/* Divides the fp16-scaled gradients of every prepared optimizer by the
 * scale their backward used, each optimizer's once until its step (no-op
 * otherwise); fp16 with no optimizer prepared is ACCEL_ERR_STATE (nothing
 * would be divided). Collective (every rank must call it) under ZeRO, tensor
 * or pipeline parallelism, where the ranks agree on an inf/nan found: a
 * failed agreement is returned (and the step then not made), not taken as
 * an overflow alone. */
accel_status accel_accelerator_unscale_gradients(accel_accelerator *acc);

/* ---------------------------------------------------------------- pipeline parallelism
 * With opts.parallelism.pp_size = p (Megatron's pp_degree) the ranks of each
 * pp group (same dp/cp/tp coordinates) are the p stages of a decoder model
 * built by accel_llama_new: stage s runs a contiguous range of its layers,
 * balanced by parameter count (the embeddings count on stage 0, the final
 * norm and an untied lm_head on the last); stage 0 also embeds, the last
 * stage also runs the final norm, lm_head and the loss.
 *
 *     opts.parallelism = (accel_parallelism_opts){.pp_size = 2, .num_micro_batches = 4,
 *                                                 .pp_schedule = "1f1b"};
 *     ... prepare(model, opt, dl) as usual ...
 *     for each batch ids [B, T]:                         // the same on every stage
 *         double loss;
 *         accel_accelerator_pipeline_step(acc, model, ids, &loss, NULL);
 *         accel_accelerator_optimizer_step(acc, opt);    // as after accelerator_backward
 *         accel_accelerator_zero_grad(acc, opt);
 *
 * pipeline_step is forward + backward of the batch in num_micro_batches
 * micro-batches of B / m rows (B must be a multiple of m), scheduled GPipe
 * (pp_schedule "gpipe"), 1F1B (default) or interleaved 1F1B ("interleaved",
 * with pp_virtual_stages = v: the layers cut into p v equal chunks, stage s
 * holding chunks s, s + p, ...; m a multiple of p): it replaces the forward, the loss
 * and accelerator_backward of a plain step. loss gets the batch's mean
 * causal-LM loss (transformers' ForCausalLMLoss, labels = ids shifted) on
 * every stage. The gradients accumulate over the micro-batches (each loss
 * scaled by 1/m, by 1/gradient_accumulation_steps and the fp16 scale, as
 * accelerator_backward scales), so after the step they equal one process's
 * over the whole batch; DDP over the data-parallel replicas of each stage
 * reduces them in the last micro-batch; a tied lm_head's gradient is summed
 * between the first and last stage on sync steps. Collective over the whole
 * job (every rank calls it with its batch). Each stage recomputes a
 * micro-batch's forward in its backward (Megatron's full recomputation): a
 * stage holds only the inputs of the micro-batches in flight, at most m
 * under GPipe and p - s under 1F1B (interleaved: Megatron's warm-up + 1
 * (chunk, micro-batch) pairs, (p - s - 1) 2 + (v - 1) p + 1). With pp_size = 1 it is gradient
 * accumulation over the micro-batches on one stage. A stage holds only its
 * part of the model: prepare moved the other stages' parameters to meta and
 * re-targeted the prepared optimizer to the stage's (prepare the model with
 * or before its optimizer). With tp_size > 1 each stage is tensor-parallel
 * over its tp group (a tp rank exchanges hidden states with the same tp rank
 * of the neighbouring stages; under sequence parallelism its T / tp
 * positions, so T must be a multiple of tp). Not with fp8 or ZeRO (stages
 * 1-3; refused). report (NULL: none) gets this stage's figures. */
typedef struct accel_pipeline_report {
    int stage, stages;           /* this rank's stage of `stages` */
    int first_layer, end_layer;  /* its layers [first_layer, end_layer) (interleaved: its first chunk's; chunk
                                  * j's are j x stages x (end_layer - first_layer) later) */
    int virtual_stages;          /* its chunks (1 but under interleaved 1F1B) */
    int micro_batches;
    double wall_s;               /* the step on this stage */
    double busy_s;               /* of which computing (the rest: waiting for the neighbours) */
    int peak_in_flight;          /* micro-batches forwarded and not yet backwarded, at most */
    size_t peak_held_bytes;      /* their saved inputs (hidden states; 0 on stage 0, which keeps ids);
                                  * interleaved: the buffers of saved inputs and arrived gradients */
} accel_pipeline_report;
accel_status accel_accelerator_pipeline_step(accel_accelerator *acc, accel_module *model, accel_tensor *ids,
                                             double *loss, accel_pipeline_report *report);
/* An explicit split instead of the balanced one, as Megatron's
 * decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers: the
 * first and last stages' layer counts (0: not given), the other stages
 * sharing the remaining layers evenly (else prepare fails naming the
 * counts). Set it on every rank alike, before accel_accelerator_prepare: the
 * split is fixed there (a stage keeps only its part), and refused after.
 * Without a pipeline (pp_size 1) a count is refused (ACCEL_ERR_STATE: one
 * stage holds every layer); 0 and 0 (no split given) are taken at any pp. */
accel_status accel_accelerator_pipeline_set_layers(accel_accelerator *acc, int first_stage_layers,
                                                   int last_stage_layers);

/* ---------------------------------------------------------------- collectives
 * Results are step tensors. 0-d inputs become 1-d. */

/* All-gather along dim 0 in rank order: [N * d0, ...]. Shapes must match. */
accel_tensor *accel_accelerator_gather(accel_accelerator *acc, accel_tensor *t);
/* gather, then at the active data loader's last batch keep only the first
 * `remainder` rows (Accelerate's gather_for_metrics) so the epoch yields exactly the dataset.
 * Under tensor parallelism over the data-parallel ranks only (a tp group's
 * ranks hold one batch: [dp * d0, ...]); refused (ACCEL_ERR_UNSUPPORTED)
 * under pipeline or context parallelism. */
accel_tensor *accel_accelerator_gather_for_metrics(accel_accelerator *acc, accel_tensor *t);
/* gather_for_metrics of n tensors (e.g. predictions and labels) in one
 * collective: their bytes travel packed in a single all-gather (debug mode
 * adds its shape check per tensor). outs[i] is what gather_for_metrics(ts[i])
 * returns, the same remainder rule included; tensors may differ in dtype and
 * shape, each must match its peers on the other ranks. On error every outs[i]
 * is NULL. */
accel_status accel_accelerator_gather_for_metrics_n(accel_accelerator *acc, int n, accel_tensor *const *ts,
                                                    accel_tensor **outs);
/* reduction: "sum", "mean" or "max" (anything else, NULL included, is
 * refused); the result times `scale`, then / N for "mean", each rounded to
 * t's dtype as torch's `x *= scale; x /= N`. An integer or bool t takes "sum"
 * or "max" with scale 1 only (ACCEL_ERR_DTYPE otherwise); a bool sum is
 * any-true. Input untouched. */
accel_tensor *accel_accelerator_reduce(accel_accelerator *acc, accel_tensor *t,
                                       const char *reduction, double scale);
/* reduce of one number (a metric's partial sum or count), in f64: "sum",
 * "mean" or "max" over the processes. NAN + error on failure. */
double accel_accelerator_reduce_scalar(accel_accelerator *acc, double v, const char *reduction);
/* Pads dim (negative counts from the end) to the largest size across ranks
 * with pad_index (at the end, or the start with pad_first); the dtype stays
 * t's. A dim out of range, or on an integer or bool t a pad_index the dtype
 * does not hold exactly, is ACCEL_ERR_INVALID_ARG on every rank. */
accel_tensor *accel_accelerator_pad_across_processes(accel_accelerator *acc, accel_tensor *t,
                                                     int dim, double pad_index, bool pad_first);
/* A copy of from_process's tensor on every rank (shapes must match;
 * from_process in [0, num_processes)). */
accel_tensor *accel_accelerator_broadcast(accel_accelerator *acc, accel_tensor *t,
                                          int from_process);
/* Byte blobs (gather_object / broadcast_object_list): see accel_pg_*_bytes.
 * *out and received data are accel_malloc'd (accel_free()). */
accel_status accel_accelerator_gather_object(accel_accelerator *acc, const void *data,
                                             size_t len, void **out, size_t *lens);
accel_status accel_accelerator_broadcast_object(accel_accelerator *acc, void **data, size_t *len,
                                                int from_process);

/* ---------------------------------------------------------------- checkpoints */

/* save_state: writes into output_dir (NULL with automatic naming:
 * <project_dir>/checkpoints/checkpoint_<N>, N one past the highest existing,
 * so the counter survives restarts; older ones beyond total_limit removed):
 *   model.safetensors (model_<i>...)       HF names, tied aliases once   (main)
 *   optimizer.safetensors (optimizer_<i>)  optim.h state vocabulary      (main)
 *   scheduler.safetensors (scheduler_<i>)                                (main)
 *   random_states_<rank>.safetensors       RNG seed/offset, step, loaders, scaler (every rank)
 * Under tensor parallelism (any ZeRO stage) the files hold whole tensors,
 * gathered over the tp group, and load onto any mesh (docs/parallelism.md).
 * Everything goes to a hidden temporary directory first, then replaces the
 * target in one rename: a crash mid-save leaves any previous checkpoint intact.
 * Its marker accel_checkpoint.json records every file's size and CRC-32C.
 * Writes the directory used into out_dir (may be NULL). */
accel_status accel_accelerator_save_state(accel_accelerator *acc, const char *output_dir,
                                          char *out_dir, size_t out_n);
/* Where a loaded checkpoint resumes training. To count updates, read
 * optimizer_steps: `step` is Accelerate's accelerator.step, accumulate's
 * micro-step counter, which restarts at 0 on the last batch of every epoch
 * (sync_with_dataloader) and so is often 0 after a resume. */
typedef struct accel_resume_point {
    int64_t epoch;  /* the first prepared data loader's epoch (0 without one) */
    int64_t batch;  /* batches of that epoch already done: the loader skips them */
    int64_t step;   /* accel_accelerator_step() when it was saved (micro-steps, see above) */
    int64_t optimizer_steps; /* updates the first prepared optimizer had applied
                              * (accel_optimizer_step_count; 0 without one): the
                              * global step of a training loop */
} accel_resume_point;
/* load_state: input_dir NULL with automatic naming = the highest checkpoint_N.
 * Restores models, optimizers, schedulers, RNG, step, loader positions, scaler:
 * resuming with the same world size continues bit for bit. Every file is
 * checked against the marker's sizes and CRC-32C first: a corrupted file
 * fails the load (ACCEL_ERR_FORMAT naming it), and with automatic naming the
 * newest intact checkpoint is taken instead (the skipped ones named on
 * stderr). What does not fit this run (a model's or optimizer's entries, the
 * registered objects' count, a blob's size) is refused before anything is
 * loaded. On success *at (may be NULL) tells where training resumes. No checkpoint yet is
 * ACCEL_ERR_IO, which the caller may handle by starting fresh: nothing of it
 * stays behind (docs/contract.md "Errors"). */
accel_status accel_accelerator_load_state(accel_accelerator *acc, const char *input_dir,
                                          accel_resume_point *at);
/* save_model's keyword arguments (Accelerate's save_model); {0} = defaults. */
typedef struct accel_save_model_opts {
    /* Largest shard: "10GB", "500MB", "2GiB", "100Mb" (bits), "1000" (bytes);
     * NULL = "10GB" (accel_parse_size). */
    const char *max_shard_size;
    /* ... or as a number of bytes (Accelerate's int form); 0 = the string.
     * Both set -> ACCEL_ERR_INVALID_ARG. */
    int64_t max_shard_bytes;
    /* safe_serialization=False: PyTorch's format, the files torch.save writes
     * (pytorch_model.bin, or pytorch_model-0000i-of-0000N.bin shards +
     * pytorch_model.bin.index.json), tied weights under every name over one
     * storage. Default (safe_serialization=True): model.safetensors (shards +
     * model.safetensors.index.json), a tensor shared by several names written
     * once under its first name, as Accelerate removes the aliases
     * (transformers ties them again on load). */
    bool no_safe_serialization;
} accel_save_model_opts;

/* save_model: the model's state dict into directory dir (created with its
 * parents), in shards of at most max_shard_size + an index when there are
 * several (io.h accel_save_sharded_as), the weights of either format replaced;
 * main process only, every rank returns the same status. A prepared model
 * saves its full weights under the HF names (DDP, mixed precision, ZeRO 1/2;
 * ZeRO-3 gathers them unit by unit into safetensors, every rank joining, and
 * refuses no_safe_serialization; under tensor parallelism the slices are
 * gathered over the tp group too, so any mesh writes the whole model). A Llama also gets config.json, as
 * save_pretrained writes it. Crash-safe: written aside (with links to the
 * directory's other files) and swapped in with one rename, so dir holds the
 * previous model or the new one; dir may not be, or hold, the working
 * directory (ACCEL_ERR_INVALID_ARG). NULL opts = defaults. */
accel_status accel_accelerator_save_model_with(accel_accelerator *acc, accel_module *model, const char *dir,
                                               const accel_save_model_opts *opts);
/* save_model with max_shard_size only ("10GB", "500MB", NULL = "10GB"), safetensors. */
accel_status accel_accelerator_save_model(accel_accelerator *acc, accel_module *model,
                                          const char *dir, const char *max_shard_size);

/* ---------------------------------------------------------------- prepare's argument mapping */

static inline accel_preparable accel__prep_model(accel_module *m) {
    return (accel_preparable){ACCEL_PREPARE_MODEL, m};
}
static inline accel_preparable accel__prep_optimizer(accel_optimizer *o) {
    return (accel_preparable){ACCEL_PREPARE_OPTIMIZER, o};
}
static inline accel_preparable accel__prep_dataloader(accel_dataloader *d) {
    return (accel_preparable){ACCEL_PREPARE_DATALOADER, d};
}
static inline accel_preparable accel__prep_scheduler(accel_lr_scheduler *s) {
    return (accel_preparable){ACCEL_PREPARE_SCHEDULER, s};
}
static inline accel_preparable accel__prep_none(void *null) { return (accel_preparable){ACCEL_PREPARE_NONE, null}; }
#define ACCEL__PREP(x)                                                                          \
    _Generic((x), accel_module *: accel__prep_model, accel_optimizer *: accel__prep_optimizer,  \
             accel_dataloader *: accel__prep_dataloader, accel_lr_scheduler *: accel__prep_scheduler, \
             void *: accel__prep_none)(x)
#define ACCEL__NARGS(...) ACCEL__NARGS_(__VA_ARGS__, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define ACCEL__NARGS_(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, n, ...) n
#define ACCEL__CAT(a, b) ACCEL__CAT_(a, b)
#define ACCEL__CAT_(a, b) a##b
#define ACCEL__PREP_ALL(...) ACCEL__CAT(ACCEL__PREP_, ACCEL__NARGS(__VA_ARGS__))(__VA_ARGS__)
#define ACCEL__PREP_1(a) ACCEL__PREP(a)
#define ACCEL__PREP_2(a, ...) ACCEL__PREP(a), ACCEL__PREP_1(__VA_ARGS__)
#define ACCEL__PREP_3(a, ...) ACCEL__PREP(a), ACCEL__PREP_2(__VA_ARGS__)
#define ACCEL__PREP_4(a, ...) ACCEL__PREP(a), ACCEL__PREP_3(__VA_ARGS__)
#define ACCEL__PREP_5(a, ...) ACCEL__PREP(a), ACCEL__PREP_4(__VA_ARGS__)
#define ACCEL__PREP_6(a, ...) ACCEL__PREP(a), ACCEL__PREP_5(__VA_ARGS__)
#define ACCEL__PREP_7(a, ...) ACCEL__PREP(a), ACCEL__PREP_6(__VA_ARGS__)
#define ACCEL__PREP_8(a, ...) ACCEL__PREP(a), ACCEL__PREP_7(__VA_ARGS__)
#define ACCEL__PREP_9(a, ...) ACCEL__PREP(a), ACCEL__PREP_8(__VA_ARGS__)
#define ACCEL__PREP_10(a, ...) ACCEL__PREP(a), ACCEL__PREP_9(__VA_ARGS__)
#define ACCEL__PREP_11(a, ...) ACCEL__PREP(a), ACCEL__PREP_10(__VA_ARGS__)
#define ACCEL__PREP_12(a, ...) ACCEL__PREP(a), ACCEL__PREP_11(__VA_ARGS__)
/* ---------------------------------------------------------------- trackers (tracking.h)
 * Trackers write under project_dir (opts.project_dir, else ACCEL_PROJECT_DIR,
 * else "."), Accelerate's logging_dir. Everything here writes on the main
 * process only; the other ranks return ACCEL_OK (but for bad values, which
 * init_trackers and log refuse on every rank). */

/* Adds a tracker of your own (log_with=[MyTracker(...)]); the accelerator owns
 * it from here (on every rank: it is finished by end_training or free). Call
 * before init_trackers, which gives it the config. The tracker is taken on
 * failure too (a NULL accelerator, out of memory: finished and freed), but
 * for a tracker already added (to this accelerator or another), refused
 * with ACCEL_ERR_STATE and left to the accelerator that holds it. */
accel_status accel_accelerator_add_tracker(accel_accelerator *acc, accel_tracker *t);
/* init_trackers(project_name, config): opens the log_with trackers in
 * <project_dir>/<project_name>/ and stores config in every tracker. Once per
 * accelerator (ACCEL_ERR_STATE the second time, on the main process: a call
 * that failed to open a tracker or to store the config in one does not
 * count, keeps none of the trackers it opened, and is made again on every
 * rank once its cause is fixed). A tracker's op that fails, here and in log
 * and end_training, is named in the error (docs/tracking.md). */
accel_status accel_accelerator_init_trackers(accel_accelerator *acc, const char *project_name, int n,
                                             const accel_value *config);
/* log(values, step): to every tracker; step < 0 = none. The values are
 * checked on every rank, trackers or none (ACCEL_ERR_INVALID_ARG: a key
 * missing or not UTF-8, a NULL or non-UTF-8 string), so a bad one fails
 * every rank alike; only the main process writes. */
accel_status accel_accelerator_log(accel_accelerator *acc, int n, const accel_value *values, int64_t step);
/* get_tracker(name): NULL (no error) when none has that name, and on other ranks. */
accel_tracker *accel_accelerator_get_tracker(accel_accelerator *acc, const char *name);
/* end_training: finishes every tracker (flushed, closed). The process group
 * goes with accel_accelerator_free. Idempotent. */
accel_status accel_accelerator_end_training(accel_accelerator *acc);

/* ---------------------------------------------------------------- saving anything */

/* register_for_checkpointing: save_state writes custom_checkpoint_<i>.bin
 * (main process) with what save returned, load_state gives those bytes back
 * to load on every rank, i in registration order. *data from malloc (accel
 * frees it). A count mismatch at load is ACCEL_ERR_FORMAT as Accelerate's
 * "Number of custom checkpoints in folder ... does not match", refused
 * before anything is loaded. A failing save or load is named in the error,
 * with the message it set (accel_set_error) or "gave no reason". */
typedef accel_status (*accel_state_save_fn)(void *obj, void **data, size_t *len);
typedef accel_status (*accel_state_load_fn)(void *obj, const void *data, size_t len);
accel_status accel_accelerator_register_for_checkpointing(accel_accelerator *acc, void *obj,
                                                          accel_state_save_fn save, accel_state_load_fn load);
/* The same for a fixed-size byte blob: saved verbatim, restored in place
 * (a saved size other than len is ACCEL_ERR_FORMAT, refused before anything
 * is loaded). Borrowed. */
accel_status accel_accelerator_register_blob_for_checkpointing(accel_accelerator *acc, void *data, size_t len);
/* accelerator.save(obj, f): on the main process only, atomically (written to
 * "<path>.tmp", fsynced, renamed). Tensors as safetensors with metadata
 * {"format": "pt"} (read back with accel_safetensors_open, io.h); bytes verbatim. */
accel_status accel_accelerator_save_tensors(accel_accelerator *acc, const char *path, int n,
                                            const char *const *names, accel_tensor *const *tensors);
accel_status accel_accelerator_save_bytes(accel_accelerator *acc, const char *path, const void *data, size_t len);
/* A file's bytes into *data (malloc'd; free()) on any rank. */
accel_status accel_load_bytes(const char *path, void **data, size_t *len);

/* ---------------------------------------------------------------- find_executable_batch_size */

/* Runs fn(ctx, batch_size) from starting_batch_size; when it returns
 * ACCEL_ERR_OOM (an allocation failed: accel_malloc and the step arena report
 * it as a status), the error is cleared, the step arena released, and fn is
 * run again with reduce(ctx, batch_size) (NULL: int(batch_size * 0.9), as
 * Accelerate 1.x). Any other status is returned as is. Reaching 0 is
 * ACCEL_ERR_OOM "No executable batch size found, reached zero.". *found
 * (may be NULL) gets the batch size that ran. */
typedef accel_status (*accel_batch_size_fn)(void *ctx, int64_t batch_size);
typedef int64_t (*accel_reduce_batch_size_fn)(void *ctx, int64_t batch_size);
accel_status accel_find_executable_batch_size(accel_batch_size_fn fn, void *ctx, int64_t starting_batch_size,
                                              accel_reduce_batch_size_fn reduce, int64_t *found);

/* ---------------------------------------------------------------- call sites
 * The functions above that may run collectives record the caller's
 * __FILE__/__LINE__ first (accel/dist.h, "call sites"), so a mismatch or
 * timeout report names the line of the user's program. */
#ifdef ACCEL_AT_CALL_SITE
#define accel_accelerator_new(...) ACCEL_AT_CALL_SITE(accel_accelerator_new(__VA_ARGS__))
#define accel_accelerator_free(...) ACCEL_AT_CALL_SITE(accel_accelerator_free(__VA_ARGS__))
#define accel_accelerator_wait_for_everyone(...) ACCEL_AT_CALL_SITE(accel_accelerator_wait_for_everyone(__VA_ARGS__))
#define accel_accelerator_main_process_first_begin(...) ACCEL_AT_CALL_SITE(accel_accelerator_main_process_first_begin(__VA_ARGS__))
#define accel_accelerator_main_process_first_end(...) ACCEL_AT_CALL_SITE(accel_accelerator_main_process_first_end(__VA_ARGS__))
#define accel_accelerator_prepare_array(...) ACCEL_AT_CALL_SITE(accel_accelerator_prepare_array(__VA_ARGS__))
#define accel_accelerator_prepare_model(...) ACCEL_AT_CALL_SITE(accel_accelerator_prepare_model(__VA_ARGS__))
#define accel_accelerator_prepare_optimizer(...) ACCEL_AT_CALL_SITE(accel_accelerator_prepare_optimizer(__VA_ARGS__))
#define accel_accelerator_prepare_dataloader(...) ACCEL_AT_CALL_SITE(accel_accelerator_prepare_dataloader(__VA_ARGS__))
#define accel_accelerator_backward(...) ACCEL_AT_CALL_SITE(accel_accelerator_backward(__VA_ARGS__))
#define accel_accelerator_pipeline_step(...) ACCEL_AT_CALL_SITE(accel_accelerator_pipeline_step(__VA_ARGS__))
#define accel_accelerator_optimizer_step(...) ACCEL_AT_CALL_SITE(accel_accelerator_optimizer_step(__VA_ARGS__))
#define accel_accelerator_clip_grad_norm(...) ACCEL_AT_CALL_SITE(accel_accelerator_clip_grad_norm(__VA_ARGS__))
#define accel_accelerator_gather(...) ACCEL_AT_CALL_SITE(accel_accelerator_gather(__VA_ARGS__))
#define accel_accelerator_gather_for_metrics(...) ACCEL_AT_CALL_SITE(accel_accelerator_gather_for_metrics(__VA_ARGS__))
#define accel_accelerator_gather_for_metrics_n(...) ACCEL_AT_CALL_SITE(accel_accelerator_gather_for_metrics_n(__VA_ARGS__))
#define accel_accelerator_reduce(...) ACCEL_AT_CALL_SITE(accel_accelerator_reduce(__VA_ARGS__))
#define accel_accelerator_reduce_scalar(...) ACCEL_AT_CALL_SITE(accel_accelerator_reduce_scalar(__VA_ARGS__))
#define accel_accelerator_pad_across_processes(...) ACCEL_AT_CALL_SITE(accel_accelerator_pad_across_processes(__VA_ARGS__))
#define accel_accelerator_broadcast(...) ACCEL_AT_CALL_SITE(accel_accelerator_broadcast(__VA_ARGS__))
#define accel_accelerator_gather_object(...) ACCEL_AT_CALL_SITE(accel_accelerator_gather_object(__VA_ARGS__))
#define accel_accelerator_broadcast_object(...) ACCEL_AT_CALL_SITE(accel_accelerator_broadcast_object(__VA_ARGS__))
#define accel_accelerator_save_state(...) ACCEL_AT_CALL_SITE(accel_accelerator_save_state(__VA_ARGS__))
#define accel_accelerator_load_state(...) ACCEL_AT_CALL_SITE(accel_accelerator_load_state(__VA_ARGS__))
#define accel_accelerator_save_model(...) ACCEL_AT_CALL_SITE(accel_accelerator_save_model(__VA_ARGS__))
#define accel_accelerator_save_model_with(...) ACCEL_AT_CALL_SITE(accel_accelerator_save_model_with(__VA_ARGS__))
#endif

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_ACCELERATOR_H */
