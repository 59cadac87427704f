#!/usr/bin/env python3
"""A generated sweep of accel's chat templates against transformers' apply_chat_template.

Every template of the fixtures (tests/data/chat_templates/*.jinja, the adversarial ones of
tests/data/chat_templates/adversarial/ included, and the model folders of
tests/data/chat_templates/dirs/, loaded as folders) is rendered over many random,
seeded conversations by both sides: transformers' own rendering path (as
tools/gen_chat_template_fixtures.py renders its cases: _normalize_chat_messages then
render_jinja_template) and accel's accel_chat_template_render_json, driven in this one
process through libaccel.so (ctypes), thousands of renders a second. Conversations have
0..8 messages with roles system/user/assistant/tool and unknown ones, contents full of
quotes, backslashes, braces, "{{", "{%", newlines, edge whitespace, Unicode (control and
format characters included), empty and very long strings, content as lists of text and
image parts, None-valued keys, reasoning fields, tool calls (arguments as dicts and as
JSON strings) and tools lists, add_generation_prompt on and off, continue_final_message,
and the extra variables templates read (bos/eos tokens, enable_thinking, date_string,
tools_in_user_message, builtin_tools, custom_tools, documents).

Each case must agree: the same text byte for byte where transformers renders, a failure
where it raises (with raise_exception's message in accel's error). accel refusing a
construct it does not implement (ACCEL_ERR_UNSUPPORTED, e.g. an object key holding U+0000)
where transformers renders is counted apart, its first few printed, and not a disagreement. Disagreements are printed with their seed and case
number (rerun one with --template NAME --seed S --only K), the first few in full.

Run (after building accel; Python is only needed here, never to build or test accel):
    python3 tools/sweep_chat_templates.py [--cases 10000] [--seed 1] [--template NAME]
"""
import argparse
import ctypes
import json
import os
import random
import sys
import time
import unicodedata

import jinja2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_chat_template_fixtures as gen  # noqa: E402 - the fixtures' own rendering path and special tokens

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
DATA = os.path.join(ROOT, "tests", "data", "chat_templates")


def accel_status_codes():
    """The accel_status values by name, from include/accel/core.h."""
    import re
    src = open(os.path.join(ROOT, "include", "accel", "core.h"), encoding="utf-8").read()
    body = re.search(r"typedef enum accel_status\s*{(.*?)}\s*accel_status;", src, re.S).group(1)
    codes, n = {}, -1
    for name, val in re.findall(r"(ACCEL_[A-Z_0-9]+)\s*(?:=\s*(-?\d+))?\s*,", body):
        n = int(val) if val else n + 1
        codes[name] = n
    return codes


class Accel:
    """accel_chat_template_* through libaccel.so."""

    def __init__(self, lib):
        self.lib = ctypes.CDLL(lib)
        self.libc = ctypes.CDLL(None)
        L = self.lib
        L.accel_chat_template_new.restype = ctypes.c_void_p
        L.accel_chat_template_new.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        L.accel_chat_template_load.restype = ctypes.c_void_p
        L.accel_chat_template_load.argtypes = [ctypes.c_char_p]
        L.accel_chat_template_free.argtypes = [ctypes.c_void_p]
        L.accel_chat_template_render_json.restype = ctypes.c_int
        L.accel_chat_template_render_json.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                                      ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
        L.accel_last_error.restype = ctypes.c_char_p
        self.libc.free.argtypes = [ctypes.c_void_p]

    def new(self, src):
        b = src.encode("utf-8")
        ct = self.lib.accel_chat_template_new(b, len(b))
        return ct, None if ct else self.error()

    def load(self, folder):
        ct = self.lib.accel_chat_template_load(folder.encode())
        return ct, None if ct else self.error()

    def error(self):
        return self.lib.accel_last_error().decode("utf-8", "replace")

    def render(self, ct, variables):
        """(status, text or error message)"""
        js = json.dumps(variables, ensure_ascii=False).encode("utf-8")
        out, n = ctypes.c_void_p(), ctypes.c_size_t()
        st = self.lib.accel_chat_template_render_json(ct, js, len(js), ctypes.byref(out), ctypes.byref(n))
        if st:
            return st, self.error()
        text = ctypes.string_at(out, n.value).decode("utf-8")
        self.libc.free(out)
        return 0, text


# ------------------------------------------------------------------ random inputs

