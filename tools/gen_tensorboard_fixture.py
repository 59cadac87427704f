#!/usr/bin/env python3
"""Writes tests/data/tensorboard/: event files made by TensorBoard's own writer
(torch.utils.tensorboard.SummaryWriter, what Accelerate's TensorBoardTracker
uses), for the calls accel's "tensorboard" tracker mirrors:

  run/events.out.tfevents.*           add_scalar("loss", 0.5, 1), add_scalar("lr", 0.001, 1),
                                      add_text("note", "hello", 2)
  run/hparams/events.out.tfevents.*   add_hparams({"lr": 0.001, "batch_size": 8,
                                      "model": "llama", "shuffle": True}, {}, run_name="hparams")

tests/test_tracking.c reads these records with accel's reader (TFRecord
framing, masked CRC-32C, protobuf-c) and compares their structure with what
accel writes. Run from the repository root: python3 tools/gen_tensorboard_fixture.py
"""
import glob
import os
import shutil

from torch.utils.tensorboard import SummaryWriter

OUT = os.path.join("tests", "data", "tensorboard")
CONFIG = {"lr": 0.001, "batch_size": 8, "model": "llama", "shuffle": True}


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    run = os.path.join(OUT, "run")
    w = SummaryWriter(run)
    w.add_scalar("loss", 0.5, 1)
    w.add_scalar("lr", 0.001, 1)
    w.add_text("note", "hello", 2)
    w.add_hparams(CONFIG, {}, run_name="hparams")
    w.close()
    # Fixed names: the C test opens them without listing the directory.
    for sub, name in (("run", "scalars_text.tfevents"), (os.path.join("run", "hparams"), "hparams.tfevents")):
        files = glob.glob(os.path.join(OUT, sub, "events.out.tfevents.*"))
        assert len(files) == 1, files
        os.replace(files[0], os.path.join(OUT, name))
    shutil.rmtree(run)
    print("wrote", sorted(os.listdir(OUT)))


if __name__ == "__main__":
    main()
