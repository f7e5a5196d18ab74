#!/usr/bin/env python3
"""Reference fixtures for the ds4 engine, computed with HF transformers' DeepseekV4ForCausalLM.

Runs on the GPU machine (torch + transformers >= 5.17); the computation itself is float32 on
the CPU so it is deterministic. For each fixture spec it:
  1. builds the model from a config, randomises EVERY parameter and persistent buffer (norm
     weights, sinks, position biases, hyper-connection base/scale, tid2eid, router bias too:
     HF's default init zeroes/ones many of them, which hides bugs);
  2. saves it with save_pretrained (the converter's input format) and checks that reloading
     the saved directory gives the same logits;
  3. records the one-shot logits of a random token sequence;
  4. refuses the fixture unless the reference is self-consistent (ARCHITECTURE.md §6): every
     prefix's logits equal the full run's, token-by-token decode with the cache equals the
     one-shot forward, and chunked prefill with the cache does too.

Output per fixture: OUT/NAME/hf/ (config.json, model.safetensors), tokens.json, logits.f32
(n_tokens x vocab, little-endian float32, row i = logits after token i) and meta.json.

Usage: make_fixture.py OUT_DIR [--only NAME ...] [--spec FILE.json]
"""
import argparse
import json
import math
import os
import sys
import time

import torch

from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
from transformers.cache_utils import DynamicCache

# Each spec: config overrides + sequence length + seed. Shapes are tiny but every feature is
# exercised: all three attention kinds, hash and routed MoE, sequences longer than the
# sliding window and several compressor windows, indexer top-k smaller than the number of
# compressed entries, YaRN, clamping of SwiGLU.
SPECS = {
    "mix": dict(
        seed=1, n_tokens=72,
        config=dict(vocab_size=320, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, head_dim=32,
                    partial_rotary_factor=0.25, q_lora_rank=32, o_groups=2, o_lora_rank=16,
                    n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                    layer_types=["sliding_attention", "compressed_sparse_attention",
                                 "heavily_compressed_attention", "compressed_sparse_attention"],
                    mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
                    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
                    sliding_window=8, index_n_heads=16, index_head_dim=16, index_topk=3,
                    hc_mult=4, hc_sinkhorn_iters=20, swiglu_limit=1.5, routed_scaling_factor=2.5,
                    max_position_embeddings=256,
                    rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64,
                                         beta_fast=32, beta_slow=1))),
    "flashlike": dict(
        seed=2, n_tokens=300,
        config=dict(vocab_size=288, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, head_dim=32,
                    partial_rotary_factor=0.25, q_lora_rank=32, o_groups=2, o_lora_rank=16,
                    n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
                    layer_types=["heavily_compressed_attention", "compressed_sparse_attention",
                                 "sliding_attention"],
                    mlp_layer_types=["hash_moe", "moe", "moe"],
                    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
                    sliding_window=16, index_n_heads=16, index_head_dim=16, index_topk=8,
                    hc_mult=4, hc_sinkhorn_iters=20, swiglu_limit=10.0, routed_scaling_factor=1.5,
                    max_position_embeddings=1048576,
                    rope_parameters=dict(rope_type="yarn", factor=16.0, original_max_position_embeddings=65536,
                                         beta_fast=32, beta_slow=1))),
    "wide": dict(
        seed=3, n_tokens=100,
        config=dict(vocab_size=300, hidden_size=96, num_hidden_layers=3, num_attention_heads=8, head_dim=48,
                    partial_rotary_factor=1.0 / 3.0, q_lora_rank=40, o_groups=4, o_lora_rank=12,
                    n_routed_experts=16, num_experts_per_tok=4, moe_intermediate_size=24,
                    layer_types=["compressed_sparse_attention", "compressed_sparse_attention",
                                 "sliding_attention"],
                    mlp_layer_types=["hash_moe", "moe", "moe"],
                    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
                    sliding_window=12, index_n_heads=16, index_head_dim=24, index_topk=5,
                    hc_mult=4, hc_sinkhorn_iters=7, swiglu_limit=3.0, routed_scaling_factor=1.0,
                    max_position_embeddings=4096, rope_theta=5000.0, compress_rope_theta=40000.0)),
}


