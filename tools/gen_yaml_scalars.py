#!/usr/bin/env python3
"""Plain YAML scalars as PyYAML (yaml.safe_load, what Accelerate reads a
config with) resolves them: the peer of src/cli/cli_cfgfile.c's
resolve_plain. Writes tests/data/yaml_scalars.tsv, one row a scalar:
`scalar<TAB>repr` with repr Python's repr of the value, or `!range` for an
int beyond 64 bits (which accel's config reader refuses: an out-of-range
error naming the key). tests/test_cli_launch.c (test_config_numbers) reads
every row back through `accel env --config_file`.

    python3 tools/gen_yaml_scalars.py
"""
import os
import yaml

SCALARS = """
0 1 -1 +1 010 -010 08 0o17 0b101 -0b11 0x1F -0x10 0x_1f 1_000 0_10 1:30 1:30:05 -1:30 1:60 1:5:7 0:30
9223372036854775807 -9223372036854775807 -9223372036854775808 9223372036854775808 -9223372036854775809
99999999999999999999 0x8000000000000000 0xFFFFFFFFFFFFFFFFF 0b1111111111111111111111111111111111111111111111111111111111111111
1e3 1E3 1e+3 1e-4 -1e3 1.e3 1.0e3 1.0e+3 1.0E-4 1.5e3 1.5e+3 1.5E+3 12e03 1.0e03 1.0e+03 1_000.5 1__0.5 1.5_0
1. -1. +1. 1.0 0.1 -0.0 0.5 .5 -.5 +.5 ._5 .5e+1 .5e1 1:30.5 -1:30.5 +1:30.5 1:30:00.25 1:30. 1:70.5
3.14159265358979 1.7976931348623157e+308 1.0e+400 -1.0e+400 4.9e-324 1.0e-400
.inf -.inf +.inf .Inf .INF -.Inf inf Infinity .nan .NaN .NAN -.nan nan NaN
0x1p3 1.2.3 0.5.5 1:2:3.4.5 1e 1.0e+ 1.0e+1_0 abc yes No on OFF ~ null NULL
""".split()


def row(s):
    v = yaml.safe_load("x: " + s)["x"]
    if isinstance(v, int) and not isinstance(v, bool) and not -2**63 <= v < 2**63:
        return "!range"
    return repr(v)


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "yaml_scalars.tsv")
    with open(out, "w") as f:
        for s in SCALARS:
            f.write(f"{s}\t{row(s)}\n")
    print(open(out).read(), end="")


if __name__ == "__main__":
    main()
