#!/usr/bin/env python3
"""Writes texts.json: the tricky texts the tokenizer fixtures are encoded on.

Deterministic (fixed seed). Random characters are drawn only from code points that
are assigned in the running Python's unicodedata AND in Unicode 15.0 (the tables the
engine is generated from): Python 3.11 ships Unicode 14.0, a subset of 15.0. Code
points assigned later (15.1, 16.0) are left out on purpose: HF tokenizers' Oniguruma
already knows them while the engine's 15.0 tables do not (see the issue-4 report).

Usage: python3 make_texts.py > texts.json
"""
import json
import random
import sys
import unicodedata

if unicodedata.unidata_version > "15.0.0":
    sys.exit("run with a Python whose unicodedata is <= 15.0 (e.g. 3.11)")

SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
            "<think>", "</think>", "<｜▁pad▁｜>", "<｜tool▁calls▁begin｜>"]

FIXED = [
    # ASCII, contractions, punctuation + letters
    ("ascii", "Hello world"),
    ("ascii_punct", "Hello, world! How are you? I'm fine... (really)."),
    ("contractions", "I'm can't won't they're we've I'd you'll it's IT'S She'S don't"),
    ("quotes", "'s' '' ''' '''hello''' \"quoted\" `tick`"),
    ("punct_letters", "(hello) ...world #include @user $var _private __init__ foo.bar.baz a-b-c x=y+z [a] \\path /usr/bin"),
    ("punct_nonascii_letters", ".Éclair -Привет _日本 #한국 'ñ"),
    # numbers
    ("digits", "1 12 123 1234 12345 123456 1234567 12345678901234567890"),
    ("decimals", "3.14159 0.5 -2.75e-10 1,000,000.00 v1.2.3 2024-05-06 12:34:56 $19.99 50%"),
    ("digits_letters", "abc123def 4ever x86_64 H2O 1st 2nd 3rd 10th"),
    ("other_numbers", "١٢٣٤٥ ۱۲۳ १२३४ ①②③④ Ⅻ ⅷ ²³¹ ¼½¾ １２３４ 𝟘𝟙𝟚"),
    # CJK, kana, Hangul
    ("chinese", "你好世界，这是一个测试。我们在北京学习中文。"),
    ("japanese", "東京都へ行きます。カタカナとひらがなを混ぜた文章です。ー・゠"),
    ("korean", "한국어 텍스트입니다. 안녕하세요, 세계!"),
    ("cjk_mixed", "中文English混合123文本，日本語テキスト、한글text"),
    ("cjk_ext", "𠀀𠀁𪜀 龦龧鿿 〇 々 〆 ㈱"),
    # other scripts
    ("cyrillic", "Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю."),
    ("greek", "Καλημέρα κόσμε· ΑΒΓΔ αβγδ ϐϑϕ"),
    ("arabic", "مرحبا بالعالم! هذا اختبار."),
    ("hebrew", "שָׁלוֹם עוֹלָם"),
    ("devanagari", "नमस्ते दुनिया, यह एक परीक्षण है।"),
    ("thai", "สวัสดีครับ ภาษาไทย"),
    ("latin_ext", "naïve café résumé straße Ǆ ǅ ǆ ŉ ﬁ ﬀ Æsir øre"),
    # combining marks
    ("combining", "e\u0301 a\u0300\u0301\u0302 \u0301start x\u0301y \u0301 1\u0301 .\u0301a"),
    ("zalgo", "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇"),
    ("marks_only", "\u0300\u0301\u0302\u0303"),
    # emoji
    ("emoji_zwj", "family: 👨‍👩‍👧‍👦 rainbow: 🏳️‍🌈 health: 🧑‍⚕️"),
    ("emoji_flags", "🇺🇸🇫🇷🇩🇪🇯🇵 🏴󠁧󠁢󠁳󠁣󠁴󠁿"),
    ("emoji_mod", "👍🏽 👋🏿 ❤️ ☺︎ 1️⃣ #️⃣"),
    ("emoji_text", "a😀b 😀 😀😀 ok👌done"),
    # code, HTML
    ("python", "def f(x):\n    return x ** 2  # square\n\nclass A(object):\n\tpass\n"),
    ("cpp", "#include <vector>\nint main() {\n  std::vector<int> v{1, 2, 3};\n  for (auto &x : v) x += 1;\n  return 0;\n}\n"),
    ("json", "{\"key\": [1, 2.5, null, true], \"s\": \"a\\nb\", \"u\": \"\\u00e9\"}"),
    ("html", "<div class=\"a\">Hello &amp; <b>world</b></div>\n<!-- comment -->\n<br/>&nbsp;&lt;tag&gt;"),
    ("regex", "^[A-Za-z0-9_]+\\s*(?:foo|bar)$ \\d{1,3} \\p{L}"),
    ("shell", "for f in *.txt; do\n\techo \"$f\" | grep -v '^#' >> out.log 2>&1\ndone"),
    ("markdown", "# Title\n\n* item one\n* item **two**\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"),
    # CRLF, whitespace
    ("crlf", "line1\r\nline2\r\n\r\nline3\rline4\n\rend"),
    ("cr_runs", "\r\r\n\n\r \r\n \n"),
    ("spaces", "a    b     c  d e"),
    ("tabs", "a\t\tb\t c \td\t"),
    ("leading_trailing", "   leading and trailing   "),
    ("newline_runs", "\n\n\n"),
    ("mixed_ws", " \n \n \t\n\t \r\n  x"),
    ("ws_before_punct", "a  ,  b   .  c\t!"),
    ("ws_before_digits", "a  5  10   100"),
    ("nbsp", "a\u00A0b \u00A0\u00A0x 10\u00A0000 \u00A0"),
    ("em_spaces", "a\u2003b\u2002c\u2009d \u2003 e\u3000全角\u3000x"),
    ("odd_spaces", "a\u202Fb\u205Fc\u1680d\u2028e\u2029f\u0085g\u180Eh"),
    ("zero_width", "a\u200Bb\u200Cc\u200Dd\u2060e\uFEFFf"),
    ("controls", "\x01\x02 a\x1bb\x0b\x0c\x7f \x1c\x1d\x1e\x1f"),
    ("nul", "a\x00b"),
    # empty lines
    ("empty", ""),
    ("paragraphs", "para1\n\npara2\n\n\n\npara3\n"),
    ("blank_lines_ws", "x\n  \n\t\n \n"),
    # lone characters
    ("lone_a", "a"), ("lone_space", " "), ("lone_nl", "\n"), ("lone_tab", "\t"), ("lone_cr", "\r"),
    ("lone_quote", "'"), ("lone_dquote", "\""), ("lone_digit", "7"), ("lone_han", "中"),
    ("lone_emoji", "😀"), ("lone_mark", "\u0301"), ("lone_zwj", "\u200D"), ("lone_bom", "\uFEFF"),
    ("lone_fffd", "\uFFFD"), ("lone_pua", "\uE000"), ("lone_plane15", "\U000F0000"),
    ("lone_nbsp", "\u00A0"), ("lone_ideo_space", "\u3000"),
    # special-token-looking text
    ("special_chat", "<｜User｜>hi<｜Assistant｜></think>ok<｜end▁of▁sentence｜>"),
    ("special_bos", "<｜begin▁of▁sentence｜>Hello"),
    ("special_adjacent", "<think></think><think><｜User｜><｜User｜>"),
    ("special_partial", "<｜User <think <think>> <<think>> </think </ think> <｜end▁of▁sentence"),
    ("special_in_words", "abc<think>def</think>ghi 123<｜User｜>456"),
    ("special_spaces", " <think> \n</think>\n\n<｜Assistant｜> x "),
    ("special_pad", "a<｜▁pad▁｜>b<｜tool▁calls▁begin｜>c"),
]


