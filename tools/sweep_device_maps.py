"""A generated sweep of accel's device maps against Accelerate's and transformers'.

For random small configs of every family from_pretrained loads (the generator
of tools/sweep_estimate_memory.py: the decoders, and BERT, RoBERTa and
XLM-RoBERTa, each config with one of the heads accel builds for it in turn),
random budgets (0-3 GPUs, the cpu, the disk, each a random share of the
model's size) and each strategy (auto, balanced, balanced_low_0, sequential),
two things are checked:

  inferred  the map accel would infer (build/bin/device_map_probe,
            tools/device_map_probe.c: the map accel's from_pretrained builds
            for that directory, strategy and budgets, without loading a
            weight) against the peer's: what transformers' from_pretrained
            asks of Accelerate (the model from_config under
            init_empty_weights, then Accelerate's get_balanced_memory (all
            but sequential; low_zero for balanced_low_0) and
            infer_auto_device_map with the model's _no_split_modules)
  loaded    a map transformers made: its from_pretrained's own
            _get_device_map (transformers.integrations.accelerate) for the
            same model, strategy and budgets, which from_pretrained keeps as
            model.hf_device_map, saved as JSON; checked once a config against
            a real from_pretrained(device_map=..., max_memory=...) over the
            cpu and the disk. accel loads it (device_map_probe --load) from the
            config's weights (random, saved by transformers) and must place
            every weight where the map's entry for it says (GPU N standing in
            as hostless:N, accel's test device, under ACCEL_TEST_DEVICES=3;
            "cpu" as a cpu offload when the map holds a GPU)

The inferred maps are compared entry by entry and in order; an error on one
side must be an error on the other. Where Accelerate's clean_device_map
merges two sibling modules' entries (BERT's bert.embeddings and bert.pooler,
RobertaClassificationHead and roberta), each merged key goes to the end of
the map in the order of a Python set of their names, which the string hash
(PYTHONHASHSEED) decides: maps equal but for that order are counted apart,
not as disagreements (accel keeps the modules' order). And where a module
holds one child with weights beside weightless ones (BertPooler: dense and
its activation), Accelerate's clean_device_map merges the two children's
entries into the module's, which then goes to the end of the map, where
accel, whose module has the dense child alone, keeps the child's entry in
place ("bert.pooler.dense" for "bert.pooler": the same weights on the same
device): maps equal once each key is followed down to its sole weighted
child (sole_weighted) are counted apart too. Two differences are by design and taken
out of the peer's: the modules without a weight transformers keeps (the
rotary embedding, dropouts, activations), which accel's model lacks, are
dropped from its map, and its buffers (the rotary tables, Gemma's embedding
scale, BERT's position and token type ids: bytes that accel computes or does
without) are emptied before it places; how many of Accelerate's maps those
buffers moved is counted and printed (a budget within those bytes of a
boundary).

    python3 tools/sweep_device_maps.py [--probe build/bin/device_map_probe] [--n 30] [--seed 0] [--only llama,bert]

Prints each disagreement and a summary; exit status 1 when any disagreed.
Needs torch, transformers and accelerate.
"""
import argparse
import contextlib
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import traceback
import warnings

import torch
import transformers
import transformers.modeling_utils
from accelerate import init_empty_weights
from accelerate.utils import compute_module_sizes, get_balanced_memory, infer_auto_device_map

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep_estimate_memory import FAMILIES, drawn, refusal  # noqa: E402

ENCODERS = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta"}  # the class names' prefix
DECODERS = [f for f in FAMILIES if f not in ENCODERS]
# the heads accel builds (accel/bert.h), each config of an encoder family with the next one
HEADS = ["ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering", "ForMaskedLM",
         "ForMultipleChoice", "ForPreTraining", "ForNextSentencePrediction"]
STRATEGIES = ["auto", "balanced", "balanced_low_0", "sequential"]
# transformers 5 renames GPT-NeoX's head module (its checkpoints still say embed_out.weight)
NEOX_HEAD = {"lm_head": "embed_out"}
GPUS = 3  # the most GPU budgets drawn (budgets); hostless:N stands in for GPU N when accel loads


