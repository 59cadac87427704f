#!/usr/bin/env python3
"""Reads the TensorBoard files accel writes with TensorBoard's own reader
(EventAccumulator and the hparams plugin's protos) and checks what it finds.

  python3 tools/check_tensorboard_reads_accel.py [build/bin/test_tracking]
      runs the C test with ACCEL_TRACKING_KEEP=<tmp> (its TensorBoard run:
      config {"lr": 0.001, "batch_size": 8, "model": "llama", "shuffle": True},
      loss=0.5 and lr=0.001 at step 1, note="hello" at step 2) and reads <tmp>/run.
  python3 tools/check_tensorboard_reads_accel.py --logdir DIR [--scalar TAG ...]
      reads any run accel wrote (e.g. <project_dir>/train_llama from
      `train_llama --log_with tensorboard`) and checks the listed scalar tags exist.

Exits non-zero, naming what is missing, when TensorBoard cannot read something.
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2


def load(run_dir):
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def hparams_of(run_dir):
    """The session_start_info hparams of the <time> sub-run add_hparams made."""
    subs = [d for d in glob.glob(os.path.join(run_dir, "*")) if os.path.isdir(d)]
    assert len(subs) == 1, f"expected one hparams sub-run in {run_dir}, found {subs}"
    acc = load(subs[0])
    content = acc.PluginTagToContent("hparams")
    assert set(content) == {"_hparams_/experiment", "_hparams_/session_start_info", "_hparams_/session_end_info"}, content
    ssi = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    out = {}
    for k, v in ssi.hparams.items():
        out[k] = v.string_value if v.WhichOneof("kind") == "string_value" else v.number_value
    return out


def check_test_run(run_dir):
    acc = load(run_dir)
    tags = acc.Tags()
    assert {"loss", "lr"} <= set(tags["scalars"]), tags
    loss = acc.Scalars("loss")
    assert [(e.step, e.value) for e in loss] == [(1, 0.5)], loss
    assert abs(acc.Scalars("lr")[0].value - 0.001) < 1e-9
    text = acc.Tensors("note/text_summary")
    assert text[0].step == 2 and text[0].tensor_proto.string_val == [b"hello"], text
    hp = hparams_of(run_dir)
    assert hp == {"lr": 0.001, "batch_size": 8.0, "model": "llama", "shuffle": 1.0}, hp
    print("TensorBoard reads accel's run:", sorted(tags["scalars"]), "text", tags["tensors"], "hparams", hp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("test_binary", nargs="?", default="build/bin/test_tracking")
    ap.add_argument("--logdir")
    ap.add_argument("--scalar", action="append", default=[])
    a = ap.parse_args()
    if a.logdir:
        acc = load(a.logdir)
        scalars = acc.Tags()["scalars"]
        missing = [t for t in a.scalar if t not in scalars]
        assert not missing, f"TensorBoard finds no {missing} in {a.logdir} (it has {scalars})"
        for t in a.scalar:
            ev = acc.Scalars(t)
            print(f"{t}: {len(ev)} points, steps {ev[0].step}..{ev[-1].step}, last {ev[-1].value:.4f}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, ACCEL_TRACKING_KEEP=tmp)
        tests_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")
        r = subprocess.run([os.path.abspath(a.test_binary)], cwd=tests_dir, env=env, capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"{a.test_binary} failed:\n{r.stderr}")
        check_test_run(os.path.join(tmp, "run"))


if __name__ == "__main__":
    main()
