"""A generated sweep of accel's tokenizers against their references: Hugging Face
`tokenizers` for every tokenizer.json fixture in tests/data/tokenizers/, the
`sentencepiece` library for every tokenizer.model in tests/data/sentencepiece/.

Random texts (seeded) mix ASCII words, punctuation, digit and whitespace runs
(\\t \\n \\r, U+00A0, U+3000 and the other Unicode spaces), CJK, Hangul,
Arabic, Hebrew, Devanagari, combining marks, emoji with ZWJ, skin tones and
flags, noncharacters, private use, U+FFFD, control characters, the
tokenizer's special and added tokens inside and at the edges of text, very
long words, the empty text and whitespace-only texts (and, for sentencepiece,
invalid UTF-8, which it reads byte by byte as U+FFFD). Compared for each:

  tokenizer.json   encode(text, add_special_tokens=True / False); decode of the
                   reference's ids with skip_special_tokens False / True; decode
                   of random id lists; id_to_token, token_to_id and is_special
                   of every id, and the vocabulary size
  tokenizer.model  encode = [bos] + sp.encode(text) / sp.encode(text); decode of
                   the reference's ids (and of random id lists) = sp.decode(ids)
                   with specials skipped; id_to_token of every id = id_to_piece

accel runs in tools/tok_sweep_harness.c (built here against build/'s
libaccel.so), thousands of texts a process. Each disagreement's text is
minimized (chunks removed while it still disagrees) and the distinct minimized
ones are printed. Exit status 1 when any disagreement was found.

    python3 tools/sweep_tokenizers.py [--texts N] [--seed S] [--build build] [name ...]

Needs: pip install tokenizers sentencepiece. Not part of ctest.
"""
import argparse
import functools
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------- random text

WORDS = ("the of and to in is was for that with as on by at from his her it an were are which this be or has had "
         "not but also first one their its new after who they have two been other when there all during into "
         "Hello World CamelCase HTTP don't I'm they'll it's John's CAN'T naïve café Zürich").split()
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "--", "?!", "''", "``", "'s", "'LL", "n't"]
SPACES = [" ", "  ", "\t", "\n", "\r", "\r\n", "\n\n", " \n ", "\u00a0", "\u1680", "\u2000", "\u2002", "\u2003",
          "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\u0085", "\u000b", "\u000c",
          "\u200b", "\ufeff", "\u180e"]
SCRIPTS = {
    "cjk": (0x4E00, 0x9FFF), "kana": (0x3040, 0x30FF), "hangul": (0xAC00, 0xD7A3), "jamo": (0x1100, 0x11FF),
    "arabic": (0x0600, 0x06FF), "hebrew": (0x0590, 0x05FF), "devanagari": (0x0900, 0x097F),
    "greek": (0x0370, 0x03FF), "cyrillic": (0x0400, 0x04FF), "latin_ext": (0x00C0, 0x024F),
    "thai": (0x0E00, 0x0E7F), "fullwidth": (0xFF01, 0xFF5E), "cjk_ext_b": (0x20000, 0x2A6DF),
    "math_alnum": (0x1D400, 0x1D7FF), "symbols": (0x2190, 0x23FF),
}
COMBINING = [chr(c) for c in range(0x0300, 0x0370)] + ["\u0651", "\u064e", "\u093f", "\u094d", "\u20dd", "\ufe0f",
                                                       "\u200d", "\u200c"]
EMOJI = ["😀", "👍", "👍🏽", "👍🏿", "🇫🇷", "🇯🇵", "🏳️‍🌈", "👨‍👩‍👧", "👩🏽‍💻", "❤️", "🚀", "✨", "🫠", "🧑‍🤝‍🧑",
         "1️⃣", "#️⃣", "🏴󠁧󠁢󠁳󠁣󠁴󠁿"]
ODD = ["\ufffd", "\ufffe", "\uffff", "\ufdd0", "\ufdef", "\U0001fffe", "\U0010ffff", "\ue000", "\uf8ff", "\U000f0000",
       "\x00", "\x01", "\x07", "\x1b", "\x7f", "\x80", "\x9f", "\u00ad", "\u034f", "\u061c", "\u200e", "\u202e",
       "\u2066", "\U000e0001", "ǅ", "İ", "ß", "ẞ", "Σ", "ς", "ﬁ", "ﬀ", "①", "½", "™", "Å", "K", "Ω", "ǈ", "ŉ",
       "ΐ", "\u0130", "\u1e9e", "\u2126", "▁", "Ġ", "Ċ", "##", "<0x41>", "<unk>", "[UNK]", "</w>"]
