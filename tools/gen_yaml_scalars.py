#!/usr/bin/env python3
"""YAML scalars as PyYAML (yaml.safe_load, what Accelerate reads a config
with) builds them: plain ones as its resolver types them (the peer of
src/cli/cli_cfgfile.c's resolve_plain), and ones tagged !!int / !!float as
its constructors read them (the peer of yaml_int_text / yaml_float_text).
Writes tests/data/yaml_scalars.tsv, one row a scalar: `scalar<TAB>repr` with
repr Python's repr of the value, `!range` for an int beyond 64 bits (which
accel's config reader refuses: an out-of-range error naming the key), or
`!error` where safe_load raises (accel refuses it naming the key). Tagged
texts that only Python's int() leniency takes (a second sign in an int, inner
blanks, "0x0x1f") are not listed: accel refuses those, as docs/cli.md says. tests/test_cli_launch.c (test_yaml_scalars) reads
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
59:59:59.123456789 3.14159265358979 1.7976931348623157e+308 1.0e+400 -1.0e+400 4.9e-324 1.0e-400
.inf -.inf +.inf .Inf .INF -.Inf inf Infinity .nan .NaN .NAN -.nan nan NaN
0x1p3 1.2.3 0.5.5 1:2:3.4.5 1e 1.0e+ 1.0e+1_0 abc yes No on OFF ~ null NULL
""".split()

TAGGED = ["!!int " + s for s in """
0o17 0O17 017 -0o17 +0o17 0o7_7 0_o17 0o 0o8 09 08 00 -0 00o17 0x1F 0x_1F 0X1F 0b101 0B1 0b 0xg 1_000 _1 1__ _
1:30 1:75 -1:75 1:30:05 1::2 :5 0:30 99999999999999999999 0x8000000000000000 -9223372036854775808 1.0 1e3 abc
""".split()] + ["!!float " + s for s in """
1e-3 1E3 1 -1 +1 1. .5 1_0.5 .inf -.Inf .NaN -.nan inf nan infinity -Infinity 1:30 1:30.5 -1:1e1 1:inf
nan(1) 0x1p3 abc 1e 1e+ 1.5e-2_0 1,5 1::2 . e3 26.96:62.29:49.443 0.1:0.2:0.3:0.7
""".split()] + [
    # float()'s blanks around each part, which construct_yaml_float leaves to it (quoted: a plain scalar has none)
    '!!float " 1"', '!!float "1 "', '!!float "\\t-1_0\\n"', '!!float "- 1"', '!!float "1: 30"',
]


def row(s):
    try:
        v = yaml.safe_load("x: " + s)["x"]
    except (ValueError, IndexError, yaml.YAMLError):
        return "!error"
    if isinstance(v, int) and not isinstance(v, bool) and not -2**63 <= v < 2**63:
        return "!range"
    return repr(v)


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "yaml_scalars.tsv")
    with open(out, "w") as f:
        for s in SCALARS + TAGGED:
            f.write(f"{s}\t{row(s)}\n")
    print(open(out).read(), end="")


if __name__ == "__main__":
    main()
