"""Shared pieces of the ds4-pystd training recipe: tokenizer, special tokens, model shapes.

Which files it trains on (the stdlib split, optional extra packages) is corpus.py.
"""
import importlib.util
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_tokenizer_fixture_module():
    # The tokenizer engineer's definition of the DeepSeek V3/V4 pre-tokenizer, used verbatim
    # (loaded by path: tools/reference/ has another make_fixture.py).
    path = os.path.join(HERE, "..", "reference", "tokenizer", "make_fixture.py")
    spec = importlib.util.spec_from_file_location("ds4_tokenizer_fixture", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_tf = _load_tokenizer_fixture_module()
deepseek_pre_tokenizer = _tf.deepseek_pre_tokenizer
BOS, EOS, PAD, USER, ASSISTANT, THINK, END_THINK = (_tf.BOS, _tf.EOS, _tf.PAD, _tf.USER, _tf.ASSISTANT,
                                                    _tf.THINK, _tf.END_THINK)

SPECIALS = [BOS, EOS, PAD, USER, ASSISTANT, THINK, END_THINK]   # ids 0..6
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2
VOCAB = 8192
SEQ = 512


def plain_tokenizer(tok):
    """A copy of `tok` that treats special-token strings as text (the engine's plain encode)."""
    from tokenizers import Tokenizer
    d = json.loads(tok.to_str())
    d["added_tokens"] = []
    return Tokenizer.from_str(json.dumps(d))


def sample_windows(stream, n_seq, seq):
    """n_seq windows of seq tokens at evenly spaced offsets (deterministic)."""
    import numpy as np
    stride = (stream.size - seq) // n_seq
    if stride < seq:
        raise SystemExit(f"stream of {stream.size} tokens is too short for {n_seq} x {seq}")
    return np.stack([stream[i * stride:i * stride + seq] for i in range(n_seq)]).astype(np.int64)


# ---------------------------------------------------------------- model shapes

# Same rope setup as DeepSeek-V4-Flash: plain 10000 on sliding layers, 160000 + YaRN
# (factor 16 over 65536, no magnitude scaling) on compressed ones. HF derives YaRN's factor
# consistency from max_position_embeddings, so that stays factor x original.
ROPE = dict(rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=1048576,
            rope_parameters=dict(rope_type="yarn", factor=16.0, original_max_position_embeddings=65536,
                                 beta_fast=32, beta_slow=1))

COMMON = dict(vocab_size=VOCAB, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
              tie_word_embeddings=False, compress_rates={"compressed_sparse_attention": 4,
                                                         "heavily_compressed_attention": 128},
              hc_mult=4, hc_sinkhorn_iters=20, swiglu_limit=10.0, routed_scaling_factor=1.5,
              n_shared_experts=1, partial_rotary_factor=0.25, sliding_window=64,
              index_n_heads=16, index_topk=16, **ROPE)

SHAPES = {
    # ~22M parameters: every V4 feature (sliding, CSA with indexer, HCA, hash + routed MoE, mHC).
    "main": dict(COMMON, hidden_size=256, num_hidden_layers=6, num_attention_heads=8, head_dim=64,
                 q_lora_rank=128, o_groups=4, o_lora_rank=64, n_routed_experts=16, num_experts_per_tok=2,
                 moe_intermediate_size=192, index_head_dim=32,
                 layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                              "compressed_sparse_attention", "heavily_compressed_attention",
                              "compressed_sparse_attention"],
                 mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe", "moe"]),
    # ~3M parameters, same tokenizer: the speculative-decoding drafter.
    "drafter": dict(COMMON, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, head_dim=32,
                    q_lora_rank=64, o_groups=2, o_lora_rank=32, n_routed_experts=8, num_experts_per_tok=2,
                    moe_intermediate_size=128, index_head_dim=16,
                    layer_types=["sliding_attention", "compressed_sparse_attention"],
                    mlp_layer_types=["hash_moe", "moe"]),
}
