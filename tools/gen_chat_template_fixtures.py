#!/usr/bin/env python3
"""Expected chat-template renders for tests/test_chat_template.c, made by transformers.

tests/data/chat_templates/*.jinja are the chat templates of common chat models (the Hub
is not reachable here: taken from public copies, llama.cpp's template tests and projects
that vendor them, or written out as the model cards publish them; docs/tokenizer.md says
which). Both sides render the same file, so the comparison is exact either way. Each is rendered here over a set of
conversations by transformers' own apply_chat_template code path (message
normalization, then render_jinja_template: jinja2's sandbox with transformers'
settings), with add_generation_prompt on (and off for some), into cases.json:
    {"template": name, "conversation": c, "add_generation_prompt": b, "expected": text}
or, where transformers raises, "error": its message and "raised": whether it was
the template's raise_exception (cases name their conversation and template; the
conversations and special tokens are stored once). The C test renders the same vars with
accel_chat_template_render_json and compares byte for byte.

dirs/ holds three model folders (tokenizer_config.json with a string template,
one with a list of templates, one with chat_template.jinja beside a config): loaded
here with AutoTokenizer.from_pretrained (tests/data/tokenizers/llama3's
tokenizer.json copied in), rendered and tokenized with apply_chat_template(tokenize=True),
into dirs.json. Run: python3 tools/gen_chat_template_fixtures.py
"""
import json
import os
import shutil
import tempfile

import jinja2
import transformers
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "chat_templates")
LLAMA3_TOKENIZER = os.path.join(HERE, "..", "tests", "data", "tokenizers", "llama3", "tokenizer.json")

# The special tokens each family's tokenizer_config.json names.
SPECIAL = {
    "chatml": {"bos_token": "<s>", "eos_token": "<|im_end|>"},
    "smollm2": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
    "mistral_instruct": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "mistral_v3": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "zephyr": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3_1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "phi3": {"bos_token": "<s>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    "phi4": {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|dummy_85|>"},
    "gemma2": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"},
    "gemma3": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"},
    "qwen2_5": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "qwen3": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
}

# Templates written to corner the interpreter (adversarial/*.jinja: namespace and loop
# scoping, nested loops and their controls, tojson's options, macros and raise_exception,
# whitespace control with string methods, dict iteration and repr), swept by
# tools/sweep_chat_templates.py too.
ADVERSARIAL = {f"adversarial/{n}": {"bos_token": "<s>", "eos_token": "</s>"}
               for n in ("items_repr", "loops_controls", "macros_raise", "namespace_loop", "tojson_tools",
                         "whitespace_strings")}

SYS = {"role": "system", "content": "You are a helpful assistant."}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city, in °C.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. \"Paris\""},
        "days": {"type": "integer", "minimum": 1}}, "required": ["city"]}}}]