def budgets(r, total):
    """Random budgets in bytes: GPU indices first, then cpu, then disk (the order Accelerate sorts them in)."""
    share = lambda: max(1, int(total * r.choice([0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5])))
    mm = {}
    for i in range(r.choice([0, 1, 1, 2, 2, 3])):
        mm[i] = share()
    if r.random() < 0.9:
        mm["cpu"] = share() if r.random() < 0.6 else 10 * total
    if r.random() < 0.4:
        mm["disk"] = 100 * total
    return mm


def model_class(model_type, head):
    """transformers' class: the causal LM of a decoder, head's class (BertForMaskedLM, ...) of an encoder."""
    return getattr(transformers, ENCODERS[model_type] + head) if head else transformers.AutoModelForCausalLM


def built(model_type, head, config):
    """config's model in float32 (from_config: AutoModelForCausalLM's; _from_config: a head class's)."""
    cls = model_class(model_type, head)
    return (cls._from_config if head else cls.from_config)(config, dtype=torch.float32)


def meta_model(model_type, head, config):
    """The model on meta as from_pretrained places it: tied (from_config on meta does not tie)."""
    with init_empty_weights():
        model = built(model_type, head, config)
    model.tie_weights()
    return model


def model_size(model_type, head, config):
    """The bytes of the model transformers builds for config; ValueError for a config accel refuses by design
    (refusal's, and a masked-LM decoder of its own: BERT's masked LM and pre-training heads untied)."""
    if refusal(model_type, config) or (head in ("ForMaskedLM", "ForPreTraining") and not config.tie_word_embeddings):
        raise ValueError("refused by design")
    return compute_module_sizes(meta_model(model_type, head, config))[""]


@contextlib.contextmanager
def quiet():
    out = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        warnings.simplefilter("ignore")
        yield


def peer_map(model_type, head, config, strategy, mm, buffers):
    """buffers False: transformers' buffers emptied first (the rotary tables, Gemma's embedding
    scale, BERT's position and token type ids), which accel computes or does without and so places
    nothing for."""
    model = meta_model(model_type, head, config)
    for mod in model.modules():
        for name, _ in list(mod.named_buffers(recurse=False)) if not buffers else []:
            setattr(mod, name, torch.empty(0, device="meta"))
    no_split = model._no_split_modules
    with quiet():
        if strategy != "sequential":
            mm = get_balanced_memory(model, max_memory=dict(mm), no_split_module_classes=no_split,
                                     low_zero=strategy == "balanced_low_0")
        placed = infer_auto_device_map(model, max_memory=dict(mm), no_split_module_classes=no_split)
    # accel computes the rotary tables instead of keeping transformers' buffers, and keeps no
    # module without weights (dropouts: GPT-2's drop, Phi's embed_dropout; activations): nothing to place
    rename = NEOX_HEAD if model_type == "gpt_neox" else {}
    weightless = lambda k: k and not any(True for _ in model.get_submodule(k).parameters())
    return [(rename.get(k, k), v) for k, v in placed.items() if not weightless(k)], model


def sole_weighted(model, key):
    """key, or key.child down the chain while the module has no weight of its own and one child holding
    weights: where a map's entry lands once weightless siblings are gone (BertPooler's dense beside its
    activation)."""
    mod = model.get_submodule(key) if key else model
    while not any(True for _ in mod.parameters(recurse=False)):
        held = [(n, c) for n, c in mod.named_children() if any(True for _ in c.parameters())]
        if len(held) != 1:
            break
        key, mod = f"{key}.{held[0][0]}" if key else held[0][0], held[0][1]
    return key


class MapMade(Exception):
    """Carries the map out of from_pretrained before it loads a weight (GPU budgets on a machine without one)."""