PIECES = ["hello", "Hello, World!", "'", '"', "\\", "\\n", "{", "}", "{{", "}}", "{%", "%}", "{#", "#}", "{{ messages }}",
          "{% if x %}y{% endif %}", "\n", "\r\n", "\t", " ", "  ", "\u00a0", "\u2028", "\u200b", "\ufeff", "\x00", "\x1b",
          "\x7f", "\x85", "é", "日本語", "🙂", "👩‍👩‍👧", "ß", "İ", "ﬁ", "Ω", "\u0301", "ΣΑΣ", "ΌΣΟΣ ", "Σ", "ǆ", "ŉ", "ᾳ", "ﬃ", "<|im_end|>", "<s>", "</s>",
          "[INST]", "<think>", "</think>", "<tool_call>", "None", "True", "0", "-1", "1.5", "null", "[]", "{}", "tool",
          "system", "assistant", "user", "CONTINUE_FINAL_MESSAGE_TAG", "%s", "%(x)s", "\u0000\u0001", "\U0001F600"]
FLOATS = [0.0, -0.0, 0.1, 1.5, -2.25, 1e16, 1e-7, 123456789.123456789, 1.7976931348623157e308, 5e-324, 3.0, 1e22,
          2.5e-5, 100.0]
INTS = [0, 1, -1, 42, 2 ** 31, 2 ** 53 + 1, 2 ** 63 - 1, -2 ** 63]


def random_char(rng):
    """A code point assigned in this Python's Unicode (which repr() and isspace() follow,
    like accel's utf8proc): the two databases differ only on code points a later Unicode
    assigned, as repr of a string says in docs/tokenizer.md."""
    while True:
        c = chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0, 0x3000), rng.randint(0x1F300, 0x1F64F),
                            rng.randint(0x80, 0xa0)]))
        if unicodedata.category(c) != "Cn":
            return c


def text(rng):
    r = rng.random()
    if r < 0.08:
        return ""
    if r < 0.12:
        return rng.choice(PIECES) * rng.randint(1000, 20000)  # long
    if r < 0.3:
        return "".join(random_char(rng) for _ in range(rng.randint(1, 30)))
    s = "".join(rng.choice(PIECES) + rng.choice(["", " ", "x"]) for _ in range(rng.randint(1, 8)))
    if rng.random() < 0.2:
        s = rng.choice([" ", "\n", "  \n ", "\t"]) + s + rng.choice([" ", "\n", "\n\n", " \t"])
    return s


def scalar(rng):
    r = rng.random()
    if r < 0.3:
        return text(rng)
    if r < 0.5:
        return rng.choice(INTS)
    if r < 0.7:
        return rng.choice(FLOATS)
    if r < 0.85:
        return rng.choice([True, False])
    return None


def value(rng, depth=0):
    r = rng.random()
    if depth > 2 or r < 0.5:
        return scalar(rng)
    if r < 0.75:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "b", "z", "city", "é", "k\"", "", "1", text(rng)[:10]]): value(rng, depth + 1)
            for _ in range(rng.randint(0, 4))}


def content(rng, plain):
    """A message's content: text only when plain (most templates concatenate it)."""
    r = rng.random()
    if plain or r < 0.6:
        return text(rng)
    if r < 0.92:
        parts = []
        for _ in range(rng.randint(0, 3)):
            kind = rng.random()
            if kind < 0.6:
                parts.append({"type": "text", "text": text(rng)})
            elif kind < 0.85:
                parts.append({"type": "image"} if rng.random() < 0.5 else {"type": "image", "url": "http://x/y.png"})
            else:
                parts.append({"type": rng.choice(["video", "audio", "text"]), "text": None} if rng.random() < 0.3
                             else {"text": text(rng)})
        return parts
    return value(rng)  # a number, bool, None, list or dict where a text was expected


def tool(rng):
    return {"type": "function", "function": {
        "name": rng.choice(["get_weather", "search", "f", "tool \"x\"", "日本"]),
        "description": text(rng),
        "parameters": {"type": "object", "properties": {
            rng.choice(["city", "q", "n"]): {"type": rng.choice(["string", "integer"]), "description": text(rng)[:40]}
            for _ in range(rng.randint(0, 2))}, "required": ["city"]}}}


def tool_call(rng):
    args = {rng.choice(["city", "days", "q", "é"]): value(rng) for _ in range(rng.randint(0, 3))}
    if rng.random() < 0.3:
        args = json.dumps(args, ensure_ascii=rng.random() < 0.5)
    call = {"name": rng.choice(["get_weather", "search", "x"]), "arguments": args}
    if rng.random() < 0.8:
        return {"id": rng.choice(["call_1", "abcDEF123", "123456789", ""]), "type": "function", "function": call}
    return call  # the flat form some callers use