TOOL_CALL = {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
    "name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}]}
TOOL_REPLY = {"role": "tool", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"}

# (name, messages, extra template variables)
CONVERSATIONS = [
    ("user", [{"role": "user", "content": "Hello!"}], {}),
    ("system_user", [SYS, {"role": "user", "content": "What is 2+2?"}], {}),
    ("multi_turn", [SYS, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
                    {"role": "user", "content": "Tell me a joke."}], {}),
    ("no_system_turns", [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
                         {"role": "user", "content": "three"}, {"role": "assistant", "content": "four"}], {}),
    ("unicode", [{"role": "user", "content": "héllo wörld — 日本語 🙂\ttab\r\nCRLF"},
                 {"role": "assistant", "content": "Ünïcödé ✓ \u00a0nbsp"}, {"role": "user", "content": "ok"}], {}),
    ("jinja_text", [{"role": "user", "content": "{{ messages }} {% if x %}y{% endif %} {# c #} {%- raw -%}"}], {}),
    ("whitespace", [{"role": "user", "content": "   padded   \n\n"},
                    {"role": "assistant", "content": "\n  answer  \n"}, {"role": "user", "content": " "}], {}),
    ("think", [{"role": "user", "content": "Why?"},
               {"role": "assistant", "content": "<think>\nLet me think.\nStep 2.\n</think>\n\nBecause."},
               {"role": "user", "content": "And then?"},
               {"role": "assistant", "content": "<think>\nAgain.\n</think>\n\nThen this."}], {}),
    ("reasoning_field", [{"role": "user", "content": "Q"},
                         {"role": "assistant", "content": "A", "reasoning_content": "because\n"}], {}),
    ("no_thinking", [{"role": "user", "content": "Quick answer please."}], {"enable_thinking": False}),
    ("thinking_on", [{"role": "user", "content": "Think hard."}], {"enable_thinking": True}),
    ("tools", [SYS, {"role": "user", "content": "Weather in Zürich?"}, TOOL_CALL, TOOL_REPLY],
     {"tools": TOOLS}),
    ("tools_no_system", [{"role": "user", "content": "Weather?"}, TOOL_CALL, TOOL_REPLY,
                         {"role": "assistant", "content": "It is 21.5 °C."}], {"tools": TOOLS}),
    ("tools_not_in_user", [{"role": "user", "content": "Weather?"}], {"tools": TOOLS, "tools_in_user_message": False,
                                                                     "date_string": "05 Dec 2026"}),
    ("tools_ids9", [{"role": "user", "content": "Weather in Zürich?"},
                    {**TOOL_CALL, "tool_calls": [{**TOOL_CALL["tool_calls"][0], "id": "abcDEF123"}]},
                    {**TOOL_REPLY, "tool_call_id": "abcDEF123"}, {"role": "assistant", "content": " 21.5 °C "},
                    {"role": "user", "content": "Thanks"}], {"tools": TOOLS}),
    ("builtin_tools", [{"role": "user", "content": "Search"}], {"builtin_tools": ["brave_search", "code_interpreter"]}),
    ("parts", [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
               {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " Describe this. "}]}], {}),
    ("null_key", [{"role": "user", "content": "x", "name": None}], {}),
    ("continue", [{"role": "user", "content": "Write a haiku."},
                  {"role": "assistant", "content": "Autumn moonlight—  "}], {"continue_final_message": True}),
    ("continue_parts", [{"role": "user", "content": [{"type": "text", "text": "Describe."}]},
                        {"role": "assistant", "content": [{"type": "text", "text": "It shows"}, {"type": "image"}]}],
     {"continue_final_message": True}),
    ("assistant_first", [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "ok"}], {}),
    # found by tools/sweep_chat_templates.py: U+0000 in a text (accel refused the JSON)
    ("nul_char", [{"role": "user", "content": "a\x00b"}, {"role": "assistant", "content": "\x00"}], {}),
    # found by the sweep: Python's full case mappings, final sigma and islower (utf8proc's one-to-one mappings differ)
    ("case_mappings", [{"role": "user", "content": "straße ΟΔΟΣ ΣΑΣ'Σ ﬁ ǆ İ ᾳ"}, {"role": "assistant", "content": "ᴐʐᵨ"},
                       {"role": "user", "content": "ǅ Σ"}], {}),
    # found by the sweep: tools that is one tool, not a list of them (transformers refuses it)
    ("tools_not_list", [{"role": "user", "content": "Weather?"}], {"tools": TOOLS[0]}),
]


# Small templates, one construct each, rendered by transformers' compiled environment
# over V: snippets.json. Together they walk the subset docs/tokenizer.md lists.
V = {"s": "  Hello, World  ", "n": 7, "f": 2.5, "l": [3, 1, 2], "d": {"b": 1, "a": [1, "x", None, True]},
     "u": "héllo wörld 日本", "e": "", "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
     "t": True, "none": None}