def randomize(model, gen, cfg):
    """Gives every parameter and persistent buffer a random, sane value."""
    touched = set()
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if "inv_freq" in name:
                continue  # derived from the config, not stored
            leaf = name.split(".")[-1]
            if leaf == "tid2eid":
                rows = [torch.randperm(cfg.n_routed_experts, generator=gen)[: p.shape[1]] for _ in range(p.shape[0])]
                p.copy_(torch.stack(rows).to(p.dtype))
            elif leaf == "e_score_correction_bias":
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif leaf == "sinks":
                p.copy_(torch.randn(p.shape, generator=gen))
            elif leaf == "position_bias":
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif leaf in ("base", "hc_base"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif leaf in ("scale", "hc_scale"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif "norm" in name and p.dim() == 1:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif leaf == "gate_up_proj":
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
            elif leaf == "down_proj" and p.dim() == 3:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
            else:
                raise SystemExit(f"randomize: no rule for {name} {tuple(p.shape)}")
            touched.add(name)
    return touched


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max())


@torch.no_grad()
def forward_full(model, ids):
    return model(input_ids=ids[None], use_cache=False).logits[0].float()


@torch.no_grad()
def forward_cached(model, ids, chunk):
    cache = DynamicCache(config=model.config)
    out = []
    for s in range(0, len(ids), chunk):
        r = model(input_ids=ids[None, s:s + chunk], past_key_values=cache, use_cache=True)
        cache = r.past_key_values
        out.append(r.logits[0].float())
    return torch.cat(out, 0)


def make(name, spec, out_root, tol):
    t0 = time.time()
    torch.manual_seed(spec["seed"])
    gen = torch.Generator().manual_seed(spec["seed"])
    cfg = DeepseekV4Config(**spec["config"])
    cfg._attn_implementation = "eager"
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    touched = randomize(model, gen, cfg)
    n = spec["n_tokens"]
    ids = torch.randint(0, cfg.vocab_size, (n,), generator=gen)

    ref = forward_full(model, ids)
    checks = {}
    # Prefix consistency: a causal model's logits for a prefix equal the full run's rows.
    worst = 0.0
    for p in sorted(set([1, 2, 3, 5, 8, 13, n // 3, n // 2, n - 1])):
        if 0 < p < n:
            worst = max(worst, rel_err(forward_full(model, ids[:p]), ref[:p]))
    checks["prefix"] = worst
    checks["decode"] = rel_err(forward_cached(model, ids, 1), ref)
    for c in (5, 16):
        checks[f"chunk{c}"] = rel_err(forward_cached(model, ids, c), ref)
    bad = {k: v for k, v in checks.items() if not v <= tol}
    if bad:
        raise SystemExit(f"{name}: reference is not self-consistent: {bad}")

    out = os.path.join(out_root, name)
    hf = os.path.join(out, "hf")
    os.makedirs(hf, exist_ok=True)
    model.save_pretrained(hf, safe_serialization=True)
    reloaded = DeepseekV4ForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    checks["reload"] = rel_err(forward_full(reloaded, ids), ref)
    if checks["reload"] != 0.0:
        raise SystemExit(f"{name}: reloading the saved model changes logits ({checks['reload']})")
    with open(os.path.join(out, "tokens.json"), "w") as f:
        json.dump([int(t) for t in ids], f)
    ref.contiguous().numpy().astype("<f4").tofile(os.path.join(out, "logits.f32"))
    meta = dict(name=name, n_tokens=n, vocab=cfg.vocab_size, seed=spec["seed"],
                max_abs_logit=float(ref.abs().max()), self_consistency=checks,
                transformers=__import__("transformers").__version__, torch=torch.__version__,
                n_params=sum(p.numel() for p in model.parameters()), randomized=len(touched))
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{name}: ok in {time.time() - t0:.1f}s {json.dumps(checks)}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--spec", help="JSON file with extra specs {name: {seed, n_tokens, config}}")
    ap.add_argument("--tol", type=float, default=1e-5, help="self-consistency tolerance (max|d|/max|ref|)")
    ap.add_argument("--threads", type=int, default=8)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.set_default_dtype(torch.float32)
    specs = dict(SPECS)
    if a.spec:
        with open(a.spec) as f:
            specs.update(json.load(f))
    for name, spec in specs.items():
        if a.only and name not in a.only:
            continue
        make(name, spec, a.out, a.tol)


if __name__ == "__main__":
    sys.exit(main())
