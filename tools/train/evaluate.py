#!/usr/bin/env python3
"""Reference numbers for the trained ds4-pystd models, with HF's own DeepseekV4ForCausalLM code.

  evaluate.py WORK --main HF_DIR --drafter HF_DIR --out DIR [--n-seq 64]

Everything is computed in float32 (TF32 off) from the saved checkpoints as they are on disk,
i.e. the bf16 weights the converter reads, widened to float32:
  - held-out sample: N_SEQ sequences of 512 tokens at evenly spaced offsets of the held-out
    stream (DIR/heldout_sample.i32, row-major int32); mean next-token loss over the 511
    predicted positions of each sequence (per position: DIR/heldout_nll.f32; argmax at every
    position: DIR/heldout_argmax.i32); the same on a sample of the LM train stream's stdlib part;
  - drafter: its held-out loss and its greedy (argmax) agreement with the main model at
    every predicted position of the sample;
  - DIR/fixture_heldout512.json: sequence N_SEQ/2 of the sample with the main model's argmax,
    top-1/top-2 logit margin and loss at every position (the committed parity fixture);
  - the reference's own consistency on that sequence: prefix rows, cached chunked prefill and
    token-by-token decode against the one-shot forward;
  - greedy continuations of a few prompts (DIR/demo.json).
Writes DIR/metrics.json.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from transformers import DeepseekV4ForCausalLM
from transformers.cache_utils import DynamicCache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pystd  # noqa: E402

PROMPTS = ["def fibonacci(n):\n", "import os\n", "class Stack:\n    def __init__(self):\n"]


@torch.no_grad()
def score(model, seqs, dev, bs=8):
    """Per-position loss [n, seq-1], argmax [n, seq], top1-top2 margin [n, seq]."""
    nll, arg, margin = [], [], []
    for i in range(0, len(seqs), bs):
        x = torch.from_numpy(seqs[i:i + bs]).to(dev)
        logits = model(input_ids=x, use_cache=False).logits.float()
        lp = F.log_softmax(logits[:, :-1], dim=-1)
        nll.append((-lp.gather(-1, x[:, 1:, None])[..., 0]).cpu())
        top = logits.topk(2, dim=-1)
        arg.append(top.indices[..., 0].cpu())
        margin.append((top.values[..., 0] - top.values[..., 1]).cpu())
    return torch.cat(nll).double(), torch.cat(arg), torch.cat(margin)


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@torch.no_grad()
def consistency(model, ids, dev):
    x = torch.tensor(ids, device=dev)[None]
    full = model(input_ids=x, use_cache=False).logits[0].float()
    out = {}
    worst = 0.0
    for p in (1, 5, 63, 64, 65, 127, 128, 129, 300):
        worst = max(worst, rel(model(input_ids=x[:, :p], use_cache=False).logits[0].float(), full[:p]))
    out["prefix"] = worst
    for chunk, n in ((64, x.shape[1]), (1, min(320, x.shape[1]))):
        cache = DynamicCache(config=model.config)
        rows = []
        for s in range(0, n, chunk):
            r = model(input_ids=x[:, s:s + chunk], past_key_values=cache, use_cache=True)
            cache = r.past_key_values
            rows.append(r.logits[0].float())
        got = torch.cat(rows)
        out[f"chunk{chunk}"] = rel(got, full[:n])
        out[f"chunk{chunk}_argmax_agree"] = float((got.argmax(-1) == full[:n].argmax(-1)).float().mean())
    return out


@torch.no_grad()
def greedy(model, ids, n, dev):
    x = torch.tensor(ids, device=dev)[None]
    for _ in range(n):
        nxt = model(input_ids=x, use_cache=False).logits[0, -1].argmax()
        x = torch.cat([x, nxt.view(1, 1)], dim=1)
        if int(nxt) == pystd.EOS_ID:
            break
    return x[0, len(ids):].tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("--main", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-seq", type=int, default=64)
    ap.add_argument("--demo-tokens", type=int, default=60)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = torch.device("cuda")
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()

    held = np.fromfile(os.path.join(a.work, "heldout.u16"), dtype="<u2")
    # The train sample is of the stdlib part (comparable across runs with and without --extra).
    train_name = "lm_train_stdlib.u16" if os.path.exists(os.path.join(a.work, "lm_train_stdlib.u16")) else "lm_train.u16"
    train = np.fromfile(os.path.join(a.work, train_name), dtype="<u2")
    hs = pystd.sample_windows(held, a.n_seq, pystd.SEQ)
    ts = pystd.sample_windows(train, a.n_seq, pystd.SEQ)
    hs.astype("<i4").tofile(os.path.join(a.out, "heldout_sample.i32"))

    def load(d):
        return DeepseekV4ForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").to(dev).eval()

    main_m = load(a.main)
    m_nll, m_arg, m_margin = score(main_m, hs, dev)
    t_nll, _, _ = score(main_m, ts, dev)
    metrics = dict(n_seq=a.n_seq, seq=pystd.SEQ, positions=int(m_nll.numel()),
                   main_params=sum(p.numel() for p in main_m.parameters()),
                   main_heldout_loss=float(m_nll.mean()), main_train_sample_loss=float(t_nll.mean()),
                   main_heldout_loss_per_seq=[float(v) for v in m_nll.mean(1)])
    print(f"main: held-out loss {metrics['main_heldout_loss']:.5f} (ppl {np.exp(metrics['main_heldout_loss']):.2f}), "
          f"train-sample loss {metrics['main_train_sample_loss']:.5f}", flush=True)

    m_arg.numpy().astype("<i4").tofile(os.path.join(a.out, "heldout_argmax.i32"))
    m_nll.numpy().astype("<f4").tofile(os.path.join(a.out, "heldout_nll.f32"))
    fx_index = a.n_seq // 2     # mid-sample: ordinary code (sequence 0 is a generated config dict)
    fx = hs[fx_index].tolist()
    fixture = dict(generator="tools/train/evaluate.py", model="ds4-pystd (main)", note=(
        f"held-out sequence {fx_index} of heldout_sample.i32; HF DeepseekV4ForCausalLM float32 on the saved bf16 weights; "
        "argmax/margin/loss per position (loss[i] = -log p(tokens[i+1] | tokens[..i]))"),
        tokens=fx, argmax=m_arg[fx_index].tolist(), margin=[round(float(v), 5) for v in m_margin[fx_index]],
        loss=[round(float(v), 6) for v in m_nll[fx_index]], mean_loss=float(m_nll[fx_index].mean()))
    with open(os.path.join(a.out, "fixture_heldout512.json"), "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
    metrics.update(fixture_index=fx_index, fixture_mean_loss=fixture["mean_loss"])
    metrics["reference_consistency"] = consistency(main_m, fx, dev)
    print(f"reference consistency on the fixture: {metrics['reference_consistency']}", flush=True)

    tok = Tokenizer.from_file(os.path.join(a.work, "tokenizer", "tokenizer.json"))
    enc = pystd.plain_tokenizer(tok)
    demos = []
    for i, p in enumerate(PROMPTS):
        for bos in ([False, True] if i == 0 else [False]):
            ids = ([pystd.BOS_ID] if bos else []) + enc.encode(p, add_special_tokens=False).ids
            out = greedy(main_m, ids, a.demo_tokens, dev)
            demos.append(dict(model="main", prompt=p, bos=bos, prompt_ids=ids, ids=out,
                              text=tok.decode(out, skip_special_tokens=False)))
            print(f"--- main, bos={bos}: {p!r}\n{p}{demos[-1]['text']}\n---", flush=True)

    dr = load(a.drafter)
    d_nll, d_arg, _ = score(dr, hs, dev)
    agree = (d_arg[:, :-1] == m_arg[:, :-1]).float()
    metrics.update(drafter_params=sum(p.numel() for p in dr.parameters()), drafter_heldout_loss=float(d_nll.mean()),
                   drafter_greedy_agreement=float(agree.mean()))
    print(f"drafter: held-out loss {metrics['drafter_heldout_loss']:.5f}, greedy agreement with main "
          f"{metrics['drafter_greedy_agreement']:.4f}", flush=True)
    ids = enc.encode(PROMPTS[0], add_special_tokens=False).ids
    out = greedy(dr, ids, a.demo_tokens, dev)
    demos.append(dict(model="drafter", prompt=PROMPTS[0], bos=False, prompt_ids=ids, ids=out,
                      text=tok.decode(out, skip_special_tokens=False)))
    print(f"--- drafter: {PROMPTS[0]!r}\n{PROMPTS[0]}{demos[-1]['text']}\n---", flush=True)
    with open(os.path.join(a.out, "demo.json"), "w") as f:
        json.dump(demos, f, indent=1, ensure_ascii=False)
    metrics["eval_seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(a.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)


if __name__ == "__main__":
    main()