SNIPPETS = [
    # whitespace control, trim_blocks, lstrip_blocks, comments
    "a\n  {% if t %}\n  b\n  {% endif %}\nc", "a  {%- if t -%}  b  {%- endif -%}  c", "x {#- c -#} y\n  {# c #}\nz",
    "  {%+ if t %}p{% endif %}", "a\n   {{+ n }} {{- +n }}", "{% if t +%}\nq{% endif %}", "{{- s -}}|{{ s }}|", "a\r\nb\rc\n", "  {{ n }}  \n",
    "{% for i in l %}\n    {{ i }}\n{% endfor %}\n",
    # literals and operators
    "{{ 1 + 2 * 3 - 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1.5e3 }} {{ 1_000 }}",
    "{{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 3.0 }} {{ -0.0 }} {{ 1 / 3 }} {{ 10 / 2 }} {{ 2 ** -1 }}",
    "{{ 'a' ~ 1 ~ none ~ true ~ undefined_name }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ 'x' 'y' }}",
    "{{ \"q'uote\" }} {{ 'it\\'s' }} {{ '\\x41\\u00e9\\U0001F600\\t|\\101|\\q' }}",
    "{{ l }} {{ d }} {{ (1,) }} {{ (1, 'a') }} {{ [] }} {{ {} }} {{ none }} {{ t }} {{ ['it\\'s', \"q\\\"\", '\\n'] }}",
    "{{ 1 < 2 < 3 }} {{ 1 < 2 > 3 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }}",
    "{{ 'ell' in s }} {{ 2 in l }} {{ 'b' in d }} {{ 5 not in l }} {{ not t }} {{ t and 'yes' }} {{ none or 'dflt' }} {{ e or 0 }}",
    "{{ 'y' if t else 'n' }}|{{ 'y' if none }}|{{ 'y' if not none else 'n' }}",
    # subscripts and slices
    "{{ l[0] }} {{ l[-1] }} {{ l[5] }}|{{ d['b'] }} {{ d.b }} {{ d.zz }}|{{ msgs[1].role }} {{ msgs[0]['content'] }} {{ l.0 }}",
    "{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ u[1:4] }} {{ u[::-1] }} {{ s[2:7] }} {{ l[5:] }} {{ l[-10:2] }}",
    # tests
    "{{ x is defined }} {{ n is defined }} {{ none is none }} {{ n is number }} {{ f is float }} {{ n is integer }} {{ t is boolean }}",
    "{{ s is string }} {{ d is mapping }} {{ l is iterable }} {{ l is sequence }} {{ n is even }} {{ n is odd }} {{ 9 is divisibleby 3 }}",
    "{{ n is not none }} {{ 'a' is in 'abc' }} {{ n is eq 7 }} {{ n is gt 3 }} {{ n is lt 3 }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ t is true }} {{ t is false }}",
    # filters
    "[{{ s | trim }}] [{{ 'xxhixx' | trim('x') }}] {{ s | upper }} {{ s | lower }} {{ u | upper }} {{ l | length }} {{ u | length }} {{ d | length }} {{ l | count }}",
    "{{ x | default('dv') }} {{ e | default('dv') }} {{ e | default('dv', true) }} {{ none | d('z', boolean=true) }} {{ n | string }} {{ l | first }} {{ l | last }} {{ u | first }}",
    "{{ l | join(', ') }} {{ l | join }} {{ msgs | map(attribute='role') | join('/') }} {{ s | replace('l', 'L') }} {{ s | replace('l', 'L', 1) }}",
    "{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %} {{ d | list }} {{ l | reverse | list }} {{ 'abc' | reverse }} {{ '42' | int + 1 }} {{ '2.5' | float }} {{ -3 | abs }}",
    "{{ msgs | selectattr('role', 'equalto', 'user') | list }} {{ msgs | rejectattr('role', 'eq', 'user') | map(attribute='content') | list }} {{ l | select('odd') | list }} {{ l | reject('gt', 1) | list }}",
    "{{ d | tojson }} {{ u | tojson }} {{ u | tojson(ensure_ascii=true) }} {{ l | tojson(indent=2) }} {{ d | tojson(indent=2, sort_keys=true) }} {{ f | tojson }} {{ none | tojson }}",
    "{{ d | tojson(separators=(',', ':')) }} {{ {'k': {'n': []}, 'e': {}} | tojson(indent='\\t') }} {{ '\\x01\\\\\\\"\\n' | tojson }} {{ 1e100 | tojson }}",
    "{{ 'hello world' | capitalize }} {{ s | safe }} {{ [n | safe] | length }}",
    # Python's case mappings: longer than one code point, final sigma, titlecase first, islower/isupper by property
    "{{ 'straße ﬁ ŉ ᾳ' | upper }} {{ 'ΟΔΟΣ ΣΑΣ\\'Σ Σ Α\u0301Σ\u0301' | lower }} {{ 'ﬁx ǆA ßb' | capitalize }} {{ 'İ'.lower() | length }}"
    " {{ 'ᴐʐᵨ' is lower }} {{ 'ß' is lower }} {{ 'ǅ' is upper }} {{ 'Ǆ1' is upper }} {{ 'ª' is lower }}",
    # generators and views
    "{{ d.items() }} {{ d.keys() }} {{ d.values() }} {{ d.keys() | length }} {% if l | select('gt', 100) %}gen{% endif %}"
    "{% if {}.items() %}view{% endif %} {{ l | reverse | list }} {{ l | select('odd') | first }} {{ msgs | map(attribute='x', default='-') | join }}",
    "{{ l | select('odd') | length }}", "{{ l | select('odd') | tojson }}", "{{ l | select('odd') | last }}",
    # a false value (not iterable, or undefined) selects and maps to nothing, whatever the arguments (found by the sweep)
    "{{ (f * 0) | select | list }} {{ none | map(attribute='x') | list }} {{ 0 | selectattr('a') | list }}"
    " {{ false | reject | list }} {{ x | rejectattr('a') | list }} {{ e | map('upper') | list }}",
    # string methods
    "[{{ s.strip() }}] [{{ s.lstrip() }}] [{{ s.rstrip() }}] [{{ 'xxaxx'.strip('x') }}] {{ s.startswith('  H') }} {{ s.endswith(('a', '  ')) }} {{ s.upper() }} {{ s.lower() }}",
    "{{ 'a,b,,c'.split(',') }} {{ ' a  b \\n c '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ 'a b c'.split(none, 1) }} {{ ''.split() }} {{ ''.split(',') }}",
    "{{ s.replace('l', '') }} {{ 'abc'.find('c') }} {{ 'aaa'.count('a') }} {{ '-'.join(['a', 'b']) }} {{ 'héllo'.capitalize() }} {{ d.get('b') }} {{ d.get('q', 'no') }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }}",
    # statements
    "{% set x = 3 %}{% set y, z = [1, 2] %}{{ x }}{{ y }}{{ z }}{% set blk %}in {{ x }}{% endset %}[{{ blk }}]",
    "{% set ns = namespace(c=0, found=false) %}{% for m in msgs %}{% set ns.c = ns.c + 1 %}{% if m.role == 'assistant' %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.c }} {{ ns.found }}",
    "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i + 10 %}{{ x }}{% endfor %}{{ x }}",
    "{% for i in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.cycle('a', 'b') }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}",
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}|{% for i in [] %}x{% else %}empty{% endfor %}|{% for i in l if i > 1 %}{{ i }}{{ loop.length }}{% endfor %}",
    "{% for i in range(2, 10, 3) %}{{ i }}{% endfor %} {% for i in range(5, 0, -2) %}{{ i }}{% endfor %} {% for c in 'ab' %}{{ c }}.{% endfor %} {% for k in d %}{{ k }}{% endfor %}",
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }}",
    "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(4) }}",
    "{% if n > 10 %}big{% elif n > 5 %}mid{% elif n > 0 %}small{% else %}neg{% endif %}",
    "{% generation %}gen {{ n }}{% endgeneration %}",
    "{{ dict(a=1, b='x') }} {{ namespace(a=1).a }} {{ ('a', 'b')[1] }} {{ {'a': 1}['a'] }} {{ [1, 2, 3] | length > 2 }}",
    # errors
    "{{ raise_exception('custom failure: ' ~ n) }}", "{{ x.y }}", "{{ x + 1 }}", "{{ 1 / 0 }}", "{{ l + 'a' }}",
    "{% for i in range(100001) %}{% endfor %}", "{{ 'a' < 1 }}", "{% set q = l.append(4) %}", "{{ n() }}",
]


