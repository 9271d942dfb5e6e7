"""qwen2moe (Qwen1.5-MoE, Qwen2-57B-A14B; also our `flash-shape`): q/k/v biases, NeoX RoPE, softmax -> top-k
without renormalisation, plus a shared expert gated by sigmoid(ffn_gate_inp_shexp · x)
(llama.cpp `llm_build_qwen2moe`).
"""

from __future__ import annotations

from strata.gguf_file import GGUFFile
from strata.models import common
from strata.models.base import MoEConfig, QKNorm, Routing, read_config

ARCH = "qwen2moe"


def config_from_gguf(gf: GGUFFile) -> MoEConfig:
    return read_config(gf, ARCH, rope_base=1e6, rope_neox=True, qk_norm=QKNorm.NONE, routing=Routing.SOFTMAX_TOPK,
                       qkv_bias=True, shared_expert=True)

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
    x = ops.add(x, common.attention(ops, cfg, x, layer, pos, QKNorm.NONE))
    h = ops.rms_norm(x, f"blk.{layer}.ffn_norm.weight", cfg.rms_eps)     # [T, D]
    y = common.routed_experts(ops, cfg, h, layer)                         # [T, D]
    return ops.add(x, ops.add(y, common.shared_expert(ops, cfg, h, layer)))
