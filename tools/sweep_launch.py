"""A generated sweep of `accel launch` against `accelerate launch`: what a launched Python script sees.

Each case is a seeded random set of launch flags and/or a random config file
(YAML or JSON, with the keys `accelerate config` writes, and now and then a key
of the wrong type, an unknown key, a bad value or an empty file). It is
launched twice on the same small script (written to a temporary folder), which
writes its sys.argv and its whole environment to <out>/rank<RANK>.json
(rankx.json when RANK is unset) and exits:

  peer   `accelerate launch ...`: the parser and launch_command of accelerate's
         own CLI (accelerate/commands/accelerate_cli.py), run in a child forked
         from this process, which imported accelerate and torch once (a fresh
         `accelerate launch` spends seconds importing them; the code path is the
         same). Neither TransformerEngine nor torchao is installed here, so
         accelerate's launchers refuse fp8 ("FP8 is not available"); the child
         replaces is_fp8_available by a function returning True, which changes
         nothing else of what they export (setup_fp8_env only reads the flags).
  accel  `build/bin/accel launch ...`

Both get the same environment (PATH, HOME, a private HF_HOME so that no
default config is read, the output folder) and run under a timeout in their own
process group, killed whole afterwards. Per rank, the variables each launcher
added or changed are compared, and the script's argv; then the exit status
(0 or not) and which side refused. A result is one of

  match          same ranks, same variables, same argv, both exit 0
  both-refused   both exit non-zero before any rank ran (accel's stderr must
                 say "error" and name the flag or key that was bad)
  accel-refused  accel refuses what Accelerate runs: accepted only where
                 docs/cli.md says so (REFUSED_BY_DESIGN below, each with the
                 line that states it), else a MISMATCH
  MISMATCH       anything else, each differing variable listed
  CRASH          accel died of a signal, or printed a sanitizer report
  HANG           accel (or the peer) ran past the timeout
  not-compared   the peer's path does not run here (NOT_COMPARED below)

Which of Accelerate's launchers runs here (no GPU): `--multi_gpu`, `--use_fsdp`
and `--use_megatron_lm` (flag or distributed_type) without `--cpu` go through
torchrun (multi_gpu_launcher), which runs without a GPU since the script never
initialises a process group; everything else through simple_launcher, which
starts one process (`python script`) whatever num_processes says, unless the
config has mpirun_config.mpirun_hostfile (then mpirun: Open MPI 4.1 here, which
refuses to run as root, as this machine's sessions run; no case has one). So a
simple-launcher case with more than one process is not compared (accel starts
num_processes workers), and
DeepSpeed is not compared (deepspeed is not installed: its launcher fails on
the import). Those cases are still run through accel, which must not crash or
hang.

    python3 tools/sweep_launch.py [--accel build/bin/accel] [--n 300] [--seed 0] [--verbose]

Prints each MISMATCH / CRASH / HANG with its command line and config, and a
summary; exit status 1 when any. Needs accelerate (1.16) and torch.
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

# ------------------------------------------------------------------ by design
# Variables that differ between the two launchers by design, each with the
# docs/cli.md line that states it. Each entry: name -> (when it is ignored, doc).
#   "always"     accel's own or the run's ids/paths
#   "no-port"    only when no port was given (flag or config), or port 0
#   "cpu"        only when accel trains on the CPU (no GPU here) and Accelerate does not
# Besides: TORCHRUN_VARS where the peer ran simple_launcher, OMP_NUM_THREADS (OMP_DOC), the fp8 aliases
# (FP8_ALIASES) and the config's dynamo backend (ignored()).
BY_DESIGN = {
    "ACCEL_*": ("always", "Worker environment: ... ACCEL_MIXED_PRECISION ... (accel's own contract)"),
    "OMP_WAIT_POLICY": ("always", "OMP_WAIT_POLICY=PASSIVE (unless set: libgomp's default spinning ...)"),
    "TORCHELASTIC_RUN_ID": ("always", "Worker environment: ... TORCHELASTIC_RUN_ID (the run's id)"),
    "TORCHELASTIC_ERROR_FILE": ("always", "each worker gets its own TORCHELASTIC_ERROR_FILE "
                                          "(attempt<A>_rank<R>_error.json ...)"),
    "TORCHELASTIC_USE_AGENT_STORE": ("always", "torchrun's `TORCHELASTIC_USE_AGENT_STORE` and "
                                     "`TORCHELASTIC_SIGNALS_TO_HANDLE` are not exported: accel has no agent store"),
    "TORCHELASTIC_SIGNALS_TO_HANDLE": ("always", "torchrun's `TORCHELASTIC_USE_AGENT_STORE` and "
                                       "`TORCHELASTIC_SIGNALS_TO_HANDLE` are not exported: ..."),
    "MASTER_PORT": ("no-port", "when no port is given ... or the port is 0 or busy, a free port is used "
                               "(MASTER_PORT says which)"),
    "ACCELERATE_USE_CPU": ("cpu", "`ACCELERATE_USE_CPU=True` ... on a machine without a GPU"),
    "KMP_AFFINITY": ("cpu", "`ACCELERATE_USE_CPU=True` (..., and `KMP_AFFINITY=...` `KMP_BLOCKTIME=1` ...) "
                            "... on a machine without a GPU"),
    "KMP_BLOCKTIME": ("cpu", "`ACCELERATE_USE_CPU=True` (..., and `KMP_AFFINITY=...` `KMP_BLOCKTIME=1` ...) "
                             "... on a machine without a GPU"),
}
# OMP_NUM_THREADS without the flag: accel's cores / local processes, Accelerate's 1 unless its args.use_cpu
# (which a config's use_cpu: false keeps off even under --cpu) is set; compared where Accelerate divides the cores.
OMP_DOC = ("OMP_NUM_THREADS (flag, else inherited, else cores / local processes, where Accelerate gives 1 unless it "
           "trains on the CPU")
# simple_launcher runs `python script` itself, no torchrun: accel's workers have torchrun's variables.
TORCHRUN_VARS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                 "TORCH_NCCL_ASYNC_ERROR_HANDLING"]
SIMPLE_DOC = "Worker environment: RANK LOCAL_RANK WORLD_SIZE ... (accel starts every worker as torchrun would)"

# What accel refuses and Accelerate runs, each with the docs/cli.md line that says so: (needle in accel's stderr, doc)
REFUSED_BY_DESIGN = [
    ("--dynamo_backend", "`--dynamo_backend` (only `no` ...)"),
    ("zero_stage", "a stage other than 0 to 3 is refused by `accel_accelerator_new`"),
    ("gradient_clipping", "`--gradient_clipping` (finite, >= 0, ...; refused before any worker starts)"),
    ("str_to_bool", "anything else is refused at launch (`invalid str_to_bool value`)"),
    ("is not a boolean", "anything else is refused at launch (config key ...: 'perhaps' is not a boolean)"),
    ("parallelism", "docs/parallelism.md, Configuring it: the checks against --num_processes"),
    ("megatron", "docs/parallelism.md, Configuring it: the checks against --num_processes"),
    ("When using `--fsdp_cpu_ram_efficient_loading` set `--fsdp_sync_module_states` to `True`",
     "CPU-RAM-efficient loading without module-state sync is refused, as in Accelerate: where the values say so "
     "as `str_to_bool` reads them (the script's FSDP plugin refuses that)"),
    ("unrecognized arguments", "A flag of Accelerate's that is not listed here ... is refused as argparse refuses "
                               "an unknown one (`unrecognized arguments`)"),
    ("has a bad value for", "Config files: ... bad values name the key and value"),
    ("You need to use at least 2 processes to use `--multi_gpu`",
     "`--multi_gpu` with fewer than 2 processes, given or not, is refused"),
    ("unknown key", "... and so is a config key accel does not know"),
    ("Less than two GPU ids", "a multi-GPU job ... whose `--gpu_ids` names fewer than two GPUs (... which it checks "
                              "only when it reads a config file)"),
]
# What Accelerate fails on with a traceback and accel runs, each with the docs/cli.md line that says so:
# (needle in accelerate's stderr, doc)
PEER_FAILS_BY_DESIGN = [
    ("'int' object has no attribute 'split'", "Unquoted numbers in the config (`gpu_ids: 0`, ...) count like their "
                                              "quoted forms"),
]

PROBE = r'''
import json, os, sys
with open(os.path.join(os.environ["SWEEP_OUT"], "rank%s.json" % os.environ.get("RANK", "x")), "w") as f:
    json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, f)
'''

# ------------------------------------------------------------------ generator
BOOL_WORDS = ["true", "false", "True", "False", "yes", "no", "1", "0", "on", "off"]
CLIP_SPELLINGS = ["1.0", "1", " 1_0 ", "0.5", "1e-1", "2.", ".5", "0", "+3", "1E2", "-1", "inf", "nan", "0x10"]
FSDP_FLAGS = {
    "fsdp_version": ["1", "2"],
    "fsdp_sharding_strategy": ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "1", "2"],
    "fsdp_reshard_after_forward": ["true", "false", "FULL_SHARD", "SHARD_GRAD_OP"],
    "fsdp_offload_params": BOOL_WORDS + ["maybe"],
    "fsdp_min_num_params": ["0", "1000", "100000000"],
    "fsdp_auto_wrap_policy": ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"],
    "fsdp_transformer_layer_cls_to_wrap": ["LlamaDecoderLayer", "BertLayer,GPT2Block"],
    "fsdp_backward_prefetch": ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"],
    "fsdp_state_dict_type": ["FULL_STATE_DICT", "SHARDED_STATE_DICT"],
    "fsdp_forward_prefetch": BOOL_WORDS,
    "fsdp_use_orig_params": BOOL_WORDS,
    "fsdp_cpu_ram_efficient_loading": BOOL_WORDS,
    "fsdp_sync_module_states": BOOL_WORDS,
    "fsdp_activation_checkpointing": BOOL_WORDS,
}
PAR_FLAGS = {
    "parallelism_config_dp_replicate_size": ["1", "2"],
    "parallelism_config_dp_shard_size": ["1", "2", "3"],
    "parallelism_config_tp_size": ["1", "2"],
    "parallelism_config_cp_size": ["1", "2"],
    "parallelism_config_cp_comm_strategy": ["allgather", "alltoall"],
}
MEGA_FLAGS = {
    "megatron_lm_tp_degree": ["1", "2"],
    "megatron_lm_pp_degree": ["1", "2"],
    "megatron_lm_num_micro_batches": ["1", "2", "4"],
    "megatron_lm_sequence_parallelism": ["true", "false"],
    "megatron_lm_recompute_activations": ["true", "false"],
    "megatron_lm_use_distributed_optimizer": ["true", "false"],
    "megatron_lm_gradient_clipping": ["1.0", "0.5", "0"],
}
FP8_FLAGS = {
    "fp8_backend": ["te", "ao", "msamp"],
    "fp8_margin": ["0", "1", "2"],
    "fp8_interval": ["1", "2"],
    "fp8_format": ["HYBRID", "E4M3", "E5M2", "hybrid"],
    "fp8_amax_history_len": ["16", "1024"],
    "fp8_amax_compute_algo": ["max", "most_recent"],
    "fp8_override_linear_precision": ["False,False,False", "True,False,False"],
    "fp8_opt_level": ["O1", "O2"],
    "fp8_enable_fsdp_float8_all_gather": ["true", "false"],
    "fp8_pad_inner_dim": ["true", "false"],
}
SCRIPT_ARGS = [["--foo", "1"], ["--cpu"], ["-m", "x"], ["--num_processes=3"], ["--", "--x"], ["a b", "--c=d"],
               ["--config_file", "nothere.yaml"], []]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spelled(r, name):
    """A flag as the user may spell it: --a_b, --a-b (both parsers take it)."""
    return "--" + (name.replace("_", "-") if r.random() < 0.2 else name)


def pick_flags(r, table, k):
    out = []
    for name in r.sample(sorted(table), min(k, len(table))):
        out += [spelled(r, name), r.choice(table[name])]
    return out


def gen_flags(r):
    f = []
    if r.random() < 0.5:
        f += ["--mixed_precision", r.choice(["no", "fp16", "bf16", "fp8", "fp8", "FP16", "fp32"])]
    if r.random() < 0.6:
        f += ["--num_processes", str(r.choice([1, 1, 2, 3]))]
    mode = r.choice(["none", "cpu", "multi_gpu", "fsdp", "fsdp", "megatron", "par", "deepspeed"])
    if mode == "cpu":
        f.append("--cpu")
    elif mode == "multi_gpu":
        f.append("--multi_gpu")
    elif mode in ("fsdp", "par"):
        f.append("--use_fsdp")
        f += pick_flags(r, FSDP_FLAGS, r.randint(0, 5))
        if mode == "par":
            f += ["--fsdp_version", "2", "--use_parallelism_config"] + pick_flags(r, PAR_FLAGS, r.randint(0, 3))
    elif mode == "deepspeed":
        f += ["--use_deepspeed", "--zero_stage", r.choice(["0", "1", "2", "3", "4"])]
        if r.random() < 0.3:
            f += ["--offload_optimizer_device", r.choice(["none", "cpu"])]
    elif mode == "megatron":
        f.append("--use_megatron_lm")
        f += pick_flags(r, MEGA_FLAGS, r.randint(0, 4))
    if r.random() < 0.15:
        f += pick_flags(r, FSDP_FLAGS, 1)  # an FSDP flag without --use_fsdp (warned about)
    if r.random() < 0.3:
        f += ["--gradient_accumulation_steps", str(r.choice([1, 2, 8]))]
    if r.random() < 0.2:
        f += ["--gradient_clipping", r.choice(CLIP_SPELLINGS)]
    if r.random() < 0.2:
        f += pick_flags(r, FP8_FLAGS, r.randint(1, 4))
    if r.random() < 0.1:
        f.append("--fp8_use_autocast_during_eval")
    if r.random() < 0.15:
        f += ["--dynamo_backend", r.choice(["no", "NO", "inductor"])]
    if r.random() < 0.15:
        f += ["--dynamo_mode", r.choice(["default", "max-autotune", "reduce-overhead", "fast"])]
    for sw in ("dynamo_use_fullgraph", "dynamo_use_dynamic", "dynamo_use_regional_compilation"):
        if r.random() < 0.08:
            f.append("--" + sw)
    if r.random() < 0.3:
        f += ["--main_process_port", str(r.choice([0, free_port()]))]
    if r.random() < 0.15:
        f += ["--num_machines", "1"]
    if r.random() < 0.15:
        f += ["--machine_rank", "0"]
    if r.random() < 0.1:
        f.append("--debug")
    if r.random() < 0.1:
        f += ["--gpu_ids", r.choice(["0", "0,1", "all"])]
    if r.random() < 0.15:
        f += ["--num_cpu_threads_per_process", str(r.choice([1, 2, 4]))]
    if r.random() < 0.08:
        f.append("--enable_cpu_affinity")
    return f


def gen_config(r):
    """A config as `accelerate config` writes it, sometimes with a fault; None: no file."""
    dt = r.choice(["NO", "MULTI_CPU", "MULTI_GPU", "FSDP", "MEGATRON_LM", "NO", "DEEPSPEED"])
    c = {"compute_environment": "LOCAL_MACHINE", "distributed_type": dt,
         "mixed_precision": r.choice(["no", "fp16", "bf16", "fp8", "BF16"]),
         "num_processes": r.choice([1, 2, 3]), "num_machines": 1, "machine_rank": 0,
         "main_training_function": "main", "rdzv_backend": "static", "same_network": True,
         "use_cpu": r.choice([False, False, True]), "downcast_bf16": "no", "debug": r.random() < 0.2,
         "enable_cpu_affinity": False, "tpu_env": [], "tpu_use_cluster": False, "tpu_use_sudo": False}
    if dt == "MULTI_GPU" or r.random() < 0.2:
        c["gpu_ids"] = r.choice(["all", "0,1", 0])
    if r.random() < 0.3:
        c["main_process_port"] = free_port()
    if dt == "FSDP" or r.random() < 0.15:
        fc = {}
        for name in r.sample(sorted(FSDP_FLAGS), r.randint(0, 6)):
            v = r.choice(FSDP_FLAGS[name])
            key = name if r.random() < 0.7 else name[len("fsdp_"):]
            fc[key] = {"true": True, "false": False}.get(v, int(v) if v.isdigit() and name != "fsdp_version" else v)
        c["fsdp_config"] = fc
        if dt == "FSDP" and r.random() < 0.4:
            fc["fsdp_version"] = 2
            c["parallelism_config"] = {k: int(v) if v.isdigit() else v
                                       for k, v in ((n, r.choice(PAR_FLAGS[n])) for n in
                                                    r.sample(sorted(PAR_FLAGS), r.randint(1, 3)))}
    if dt == "DEEPSPEED":
        c["deepspeed_config"] = {"zero_stage": r.choice([0, 1, 2, 3]), "gradient_accumulation_steps": r.choice([1, 4]),
                                 "offload_optimizer_device": "none", "zero3_init_flag": r.random() < 0.5}
    if dt == "MEGATRON_LM":
        c["megatron_lm_config"] = {n: (r.choice(MEGA_FLAGS[n]) == "true") if "parallelism" in n or "recompute" in n
                                   or "distributed" in n else float(r.choice(MEGA_FLAGS[n])) if "clipping" in n
                                   else int(r.choice(MEGA_FLAGS[n]))
                                   for n in r.sample(sorted(MEGA_FLAGS), r.randint(0, 4))}
    if r.random() < 0.3:
        c["dynamo_config"] = {"dynamo_backend": r.choice(["NO", "INDUCTOR"]),
                              "dynamo_mode": r.choice(["default", "reduce-overhead"]),
                              "dynamo_use_fullgraph": r.random() < 0.5}
        if r.random() < 0.5:
            c["dynamo_config"]["dynamo_use_dynamic"] = r.random() < 0.5
        if r.random() < 0.5:
            c["dynamo_config"]["dynamo_use_regional_compilation"] = r.random() < 0.5
    if c["mixed_precision"] == "fp8" and r.random() < 0.7:
        c["fp8_config"] = {"backend": r.choice(["TE", "AO", "te"]),
                           r.choice(["fp8_format", "format"]): r.choice(["HYBRID", "E4M3"]),
                           "amax_history_length": r.choice([16, 1024]),
                           "amax_compute_algorithm": r.choice(["max", "most_recent"]),
                           "margin": r.choice([0, 1]), "interval": 1, "override_linear_precision": [False] * 3}
    fault = r.random()
    if fault < 0.05:
        c["num_processes"] = "two"
    elif fault < 0.09:
        c["debug"] = "maybe"
    elif fault < 0.13:
        c["not_a_key"] = 1
    elif fault < 0.16:
        c["mixed_precision"] = "fp32"
    elif fault < 0.19:
        del c["distributed_type"]
    elif fault < 0.22:
        return ""  # an empty file
    elif fault < 0.25 and "fsdp_config" in c:
        c["fsdp_config"]["fsdp_min_num_params"] = [1]
    elif fault < 0.27:
        c["gpu_ids"] = ["0"]
    return c


def write_config(r, d, c):
    if c == "":
        path = os.path.join(d, "empty.yaml")
        open(path, "w").close()
        return path
    if r.random() < 0.3:
        path = os.path.join(d, "cfg.json")
        with open(path, "w") as f:
            json.dump(c, f, indent=2)
        return path
    import yaml
    path = os.path.join(d, "cfg.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(c, f, sort_keys=True)
    return path


# ------------------------------------------------------------------ running
def kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_peer(parser, argv, env, cwd, timeout):
    """accelerate launch ARGV in a forked child; (rc or 'hang', stderr text)."""
    errpath = os.path.join(cwd, "peer.stderr")
    pid = os.fork()
    if pid == 0:  # child: become `accelerate launch`
        try:
            os.setpgid(0, 0)
            fd = os.open(errpath, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 2)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            import accelerate.utils.launch as ul
            ul.is_fp8_available = lambda: True
            args = parser.parse_args(["launch"] + argv)
            args.func(args)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stderr.flush()
        os._exit(code)
    deadline = time.time() + timeout
    hang = False
    while not os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
        if time.time() > deadline:
            hang = True
            break
        time.sleep(0.05)
    kill_group(pid)  # leftovers, while the group's id is still the child's (not yet reaped)
    _, status = os.waitpid(pid, 0)
    with open(errpath, errors="replace") as f:
        err = f.read()
    return ("hang" if hang else os.waitstatus_to_exitcode(status)), err


def run_accel(accel, argv, env, cwd, timeout):
    p = subprocess.Popen([accel, "launch"] + argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:  # nothing outlives accel's launcher (docs/cli.md): only a hung one is killed, with its group
        _, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        kill_group(p.pid)
        _, err = p.communicate()
        rc = "hang"
    return rc, err.decode(errors="replace")


def ranks(out):
    got = {}
    for name in os.listdir(out):
        if name.startswith("rank") and name.endswith(".json"):
            with open(os.path.join(out, name)) as f:
                got[name[4:-5]] = json.load(f)
    return got


def added(env, base):
    return {k: v for k, v in env.items() if base.get(k) != v and k != "SWEEP_OUT"}


# fp8_config keys `accelerate config` writes under another name than the flag's: Accelerate's launcher exports
# them as ACCELERATE_FP8_<KEY> (which nothing reads) and keeps the flag's default; accel gives the flag's variable
# the value. docs/cli.md: "also the `amax_history_length`, `amax_compute_algorithm` ... that `accelerate config`
# writes and Accelerate's launcher then loses".
FP8_ALIASES = {"amax_history_length": ("ACCELERATE_FP8_AMAX_HISTORY_LEN", "ACCELERATE_FP8_AMAX_HISTORY_LENGTH"),
               "amax_compute_algorithm": ("ACCELERATE_FP8_AMAX_COMPUTE_ALGO", "ACCELERATE_FP8_AMAX_COMPUTE_ALGORITHM")}


def ignored(name, ctx):
    if name.startswith("ACCEL_"):
        return True
    cfg = ctx["cfg"] if isinstance(ctx["cfg"], dict) else {}
    fp8 = cfg.get("fp8_config") if isinstance(cfg.get("fp8_config"), dict) else {}
    if any(alias in fp8 and name in names for alias, names in FP8_ALIASES.items()):
        return True
    dyn = cfg.get("dynamo_config") if isinstance(cfg.get("dynamo_config"), dict) else {}
    if name == "ACCELERATE_DYNAMO_BACKEND" and str(dyn.get("dynamo_backend", "NO")).upper() != "NO":
        return True  # docs/cli.md: "a config's dynamo_config.dynamo_backend other than no is ignored, with a note"
    if ctx["simple"] and name in TORCHRUN_VARS:
        return True
    if name == "OMP_NUM_THREADS" and ctx["accel_cpu"] and ctx["peer_omp"] == "1":
        return True  # OMP_DOC
    rule = BY_DESIGN.get(name)
    if not rule:
        return False
    when = rule[0]
    return (when == "always" or (when == "no-port" and not ctx["port_given"])
            or (when == "cpu" and ctx["accel_cpu"] and not ctx["peer_cpu"]))


def peer_path(launch_flags, cfg):
    """Which of Accelerate's launchers runs the case here: simple or torchrun (launch_flags: before the script)."""
    flags = set(a.replace("-", "_") for a in launch_flags)
    if "__cpu" in flags:
        return "simple"
    if flags & {"__use_fsdp", "__multi_gpu", "__use_megatron_lm"}:
        return "torchrun"
    if isinstance(cfg, dict) and cfg.get("distributed_type") in ("FSDP", "MULTI_GPU", "MEGATRON_LM"):
        return "torchrun"
    return "simple"