INVALID = [b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\x80", b"\xfe"]


def random_char(rng):
    lo, hi = rng.choice(list(SCRIPTS.values()))
    return chr(rng.randint(lo, hi))


def piece(rng, specials):
    r = rng.random()
    if r < 0.22:
        w = rng.choice(WORDS)
        return w.upper() if rng.random() < 0.1 else w.capitalize() if rng.random() < 0.2 else w
    if r < 0.32:
        return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 4)))
    if r < 0.40:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 12)))
    if r < 0.52:
        return "".join(rng.choice(SPACES) for _ in range(rng.randint(1, 4)))
    if r < 0.66:
        return "".join(random_char(rng) for _ in range(rng.randint(1, 6)))
    if r < 0.72:
        base = rng.choice("aeiounAEOcz") if rng.random() < 0.7 else random_char(rng)
        return base + "".join(rng.choice(COMBINING) for _ in range(rng.randint(1, 3)))
    if r < 0.78:
        return rng.choice(EMOJI)
    if r < 0.84:
        return rng.choice(ODD)
    if r < 0.93 and specials:
        return rng.choice(specials)
    if r < 0.96:
        return rng.choice(WORDS) * rng.randint(5, 60)  # a very long word
    return chr(rng.randint(0x20, 0x2FFFF)) if rng.random() < 0.5 else chr(rng.randint(0, 0x10FFFF))


def present_in(version):
    """The code points Unicode `version` assigns, from Perl's Unicode::UCD (an
    inversion list: starts of alternating in / out ranges)."""
    out = subprocess.run(["perl", "-MUnicode::UCD", "-e",
                          f'print join(" ", Unicode::UCD::prop_invlist("Present_In: {version}"))'],
                         capture_output=True, text=True, check=True).stdout.split()
    bounds = list(map(int, out)) + [0x110000]
    return {c for i in range(0, len(bounds) - 1, 2) for c in range(bounds[i], bounds[i + 1])}


# The reference's Unicode tables are of several ages (docs/tokenizer.md): its
# BertNormalizer's categories are Unicode 8.0's, its normalization forms and marks
# about 9.0's, its regular expressions (Oniguruma) 16.0's, where accel has the
# installed utf8proc's and PCRE2's. Characters assigned after 8.0 are classified
# by each side's own tables, so the random texts leave them out (--all-unicode
# keeps them); unassigned code points are kept where no version assigns them.
PRESENT = None


def stable(c):
    cp = ord(c)
    if 0xD800 <= cp <= 0xDFFF:
        return False
    return (PRESENT is None or cp in PRESENT or 0xFDD0 <= cp <= 0xFDEF or (cp & 0xFFFE) == 0xFFFE
            or 0x40000 <= cp <= 0xDFFFF)


def clean(s):
    return "".join(c for c in s if stable(c))


@functools.lru_cache(maxsize=None)
def every_code_point():
    """Texts that between them hold every stable code point, 64 consecutive ones a text."""
    cps = [chr(c) for c in range(0x110000) if stable(chr(c))]
    return ["".join(cps[i:i + 64]).encode() for i in range(0, len(cps), 64)]


def random_text(rng, specials):
    r = rng.random()
    if r < 0.01:
        return ""
    if r < 0.04:
        return "".join(rng.choice(SPACES) for _ in range(rng.randint(1, 8)))
    parts = [piece(rng, specials) for _ in range(rng.randint(1, 14))]
    sep = rng.choice(["", "", " ", " ", "  ", "\n", "\t"])
    return clean(sep.join(parts))


def random_bytes_text(rng, specials):
    """sentencepiece only: UTF-8 with invalid bytes spliced in."""
    b = random_text(rng, specials).encode()
    for _ in range(rng.randint(1, 3)):
        k = rng.randint(0, len(b))
        b = b[:k] + rng.choice(INVALID) + b[k:]
    return b


# ---------------------------------------------------------------- accel's side

def build_harness(build, tmp):
    """The harness in tmp, linked to a copy of build's libaccel.so (a rebuild
    during the sweep does not touch it)."""
    lib = os.path.join(build, "lib")
    if not os.path.exists(os.path.join(lib, "libaccel.so")):
        lib = build
    so = os.path.realpath(os.path.join(lib, "libaccel.so"))
    for name in ("libaccel.so", os.path.basename(so)) + tuple(f for f in os.listdir(lib) if f.startswith("libaccel.so.")):
        shutil.copy(so, os.path.join(tmp, name))
    exe = os.path.join(tmp, "tok_sweep_harness")
    subprocess.run(["cc", "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-I" + os.path.join(ROOT, "include"),
                    os.path.join(ROOT, "tools", "tok_sweep_harness.c"), "-o", exe, "-L" + tmp, "-laccel",
                    "-Wl,-rpath," + tmp], check=True)
    return exe


