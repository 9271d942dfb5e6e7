"""olmoe (OLMoE-1B-7B): q/k RMSNorm over the whole projection (not per head), NeoX RoPE, softmax -> top-k without
renormalisation (llama.cpp `llm_build_olmoe`; norm_topk_prob false in the released config).
"""

from __future__ import annotations

from strata.gguf_file import GGUFFile
from strata.models import common
from strata.models.base import MoEConfig, QKNorm, Routing, read_config

ARCH = "olmoe"


def config_from_gguf(gf: GGUFFile) -> MoEConfig:
    return read_config(gf, ARCH, rope_base=1e4, rope_neox=True, qk_norm=QKNorm.FULL, routing=Routing.SOFTMAX_TOPK)

def tensor_specs(cfg: MoEConfig) -> tuple[dict, dict]:
    req, opt = common.standard_tensors(cfg)
    for l in range(cfg.n_layer):
        req[f"blk.{l}.attn_q_norm.weight"] = (cfg.n_q,)
        req[f"blk.{l}.attn_k_norm.weight"] = (cfg.n_kv,)
    return req, opt


def block(ops, cfg: MoEConfig, x, layer: int, pos):
    """x [T, D] -> [T, D]: x + attn(x), then + moe(norm(x))."""
    x = ops.add(x, common.attention(ops, cfg, x, layer, pos, QKNorm.FULL))
    h = ops.rms_norm(x, f"blk.{layer}.ffn_norm.weight", cfg.rms_eps)     # [T, D]
    return ops.add(x, common.routed_experts(ops, cfg, h, layer))
