#!/usr/bin/env python3
"""Differential check of the engine tokenizer against HF tokenizers on random texts.

Needs the `tokenizers` npm package (see hf_oracle.js) and the tokenizer_batch helper
(tests/tokenizer). Random characters come only from code points assigned in Unicode
<= 15.0 (this Python's unicodedata must not be newer): HF already knows later ones.

  NODE_PATH=/tmp/hf/node_modules python3 diff_fuzz.py BUILD_DIR TOKENIZER_JSON [N] [SEED]
"""
import json
import os
import random
import subprocess
import sys
import tempfile
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"]


def generators(rng):
    pool = [c for c in range(0x110000) if unicodedata.category(chr(c)) not in ("Cn", "Cs")]
    bmp = [c for c in pool if c < 0x10000]
    by_cat = {}
    for c in pool:
        by_cat.setdefault(unicodedata.category(chr(c))[0], []).append(c)
    ws = [0x9, 0xA, 0xB, 0xC, 0xD, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x2003, 0x2028, 0x2029, 0x202F, 0x3000]
    ascii_ = [chr(c) for c in range(0x20, 0x7F)] + ["\n", "\r", "\t"]

    def any_char():
        return chr(rng.choice(pool))

    def bmp_char():
        return chr(rng.choice(bmp))

    def class_mix():
        k = rng.choice("LLLMNPSZC")
        if k == "Z":
            return chr(rng.choice(ws))
        return chr(rng.choice(by_cat[k]))

    def ascii_char():
        return rng.choice(ascii_)

    def structured():
        return rng.choice(["'s", "'T", " ", "  ", "\n", "\r\n", "\t", "123", "4567", "3.14", "ab", "Zz", "é",
                           "e\u0301", "\u0301", "中文", "カナ", "ー", "한", "Щ", "😀", "\u200d", "👍🏽", "🇺🇸",
                           ".", "...", "(", "#", "_x", "-", "<", "</", ">", "&amp;", "\u00a0", "\u3000", "\x00"])

    return [any_char, bmp_char, class_mix, ascii_char, structured]


def main():
    build, tok_json = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    gens = generators(rng)
    texts = []
    for _ in range(n):
        g = [rng.choice(gens) for _ in range(rng.randint(1, 3))]
        s = "".join(rng.choice(g)() for _ in range(rng.choice([1, 2, 4, 8, 16, 32, 64, 200])))
        if rng.random() < 0.1:
            p = rng.randint(0, len(s))
            s = s[:p] + rng.choice(SPECIALS) + s[p:]
        texts.append(s)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump(texts, f)
        path = f.name
    ref = json.loads(subprocess.run(["node", os.path.join(HERE, "hf_oracle.js"), "encode", tok_json, path],
                                    check=True, capture_output=True).stdout)
    batch = os.path.join(build, "bin", "tokenizer_batch")
    got = json.loads(subprocess.run([batch, tok_json, path],
                                    check=True, capture_output=True).stdout)
    os.unlink(path)
    bad = 0
    for t, r, g in zip(texts, ref, got):
        for k in ("plain", "special"):
            if r[k] != g[k]:
                bad += 1
                if bad <= 5:
                    print("MISMATCH", k, repr(t), "\n  hf ", r[k], "\n  ds4", g[k])
    print("%d texts, %d mismatches" % (n, bad))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
