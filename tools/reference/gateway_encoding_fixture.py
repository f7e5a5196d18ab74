#!/usr/bin/env python3
"""Refresh (or check) the "expected" prompts of tests/fixtures/gateway/dsv4_encoding.json.

The expected strings are what DeepSeek-V4's encoding script (encoding/encoding_dsv4.py,
distributed with the model, not with ds4) gives for each case. The script is not in this
repository: pass the path of a copy.

    python3 tools/reference/gateway_encoding_fixture.py PATH/encoding_dsv4.py [--check]

Each case is an OpenAI chat request in short: "messages", optional "tools" (OpenAI tool
objects), "thinking", "reasoning_effort" and "response_format". It is handed to the script the
way DeepSeek V4 servers do (vLLM's tokenizer wrapper): the tools go on the first message when
it is a system message, else on an empty system message put in front; thinking_mode is
"thinking" or "chat"; reasoning_effort is passed on ("max" or "high"); a trailing assistant
message is a prefix the reply continues (wo_eos). A json_schema response_format's schema goes
on that same system message as the script's response_format (what ds4's gateway hands over;
vLLM passes none). A case with "context" continues a conversation: "context" is its earlier
messages (ending with the assistant's reply), which carry the tools and response format, and
the expected text is the script's encode_messages(messages, context=context): the new turns
only. --check compares instead of writing and exits 1 on a difference.
"""
import copy
import importlib.util
import json
import pathlib
import sys

FIXTURE = pathlib.Path(__file__).resolve().parents[2] / "tests/fixtures/gateway/dsv4_encoding.json"


def load(path):
    spec = importlib.util.spec_from_file_location("encoding_dsv4", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def script_input(case):
    messages = copy.deepcopy(case["messages"])
    context = copy.deepcopy(case.get("context", []))
    first = context if context else messages   # the conversation's first turn
    header = {}
    if case.get("tools"):
        header["tools"] = case["tools"]
    rf = case.get("response_format")
    if rf and rf.get("type") == "json_schema":
        header["response_format"] = rf["json_schema"]["schema"]
    if header:
        if first and first[0].get("role") == "system":
            first[0].update(header)
        else:
            first.insert(0, dict({"role": "system"}, **header))
    if messages and messages[-1].get("role") == "assistant":
        messages[-1]["wo_eos"] = True
    return context, messages, "thinking" if case.get("thinking") else "chat", case.get("reasoning_effort")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    enc = load(sys.argv[1])
    check = "--check" in sys.argv[2:]
    doc = json.loads(FIXTURE.read_text(encoding="utf-8"))
    bad = 0
    for i, case in enumerate(doc["cases"]):
        context, messages, mode, effort = script_input(case)
        want = enc.encode_messages(messages, mode, context=context or None, reasoning_effort=effort)
        if check and case.get("expected") != want:
            bad += 1
            print(f"case {i} ({case.get('name', '')}) differs", file=sys.stderr)
        case["expected"] = want
    if check:
        print(f"{len(doc['cases'])} cases, {bad} differ")
        sys.exit(1 if bad else 0)
    FIXTURE.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(doc['cases'])} cases to {FIXTURE}")


if __name__ == "__main__":
    main()
