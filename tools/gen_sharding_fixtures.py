"""Writes tests/data/sharding_sweep.json: accelerate's own sharding over a grid
of (dataset size, batch size, processes, split_batches, even_batches, drop_last),
for tests/test_data_sweep.c. Run from the repository root:
    python3 tools/gen_sharding_fixtures.py

Two truths per case, both from accelerate's code, never re-derived here:
  shard   every rank's batches from accelerate.data_loader.BatchSamplerShard over
          torch's BatchSampler(SequentialSampler(range(n)), bs, drop_last), and
          len(BatchSamplerShard) per rank; or the message of the exception its
          constructor raises.
  loader  what prepare_data_loader(DataLoader(range(n), bs, drop_last),
          num_processes, process_index, split_batches, even_batches) iterates on
          every rank, its len, and its remainder (the GradientState remainder
          gather_for_metrics cuts the last gathered batch to; -1 = no cut); or the
          exception's message. With one process prepare_data_loader does not wrap
          the batch sampler, so "loader" differs from "shard" there.

Format: {"accelerate": version, "torch": version, "errors": [message...],
"cases": [case...]} with case = [n, bs, procs, split, even, drop_last, shard,
loader], where shard and loader are each either the index of an exception's
message in "errors" or
  [[len_rank0, ...], ["batches of rank 0", ...]]            (shard)
  [remainder, [len_rank0, ...], ["batches of rank 0", ...]] (loader)
the loader's batch list left out when it is the shard's. A rank's batches are
written "0-2;6-8;21,0-1": batches separated by ';', each a ','-list of runs, a
run "a-b" meaning a, a+1, ..., b.
"""
import json

import accelerate
import torch
from accelerate.data_loader import BatchSamplerShard, prepare_data_loader
from accelerate.state import PartialState
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

SIZES = list(range(0, 41)) + [47, 64, 100]
BATCH_SIZES = range(1, 11)
PROCESSES = range(1, 5)
FLAGS = [(split, even, drop) for split in (0, 1) for even in (0, 1) for drop in (0, 1)]
VARIABLE_SIZES = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
OUT = "tests/data/sharding_sweep.json"


def runs(batch):
    """[21, 0, 1] -> '21,0-1'."""
    out, i = [], 0
    while i < len(batch):
        j = i
        while j + 1 < len(batch) and batch[j + 1] == batch[j] + 1:
            j += 1
        out.append(str(batch[i]) if i == j else f"{batch[i]}-{batch[j]}")
        i = j + 1
    return ",".join(out)


def encode(batches):
    batches = [list(b) for b in batches]
    assert all(batches), "an empty batch would not survive the encoding"
    return ";".join(runs(b) for b in batches)


ERRORS = []


def error_index(e):
    """The index of the exception's message in ERRORS (added once)."""
    text = f"{type(e).__name__}: {e}"
    if text not in ERRORS:
        ERRORS.append(text)
    return ERRORS.index(text)


def shard_case(make_sampler, procs, split, even):
    lens, ranks = [], []
    for r in range(procs):
        try:
            shard = BatchSamplerShard(make_sampler(), procs, r, split_batches=bool(split), even_batches=bool(even))
        except ValueError as e:
            return error_index(e)
        lens.append(len(shard))
        ranks.append(encode(shard))
    return [lens, ranks]


def loader_case(make_loader, procs, split, even):
    lens, ranks, remainders = [], [], set()
    for r in range(procs):
        try:
            dl = prepare_data_loader(make_loader(), num_processes=procs, process_index=r, split_batches=bool(split),
                                     even_batches=bool(even), put_on_device=False)
        except ValueError as e:
            return error_index(e)
        batches, ends = [], []
        for b in dl:
            batches.append(b)
            ends.append(dl.end_of_dataloader)
        assert ends == [i + 1 == len(ends) for i in range(len(ends))], "end_of_dataloader off the last batch"
        lens.append(len(dl))
        ranks.append(encode(batches))
        remainders.add(dl.remainder)  # set by begin(), kept after the loop
    assert len(remainders) == 1, remainders
    return [remainders.pop(), lens, ranks]


def both(make_sampler, make_loader, procs, split, even):
    shard = shard_case(make_sampler, procs, split, even)
    loader = loader_case(make_loader, procs, split, even)
    if isinstance(shard, list) and isinstance(loader, list) and loader[2] == shard[1]:
        loader.pop()
    return [shard, loader]


def fixed_cases():
    for n in SIZES:
        for bs in BATCH_SIZES:
            for procs in PROCESSES:
                for split, even, drop in FLAGS:
                    sampler = lambda: BatchSampler(SequentialSampler(range(n)), bs, bool(drop))
                    loader = lambda: DataLoader(list(range(n)), batch_size=bs, drop_last=bool(drop), collate_fn=list)
                    yield [n, bs, procs, split, even, drop, *both(sampler, loader, procs, split, even)]


def variable_cases():
    """A batch sampler without batch_size (a list of lists): batch i holds the next
    VARIABLE_SIZES[(start + i) % 10] indices."""
    for count in range(0, 10):
        for start in range(0, 10):
            sizes = [VARIABLE_SIZES[(start + i) % len(VARIABLE_SIZES)] for i in range(count)]
            bounds = [sum(sizes[:i]) for i in range(count + 1)]
            batches = [list(range(bounds[i], bounds[i + 1])) for i in range(count)]
            for procs in PROCESSES:
                for even in (0, 1):
                    sampler = lambda: [list(b) for b in batches]
                    loader = lambda: DataLoader(list(range(bounds[-1])), batch_sampler=sampler(), collate_fn=list)
                    yield [sizes, procs, even, *both(sampler, loader, procs, 0, even)]


def write_cases(f, name, cases):
    f.write(f'"{name}": [\n' + ",\n".join(json.dumps(c, separators=(",", ":")) for c in cases) + "\n]")


def main():
    PartialState(cpu=True)  # prepare_data_loader reads the (single-process) state
    cases, variable = list(fixed_cases()), list(variable_cases())
    versions = {"accelerate": accelerate.__version__, "torch": torch.__version__.split("+")[0]}
    with open(OUT, "w") as f:
        f.write(json.dumps(versions)[:-1] + ',\n"errors": ' + json.dumps(ERRORS, indent=0) + ",\n")
        write_cases(f, "cases", cases)
        f.write(",\n")
        write_cases(f, "variable", variable)
        f.write("}\n")
    print(f"{OUT}: {len(cases)} fixed-size cases, {len(variable)} variable-size")


if __name__ == "__main__":
    main()