def deepspeed(launch_flags, cfg):
    """Whether Accelerate's DeepSpeed launcher runs the case (launch_flags: before the script)."""
    flags = [a.replace("-", "_") for a in launch_flags]
    if "__cpu" in flags:
        return False
    if "__use_deepspeed" in flags:
        return True
    return isinstance(cfg, dict) and cfg.get("distributed_type") == "DEEPSPEED" and not any(
        a in ("__use_fsdp", "__multi_gpu", "__use_megatron_lm") for a in flags)


def refusal_names_problem(err, argv, cfg):
    """accel's message must be an error naming a flag, key or value of the case."""
    if "error" not in err.lower():
        return False
    words = set()
    for a in argv:
        words.add(a.lstrip("-").split("=")[0].replace("-", "_"))
        words.add(a.strip())
    if isinstance(cfg, dict):
        for k, v in cfg.items():
            words.add(k)
            if isinstance(v, dict):
                words.update(v.keys())
            words.add(str(v))
    if cfg == "":
        words.add("empty")
    return any(w and len(w) > 1 and w in err for w in words)


def compare(case, peer, acc, ctx):
    """(verdict, [details])"""
    (prc, perr, pranks), (arc, aerr, aranks) = peer, acc
    if arc == "hang" or prc == "hang":
        return "HANG", ["accel hang" if arc == "hang" else "peer hang"]
    if (isinstance(arc, int) and arc < 0) or "Sanitizer" in aerr or "runtime error:" in aerr:
        return "CRASH", [aerr[-2000:]]
    if prc != 0 and arc != 0:
        if aranks:
            return "MISMATCH", ["peer refused, accel ran its ranks then failed: " + aerr[-500:]]
        if not refusal_names_problem(aerr, case["argv"], case["cfg"]):
            return "MISMATCH", ["accel's refusal names nothing of the case: " + aerr[-500:]]
        return "both-refused", []
    if prc == 0 and arc != 0:
        for needle, doc in REFUSED_BY_DESIGN:
            if needle in aerr and refusal_names_problem(aerr, case["argv"], case["cfg"]):
                return "accel-refused", [doc, aerr.strip().splitlines()[-1]]
        return "MISMATCH", ["accel refused what accelerate ran: " + aerr.strip()[-600:]]
    if prc != 0:
        for needle, doc in PEER_FAILS_BY_DESIGN:
            if needle in perr:
                return "peer-failed", [doc]
        last = perr.strip().splitlines()[-1:] or [""]
        return "MISMATCH", ["accelerate refused, accel ran: " + last[0][:300]]
    if ctx["simple"] and len(aranks) > 1:
        return "not-compared", ["simple_launcher runs one process (no mpirun_hostfile); accel ran %d" % len(aranks)]
    diffs = []
    pk = sorted(pranks)
    ak = sorted(aranks)
    if ctx["simple"]:
        pk = ["0"] if pk == ["x"] else pk
        pranks = {"0": pranks["x"]} if "x" in pranks else pranks
    if pk != ak:
        return "MISMATCH", ["ranks: accelerate %s, accel %s" % (pk, ak)]
    for rk in ak:
        pe, ae = added(pranks[rk]["env"], ctx["base"]), added(aranks[rk]["env"], ctx["base"])
        ctx["accel_cpu"] = ae.get("ACCELERATE_USE_CPU") == "True"
        ctx["peer_cpu"] = pe.get("ACCELERATE_USE_CPU") == "True"
        ctx["peer_omp"] = pe.get("OMP_NUM_THREADS")
        for k in sorted(set(pe) | set(ae)):
            if pe.get(k) != ae.get(k) and not ignored(k, ctx):
                diffs.append("rank %s %s: accelerate %r, accel %r" % (rk, k, pe.get(k), ae.get(k)))
        if pranks[rk]["argv"] != aranks[rk]["argv"]:
            diffs.append("rank %s argv: accelerate %r, accel %r" % (rk, pranks[rk]["argv"], aranks[rk]["argv"]))
    return ("MISMATCH", diffs) if diffs else ("match", [])