def message(rng, role, plain):
    m = {"role": role, "content": content(rng, plain)}
    if role == "assistant":
        if rng.random() < 0.3:
            m["tool_calls"] = [tool_call(rng) for _ in range(rng.randint(1, 2))]
            if rng.random() < 0.5:
                m["content"] = rng.choice(["", text(rng)] if plain else ["", None, text(rng)])
        if rng.random() < 0.2:
            m[rng.choice(["reasoning_content", "thinking", "reasoning"])] = text(rng)
        if rng.random() < 0.15:
            m["content"] = rng.choice(["<think>\n", "", "x"]) + text(rng) + "</think>" + text(rng)
    if role == "tool" and rng.random() < 0.5:
        m["tool_call_id"] = rng.choice(["call_1", "abcDEF123", "x"])
        if rng.random() < 0.3:
            m["name"] = "get_weather"
    if not plain and rng.random() < 0.05:
        m[rng.choice(["name", "tool_calls", "content", "extra"])] = None
    return m


def conversation(rng, n_max=8):
    """messages, extra variables, add_generation_prompt"""
    n = rng.randint(0, n_max)
    plain = rng.random() < 0.6
    msgs = []
    if rng.random() < 0.6:  # a well-formed chat: optional system, user/assistant turns with tool replies
        if n and rng.random() < 0.4:
            msgs.append(message(rng, "system", plain))
        while len(msgs) < n:
            msgs.append(message(rng, "user", plain))
            if len(msgs) < n:
                a = message(rng, "assistant", plain)
                msgs.append(a)
                if "tool_calls" in a and len(msgs) < n:
                    msgs.append(message(rng, "tool", plain))
    else:  # anything
        roles = ["system", "user", "assistant", "tool", "developer", "ipython", "function", "User", "", "straße", "ǆ", "ΣΟΦΊΑΣ"]
        msgs = [message(rng, rng.choice(roles), plain) for _ in range(n)]
    if msgs and rng.random() < 0.05:  # a message without a role, or with one that is not a string
        m = msgs[rng.randrange(len(msgs))]
        if rng.random() < 0.5:
            del m["role"]
        else:
            m["role"] = rng.choice([1, 2.5, True, ["user"], {"role": "user"}])
    if msgs and rng.random() < 0.03:  # tool_calls or tools of the wrong shape
        msgs[rng.randrange(len(msgs))]["tool_calls"] = rng.choice([tool_call(rng), "call", 3, []])
    extra = {}
    if rng.random() < 0.3:
        extra["tools"] = [tool(rng) for _ in range(rng.randint(0, 3))] if rng.random() < 0.9 else \
            rng.choice([None, tool(rng), "tools"])
    for key, gen_value in (("enable_thinking", lambda: rng.choice([True, False, None, 0, "yes"])),
                           ("date_string", lambda: rng.choice(["26 Jul 2024", "", text(rng)])),
                           ("tools_in_user_message", lambda: rng.choice([True, False])),
                           ("builtin_tools", lambda: rng.choice([["brave_search"], ["code_interpreter", "wolfram_alpha"], []])),
                           ("custom_tools", lambda: [tool(rng)]),
                           ("documents", lambda: [{"title": text(rng), "text": text(rng)}]),
                           ("keep_past_thinking", lambda: rng.choice([True, False]))):
        if rng.random() < 0.12:
            extra[key] = gen_value()
    agp = rng.random() < 0.6
    if msgs and not agp and rng.random() < 0.1:
        extra["continue_final_message"] = True
    return msgs, extra, agp


def special_tokens(rng, special):
    if rng.random() < 0.9:
        return dict(special)
    return {k: rng.choice(["", "<s>", text(rng)]) for k in ("bos_token", "eos_token")}


# ------------------------------------------------------------------ the two sides

def peer(src, special, msgs, extra, agp):
    """(True, text) or (False, (message, raised by raise_exception))"""
    if not msgs:  # apply_chat_template's own refusal, before the template
        return False, ("empty conversation", False)
    try:
        return True, gen.render(src, special, msgs, extra, agp)
    except jinja2.exceptions.TemplateError as e:
        return False, (str(e), type(e) is jinja2.exceptions.TemplateError)
    except Exception as e:  # noqa: BLE001 - any failure of the peer is a failure accel must share
        return False, (f"{type(e).__name__}: {e}", False)


def variables(special, msgs, extra, agp):
    v = dict(special)
    v.update(extra)
    v["messages"] = msgs
    v["add_generation_prompt"] = agp
    return v


