#!/usr/bin/env python3
"""Trains one ds4-pystd model (DeepseekV4ForCausalLM) on the token stream of prepare_data.py.

  train_lm.py WORK --shape main|drafter --out DIR [--seconds S | --steps N] [--init-from HF_DIR]

AdamW (decay 0.1 on matrices), bf16 autocast, linear warm-up then cosine to 10% of the peak,
random 512-token windows of the train stream. With --seconds the step count is fixed after
the first timed steps so the cosine schedule ends on time. --init-from continues from the
weights of a saved model (optimizer state does not travel back from the GPU machine, so a
continuation restarts the moments with a short warm-up).

Routing: hash layers get a fixed random token -> 2 distinct experts table (tid2eid, seed 1234);
routed layers use DeepSeek's auxiliary-loss-free balancing: after every step each router's
e_score_correction_bias moves by +-gamma towards equal expert load.

Training runs the routed experts as one dense batched product over all experts weighted by
the (sparse) routing weights: the same function as HF's per-expert loop, without its host
synchronisations. Evaluation (evaluate.py) uses HF's own code.

Every --val-every steps the loss on a fixed sample of the validation stream is measured and
the best weights are kept; those are saved (so a run that starts to overfit the small corpus
keeps its best point). --attn-dropout applies to the attention probabilities during training
only (the saved config keeps 0).

Writes DIR/hf (save_pretrained, bf16 safetensors, shards <= 14 MB) and DIR/train.json.
"""
import argparse
import json
import math
import os
import sys
import time
import types

import numpy as np
import torch
import torch.nn.functional as F

from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pystd  # noqa: E402


def dense_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    route = torch.zeros(hidden_states.shape[0], self.num_experts, dtype=top_k_weights.dtype,
                        device=hidden_states.device).scatter(1, top_k_index, top_k_weights)
    gate_up = torch.matmul(hidden_states.unsqueeze(0), self.gate_up_proj.transpose(1, 2))   # [E, T, 2I]
    act = self._apply_gate(gate_up)
    out = torch.matmul(act, self.down_proj.transpose(1, 2))                                 # [E, T, D]
    return torch.einsum("etd,te->td", out, route.to(out.dtype))


def experts_modules(model):
    return [m for m in model.modules() if type(m).__name__ == "DeepseekV4Experts"]


def use_dense_experts(model, on):
    for m in experts_modules(model):
        if on:
            m.forward = types.MethodType(dense_experts_forward, m)
        elif "forward" in m.__dict__:
            del m.forward


def build(shape, seed):
    torch.manual_seed(seed)
    cfg = DeepseekV4Config(**pystd.SHAPES[shape])
    cfg._attn_implementation = "eager"
    model = DeepseekV4ForCausalLM(cfg)
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("tid2eid"):
                rows = [torch.randperm(cfg.n_routed_experts, generator=g)[: buf.shape[1]] for _ in range(buf.shape[0])]
                buf.copy_(torch.stack(rows).to(buf.dtype))
    return model


