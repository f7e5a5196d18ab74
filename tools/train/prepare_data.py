#!/usr/bin/env python3
"""Tokenizer + token streams for ds4-pystd (runs on the GPU machine; CPU only).

  prepare_data.py WORK [--tokenizer DIR] [--reference RUN_DIR]
                  [--extra all|NAME,NAME... [--extra-cap-tokens N]] [--stdlib-repeat K]

Without --tokenizer, trains the byte-level BPE (vocab 8192, DeepSeek pre-tokenizer and special
tokens) on the train split and writes WORK/tokenizer/{tokenizer.json,tokenizer_config.json}.
With it, reuses that tokenizer (the committed one) unchanged.

Then encodes every file as plain text (special-token strings inside the sources stay text,
as the engine's plain encode does) and writes the streams
  WORK/train.u16, WORK/heldout.u16   <BOS> file <EOS> <BOS> file <EOS> ...   (uint16 LE)
  WORK/lm_train.u16, WORK/val.u16    the train split without / with only its validation files
The tokenizer is trained on the whole train split (validation files included); the LM
trains on lm_train and picks its checkpoint on val; held-out files are seen by neither.
WORK/lm_train_stdlib.u16 is lm_train's stdlib part once (evaluate.py's train sample), and
WORK/data.json has file counts, bytes, tokens, the corpus digest and the streams' sha1s.

--extra adds the Python source of installed packages (corpus.EXTRA_LICENCES, each with its
licence; the selection rules are corpus.py's) to lm_train only, after --stdlib-repeat copies
of the stdlib part; --extra-cap-tokens shares a token budget out over the packages. The
tokenizer (trained or reused) and the train / validation / held-out streams stay the stdlib's,
byte for byte, whatever --extra says. data.json["extra"] lists each package: licence,
distribution, version, files / bytes / tokens taken, and the files left out by reason.

--reference RUN_DIR (data.json + heldout_sample.i32 of an earlier run, tools/train/run for
the committed model): when its stdlib digest equals this one, the held-out, validation and
train streams must reproduce it (lengths, sha1s it recorded, the held-out sample windows it
scored) or this exits with an error, so held-out losses stay comparable; with another stdlib
the check is skipped and says so.
"""
import argparse
import hashlib
import json
import os
import shutil
import sys
import time

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
import tokenizers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
import pystd  # noqa: E402

BYTES_PER_TOKEN_MAX = 4.5   # pre-selection by bytes before tokenizing: generous (stdlib: 3.85)


def train_tokenizer(texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pystd.deepseek_pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=pystd.VOCAB, min_frequency=2,
                                  special_tokens=[AddedToken(s, special=True, normalized=False)
                                                  for s in pystd.SPECIALS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def write_tokenizer(tok, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=False)
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": pystd.BOS, "eos_token": pystd.EOS,
           "pad_token": pystd.PAD, "add_bos_token": False, "add_eos_token": False,
           "clean_up_tokenization_spaces": False, "model_max_length": pystd.SEQ,
           "additional_special_tokens": pystd.SPECIALS[3:]}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)


def encode_stream(tok, texts):
    if not texts:
        raise SystemExit("encode_stream: no files")
    encs = pystd.plain_tokenizer(tok).encode_batch(texts, add_special_tokens=False)
    parts = []
    for e in encs:
        parts.append(np.array([pystd.BOS_ID] + e.ids + [pystd.EOS_ID], dtype=np.uint16))
    return np.concatenate(parts)


def encode_files(tok, texts, chunk=256):
    """One framed uint16 array per text (chunked: Encoding objects are large)."""
    enc = pystd.plain_tokenizer(tok)
    out = []
    for i in range(0, len(texts), chunk):
        for e in enc.encode_batch(texts[i:i + chunk], add_special_tokens=False):
            out.append(np.array([pystd.BOS_ID] + e.ids + [pystd.EOS_ID], dtype=np.uint16))
    return out