class Accel:
    def __init__(self, exe, path):
        self.exe, self.path = exe, path

    def run(self, requests):
        p = subprocess.run([self.exe, self.path], input=b"".join(requests), capture_output=True)
        if p.returncode:
            raise RuntimeError(f"harness on {self.path}: {p.stderr.decode(errors='replace')}")
        return p.stdout.decode().split("\n")

    def encode(self, texts):
        """[(ids with specials, ids without) or "error message"] for texts (bytes)."""
        out = []
        for line in self.run([b"E" + struct.pack("<I", len(t)) + t for t in texts])[:len(texts)]:
            if line.startswith("X "):
                out.append(line[2:])
            else:
                a, b = line[2:].split("|")
                out.append((tuple(map(int, a.split())), tuple(map(int, b.split()))))
        return out

    def decode(self, id_lists, skip):
        reqs = [b"D" + bytes([skip]) + struct.pack("<I", len(ids)) + struct.pack(f"<{len(ids)}q", *ids)
                for ids in id_lists]
        return [bytes.fromhex(line[2:]).decode("utf-8", "surrogateescape") if line.startswith("D ") else
                "ERROR " + line[2:] for line in self.run(reqs)[:len(id_lists)]]

    def vocab(self):
        lines = self.run([b"V"])
        n = int(lines[0].split()[1])
        rows = []
        for line in lines[1:n + 1]:
            _, special, tok = line.split(" ")
            rows.append((None if tok == "-" else bytes.fromhex(tok).decode(), special == "1"))
        return rows


# ---------------------------------------------------------------- the references

class HF:
    """Hugging Face tokenizers on a tokenizer.json."""

    def __init__(self, path):
        from tokenizers import Tokenizer
        self.tok = Tokenizer.from_file(path)
        added = self.tok.get_added_tokens_decoder()
        self.specials = sorted({t.content for t in added.values()})
        self.special_ids = {i for i, t in added.items() if t.special}

    def encode(self, texts):
        out = []
        for t in texts:
            s = t.decode()
            try:
                out.append((tuple(self.tok.encode(s, add_special_tokens=True).ids),
                            tuple(self.tok.encode(s, add_special_tokens=False).ids)))
            except Exception as e:  # noqa: BLE001 (the reference's refusal is an answer too)
                out.append(f"reference raised {type(e).__name__}: {e}")
        return out

    def decode(self, id_lists, skip):
        return self.tok.decode_batch([list(i) for i in id_lists], skip_special_tokens=bool(skip))

    def vocab(self):
        n = max(self.tok.get_vocab(with_added_tokens=True).values()) + 1
        return [(self.tok.id_to_token(i), i in self.special_ids) for i in range(n)]

    def token_to_id(self, tok):
        return self.tok.token_to_id(tok)


def piece_types(proto):
    """Each piece's type (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
    6 byte) from a ModelProto's wire format: field 1 the pieces, field 3 of each the type."""
    def varint(b, i):
        v = shift = 0
        while True:
            v |= (b[i] & 0x7F) << shift
            shift += 7
            i += 1
            if b[i - 1] < 0x80:
                return v, i

    def fields(b):
        i = 0
        while i < len(b):
            key, i = varint(b, i)
            wire = key & 7
            if wire == 0:
                v, i = varint(b, i)
            elif wire == 1:
                v, i = b[i:i + 8], i + 8
            elif wire == 5:
                v, i = b[i:i + 4], i + 4
            else:
                n, i = varint(b, i)
                v, i = b[i:i + n], i + n
            yield key >> 3, v

    return [dict(fields(v)).get(3, 1) for f, v in fields(proto) if f == 1]


class SPM:
    """sentencepiece on a tokenizer.model, as accel presents it (BOS first with specials)."""

    def __init__(self, path):
        import sentencepiece as spm
        self.sp = spm.SentencePieceProcessor(model_file=path)
        with open(path, "rb") as f:
            types = piece_types(f.read())
        # control pieces (text in the text, as sentencepiece reads them) and user-defined ones
        self.specials = [self.sp.id_to_piece(i) for i, t in enumerate(types) if t in (3, 4)]
        self.bos = self.sp.bos_id()

    def encode(self, texts):
        out = []
        for t in texts:
            ids = tuple(self.sp.encode(t))
            out.append(((self.bos,) + ids if self.bos >= 0 else ids, ids))
        return out

    def decode(self, id_lists, skip):
        assert skip
        return [self.sp.decode(list(i)) for i in id_lists]

    def vocab(self):
        return [(self.sp.id_to_piece(i), bool(self.sp.is_control(i))) for i in range(self.sp.get_piece_size())]

    def token_to_id(self, tok):
        i = self.sp.piece_to_id(tok)
        return i if self.sp.id_to_piece(i) == tok else None


