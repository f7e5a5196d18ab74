#!/usr/bin/env python3
"""Tokenizer fixtures from real HF `tokenizers` (run on the GPU machine, tokenizers >= 0.20).

Trains two byte-level BPE tokenizers with the DeepSeek V3/V4 pre-tokenizer and
DeepSeek special tokens on corpora assembled here (Python stdlib sources, their
docstrings, synthetic multilingual text), saves each tokenizer.json and writes the
ids HF produces for every text of texts.json, on both paths:
  plain   - special tokens are ordinary text (encode_special_tokens = True),
  special - special tokens are matched (the default),
plus a few rendered DeepSeek-V4 chat conversations (special path) and, for the
engine's Unicode tables, the code points HF's regex engine puts in \\p{L} \\p{M}
\\p{N} \\p{P} \\p{S} and \\s.

Usage: python3 make_fixture.py TEXTS_JSON OUT_DIR
Writes OUT_DIR/{a,b}/tokenizer.json, OUT_DIR/{a,b}/expected.json, OUT_DIR/hf_categories.json.

Reproducing tests/fixtures/tokenizer/:
  python3 tools/reference/tokenizer/make_texts.py > tools/reference/tokenizer/texts.json  (Python <= 3.11)
  on the GPU machine: python3 tools/reference/tokenizer/make_fixture.py tools/reference/tokenizer/texts.json $OUT/tok
  copy $OUT/tok/{a,b,hf_categories.json} to tests/fixtures/tokenizer/.
Training is deterministic for a given Python stdlib; the committed fixture came from
Python 3.12.3 and tokenizers 0.23.2.
"""
import glob
import json
import os
import random
import sys
import sysconfig

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
THINK, END_THINK = "<think>", "</think>"
MORE_SPECIALS = [USER, ASSISTANT, THINK, END_THINK, "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>",
                 "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                 "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"]

# The DeepSeek V3/V4 tokenizer.json pre_tokenizer, verbatim.
SPLITS = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]


def deepseek_pre_tokenizer():
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in SPLITS]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


# ---------------------------------------------------------------- corpora

def stdlib_files():
    root = sysconfig.get_paths()["stdlib"]
    return sorted(p for p in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
                  if "site-packages" not in p and "/test" not in p)


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def docstrings(files):
    import ast
    out = []
    for p in files:
        try:
            tree = ast.parse(read(p))
        except Exception:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                d = ast.get_docstring(node)
                if d:
                    out.append(d)
    return out


