#!/usr/bin/env python3
"""Tokenizer + token streams for ds4-pystd (runs on the GPU machine; CPU only).

  prepare_data.py WORK [--tokenizer DIR]

Without --tokenizer, trains the byte-level BPE (vocab 8192, DeepSeek pre-tokenizer and special
tokens) on the train split and writes WORK/tokenizer/{tokenizer.json,tokenizer_config.json}.
With it, reuses that tokenizer (the committed one) unchanged.

Then encodes every file as plain text (special-token strings inside the sources stay text,
as the engine's plain encode does) and writes the streams
  WORK/train.u16, WORK/heldout.u16   <BOS> file <EOS> <BOS> file <EOS> ...   (uint16 LE)
  WORK/lm_train.u16, WORK/val.u16    the train split without / with only its validation files
The tokenizer is trained on the whole train split (validation files included); the LM
trains on lm_train and picks its checkpoint on val; held-out files are seen by neither.
and WORK/data.json (file counts, bytes, tokens, corpus digest).
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
import pystd  # noqa: E402


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("--tokenizer", help="folder with tokenizer.json (+ tokenizer_config.json) to reuse")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    t0 = time.time()
    train, held = pystd.split_corpus()
    train_texts = [pystd.read(p) for _, p in train]
    held_texts = [pystd.read(p) for _, p in held]
    info = {"stdlib": pystd.stdlib_root(), "python": sys.version.split()[0], "tokenizers": tokenizers.__version__,
            "files_train": len(train), "files_heldout": len(held),
            "bytes_train": sum(len(t.encode()) for t in train_texts),
            "bytes_heldout": sum(len(t.encode()) for t in held_texts),
            "corpus_sha1": pystd.corpus_digest(train + held),
            "heldout_files": [r for r, _ in held]}
    print(f"corpus: {len(train)} train / {len(held)} held-out files, "
          f"{info['bytes_train'] / 1e6:.1f} / {info['bytes_heldout'] / 1e6:.2f} MB ({time.time() - t0:.1f}s)", flush=True)

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
        tok = train_tokenizer(train_texts)
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
    val_idx = [i for i, (r, _) in enumerate(train) if pystd.is_validation(r)]
    lm_idx = [i for i, (r, _) in enumerate(train) if not pystd.is_validation(r)]
    lm = encode_stream(tok, [train_texts[i] for i in lm_idx])
    va = encode_stream(tok, [train_texts[i] for i in val_idx])
    lm.astype("<u2").tofile(os.path.join(a.work, "lm_train.u16"))
    va.astype("<u2").tofile(os.path.join(a.work, "val.u16"))
    info.update(files_lm_train=len(lm_idx), files_val=len(val_idx), tokens_lm_train=int(lm.size),
                tokens_val=int(va.size), val_files=[train[i][0] for i in val_idx])
    he.astype("<u2").tofile(os.path.join(a.work, "heldout.u16"))
    info.update(tokens_train=int(tr.size), tokens_heldout=int(he.size),
                bytes_per_token=info["bytes_train"] / tr.size,
                train_stream_sha1=hashlib.sha1(tr.tobytes()).hexdigest())
    # Round trip on the held-out files: the tokenizer must reproduce every source exactly.
    bad = sum(1 for t, e in zip(held_texts, tok.encode_batch(held_texts, add_special_tokens=False))
              if tok.decode(e.ids, skip_special_tokens=False) != t)
    info["heldout_roundtrip_failures"] = bad
    print(f"encoded: {tr.size} train ({lm.size} LM train + {va.size} validation) / {he.size} held-out tokens, {info['bytes_per_token']:.2f} bytes/token, "
          f"round-trip failures {bad} ({time.time() - t2:.1f}s)", flush=True)
    with open(os.path.join(a.work, "data.json"), "w") as f:
        json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
