"""llama with experts (Mixtral 8x7B/8x22B): normal (non-NeoX) RoPE over q/k rows that the converter permuted
for it, no q/k norm, softmax -> top-k -> renormalise (llama.cpp `llm_build_llama` with n_expert > 0).
"""

from __future__ import annotations

from strata.gguf_file import GGUFFile
from strata.models import common
from strata.models.base import MoEConfig, QKNorm, Routing, read_config, UnsupportedArchitecture, meta_get

ARCH = "llama"


def config_from_gguf(gf: GGUFFile) -> MoEConfig:
    m = gf.metadata
    if not meta_get(m, ARCH, "expert_count", 0):
        raise UnsupportedArchitecture(f"{gf.path}: a `llama` file without experts is a dense model; Strata runs "
                                      f"Mixture-of-Experts models (llama with {ARCH}.expert_count > 0)")
    if "blk.0.ffn_gate.0.weight" in gf.tensors:
        raise UnsupportedArchitecture(f"{gf.path}: experts stored one tensor each (blk.N.ffn_gate.E.weight, "
                                      f"the pre-2024 Mixtral layout); re-convert with a current llama.cpp")
    return read_config(gf, ARCH, rope_base=1e4, rope_neox=False, qk_norm=QKNorm.NONE,
                       routing=Routing.SOFTMAX_TOPK_RENORM)


def tensor_specs(cfg: MoEConfig) -> tuple[dict, dict]:
    return common.standard_tensors(cfg)


def block(ops, cfg: MoEConfig, x, layer: int, pos):
    """x [T, D] -> [T, D]: x + attn(x), then + moe(norm(x))."""
    x = ops.add(x, common.attention(ops, cfg, x, layer, pos, QKNorm.NONE))
    h = ops.rms_norm(x, f"blk.{layer}.ffn_norm.weight", cfg.rms_eps)     # [T, D]
    return ops.add(x, common.routed_experts(ops, cfg, h, layer))
