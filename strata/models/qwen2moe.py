"""qwen2moe (Qwen1.5-MoE, Qwen2-57B-A14B; also our `flash-shape`): q/k/v biases, NeoX RoPE, softmax -> top-k
without renormalisation, plus a shared expert gated by sigmoid(ffn_gate_inp_shexp · x)
(llama.cpp `llm_build_qwen2moe`).
"""

from __future__ import annotations

from strata.gguf_file import GGUFFile
from strata.models import common
from strata.models.base import MoEConfig, QKNorm, Routing, meta_get, vocab_size

ARCH = "qwen2moe"


def config_from_gguf(gf: GGUFFile) -> MoEConfig:
    m = gf.metadata
    D = meta_get(m, ARCH, "embedding_length")
    H = meta_get(m, ARCH, "attention.head_count")
    hd = meta_get(m, ARCH, "attention.key_length", D // H)
    F = meta_get(m, ARCH, "expert_feed_forward_length")
    return MoEConfig(
        arch=ARCH, n_layer=meta_get(m, ARCH, "block_count"), n_embd=D, n_head=H,
        n_head_kv=meta_get(m, ARCH, "attention.head_count_kv", H), head_dim=hd,
        n_rot=meta_get(m, ARCH, "rope.dimension_count", hd),
        n_expert=meta_get(m, ARCH, "expert_count"), n_expert_used=meta_get(m, ARCH, "expert_used_count"),
        n_ff_exp=F, n_vocab=vocab_size(gf, ARCH),
        n_ctx_train=meta_get(m, ARCH, "context_length"), rope_base=meta_get(m, ARCH, "rope.freq_base", 1e6),
        rms_eps=meta_get(m, ARCH, "attention.layer_norm_rms_epsilon"), rope_neox=True,
        qk_norm=QKNorm.NONE, routing=Routing.SOFTMAX_TOPK, qkv_bias=True,
        n_ff_shexp=meta_get(m, ARCH, "expert_shared_feed_forward_length", F),
        tied_output="output.weight" not in gf.tensors,
    )


def tensor_specs(cfg: MoEConfig) -> tuple[dict, dict]:
    req, opt = common.standard_tensors(cfg)
    D, Fs = cfg.n_embd, cfg.n_ff_shexp
    for l in range(cfg.n_layer):
        p = f"blk.{l}."
        req |= {p + "attn_q.bias": (cfg.n_q,), p + "attn_k.bias": (cfg.n_kv,), p + "attn_v.bias": (cfg.n_kv,),
                p + "ffn_gate_inp_shexp.weight": (D,), p + "ffn_gate_shexp.weight": (D, Fs),
                p + "ffn_up_shexp.weight": (D, Fs), p + "ffn_down_shexp.weight": (Fs, D)}
    return req, opt


def block(ops, cfg: MoEConfig, x, layer: int, pos):
    """x [T, D] -> [T, D]: x + attn(x), then + routed(norm(x)) + shared(norm(x))."""
    x = x + common.attention(ops, cfg, x, layer, pos, QKNorm.NONE)
    h = ops.rms_norm(x, f"blk.{layer}.ffn_norm.weight", cfg.rms_eps)     # [T, D]
    y = common.routed_experts(ops, cfg, h, layer)                         # [T, D]
    return x + (y + common.shared_expert(ops, cfg, h, layer))