def make_case(r):
    use_cfg = r.random() < 0.55
    cfg = gen_config(r) if use_cfg else None
    flags = gen_flags(r) if (not use_cfg or r.random() < 0.6) else []
    module = r.random() < 0.15
    return {"flags": flags, "cfg": cfg, "module": module, "script_args": r.choice(SCRIPT_ARGS),
            "cfg_rng": r.random()}


def run_case(case, parser, accel, timeout):
    d = tempfile.mkdtemp(prefix="sweep-launch-")
    try:
        with open(os.path.join(d, "probe.py"), "w") as f:
            f.write(PROBE)
        argv = list(case["flags"])
        if case["cfg"] is not None:
            argv = ["--config_file", write_config(random.Random(case["cfg_rng"]), d, case["cfg"])] + argv
        argv += (["-m", "probe"] if case["module"] else ["probe.py"]) + case["script_args"]
        case["argv"] = argv
        base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "HF_HOME": os.path.join(d, "hf"),
                "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        flag_ports = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a.replace("-", "_") == "__main_process_port"]
        cfg_port = case["cfg"].get("main_process_port") if isinstance(case["cfg"], dict) else None
        port_given = flag_ports[-1] != "0" if flag_ports else bool(cfg_port)
        ctx = {"simple": peer_path(case["flags"], case["cfg"]) == "simple", "port_given": port_given, "base": base,
               "cfg": case["cfg"]}
        if deepspeed(case["flags"], case["cfg"]):  # not compared: deepspeed is not installed here
            out = os.path.join(d, "accel")
            os.mkdir(out)
            rc, err = run_accel(accel, argv, dict(base, SWEEP_OUT=out), d, timeout)
            if rc == "hang":
                return "HANG", ["accel hang"], None
            if (isinstance(rc, int) and rc < 0) or "Sanitizer" in err:
                return "CRASH", [err[-2000:]], None
            return "not-compared", ["DeepSpeed: deepspeed is not installed"], None
        results = []
        for who in ("peer", "accel"):
            out = os.path.join(d, who)
            os.mkdir(out)
            env = dict(base, SWEEP_OUT=out)
            if who == "peer":
                rc, err = run_peer(parser, argv, env, d, timeout)
            else:
                rc, err = run_accel(accel, argv, env, d, timeout)
            results.append((rc, err, ranks(out)))
        verdict, details = compare(case, results[0], results[1], ctx)
        return verdict, details, results
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--accel", default="build/bin/accel")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    accel = os.path.abspath(a.accel)
    from accelerate.commands.accelerate_cli import CustomArgumentParser
    from accelerate.commands.launch import launch_command_parser
    import torch  # noqa: F401 (imported once here, before the forks)
    parser = CustomArgumentParser("accelerate", allow_abbrev=False)
    launch_command_parser(subparsers=parser.add_subparsers())

    counts, reasons = {}, {}
    bad = 0
    for i in range(a.n):
        r = random.Random(a.seed * 1_000_003 + i)
        case = make_case(r)
        verdict, details, results = run_case(case, parser, accel, a.timeout)
        counts[verdict] = counts.get(verdict, 0) + 1
        if verdict in ("accel-refused", "not-compared", "peer-failed"):
            why = (verdict, details[0].split(";")[0])
            reasons[why] = reasons.get(why, 0) + 1
        if verdict in ("MISMATCH", "CRASH", "HANG"):
            bad += 1
            print("case %d: %s\n  accel launch %s" % (i, verdict, " ".join(repr(x) for x in case["argv"])))
            if case["cfg"] is not None:
                print("  config: %s" % json.dumps(case["cfg"]))
            for line in details:
                print("   ", line)
            sys.stdout.flush()
        elif a.verbose:
            print("case %d: %s %s" % (i, verdict, " ".join(case["argv"])), details)
    for (verdict, why), n in sorted(reasons.items()):
        print("  %s %d: %s" % (verdict, n, why))
    summary = ", ".join("%s %d" % kv for kv in sorted(counts.items()))
    print("%d cases, each launched by both: %s" % (a.n, summary))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