def transformers_map(model_type, head, d, strategy, mm):
    """The map from_pretrained(d, device_map=strategy, max_memory=mm) computes (its _get_device_map) and keeps
    as model.hf_device_map, taken as it comes out: nothing is loaded."""
    made = transformers.modeling_utils._get_device_map

    def caught(*args, **kwargs):
        raise MapMade(made(*args, **kwargs))

    transformers.modeling_utils._get_device_map = caught
    try:
        with quiet():
            model_class(model_type, head).from_pretrained(d, device_map=strategy, max_memory=dict(mm),
                                                          dtype=torch.float32)
    except MapMade as m:
        return dict(m.args[0])
    finally:
        transformers.modeling_utils._get_device_map = made
    raise RuntimeError("from_pretrained made no device map")


def from_pretrained_map(model_type, head, d, strategy, mm, tmp):
    """model.hf_device_map of a real from_pretrained over the cpu and the disk (None: one device, no map)."""
    with quiet():
        model = model_class(model_type, head).from_pretrained(d, device_map=strategy, max_memory=dict(mm),
                                                              offload_folder=os.path.join(tmp, "offload"),
                                                              dtype=torch.float32)
    return getattr(model, "hf_device_map", None)


def expected_places(model_type, hf_map, names):
    """Where accel must place each state-dict name under hf_map: its longest key's device, GPU N as
    hostless:N, "cpu" a cpu offload when the map holds a GPU (accel_dispatched_placement's words)."""
    gpu = any(isinstance(v, int) for v in hf_map.values())
    rename = {v: k for k, v in NEOX_HEAD.items()} if model_type == "gpt_neox" else {}
    out = {}
    for name in names:
        first, dot, rest = name.partition(".")
        tname = rename.get(first, first) + dot + rest  # transformers' name of it
        keys = [k for k in hf_map if k == "" or tname == k or tname.startswith(k + ".")]
        v = hf_map[max(keys, key=len)] if keys else None
        out[name] = (f"hostless:{v}" if isinstance(v, int) else "cpu-offload" if v == "cpu" and gpu else v)
    return out


def saved(model_type, head, config, d):
    """config's model with random weights saved in d (once)."""
    if not os.path.exists(os.path.join(d, "model.safetensors")):
        with quiet():
            built(model_type, head, config).save_pretrained(d)


def peer_crash(e):
    """Which of Accelerate's own failures e is, where there is no map to compare, else None: "disk",
    get_balanced_memory calling torch.device("disk"); "tie", infer_auto_device_map's
    get_module_size_with_ties looking for the module of a weight tied to a bare parameter (BERT's
    cls.predictions.bias) among the modules and finding none."""
    if "device string: disk" in str(e):
        return "disk"
    tie = isinstance(e, IndexError) and traceback.extract_tb(e.__traceback__)[-1].name == "get_module_size_with_ties"
    return "tie" if tie else None