def sha1(a):
    return hashlib.sha1(a.astype("<u2").tobytes()).hexdigest()


def check_reference(ref_dir, info, held_stream):
    """Held-out / validation / train streams equal to those of the run in ref_dir (same stdlib)."""
    with open(os.path.join(ref_dir, "data.json")) as f:
        ref = json.load(f)
    if ref["corpus_sha1"] != info["corpus_sha1"]:
        return f"skipped: stdlib digest {info['corpus_sha1'][:12]} differs from the reference's {ref['corpus_sha1'][:12]}"
    bad = []
    for k in ("heldout_files", "val_files", "tokens_heldout", "tokens_val", "tokens_train", "train_stream_sha1",
              "heldout_stream_sha1", "val_stream_sha1"):
        if k in ref and ref[k] != info[k]:
            bad.append(f"{k}: {info[k]} != reference {ref[k]}")
    sample_path = os.path.join(ref_dir, "heldout_sample.i32")
    compared = [k for k in ("tokens_heldout", "tokens_val", "train_stream_sha1", "heldout_stream_sha1",
                            "val_stream_sha1") if k in ref]
    if os.path.exists(sample_path):
        sample = np.fromfile(sample_path, dtype="<i4").reshape(-1, pystd.SEQ)
        got = pystd.sample_windows(held_stream, sample.shape[0], pystd.SEQ)
        if not np.array_equal(got, sample):
            bad.append(f"held-out sample: {int((got != sample).sum())} of {sample.size} tokens differ "
                       f"from {sample_path}")
        compared.append(f"{sample.shape[0]} held-out windows")
    if bad:
        raise SystemExit("held-out/validation streams differ from the reference run " + ref_dir + ":\n  " + "\n  ".join(bad))
    return "equal: " + ", ".join(compared)


def select_extra(a, stdlib_files, eval_texts):
    """corpus.select_extra with timing; runs before any tokenizer work (it forks workers)."""
    t0 = time.time()
    packages, files, missing = corpus.select_extra(corpus.parse_extra(a.extra), stdlib_files, eval_texts)
    return packages, files, missing, time.time() - t0


def add_extra(a, tok, selection):
    """The selected extra files, tokenized and capped -> (list of uint16 arrays, data.json entry)."""
    packages, files, missing, t_select = selection
    t0 = time.time()
    cap = a.extra_cap_tokens
    # Tokenize only what a generous byte budget could need, then cap exactly on tokens.
    pre = corpus.cap_counts({k: [f[2] for f in v] for k, v in files.items()},
                            None if cap is None else int(cap * BYTES_PER_TOKEN_MAX))
    arrays, sizes = {}, {}
    for name, fl in files.items():
        texts = [corpus.read(p) for _, p, _ in fl[:pre[name]]]
        arrays[name] = encode_files(tok, texts) if texts else []
        sizes[name] = [int(x.size) for x in arrays[name]]
    take = corpus.cap_counts(sizes, cap)
    out = []
    for pkg in packages:
        n = take[pkg["name"]]
        sel = arrays[pkg["name"]][:n]
        pkg.update(files=n, bytes=sum(f[2] for f in files[pkg["name"]][:n]), tokens=sum(int(x.size) for x in sel),
                   tokens_tokenized=sum(sizes[pkg["name"]]))
        out.extend(sel)
    entry = dict(requested=a.extra, cap_tokens=cap, missing=missing, packages=packages,
                 files=sum(p["files"] for p in packages), bytes=sum(p["bytes"] for p in packages),
                 tokens=sum(p["tokens"] for p in packages), select_seconds=round(t_select, 1),
                 tokenize_seconds=round(time.time() - t0, 1),
                 rules=dict(max_file_bytes=corpus.MAX_FILE_BYTES, min_file_bytes=corpus.MIN_FILE_BYTES,
                            max_line_chars=corpus.MAX_LINE_CHARS, vendor_dirs=sorted(corpus.VENDOR_DIRS),
                            generated=corpus.GENERATED.pattern,
                            near_dup=[corpus.NEAR_DUP_MIN_CHARS, corpus.NEAR_DUP_FRACTION, corpus.NEAR_DUP_MIN_LINES]))
    return out, entry


