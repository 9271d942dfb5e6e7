"""qwen3moe (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder): GQA with per-head q/k RMSNorm, NeoX RoPE, and
softmax -> top-k -> renormalise routing (llama.cpp `llm_build_qwen3moe`, norm_w hard-coded true).
"""

from __future__ import annotations

from strata.gguf_file import GGUFFile
from strata.models import common
from strata.models.base import MoEConfig, QKNorm, Routing, read_config

ARCH = "qwen3moe"


def config_from_gguf(gf: GGUFFile) -> MoEConfig:
    return read_config(gf, ARCH, rope_base=1e6, rope_neox=True, qk_norm=QKNorm.PER_HEAD,
                       routing=Routing.SOFTMAX_TOPK_RENORM)

def tensor_specs(cfg: MoEConfig) -> tuple[dict, dict]:
    req, opt = common.standard_tensors(cfg)
    for l in range(cfg.n_layer):
        req[f"blk.{l}.attn_q_norm.weight"] = (cfg.head_dim,)
        req[f"blk.{l}.attn_k_norm.weight"] = (cfg.head_dim,)
    return req, opt


def block(ops, cfg: MoEConfig, x, layer: int, pos):
    """x [T, D] -> [T, D]: x + attn(x), then + moe(norm(x))."""
    x = ops.add(x, common.attention(ops, cfg, x, layer, pos, QKNorm.PER_HEAD))
    h = ops.rms_norm(x, f"blk.{layer}.ffn_norm.weight", cfg.rms_eps)     # [T, D]
    return ops.add(x, common.routed_experts(ops, cfg, h, layer))