def assigned_pool():
    """All code points assigned in this Python's Unicode (<= 15.0), minus surrogates."""
    pool = []
    for cp in range(0x110000):
        cat = unicodedata.category(chr(cp))
        if cat not in ("Cn", "Cs"):
            pool.append(cp)
    return pool


def main():
    rng = random.Random(20240504)
    pool = assigned_pool()
    classes = [
        (20, lambda: rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")),
        (5, lambda: rng.choice("0123456789")),
        (6, lambda: rng.choice("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")),
        (8, lambda: rng.choice("  \t\n\r")),
        (2, lambda: rng.choice("\u00A0\u2003\u3000\u2009\u0085\u2028")),
        (5, lambda: chr(rng.randint(0x4E00, 0x9FA5))),
        (3, lambda: chr(rng.randint(0x3041, 0x30FF))),
        (3, lambda: chr(rng.randint(0xAC00, 0xD7A3))),
        (4, lambda: chr(rng.randint(0x0410, 0x044F))),
        (3, lambda: chr(rng.randint(0x0300, 0x036F))),
        (3, lambda: chr(rng.choice([0x1F600, 0x1F468, 0x1F469, 0x1F1FA, 0x1F1F8, 0x2764, 0x1F3FD])
                        + rng.randint(0, 5))),
        (2, lambda: rng.choice(["\u200D", "\uFE0F", "\u20E3", "\U000E0067"])),
        (6, lambda: chr(rng.choice(pool))),
    ]
    total = sum(w for w, _ in classes)

    def rand_char():
        r = rng.uniform(0, total)
        for w, f in classes:
            r -= w
            if r <= 0:
                return f()
        return classes[-1][1]()

    texts = [{"name": n, "text": t} for n, t in FIXED]
    for i in range(200):
        n = rng.choice([1, 2, 3, 5, 8, 13, 21, 40, 80])
        s = "".join(rand_char() for _ in range(n))
        if rng.random() < 0.15:
            pos = rng.randint(0, len(s))
            s = s[:pos] + rng.choice(SPECIALS) + s[pos:]
        texts.append({"name": "random_%03d" % i, "text": s})
    # One longer mixed document.
    doc = "\n\n".join(t for _, t in FIXED if t) * 3
    texts.append({"name": "long_mixed", "text": doc})
    json.dump({"texts": texts}, sys.stdout, ensure_ascii=True, indent=0)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
