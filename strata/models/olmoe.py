"""olmoe (OLMoE-1B-7B): q/k RMSNorm over the whole projection (not per head), NeoX RoPE, softmax -> top-k without
renormalisation (llama.cpp `llm_build_olmoe`; norm_topk_prob false in the released config).
"""

from __future__ import annotations

from strata.gguf_file import GGUFFile
from strata.models import common
from strata.models.base import MoEConfig, QKNorm, Routing, meta_get, vocab_size

ARCH = "olmoe"


def config_from_gguf(gf: GGUFFile) -> MoEConfig:
    m = gf.metadata
    D = meta_get(m, ARCH, "embedding_length")
    H = meta_get(m, ARCH, "attention.head_count")
    hd = meta_get(m, ARCH, "attention.key_length", D // H)
    return MoEConfig(
        arch=ARCH, n_layer=meta_get(m, ARCH, "block_count"), n_embd=D, n_head=H,
        n_head_kv=meta_get(m, ARCH, "attention.head_count_kv", H), head_dim=hd,
        n_rot=meta_get(m, ARCH, "rope.dimension_count", hd),
        n_expert=meta_get(m, ARCH, "expert_count"), n_expert_used=meta_get(m, ARCH, "expert_used_count"),
        # the converter writes the expert size as feed_forward_length (notes/tooling.md §2.2)
        n_ff_exp=meta_get(m, ARCH, "expert_feed_forward_length", None, required=False)
        or meta_get(m, ARCH, "feed_forward_length"),
        n_vocab=vocab_size(gf, ARCH),
        n_ctx_train=meta_get(m, ARCH, "context_length"), rope_base=meta_get(m, ARCH, "rope.freq_base", 1e4),
        rms_eps=meta_get(m, ARCH, "attention.layer_norm_rms_epsilon"), rope_neox=True,
        qk_norm=QKNorm.FULL, routing=Routing.SOFTMAX_TOPK,
        tied_output="output.weight" not in gf.tensors,
    )


def tensor_specs(cfg: MoEConfig) -> tuple[dict, dict]:
    req, opt = common.standard_tensors(cfg)
    for l in range(cfg.n_layer):
        req[f"blk.{l}.attn_q_norm.weight"] = (cfg.n_q,)
        req[f"blk.{l}.attn_k_norm.weight"] = (cfg.n_kv,)
    return req, opt


def block(ops, cfg: MoEConfig, x, layer: int, pos):
    """x [T, D] -> [T, D]: x + attn(x), then + moe(norm(x))."""
    x = x + common.attention(ops, cfg, x, layer, pos, QKNorm.FULL)
    h = ops.rms_norm(x, f"blk.{layer}.ffn_norm.weight", cfg.rms_eps)     # [T, D]
    return x + common.routed_experts(ops, cfg, h, layer)