def templates(only):
    """(name, source, special tokens, folder or None)"""
    out = []
    for name in sorted(gen.SPECIAL):
        out.append((name, open(os.path.join(DATA, name + ".jinja"), encoding="utf-8").read(), gen.SPECIAL[name], None))
    for name in sorted(gen.ADVERSARIAL):
        path = os.path.join(DATA, name + ".jinja")
        out.append((name, open(path, encoding="utf-8").read(), gen.ADVERSARIAL[name], None))
    for d in sorted(os.listdir(os.path.join(DATA, "dirs"))):
        folder = os.path.join(DATA, "dirs", d)
        cfg = json.load(open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8"))
        special = {k: (v["content"] if isinstance(v, dict) else v) for k, v in cfg.items()
                   if k.endswith("_token") and v is not None}
        jf = os.path.join(folder, "chat_template.jinja")
        src = open(jf, encoding="utf-8").read() if os.path.exists(jf) else cfg["chat_template"]
        out.append(("dirs/" + d, src, special, folder))
    return [t for t in out if not only or t[0] == only]


def pick(src, extra):
    """The template transformers picks from a list: tool_use when tools are given."""
    if isinstance(src, str):
        return src
    named = {t["name"]: t["template"] for t in src}
    return named["tool_use"] if extra.get("tools") is not None and "tool_use" in named else named["default"]


def sweep(acc, name, src, special, folder, n, seed, only, show, codes):
    ct, err = acc.load(folder) if folder else acc.new(src)
    if not ct:
        print(f"{name}: accel refuses to load it: {err}")
        return 1, 0, 0
    rng = random.Random(f"{seed}/{name}")
    bad = unsupported = rendered = 0
    for k in range(n):
        case_rng = random.Random(rng.getrandbits(64))
        msgs, extra, agp = conversation(case_rng)
        sp = special_tokens(case_rng, special)
        if only is not None and k != only:
            continue
        ok, want = peer(pick(src, extra), sp, json.loads(json.dumps(msgs)), dict(extra), agp)
        st, got = acc.render(ct, variables(sp, msgs, extra, agp))
        if st == codes["ACCEL_ERR_UNSUPPORTED"]:  # a named refusal, as the contract allows: counted apart
            unsupported += 1
            if unsupported <= show:
                print(f"--- {name} seed {seed} case {k}: refused as unsupported: {got[:300]}")
            continue
        if ok and not st and got == want:
            rendered += 1
            continue
        elif not ok and st and (not want[1] or want[0] in got):
            continue
        elif not ok and st:
            why = "raise_exception's message is not in accel's error"
        else:
            why = "texts differ" if ok and not st else "accel fails where transformers renders" if ok else \
                "accel renders where transformers fails"
        bad += 1
        if bad <= show or only is not None:
            print(f"--- {name} seed {seed} case {k}: {why}")
            print("variables:", json.dumps(variables(sp, msgs, extra, agp), ensure_ascii=False)[:4000])
            at = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got))) \
                if ok and not st else 0
            if at:
                print(f"the texts agree up to character {at}")
            print("transformers:", repr(want[max(0, at - 200):] if at else want)[:2000])
            print("accel:", repr(got[max(0, at - 200):] if at else got)[:2000])
    acc.lib.accel_chat_template_free(ct)
    return bad, unsupported, rendered


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10000, help="conversations per template")
    ap.add_argument("--seed", default="1")
    ap.add_argument("--template", help="only this one (a fixture's name, e.g. qwen3 or dirs/config_list)")
    ap.add_argument("--only", type=int, help="only this case number (with --template)")
    ap.add_argument("--show", type=int, default=3, help="disagreements printed in full per template")
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "lib", "libaccel.so"))
    a = ap.parse_args()
    acc = Accel(a.lib)
    codes = accel_status_codes()
    total_bad = total = 0
    for name, src, special, folder in templates(a.template):
        t0 = time.time()
        bad, unsupported, rendered = sweep(acc, name, src, special, folder, a.cases, a.seed, a.only, a.show, codes)
        total_bad += bad
        total += a.cases
        print(f"{name}: {a.cases} conversations, {rendered} rendered alike, {a.cases - rendered - bad - unsupported} "
              f"failed alike, {bad} disagreements, {unsupported} refused as unsupported, {time.time() - t0:.0f} s",
              flush=True)
    print(f"{total} conversations, {total_bad} disagreements")
    return 1 if total_bad else 0


if __name__ == "__main__":
    sys.exit(main())