# ---------------------------------------------------------------- comparing

def encode_disagrees(accel, ref, texts):
    """Indices of texts whose encodings differ, and why."""
    a, r = accel.encode(texts), ref.encode(texts)
    return [(i, f"accel {a[i]} != reference {r[i]}") for i in range(len(texts)) if a[i] != r[i]]


def minimize(accel, ref, text):
    """A smaller text that still disagrees: chunks of characters removed, all
    candidates of a round checked in one harness run."""
    units = [bytes([b]) for b in text] if isinstance(ref, SPM) else [c.encode() for c in text.decode()]
    join = b"".join
    k = max(1, len(units) // 2)
    while True:
        cands = []
        for size in sorted({k, max(1, k // 2), 1}, reverse=True):
            cands += [units[:i] + units[i + size:] for i in range(0, len(units) - size + 1)]
        cands = [c for c in cands if c]
        bad = {i for i, _ in encode_disagrees(accel, ref, [join(c) for c in cands])} if cands else set()
        if not bad:
            if k == 1:
                return join(units)
            k = max(1, k // 2)
            continue
        units = min((cands[i] for i in bad), key=len)
        k = max(1, min(k, len(units) // 2))


def sweep_one(name, path, exe, n_texts, seed, report):
    ref = SPM(path) if path.endswith(".model") else HF(path)
    accel = Accel(exe, path)
    rng = random.Random(f"{seed}:{name}")
    t0 = time.time()
    problems = []
    # lookups: every id's token and special flag, and the token back to its id
    av, rv = accel.vocab(), ref.vocab()
    if len(av) != len(rv):
        problems.append(f"vocab size: accel {len(av)}, reference {len(rv)}")
    for i, (a, r) in enumerate(zip(av, rv)):
        if a != r:
            problems.append(f"id {i}: accel (token, special) {a}, reference {r}")
    # texts, in batches of 2000
    texts = [b""] + [t.encode() for t in SPACES] + every_code_point()
    target = len(texts) + n_texts
    while len(texts) < target:
        texts.append(random_bytes_text(rng, ref.specials) if isinstance(ref, SPM) and rng.random() < 0.05
                     else random_text(rng, ref.specials).encode())
    bad_texts = []
    for lo in range(0, len(texts), 2000):
        batch = texts[lo:lo + 2000]
        bad_texts += [batch[i] for i, _ in encode_disagrees(accel, ref, batch)]
        # decode the reference's ids: skip_special_tokens False and True (sentencepiece: True)
        ids = [e[0] for e in ref.encode(batch)]
        for skip in ((1,) if isinstance(ref, SPM) else (0, 1)):
            for i, (a, r) in enumerate(zip(accel.decode(ids, skip), ref.decode(ids, skip))):
                if a != r:
                    problems.append(f"decode(skip={skip}) of {ids[i]} (from {batch[i]!r}): accel {a!r}, reference {r!r}")
        # random id lists (byte pieces that make invalid UTF-8, specials, anything)
        n = len(rv)
        rand_ids = [[rng.randrange(n) if rng.random() < 0.7 else rng.randrange(min(n, 300))
                     for _ in range(rng.randint(0, 16))] for _ in range(len(batch) // 4)]
        for skip in ((1,) if isinstance(ref, SPM) else (0, 1)):
            for i, (a, r) in enumerate(zip(accel.decode(rand_ids, skip), ref.decode(rand_ids, skip))):
                if a != r:
                    problems.append(f"decode(skip={skip}) of random {rand_ids[i]}: accel {a!r}, reference {r!r}")
    minimized = {}
    for t in bad_texts[:40]:
        m = minimize(accel, ref, t)
        minimized.setdefault(m, encode_disagrees(accel, ref, [m])[0][1])
    for m, why in sorted(minimized.items(), key=lambda kv: len(kv[0])):
        problems.append(f"encode {m!r}: {why}")
    dt = time.time() - t0
    print(f"{name}: {len(texts)} texts, {len(bad_texts)} encodings disagree, {len(problems)} problems, {dt:.1f} s",
          flush=True)
    for p in problems[:report]:
        print("  " + p, flush=True)
    return not problems


# Synthetic tokenizers: the gpt2 fixture (byte-level BPE: any text has ids, so the
# ids show every split and every normalized character) behind one component each.
SPLIT_PATTERNS = [r"\s+", r"\S+", r"\w+", r"\W+", r"[\w\-']+", r"[^\w\s]+", r"\b", r"\B", r"\h+", r"\H", r"\v",
                  r"\p{L}+|\p{N}+", r"[^\s\p{L}\p{N}]+", r"(?i:'s|'t|k|ss|\u00df)", r"\d+", r"\s+(?!\S)", r"\p{M}+",
                  r"[\p{P}\p{S}]", r"\p{Lu}\p{Ll}*"]


def synthetic(tmp):
    from tokenizers import Regex, Tokenizer, normalizers as N, pre_tokenizers as P
    byte_level = P.ByteLevel(add_prefix_space=False, use_regex=False)
    variants = [("whitespace", None, P.Whitespace()), ("whitespace_split", None, P.WhitespaceSplit()),
                ("bert_pre", None, P.BertPreTokenizer()), ("digits", None, P.Digits(individual_digits=True)),
                ("digits_runs", None, P.Digits(individual_digits=False))]
    for i, pat in enumerate(SPLIT_PATTERNS):  # every pattern isolated, two under every behaviour
        for behavior in ("isolated", "removed", "merged_with_previous", "merged_with_next", "contiguous"):
            if behavior == "isolated" or i < 2:
                variants.append((f"split{i}_{behavior}", None,
                                 P.Split(Regex(pat), behavior, invert=behavior == "removed")))
    for name, nz in [("nfc", N.NFC()), ("nfd", N.NFD()), ("nfkc", N.NFKC()), ("nfkd", N.NFKD()),
                     ("lower", N.Lowercase()), ("nfd_strip", N.Sequence([N.NFD(), N.StripAccents()])),
                     ("strip_accents", N.StripAccents()),
                     ("bert_all", N.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=True,
                                                   lowercase=True)),
                     ("bert_cased", N.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False,
                                                     lowercase=False)),
                     ("bert_lower_only", N.BertNormalizer(clean_text=False, handle_chinese_chars=False,
                                                          strip_accents=None, lowercase=True)),
                     ("strip", N.Strip(left=True, right=True)), ("replace_ws", N.Replace(Regex(r"\s+"), " ")),
                     ("prepend", N.Prepend("\u2581"))]:
        variants.append(("norm_" + name, nz, None))
    out = []
    for name, nz, pre in variants:
        tok = Tokenizer.from_file(os.path.join(ROOT, "tests", "data", "tokenizers", "gpt2", "tokenizer.json"))
        tok.normalizer = nz
        tok.pre_tokenizer = P.Sequence([pre, byte_level]) if pre else byte_level
        path = os.path.join(tmp, "syn_" + name + ".json")
        tok.save(path)
        out.append(("syn_" + name, path))
    return out


def fixtures():
    out = []
    d = os.path.join(ROOT, "tests", "data", "tokenizers")
    for name in sorted(os.listdir(d)):
        if os.path.exists(os.path.join(d, name, "tokenizer.json")):
            out.append((name, os.path.join(d, name, "tokenizer.json")))
    d = os.path.join(ROOT, "tests", "data", "sentencepiece")
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name, "tokenizer.model")
        if os.path.exists(p) and os.path.exists(os.path.join(d, name, "expected.json")):
            out.append(("spm_" + name, p))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--texts", type=int, default=20000, help="random texts per tokenizer")
    ap.add_argument("--synthetic-texts", type=int, default=5000, help="random texts per synthetic tokenizer")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--report", type=int, default=20, help="problems printed per tokenizer")
    ap.add_argument("--all-unicode", action="store_true",
                    help="characters of every Unicode version (expect disagreements from the tables' ages)")
    ap.add_argument("--no-synthetic", action="store_true", help="the fixtures only")
    ap.add_argument("names", nargs="*", help="tokenizers whose names start so (gpt2, spm_, syn_, ...); all by default")
    args = ap.parse_args()
    global PRESENT
    if not args.all_unicode:
        PRESENT = present_in("8.0")
    ok = True
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_harness(args.build, tmp)
        for name, path in fixtures() + ([] if args.no_synthetic else synthetic(tmp)):
            if not args.names or any(name.startswith(n) for n in args.names):
                n = args.texts if not name.startswith("syn_") else args.synthetic_texts
                ok &= sweep_one(name, path, exe, n, args.seed, args.report)
    print(f"{'clean' if ok else 'DISAGREEMENTS'}: {time.time() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