def render(src, special, messages, extra, add_generation_prompt):
    kwargs = dict(extra)
    tools = kwargs.pop("tools", None)
    documents = kwargs.pop("documents", None)
    if kwargs.get("continue_final_message") and add_generation_prompt:  # apply_chat_template's own check
        raise ValueError("continue_final_message and add_generation_prompt are not compatible")
    convs = [_normalize_chat_messages(messages)]
    rendered, _ = render_jinja_template(conversations=convs, tools=tools, documents=documents, chat_template=src,
                                        add_generation_prompt=add_generation_prompt, **{**special, **kwargs})
    return rendered[0]


TOOL_CONVERSATIONS = {"tools", "tools_no_system", "tools_not_in_user", "builtin_tools", "tools_ids9", "tools_not_list"}
TOOL_TEMPLATES = {"qwen2_5", "qwen3", "llama3_1", "mistral_v3"}  # the templates with tool branches
# add_generation_prompt off too (on for every conversation): enough to see each template's branch for it
BOTH_PROMPTS = {"user", "multi_turn", "think", "tools", "no_thinking", "continue", "continue_parts"}


def main():
    cases = []
    special = {**SPECIAL, **ADVERSARIAL}
    for name in sorted(SPECIAL) + sorted(ADVERSARIAL):
        src = open(os.path.join(DATA, name + ".jinja"), encoding="utf-8").read()
        for conv, messages, extra in CONVERSATIONS:
            if conv in TOOL_CONVERSATIONS and name not in TOOL_TEMPLATES | {"adversarial/tojson_tools"}:
                continue
            for agp in (True, False) if conv in BOTH_PROMPTS else (True,):
                case = {"template": name, "conversation": conv, "add_generation_prompt": agp}
                try:
                    case["expected"] = render(src, special[name], messages, extra, agp)
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = str(e)
                    case["raised"] = type(e) is jinja2.exceptions.TemplateError
                except (TypeError, ValueError) as e:
                    case["error"] = str(e)
                    case["raised"] = False
                cases.append(case)
    # The C test's variables for a case: special[template] + conversations[c].vars +
    # {"messages": conversations[c].messages, "add_generation_prompt": ...}.
    with open(os.path.join(DATA, "cases.json"), "w", encoding="utf-8") as f:
        f.write('{"transformers": %s, "jinja2": %s,\n"special": %s,\n"conversations": {\n' % (
            json.dumps(transformers.__version__), json.dumps(jinja2.__version__), json.dumps(special)))
        f.write(",\n".join(json.dumps(c) + ": " + json.dumps({"messages": m, "vars": e}, ensure_ascii=False)
                            for c, m, e in CONVERSATIONS))
        f.write("},\n\"cases\": [\n")
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("]}\n")
    ok = sum("expected" in c for c in cases)
    print(f"{len(cases)} cases, {ok} rendered, {len(cases) - ok} errors")

    from transformers.utils.chat_template_utils import _compile_jinja_template
    snippets = []
    for src in SNIPPETS:
        case = {"template": src}
        try:
            case["expected"] = _compile_jinja_template(src).render(**V)
        except Exception as e:  # noqa: BLE001 - the C test checks that it fails, and raise_exception's text
            case["error"] = str(e)
            case["raised"] = type(e) is jinja2.exceptions.TemplateError
        snippets.append(case)
    with open(os.path.join(DATA, "snippets.json"), "w", encoding="utf-8") as f:
        f.write('{"vars": %s,\n"cases": [\n' % json.dumps(V, ensure_ascii=False))
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in snippets))
        f.write("]}\n")
    print(f"{len(snippets)} snippets, {sum('error' in c for c in snippets)} errors")

    # Model folders, loaded as transformers loads them.
    chatml = open(os.path.join(DATA, "chatml.jinja"), encoding="utf-8").read()
    dirs = {
        "config_string": {"tokenizer_config.json": {
            "bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>", "lstrip": False, "normalized": False,
                          "rstrip": False, "single_word": False},
            "eos_token": "<|eot_id|>", "pad_token": None,
            "chat_template": open(os.path.join(DATA, "zephyr.jinja"), encoding="utf-8").read()}},
        "config_list": {"tokenizer_config.json": {
            "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
            "chat_template": [{"name": "default", "template": chatml},
                              {"name": "tool_use", "template": open(os.path.join(DATA, "qwen2_5.jinja"), encoding="utf-8").read()},
                              {"name": "rag", "template": "{{ raise_exception('not this one') }}"}]}},
        "jinja_file": {"tokenizer_config.json": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                                                 "chat_template": chatml},
                       "chat_template.jinja": open(os.path.join(DATA, "llama3.jinja"), encoding="utf-8").read()},
    }
    msgs = [SYS, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Weather in Zürich?"}]
    out = {}
    for d, files in dirs.items():
        dst = os.path.join(DATA, "dirs", d)
        os.makedirs(dst, exist_ok=True)
        for fn, content in files.items():
            with open(os.path.join(dst, fn), "w", encoding="utf-8") as f:
                if isinstance(content, str):
                    f.write(content)
                else:
                    json.dump(content, f, ensure_ascii=False, indent=2)
        with tempfile.TemporaryDirectory() as tmp:
            for fn in files:
                shutil.copy(os.path.join(dst, fn), tmp)
            shutil.copy(LLAMA3_TOKENIZER, tmp)
            tok = AutoTokenizer.from_pretrained(tmp)
            entry = {}
            for agp in (True, False):
                entry[f"text_{int(agp)}"] = tok.apply_chat_template(msgs, add_generation_prompt=agp, tokenize=False)
                entry[f"ids_{int(agp)}"] = tok.apply_chat_template(msgs, add_generation_prompt=agp, tokenize=True,
                                                                   return_dict=False)
            entry["text_tools"] = tok.apply_chat_template(msgs, tools=TOOLS, add_generation_prompt=True, tokenize=False)
            out[d] = entry
    out["messages"] = msgs
    out["tools"] = TOOLS
    with open(os.path.join(DATA, "dirs.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("dirs:", ", ".join(dirs))


if __name__ == "__main__":
    main()