class Probe:
    """device_map_probe running aside: one line a case in, one line out."""

    def __init__(self, *args, env=None):
        self.p = subprocess.Popen(list(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  bufsize=1, env=env, stderr=subprocess.DEVNULL)

    def ask(self, *fields):
        self.p.stdin.write("\t".join(fields) + "\n")
        return self.p.stdout.readline().rstrip("\n")

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", default="build/bin/device_map_probe")
    ap.add_argument("--n", type=int, default=30, help="configs per family (each with every strategy)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    only = set(a.only.split(",")) if a.only else None
    transformers.logging.set_verbosity_error()
    probe = Probe(a.probe)
    loader = Probe(a.probe, "--load", env=dict(os.environ, ACCEL_TEST_DEVICES=str(GPUS)))
    peer_crashed = {"disk": 0, "tie": 0}
    bad = total = moved_by_buffers = hash_order = weightless_merge = loaded = load_skipped = checked_real = 0
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in DECODERS + list(ENCODERS):
            if only and model_type not in only:
                continue
            r = random.Random(f"{a.seed}:{model_type}:maps")
            heads = [h for h in HEADS if hasattr(transformers, ENCODERS[model_type] + h)] \
                if model_type in ENCODERS else [None]
            turn = iter(range(1 << 30))
            head_of = {}

            def measure(config, d):
                head_of[d] = heads[next(turn) % len(heads)]
                return model_size(model_type, head_of[d], config)

            done = 0
            for _, config, d, size in drawn(model_type, r, a.n, tmp, measure):
                done += 1
                head = head_of[d]
                cls = ENCODERS[model_type] + head if head else ""
                real_checked = False
                for strategy in STRATEGIES:
                    mm = budgets(r, size)
                    total += 1
                    where = f"{model_type} {cls or 'causal LM'} {strategy} budgets={mm} config={config.to_json_string()!r}"
                    try:
                        (want, model), err_want, crashed = peer_map(model_type, head, config, strategy, mm, False), None, None
                        moved_by_buffers += want != peer_map(model_type, head, config, strategy, mm, True)[0]
                    except Exception as e:  # noqa: BLE001 - the peer's refusal is the expected outcome
                        want, err_want, crashed = None, f"{type(e).__name__}: {e}", peer_crash(e)
                    if crashed:
                        peer_crashed[crashed] += 1
                    else:
                        spec = ",".join(f"{k}={v}" for k, v in mm.items())
                        line = probe.ask(d, strategy, spec, cls)
                        got = None if line.startswith("ERROR ") else list(json.loads(line).items())
                        sole = lambda m: sorted(((sole_weighted(model, k), v) for k, v in m), key=str)
                        if got and want and got != want and sorted(got, key=str) == sorted(want, key=str):
                            hash_order += 1  # the same entries in an order of Python's string hash (above)
                        elif got and want and got != want and sole(got) == sole(want):
                            weightless_merge += 1  # Accelerate merged a module's sole weighted child (above)
                        elif (got is None) != (want is None) or (got is not None and got != want):
                            bad += 1
                            print(f"DISAGREE inferred {where}")
                            print(f"  accel:      {line}")
                            print(f"  accelerate: {json.dumps(dict(want)) if want is not None else err_want}")
                    # the map transformers makes for these budgets, loaded by accel
                    saved(model_type, head, config, d)
                    try:
                        hf_map = transformers_map(model_type, head, d, strategy, mm)
                    except Exception:  # noqa: BLE001 - no map made: nothing to load
                        load_skipped += 1
                        continue
                    if not real_checked and all(k in ("cpu", "disk") for k in mm) and "cpu" in mm:
                        real_checked = True
                        try:
                            real = from_pretrained_map(model_type, head, d, strategy, mm, tmp)
                        except Exception as e:  # noqa: BLE001 - a refusal is as good as a map here
                            real = f"{type(e).__name__}: {e}"
                        checked_real += 1
                        if real is not None and real != hf_map:
                            bad += 1
                            print(f"DISAGREE hf_device_map {where}")
                            print(f"  from_pretrained: {real}")
                            print(f"  _get_device_map: {hf_map}")
                    map_file = os.path.join(tmp, "hf_device_map.json")
                    with open(map_file, "w") as f:
                        json.dump({k: f"hostless:{v}" if isinstance(v, int) else v for k, v in hf_map.items()}, f)
                    loaded += 1
                    line = loader.ask(d, map_file, cls)
                    got = None if line.startswith("ERROR ") else json.loads(line)
                    want = expected_places(model_type, hf_map, got) if got is not None else None
                    if got is None or got != want:
                        bad += 1
                        print(f"DISAGREE loaded {where}")
                        print(f"  map:   {json.dumps(hf_map)}")
                        print(f"  accel: {line}")
                        if want is not None:
                            print(f"  want:  {json.dumps({k: v for k, v in want.items() if got[k] != v})}")
            print(f"{model_type}: {done} configs", file=sys.stderr)
    probe.close()
    loader.close()
    print(f"{total} maps ({peer_crashed['disk']} of them a balanced strategy over a disk budget, "
          f"{peer_crashed['tie']} a tie to a bare parameter: Accelerate fails there (peer_crash), not compared); "
          f"transformers' buffers moved {moved_by_buffers} of "
          f"Accelerate's maps; {hash_order} equal but for the order of merged siblings, {weightless_merge} but "
          f"for a module's sole weighted child Accelerate merged; {loaded} maps transformers made loaded by accel ({load_skipped} not made, "
          f"{checked_real} checked against a real from_pretrained); {bad} disagreed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