def synthetic_multilingual(rng, n_words):
    """Zipf-ish words from several scripts so merges form inside each of them."""
    def pool(lo, hi, k):
        return [chr(rng.randint(lo, hi)) for _ in range(k)]
    scripts = {
        "han": pool(0x4E00, 0x9FA5, 400), "hira": pool(0x3041, 0x3096, 60), "kata": pool(0x30A1, 0x30FA, 60),
        "hangul": pool(0xAC00, 0xD7A3, 300), "cyr": [chr(c) for c in range(0x0430, 0x0450)],
        "greek": [chr(c) for c in range(0x03B1, 0x03CA)], "arabic": [chr(c) for c in range(0x0627, 0x064B)],
        "deva": [chr(c) for c in range(0x0915, 0x0939)], "latin": list("abcdefghijklmnopqrstuvwxyzéèàüöäñç"),
    }
    marks = {"deva": ["\u093E", "\u093F", "\u0940", "\u094D", "\u0902"], "latin": ["\u0301", "\u0308"],
             "arabic": ["\u064E", "\u0650"]}
    lexicon = {}
    for name, chars in scripts.items():
        words = []
        for _ in range(300):
            w = "".join(rng.choice(chars[: max(4, len(chars) // (1 + rng.randint(0, 3)))])
                        for _ in range(rng.randint(1, 6)))
            if name in marks and rng.random() < 0.4:
                w += rng.choice(marks[name])
            words.append(w)
        lexicon[name] = words
    emoji = ["😀", "👍", "👍🏽", "❤️", "👨‍👩‍👧", "🇺🇸", "🇯🇵", "🎉", "🔥"]
    punct = ["，", "。", "、", "！", "？", ".", ",", "!", "?", ":", ";", " -", "(", ")", "«", "»", "—"]
    seps = [" ", " ", " ", "", "\n", "  ", "\t", "\u3000", "\u00A0"]
    out = []
    names = list(lexicon)
    for _ in range(n_words // 12):
        name = rng.choice(names)
        words = lexicon[name]
        sent = []
        for _ in range(rng.randint(3, 20)):
            w = words[min(int(rng.paretovariate(1.2)) - 1, len(words) - 1)]
            sent.append(w)
            if rng.random() < 0.1:
                sent.append(rng.choice(punct))
            if rng.random() < 0.04:
                sent.append(rng.choice(emoji))
            if rng.random() < 0.05:
                sent.append(str(rng.randint(0, 10 ** rng.randint(1, 8))))
            sent.append(rng.choice(seps))
        out.append("".join(sent))
    return out


def synthetic_markup(rng, n):
    tags = ["div", "span", "p", "a", "b", "li", "ul", "table", "tr", "td"]
    out = []
    for i in range(n):
        t = rng.choice(tags)
        out.append('<%s class="c%d" id="x%d">Item %d &amp; more &lt;%s&gt;</%s>\r\n' % (t, i % 7, i, i, t, t))
        out.append('{"id": %d, "value": %.3f, "name": "n%d", "tags": ["a", "b"], "ok": %s}\n'
                   % (i, rng.random() * 1000, i, "true" if i % 2 else "false"))
    return out


# ---------------------------------------------------------------- chat reference

def render_chat(messages, thinking):
    """DeepSeek-V4 chat format (encoding_dsv4.encode_messages, drop_thinking=True, no tools)."""
    last_user = max([i for i, m in enumerate(messages) if m["role"] == "user"], default=-1)
    out = BOS
    for i, m in enumerate(messages):
        role, content = m["role"], m.get("content", "")
        if role == "system":
            out += content
        elif role == "user":
            out += USER + content
        elif role == "assistant":
            reasoning = ""
            if thinking and i > last_user:
                reasoning = m.get("reasoning", "") + END_THINK
            out += reasoning + content + EOS
        if i + 1 < len(messages) and messages[i + 1]["role"] != "assistant":
            continue
        if role == "user":
            out += ASSISTANT + (THINK if thinking and i >= last_user else END_THINK)
    return out


CONVERSATIONS = [
    ("chat_single", False, [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello! What is 2+2?"}]),
    ("chat_multi", False, [
        {"role": "system", "content": "Answer briefly.\n"},
        {"role": "user", "content": "Translate 'cat' to French."},
        {"role": "assistant", "content": "« chat »"},
        {"role": "user", "content": "And to 日本語?"},
        {"role": "assistant", "content": "猫 (ねこ)"},
        {"role": "user", "content": "Thanks!\n\n  Bye."}]),
    ("think_open", True, [
        {"role": "user", "content": "Why is the sky blue?"}]),
    ("think_multi", True, [
        {"role": "system", "content": "Think step by step."},
        {"role": "user", "content": "1+1=?"},
        {"role": "assistant", "reasoning": "Adding one and one.", "content": "2"},
        {"role": "user", "content": "Times 10?"},
        {"role": "assistant", "reasoning": "2 * 10 = 20\n", "content": "20."}]),
    ("think_history", True, [
        {"role": "user", "content": "def f(x):\n    return x"},
        {"role": "assistant", "reasoning": "It is the identity.", "content": "Identity function."},
        {"role": "user", "content": "Привет!"}]),
    ("no_system_users", False, [
        {"role": "user", "content": "first"},
        {"role": "user", "content": "second, with <think> inside the content"},
        {"role": "assistant", "content": ""}]),
]


# ---------------------------------------------------------------- categories

def hf_categories():
    """Code points HF's regex engine matches with each class (one Split per class)."""
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    text = "".join(map(chr, cps))
    out = {}
    for name, rx in [("L", r"\p{L}"), ("M", r"\p{M}"), ("N", r"\p{N}"), ("P", r"\p{P}"), ("S", r"\p{S}"),
                     ("WS", r"\s")]:
        pt = pre_tokenizers.Split(Regex(rx), behavior="removed", invert=False)
        matched = bytearray([1]) * len(cps)
        for _, (a, b) in pt.pre_tokenize_str(text):
            matched[a:b] = bytes(b - a)
        ranges, start = [], None
        for i in range(len(cps) + 1):
            m = i < len(cps) and matched[i]
            if m and start is None:
                start = i
            if not m and start is not None:
                ranges.append([cps[start], cps[i - 1]])
                start = None
        out[name] = ranges
    return out


# ---------------------------------------------------------------- main

def train(files_or_iter, vocab_size, min_frequency, specials):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = deepseek_pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=[AddedToken(s, special=True, normalized=False) for s in specials],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(files_or_iter, trainer=trainer)
    return tok


def encode_all(tok, texts):
    # The plain path two ways: encode_special_tokens=True, and a copy without added tokens.
    d = json.loads(tok.to_str())
    d["added_tokens"] = []
    bare = Tokenizer.from_str(json.dumps(d))
    has_flag = hasattr(tok, "encode_special_tokens")
    rows = []
    for t in texts:
        special = tok.encode(t["text"], add_special_tokens=False).ids
        plain = bare.encode(t["text"], add_special_tokens=False).ids
        if has_flag:
            tok.encode_special_tokens = True
            plain2 = tok.encode(t["text"], add_special_tokens=False).ids
            tok.encode_special_tokens = False
            assert plain == plain2, ("plain paths differ", t["name"])
        rows.append({"name": t["name"], "text": t["text"], "plain": plain, "special": special,
                     "decode_roundtrip": tok.decode(plain, skip_special_tokens=False) == t["text"]})
    return rows


def write_fixture(tok, out_dir, texts, note):
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=False)
    # Reload from disk so the expected ids come from exactly what is committed.
    tok = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    chats = []
    for name, thinking, msgs in CONVERSATIONS:
        text = render_chat(msgs, thinking)
        chats.append({"name": name, "thinking": thinking, "messages": msgs, "rendered": text,
                      "ids": tok.encode(text, add_special_tokens=False).ids})
    exp = {"generator": "tools/reference/tokenizer/make_fixture.py", "tokenizers_version": tokenizers.__version__,
           "note": note, "vocab_size": tok.get_vocab_size(with_added_tokens=True),
           "texts": encode_all(tok, texts), "chats": chats}
    with open(os.path.join(out_dir, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(exp, f, ensure_ascii=True, separators=(",", ":"))


def main():
    texts_path, out = sys.argv[1], sys.argv[2]
    texts = json.load(open(texts_path, encoding="utf-8"))["texts"]
    rng = random.Random(7)
    files = stdlib_files()
    print("tokenizers", tokenizers.__version__, "stdlib files", len(files), flush=True)

    # A: stdlib sources + synthetic multilingual text, 4096 tokens, specials first (ids 0..14).
    corpus_a = [read(p) for p in files[: len(files) // 2]] + synthetic_multilingual(rng, 300000)
    tok_a = train(corpus_a, 4096, 2, [BOS, EOS, PAD] + MORE_SPECIALS)
    write_fixture(tok_a, os.path.join(out, "a"), texts,
                  "stdlib sources (first half) + synthetic multilingual; vocab 4096; specials at ids 0..14")

    # B: different data (docstrings of the other half, markup, other multilingual sample), 2500 tokens,
    # BOS/EOS/PAD first and the other specials appended after the trained vocabulary (DeepSeek's layout).
    rng_b = random.Random(99)
    corpus_b = docstrings(files[len(files) // 2:]) + synthetic_markup(rng_b, 3000) + \
        synthetic_multilingual(rng_b, 150000)
    tok_b = train(corpus_b, 2500, 3, [BOS, EOS, PAD])
    tok_b.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in MORE_SPECIALS])
    write_fixture(tok_b, os.path.join(out, "b"), texts,
                  "docstrings (second half) + markup + synthetic multilingual; vocab 2500 + 12 appended specials")

    with open(os.path.join(out, "hf_categories.json"), "w") as f:
        json.dump(hf_categories(), f)
    print("done", flush=True)


if __name__ == "__main__":
    main()
