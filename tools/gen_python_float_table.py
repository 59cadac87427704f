"""Prints the table of tests/test_python_float.c: each text, whether Python's
float() takes it, and the value it gives (a C hex literal, so the test
compares exact bits). accel__python_float (src/core/env.c) must agree on
every row. Run from the repository root and paste the output over the table:
    python3 tools/gen_python_float_table.py
"""
import math

TEXTS = [
    # the underscores: one between two digits only
    "1_0", "_1", "1__0", "1_", "1_000.000_1", "0_0", "1e1_0", "1_e1", "1e_1", "1e+_1", "1_.5", "1._5", "+_1",
    # blanks around it (not inside), ASCII ones only
    " 1", "1 ", "\t1\n", "\v1\f\r", " 1 1", "- 1", "\x1c1", "1\x1f",
    # the words, any case
    "+inf", "-Infinity", "nan", "infinity", "iNf", "nAn", "-nan", "+infinity", " -Infinity\t", "inf ", "infinit",
    "in", "infinityy",
    # what strtod takes and float() does not
    "0x10", "0x1p3", "nan(1)", "0X1P-2", "1,5",
    # the numbers' forms
    "1e3", "1.e3", ".5", "5.", "-.5", "+.5e+2", "1.5e-3", "00", "007.5", "1E5", "1e400", "-1e400", "1e-400",
    "4.9e-324", "0.1", "123456789012345678901234567890", "2.5", "-0",
    # none
    "", " ", "1e", "e3", "1d", ".", "+", "-", "..5", "1..", "5.5.5", "+-1", "1e+", "1e3.5", ".e3", "1f",
]


def c_string(s):
    out = ""
    for ch in s:
        out += {"\t": "\\t", "\n": "\\n", "\v": "\\v", "\f": "\\f", "\r": "\\r", '"': '\\"', "\\": "\\\\"}.get(
            ch, ch if " " <= ch <= "~" else "\\%03o" % ord(ch))
    return '"' + out + '"'


def c_value(v):
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "-INFINITY" if v < 0 else "INFINITY"
    return v.hex()


for text in TEXTS:
    try:
        value = float(text)
        print("    {%s, true, %s}," % (c_string(text), c_value(value)))
    except ValueError:
        print("    {%s, false, 0}," % c_string(text))
