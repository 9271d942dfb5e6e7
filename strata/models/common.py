"""The transformer pieces the four MoE architectures share, written against a backend's ops.

A backend (`strata.reference.ops.RefOps`, the accel backends) supplies: embed, rms_norm, linear, add (a block's
residual sum, x + y in f32), add_bias, rope, attention, router_probs, topk (renormalised on request), experts, ffn,
sigmoid_gate and output, and qk_norm_rope (per-head RMSNorm of q and k, then RoPE: rms_norm and rope, composed
where a backend does not fuse them). Model code never branches on the
backend (STYLE point 6). Legend: T tokens, D hidden, H/Hkv heads, hd head size, E experts, K top-k.
"""

from __future__ import annotations

from strata.models.base import MoEConfig, QKNorm


def attention(ops, cfg: MoEConfig, x, layer: int, pos, qk_norm: QKNorm):
    """Pre-norm GQA self-attention; returns the block's output [T, D] (the caller adds the residual)."""
    p = f"blk.{layer}."
    T = x.shape[0]
    h = ops.rms_norm(x, p + "attn_norm.weight", cfg.rms_eps)            # [T, D]
    q = ops.linear(h, p + "attn_q.weight")                                # [T, H*hd]
    k = ops.linear(h, p + "attn_k.weight")                                # [T, Hkv*hd]
    v = ops.linear(h, p + "attn_v.weight")                                # [T, Hkv*hd]
    if cfg.qkv_bias:
        q = ops.add_bias(q, p + "attn_q.bias")
        k = ops.add_bias(k, p + "attn_k.bias")
        v = ops.add_bias(v, p + "attn_v.bias")
    if qk_norm is QKNorm.FULL:  # olmoe: over the whole projection, before the head split
        q = ops.rms_norm(q, p + "attn_q_norm.weight", cfg.rms_eps)
        k = ops.rms_norm(k, p + "attn_k_norm.weight", cfg.rms_eps)
    q = q.reshape(T, cfg.n_head, cfg.head_dim)                            # [T, H, hd]
    k = k.reshape(T, cfg.n_head_kv, cfg.head_dim)                         # [T, Hkv, hd]
    v = v.reshape(T, cfg.n_head_kv, cfg.head_dim)                         # [T, Hkv, hd]
    if qk_norm is QKNorm.PER_HEAD:  # qwen3moe: per head, after the split, then RoPE (one kernel on the GPU)
        q, k = ops.qk_norm_rope(q, k, p + "attn_q_norm.weight", p + "attn_k_norm.weight", cfg.rms_eps, pos, cfg)
    else:
        q = ops.rope(q, pos, cfg)                                         # [T, H, hd]
        k = ops.rope(k, pos, cfg)                                         # [T, Hkv, hd]
    o = ops.attention(layer, q, k, v, pos)                                # [T, H*hd]
    return ops.linear(o, p + "attn_output.weight")                        # [T, D]


def norm_then_rope(ops, q, k, qn: str, kn: str, eps: float, pos, cfg: MoEConfig):
    """`ops.qk_norm_rope` from the backend's rms_norm and rope (a backend that does not fuse them)."""
    return ops.rope(ops.rms_norm(q, qn, eps), pos, cfg), ops.rope(ops.rms_norm(k, kn, eps), pos, cfg)


def routed_experts(ops, cfg: MoEConfig, h, layer: int):
    """Router -> routing -> experts -> weighted combine in k order (SPEC §1, §3). h is the normed input."""
    p = f"blk.{layer}."
    probs = ops.router_probs(h, p + "ffn_gate_inp.weight")                # [T, E] softmax over all E
    # [T, K] ids, [T, K] weights (renormalised: w / sum_k w, the sum in k order; one kernel with the top-k on the GPU)
    ids, w = ops.topk(probs, cfg.n_expert_used, cfg.renormalise)
    return ops.experts(h, layer, ids, w)                                  # [T, D] sum_k w[t,k]·expert(h[t])


def shared_expert(ops, cfg: MoEConfig, h, layer: int):
    """qwen2moe: shared(h) · sigmoid(ffn_gate_inp_shexp · h)."""
    p = f"blk.{layer}."
    s = ops.ffn(h, p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight", p + "ffn_down_shexp.weight")
    return ops.sigmoid_gate(s, h, p + "ffn_gate_inp_shexp.weight")        # [T, D]


def head(ops, cfg: MoEConfig, x):
    h = ops.rms_norm(x, "output_norm.weight", cfg.rms_eps)                # [T, D]
    return ops.linear(h, "token_embd.weight" if cfg.tied_output else "output.weight")   # [T, V]


def standard_tensors(cfg: MoEConfig) -> tuple[dict, dict]:
    """ggml shapes (ne order) of the tensors every architecture here has; arch files add their own."""
    D, V, E, F = cfg.n_embd, cfg.n_vocab, cfg.n_expert, cfg.n_ff_exp
    req = {"token_embd.weight": (D, V), "output_norm.weight": (D,)}
    opt = {}
    if not cfg.tied_output:
        req["output.weight"] = (D, V)
    for l in range(cfg.n_layer):
        p = f"blk.{l}."
        req |= {
            p + "attn_norm.weight": (D,), p + "attn_q.weight": (D, cfg.n_q), p + "attn_k.weight": (D, cfg.n_kv),
            p + "attn_v.weight": (D, cfg.n_kv), p + "attn_output.weight": (cfg.n_q, D),
            p + "ffn_norm.weight": (D,), p + "ffn_gate_inp.weight": (D, E),
            p + "ffn_gate_exps.weight": (D, F, E), p + "ffn_up_exps.weight": (D, F, E),
            p + "ffn_down_exps.weight": (F, D, E),
        }
    return req, opt