def batches(stream, batch, seq, gen):
    n = stream.size - seq
    while True:
        starts = torch.randint(0, n, (batch,), generator=gen).numpy()
        idx = starts[:, None] + np.arange(seq)[None, :]
        yield torch.from_numpy(stream[idx].astype(np.int64))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("--shape", choices=sorted(pystd.SHAPES), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=0)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--gamma", type=float, default=1e-3, help="balancing bias step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init-from")
    ap.add_argument("--attn-dropout", type=float, default=0.0)
    ap.add_argument("--val-every", type=int, default=50)
    ap.add_argument("--val-seqs", type=int, default=32)
    ap.add_argument("--check-dense", action="store_true", help="compare dense experts with HF's loop first")
    a = ap.parse_args()
    if not (a.seconds > 0) ^ (a.steps > 0):
        raise SystemExit("give exactly one of --seconds / --steps")
    torch.backends.cuda.matmul.allow_tf32 = False   # the dense-experts check compares in true fp32
    dev = torch.device("cuda")
    t_start = time.time()

    stream = np.fromfile(os.path.join(a.work, "lm_train.u16"), dtype="<u2")
    val_stream = np.fromfile(os.path.join(a.work, "val.u16"), dtype="<u2")
    a.val_seqs = max(1, min(a.val_seqs, (val_stream.size - pystd.SEQ) // pystd.SEQ))
    val = torch.from_numpy(pystd.sample_windows(val_stream, a.val_seqs, pystd.SEQ))
    if a.init_from:
        model = DeepseekV4ForCausalLM.from_pretrained(a.init_from, dtype=torch.float32, attn_implementation="eager")
    else:
        model = build(a.shape, a.seed)
    cfg = model.config
    model.to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    n_expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    print(f"[{a.shape}] parameters {n_params / 1e6:.3f}M (routed experts {n_expert / 1e6:.3f}M)", flush=True)

    gen = torch.Generator().manual_seed(1000 + a.seed + (7 if a.shape == "drafter" else 0))
    data = batches(stream, a.batch, pystd.SEQ, gen)

    if a.check_dense:
        x = next(data)[:4].to(dev)
        model.eval()
        with torch.no_grad():
            ref = model(input_ids=x, use_cache=False).logits.float()
            use_dense_experts(model, True)
            got = model(input_ids=x, use_cache=False).logits.float()
            use_dense_experts(model, False)
        print(f"[{a.shape}] dense-vs-HF experts, fp32: max|d|/max|ref| = "
              f"{float((got - ref).abs().max() / ref.abs().max()):.2e}", flush=True)
    use_dense_experts(model, True)
    torch.backends.cuda.matmul.allow_tf32 = True
    for m in model.modules():
        if type(m).__name__ == "DeepseekV4Attention":
            m.attention_dropout = a.attn_dropout
    model.train()
    val = val.to(dev)

    @torch.no_grad()
    def val_loss():
        model.eval()
        tot = torch.zeros((), device=dev)
        for i in range(0, val.shape[0], 16):
            x = val[i:i + 16]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                lg = model(input_ids=x, use_cache=False).logits
            tot += F.cross_entropy(lg[:, :-1].float().reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1),
                                   reduction="sum")
        model.train()
        return float(tot) / (val.shape[0] * (val.shape[1] - 1))

    best = dict(loss=float("inf"), step=0, state=None)
    val_log = []

    def check_val(step):
        try:
            v = val_loss()
        except Exception as e:  # the selection is a safety net; never lose the run over it
            print(f"[{a.shape}] validation failed at step {step}: {e!r}", flush=True)
            return float("nan")
        val_log.append((step, v))
        if v < best["loss"]:
            best.update(loss=v, step=step,
                        state={k: t.detach().clone() for k, t in model.state_dict().items()})
        return v

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed_tokens" not in n else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)

    routers = [m for m in model.modules() if type(m).__name__ == "DeepseekV4TopKRouter"]
    counts = {id(r): torch.zeros(r.num_experts, device=dev) for r in routers}

    def count_hook(mod, _inp, out):
        if mod.training:
            counts[id(mod)] += torch.bincount(out[2].reshape(-1), minlength=mod.num_experts).float()
    hooks = [r.register_forward_hook(count_hook) for r in routers]

    total = a.steps if a.steps else None
    warmup = min(a.warmup, max(1, (a.steps or 10 ** 9) // 10))

    def lr_at(step):
        if step < warmup:
            return a.lr * (step + 1) / warmup
        if total is None:
            return a.lr
        prog = min(1.0, (step - warmup) / max(1, total - warmup))
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))

    log, losses, step = [], [], 0
    t_train = time.time()
    t_mark, mark_step = None, 0
    acc = torch.zeros((), device=dev)
    while True:
        if total is not None and step >= total:
            break
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step)
        x = next(data).to(dev, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            for r in routers:
                c = counts[id(r)]
                r.e_score_correction_bias += a.gamma * torch.sign(c.mean() - c)
                c.zero_()
        acc += loss.detach()
        step += 1
        if step == 5:
            torch.cuda.synchronize()
            t_mark, mark_step = time.time(), step
        if total is None and step == 25:
            torch.cuda.synchronize()
            per = (time.time() - t_mark) / (step - mark_step)
            left = a.seconds - (time.time() - t_start)
            total = step + max(0, int(left / per))
            print(f"[{a.shape}] {per * 1000:.1f} ms/step -> {total} steps in {a.seconds:.0f}s", flush=True)
        vtxt = ""
        if step % a.val_every == 0 or step == total:
            vtxt = f" val {check_val(step):.4f}"
        if step % 25 == 0 or step == total:
            mean = float(acc) / (25 if step % 25 == 0 else step % 25)
            acc.zero_()
            losses.append((step, mean))
            el = time.time() - t_train
            log.append(dict(step=step, loss=mean, lr=lr_at(step - 1), gnorm=float(gnorm), t=round(el, 1)))
            if step % 100 == 0 or step == total or step <= 50:
                print(f"[{a.shape}] step {step} loss {mean:.4f}{vtxt} lr {lr_at(step - 1):.2e} "
                      f"gnorm {float(gnorm):.2f} {el:.0f}s", flush=True)
    torch.cuda.synchronize()
    t_done = time.time()
    steady = (t_done - t_mark) / (step - mark_step) if t_mark and step > mark_step else float("nan")
    print(f"[{a.shape}] steady {steady * 1000:.1f} ms/step, {a.batch * pystd.SEQ / steady:.0f} tokens/s", flush=True)
    for h in hooks:
        h.remove()
    if step % a.val_every != 0 and step != total:
        check_val(step)
    last_val = val_log[-1][1] if val_log else float("nan")
    if best["state"] is not None:
        model.load_state_dict(best["state"])
    print(f"[{a.shape}] keeping step {best['step']} (val {best['loss']:.4f}; last step {step} val {last_val:.4f})",
          flush=True)
    use_dense_experts(model, False)
    for m in model.modules():
        if type(m).__name__ == "DeepseekV4Attention":
            m.attention_dropout = 0.0
    bias = [r.e_score_correction_bias.detach().float().cpu() for r in routers]

    model.eval()
    model.to(torch.bfloat16)
    hf_dir = os.path.join(a.out, "hf")
    model.save_pretrained(hf_dir, max_shard_size="14MB", safe_serialization=True)
    tokens_seen = step * a.batch * pystd.SEQ
    info = dict(shape=a.shape, config=pystd.SHAPES[a.shape], params=n_params, routed_expert_params=n_expert,
                steps=step, batch=a.batch, seq=pystd.SEQ, tokens_seen=tokens_seen,
                epochs=tokens_seen / stream.size, lr=a.lr, warmup=warmup, gamma=a.gamma,
                init_from=a.init_from, train_seconds=round(t_done - t_train, 1),
                ms_per_step=round(1000 * (t_done - t_train) / max(1, step), 1), ms_per_step_steady=round(1000 * steady, 1),
                peak_mem_gb=round(torch.cuda.max_memory_allocated() / 2 ** 30, 2),
                final_train_loss_last100=float(np.mean([l for s, l in losses[-4:]])) if losses else None,
                router_bias_absmax=[float(b.abs().max()) for b in bias], attn_dropout=a.attn_dropout,
                kept_step=best["step"], kept_val_loss=best["loss"], last_val_loss=last_val,
                val_seqs=a.val_seqs, val_log=val_log, log=log)
    with open(os.path.join(a.out, "train.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"[{a.shape}] done: {step} steps, {tokens_seen / 1e6:.1f}M tokens ({info['epochs']:.2f} epochs), "
          f"{info['ms_per_step']} ms/step, peak {info['peak_mem_gb']} GB, last loss "
          f"{info['final_train_loss_last100']}, saved in {time.time() - t_done:.1f}s", flush=True)


if __name__ == "__main__":
    main()
