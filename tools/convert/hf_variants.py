#!/usr/bin/env python3
"""transformers-saved DeepSeek-V4 directories of shapes that are not in the repo, for
checking ds4-convert (run on the GPU machine, where torch + transformers >= 5.17 are).

Each variant gets other widths, layer mixes, expert counts, rope/YaRN settings and save
options (bf16 / f16 weights, sharded files) than the committed fixtures. Parameters are
randomised with tools/reference/make_fixture.py's rules. Per variant: OUT/NAME/hf/
(save_pretrained output), tokens.json and logits.f32 (float32 CPU forward of the saved
weights, n_tokens x vocab). No self-consistency checks: these are converter inputs, the
committed fixtures are the parity references.

Usage: hf_variants.py OUT_DIR
"""
import json
import os
import sys

import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from make_fixture import randomize  # noqa: E402

VARIANTS = {
    # Deeper, wider, two leading sliding layers, 3 hash layers, HCA ratio 32, other YaRN
    # betas; bf16 weights in shards.
    "deep": dict(
        seed=11, save_dtype=torch.bfloat16, shard="400KB",
        config=dict(vocab_size=400, hidden_size=128, num_hidden_layers=6, num_attention_heads=8, head_dim=64,
                    partial_rotary_factor=0.125, q_lora_rank=64, o_groups=4, o_lora_rank=32,
                    n_routed_experts=32, num_experts_per_tok=6, moe_intermediate_size=64,
                    layer_types=["sliding_attention", "sliding_attention", "compressed_sparse_attention",
                                 "heavily_compressed_attention", "compressed_sparse_attention",
                                 "heavily_compressed_attention"],
                    mlp_layer_types=["hash_moe", "hash_moe", "hash_moe", "moe", "moe", "moe"],
                    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 32},
                    sliding_window=16, index_n_heads=16, index_head_dim=32, index_topk=4,
                    hc_mult=4, hc_sinkhorn_iters=10, swiglu_limit=7.0, routed_scaling_factor=2.0,
                    max_position_embeddings=2048,
                    rope_parameters=dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=256,
                                         beta_fast=16, beta_slow=2))),
    # HCA only (no indexer anywhere), no hash layers, one expert used, no YaRN.
    "hcaonly": dict(
        seed=12, save_dtype=torch.float32, shard=None,
        config=dict(vocab_size=270, hidden_size=160, num_hidden_layers=2, num_attention_heads=4, head_dim=40,
                    partial_rotary_factor=0.25, q_lora_rank=48, o_groups=2, o_lora_rank=24,
                    n_routed_experts=4, num_experts_per_tok=1, moe_intermediate_size=48,
                    layer_types=["heavily_compressed_attention", "heavily_compressed_attention"],
                    mlp_layer_types=["moe", "moe"],
                    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
                    sliding_window=6, index_n_heads=16, index_head_dim=16, index_topk=2,
                    hc_mult=4, hc_sinkhorn_iters=20, swiglu_limit=10.0, routed_scaling_factor=1.0,
                    max_position_embeddings=512, rope_theta=20000.0, compress_rope_theta=80000.0)),
    # Every layer CSA and hash-routed, 64 experts, one output group, 2 streams.
    "allcsa": dict(
        seed=13, save_dtype=torch.float16, shard=None,
        config=dict(vocab_size=300, hidden_size=64, num_hidden_layers=5, num_attention_heads=2, head_dim=128,
                    partial_rotary_factor=0.25, q_lora_rank=32, o_groups=1, o_lora_rank=64,
                    n_routed_experts=64, num_experts_per_tok=8, moe_intermediate_size=16,
                    layer_types=["compressed_sparse_attention"] * 5,
                    mlp_layer_types=["hash_moe"] * 5,
                    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
                    sliding_window=4, index_n_heads=16, index_head_dim=32, index_topk=2,
                    hc_mult=2, hc_sinkhorn_iters=3, swiglu_limit=5.0, routed_scaling_factor=1.5,
                    max_position_embeddings=1024,
                    rope_parameters=dict(rope_type="yarn", factor=2.0, original_max_position_embeddings=128,
                                         beta_fast=32, beta_slow=1))),
}


def make(name, spec, out_root, n_tokens=48):
    torch.manual_seed(spec["seed"])
    gen = torch.Generator().manual_seed(spec["seed"])
    cfg = DeepseekV4Config(**spec["config"])
    cfg._attn_implementation = "eager"
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    randomize(model, gen, cfg)
    # Reference = the weights as saved (rounded to the save dtype), computed in float32.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(spec["save_dtype"]).float())
    ids = torch.randint(0, cfg.vocab_size, (n_tokens,), generator=gen)
    with torch.no_grad():
        logits = model(input_ids=ids[None], use_cache=False).logits[0].float()
    out = os.path.join(out_root, name)
    hf = os.path.join(out, "hf")
    os.makedirs(hf, exist_ok=True)
    kw = dict(safe_serialization=True)
    if spec["shard"]:
        kw["max_shard_size"] = spec["shard"]
    model.to(spec["save_dtype"]).save_pretrained(hf, **kw)
    with open(os.path.join(out, "tokens.json"), "w") as f:
        json.dump([int(t) for t in ids], f)
    logits.contiguous().numpy().astype("<f4").tofile(os.path.join(out, "logits.f32"))
    print(name, "saved:", sorted(os.listdir(hf)), flush=True)


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    torch.set_num_threads(8)
    failed = []
    for name, spec in VARIANTS.items():
        try:
            make(name, spec, sys.argv[1])
        except Exception as e:  # report and go on: the other variants are still useful
            import traceback
            traceback.print_exc()
            failed.append(f"{name}: {e}")
    if failed:
        raise SystemExit("failed: " + "; ".join(failed))


if __name__ == "__main__":
    main()
