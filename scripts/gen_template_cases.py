#!/usr/bin/env python3
"""Renders extra chat-template cases with Jinja2 (as transformers' apply_chat_template does:
trim_blocks, lstrip_blocks, loopcontrols, tojson = json.dumps(ensure_ascii=False)) from the
real Qwen3 template, for src/tokenizer/tokenizer_test.c. An independent renderer: anvil's C
renderer is checked against it. Usage: gen_template_cases.py TOKENIZER_CONFIG.json > OUT.jsonl
"""
import json
import sys

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def raise_exception(message):
    raise RuntimeError(message)


cfg = json.load(open(sys.argv[1]))
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
tpl = env.from_string(cfg["chat_template"])

U, A, S, T = "user", "assistant", "system", "tool"
conversations = [
    [{"role": S, "content": "sys only"}],
    [{"role": U, "content": ""}],
    [{"role": U, "content": "a"}, {"role": A, "content": "<think>\nreason\n</think>\n\nanswer"}],
    [{"role": U, "content": "a"}, {"role": A, "content": "\n\n<think>\n\nr1\n\n</think>\n\n\nans"}],
    [{"role": U, "content": "q"}, {"role": A, "content": "x</think>y</think>z"}],
    [{"role": U, "content": "q"}, {"role": A, "content": "<think>a<think>b</think>c"}],
    [{"role": U, "content": "q"}, {"role": A, "content": "plain", "reasoning_content": "why"}],
    [{"role": U, "content": "q1"}, {"role": A, "content": "a1", "reasoning_content": "r1"},
     {"role": U, "content": "q2"}, {"role": A, "content": "<think>r2</think>a2"}],
    [{"role": U, "content": "q1"}, {"role": A, "content": "a1", "reasoning_content": ""},
     {"role": A, "content": "a2", "reasoning_content": "r2"},
     {"role": A, "content": "a3"}],
    [{"role": S, "content": "s"}, {"role": U, "content": "weather?"},
     {"role": A, "content": "", "tool_calls": [
         {"type": "function", "function": {"name": "get_weather",
                                           "arguments": {"city": "Paris", "days": 3,
                                                         "units": ["C", "F"], "x": None,
                                                         "ok": True, "f": 1.5,
                                                         "s": "é\"\\\n\t"}}}]},
     {"role": T, "content": "{\"temp\": 20}"}, {"role": T, "content": "second"},
     {"role": A, "content": "It is 20."}],
    [{"role": U, "content": "q"},
     {"role": A, "content": "let me check", "tool_calls": [
         {"function": {"name": "f", "arguments": "{\"a\": 1}"}},
         {"name": "g", "arguments": {}}]},
     {"role": T, "content": "r"}],
    [{"role": U, "content": "<tool_response>\nx\n</tool_response>"},
     {"role": A, "content": "<think>t</think>after"}],
    [{"role": U, "content": "q"}, {"role": T, "content": "r1"},
     {"role": A, "content": "<think>t</think>final"}],
    [{"role": S, "content": "first"}, {"role": U, "content": "u"},
     {"role": S, "content": "second system"}, {"role": "other", "content": "dropped"}],
    [{"role": U, "content": "多语言 🌍 <|im_start|> \r\n"}],
]
weather = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city — «quoted» \"text\"",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "scale": {"type": "number", "default": 0.5}, "units": {"enum": ["C", "F"]},
        "strict": {"type": "boolean", "default": False}, "note": {"default": None}},
        "required": ["city"]}}}
plain_tool = {"name": "ping", "parameters": {}}
with_tools = [
    ([{"role": U, "content": "weather in Paris?"}], [weather]),
    ([{"role": S, "content": "You are terse."}, {"role": U, "content": "ping"}],
     [weather, plain_tool]),
    ([{"role": U, "content": "q"}, {"role": A, "content": "", "tool_calls": [
        {"function": {"name": "ping", "arguments": {}}}]},
      {"role": T, "content": "pong"}], [plain_tool]),
    ([{"role": U, "content": "no tools after all"}], []),
]
cases = [(m, None) for m in conversations] + with_tools
for msgs, tools in cases:
    for gen in (True, False):
        for think in (True, False):
            out = tpl.render(messages=msgs, add_generation_prompt=gen, enable_thinking=think,
                             tools=tools, bos_token=None, eos_token="<|im_end|>")
            case = {"messages": msgs, "add_generation_prompt": gen, "enable_thinking": think,
                    "rendered": out}
            if tools is not None:
                case["tools"] = tools
            print(json.dumps(case, ensure_ascii=False))