def print_extra(e):
    print(f"extra source ({e['requested']}, cap {e['cap_tokens']} tokens): {e['files']} files, "
          f"{e['bytes'] / 1e6:.1f} MB, {e['tokens']} tokens (selection {e['select_seconds']}s, "
          f"tokenizing {e['tokenize_seconds']}s)")
    print(f"  {'package':<20} {'licence':<26} {'version':<12} {'files':>6} {'MB':>7} {'tokens':>10} | "
          f"{'cand.':>6} {'MB':>7} {'tokenized':>10} | left out")
    for p in e["packages"]:
        print(f"  {p['name']:<20} {p['licence']:<26} {str(p.get('version', '?')):<12} {p['files']:>6} "
              f"{p['bytes'] / 1e6:>7.2f} {p['tokens']:>10} | {p['files_candidate']:>6} {p['bytes_candidate'] / 1e6:>7.2f} "
              f"{p['tokens_tokenized']:>10} | {' '.join(f'{k} {v}' for k, v in p['dropped'].items())}")
        if p.get("declared_licence") and p["declared_licence"] != p["licence"]:
            print(f"  {'':<20} (metadata: {p['declared_licence']})")
    if e["missing"]:
        print(f"  not installed: {' '.join(e['missing'])}")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("--tokenizer", help="folder with tokenizer.json (+ tokenizer_config.json) to reuse")
    ap.add_argument("--reference", help="earlier run folder (data.json, heldout_sample.i32) whose held-out and "
                                        "validation streams these must equal when the stdlib is the same")
    ap.add_argument("--extra", help="'all' or comma-separated import names from corpus.EXTRA_LICENCES: their "
                                    "installed Python source joins the LM training stream")
    ap.add_argument("--extra-cap-tokens", type=int, help="at most this many extra tokens (water-filled over packages)")
    ap.add_argument("--stdlib-repeat", type=int, default=1, help="copies of the stdlib training part in lm_train")
    a = ap.parse_args()
    if a.stdlib_repeat < 1:
        raise SystemExit("--stdlib-repeat must be >= 1")
    if a.extra_cap_tokens is not None and (a.extra_cap_tokens < 0 or not a.extra):
        raise SystemExit("--extra-cap-tokens needs --extra and a count >= 0")
    corpus.parse_extra(a.extra)            # unknown names fail before any work
    os.makedirs(a.work, exist_ok=True)
    t0 = time.time()
    train, held = corpus.split_corpus()
    train_texts = [corpus.read(p) for _, p in train]
    held_texts = [corpus.read(p) for _, p in held]
    info = {"stdlib": corpus.stdlib_root(), "python": sys.version.split()[0], "tokenizers": tokenizers.__version__,
            "files_train": len(train), "files_heldout": len(held),
            "bytes_train": sum(len(t.encode()) for t in train_texts),
            "bytes_heldout": sum(len(t.encode()) for t in held_texts),
            "corpus_sha1": corpus.corpus_digest(train + held),
            "heldout_files": [r for r, _ in held]}
    print(f"corpus: {len(train)} train / {len(held)} held-out files, "
          f"{info['bytes_train'] / 1e6:.1f} / {info['bytes_heldout'] / 1e6:.2f} MB ({time.time() - t0:.1f}s)", flush=True)
    val_idx = [i for i, (r, _) in enumerate(train) if corpus.is_validation(r)]
    lm_idx = [i for i, (r, _) in enumerate(train) if not corpus.is_validation(r)]
    # Before any tokenizer work: the selection forks worker processes.
    selection = select_extra(a, train + held, held_texts + [train_texts[i] for i in val_idx]) if a.extra else None

    tok_dir = os.path.join(a.work, "tokenizer")
    if a.tokenizer:
        if os.path.abspath(a.tokenizer) != os.path.abspath(tok_dir):
            os.makedirs(tok_dir, exist_ok=True)
            for f in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(os.path.join(a.tokenizer, f), os.path.join(tok_dir, f))
        tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
        info["tokenizer"] = "reused " + a.tokenizer
    else:
        t1 = time.time()
        tok = train_tokenizer(train_texts)      # the stdlib's train split only, extras or not
        write_tokenizer(tok, tok_dir)
        tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
        info["tokenizer"] = f"trained in {time.time() - t1:.1f}s"
        print(f"tokenizer: {info['tokenizer']}", flush=True)
    if tok.get_vocab_size(with_added_tokens=True) != pystd.VOCAB:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size(with_added_tokens=True)} tokens, expected {pystd.VOCAB}")
    for i, s in enumerate(pystd.SPECIALS):
        if tok.token_to_id(s) != i:
            raise SystemExit(f"special token {s} has id {tok.token_to_id(s)}, expected {i}")

    t2 = time.time()
    tr = encode_stream(tok, train_texts)
    he = encode_stream(tok, held_texts)
    tr.astype("<u2").tofile(os.path.join(a.work, "train.u16"))
    lm = encode_stream(tok, [train_texts[i] for i in lm_idx])
    va = encode_stream(tok, [train_texts[i] for i in val_idx])
    lm.astype("<u2").tofile(os.path.join(a.work, "lm_train_stdlib.u16"))
    va.astype("<u2").tofile(os.path.join(a.work, "val.u16"))
    info.update(files_lm_train=len(lm_idx), files_val=len(val_idx), tokens_lm_train_stdlib=int(lm.size),
                tokens_val=int(va.size), val_files=[train[i][0] for i in val_idx])
    he.astype("<u2").tofile(os.path.join(a.work, "heldout.u16"))
    info.update(tokens_train=int(tr.size), tokens_heldout=int(he.size),
                bytes_per_token=info["bytes_train"] / tr.size,
                train_stream_sha1=sha1(tr), heldout_stream_sha1=sha1(he), val_stream_sha1=sha1(va),
                lm_train_stdlib_stream_sha1=sha1(lm))
    # Round trip on the held-out files: the tokenizer must reproduce every source exactly.
    bad = sum(1 for t, e in zip(held_texts, tok.encode_batch(held_texts, add_special_tokens=False))
              if tok.decode(e.ids, skip_special_tokens=False) != t)
    info["heldout_roundtrip_failures"] = bad
    print(f"encoded: {tr.size} train ({lm.size} LM train + {va.size} validation) / {he.size} held-out tokens, {info['bytes_per_token']:.2f} bytes/token, "
          f"round-trip failures {bad} ({time.time() - t2:.1f}s)", flush=True)
    if a.reference:
        info["reference"] = a.reference
        info["reference_check"] = check_reference(a.reference, info, he)
        print(f"held-out / validation / train streams vs {a.reference}: {info['reference_check']}", flush=True)

    parts = [lm] * a.stdlib_repeat
    info["stdlib_repeat"] = a.stdlib_repeat
    if a.extra:
        extra, info["extra"] = add_extra(a, tok, selection)
        print_extra(info["extra"])
        parts += extra
    lm_all = np.concatenate(parts)
    lm_all.astype("<u2").tofile(os.path.join(a.work, "lm_train.u16"))
    info["tokens_lm_train"] = int(lm_all.size)
    print(f"LM training stream: {lm_all.size} tokens ({a.stdlib_repeat} x {lm.size} stdlib"
          f"{' + %d extra' % info['extra']['tokens'] if a.extra else ''})", flush=True)
    with open(os.path.join(a.work, "data.json"), "w") as f:
        json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
