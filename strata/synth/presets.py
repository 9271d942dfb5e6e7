"""Model shapes and quant mixes the synthesiser (and the simulator) know by name.

Full-size shapes copy the released models' config.json values (the source is named on each); the tiny ones are
ours, sized for tests and golden files (each file <= 2 MB). Legend: L layers, D hidden, E experts, K top-k,
F expert FFN, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# ggml type ids (gguf.GGMLQuantizationType) by name, so this module needs neither numpy nor gguf.
GGML = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q8_1": 9, "Q2_K": 10, "Q3_K": 11,
    "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q8_K": 15, "IQ2_XXS": 16, "IQ2_XS": 17, "IQ3_XXS": 18, "IQ1_S": 19,
    "IQ4_NL": 20, "IQ3_S": 21, "IQ2_S": 22, "IQ4_XS": 23, "IQ1_M": 29, "BF16": 30, "MXFP4": 39, "Q2_0": 42,
    "TIED": -1,  # output role only: no output.weight, the head reuses token_embd
}
# (weights per block, bytes per block): ggml's type traits (ggml.c `type_traits`).
BLOCK = {
    0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
    23: (256, 136), 29: (256, 56), 39: (32, 17), 42: (64, 18),
}

# Roles a quant mix assigns a type to. Per-layer overrides use "role@layer" keys, e.g. "exp_gate@1".
ROLES = ("embd", "output", "attn_q", "attn_k", "attn_v", "attn_output", "router", "exp_gate", "exp_up",
         "exp_down", "shexp", "shexp_gate", "norm")


def row_bytes(qtype: int, n: int) -> int:
    q, s = BLOCK[qtype]
    assert n % q == 0, f"a row of {n} weights is not a whole number of {q}-weight blocks (type {qtype})"
    return n // q * s


@dataclass(frozen=True, slots=True)
class ModelShape:
    arch: str                  # general.architecture
    n_layer: int               # L
    n_embd: int                # D
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int              # E
    n_expert_used: int         # K
    n_ff_exp: int              # F
    n_vocab: int               # V
    n_ctx: int = 4096
    n_ff_shexp: int = 0        # shared expert FFN (qwen2moe); 0 = none
    rope_base: float = 1e6
    rms_eps: float = 1e-6
    types: dict = field(default_factory=dict)   # role -> ggml type id (see ROLES)

    def type_of(self, role: str, layer: int | None = None) -> int:
        if layer is not None and f"{role}@{layer}" in self.types:
            return self.types[f"{role}@{layer}"]
        if role in self.types:
            return self.types[role]
        if role in ("exp_up", "exp_down") and "exp_gate" in self.types:
            return self.types["exp_gate"]
        return GGML["F32"] if role in ("norm", "router", "shexp_gate") else GGML["Q8_0"]

    def expert_blob_bytes(self, layer: int = 0) -> int:
        """Bytes of one expert's [gate | up | down] blob (SPEC §1)."""
        g = row_bytes(self.type_of("exp_gate", layer), self.n_embd) * self.n_ff_exp
        u = row_bytes(self.type_of("exp_up", layer), self.n_embd) * self.n_ff_exp
        d = row_bytes(self.type_of("exp_down", layer), self.n_ff_exp) * self.n_embd
        return g + u + d

    def with_types(self, **types: str) -> "ModelShape":
        t = dict(self.types)
        t.update({k.replace("_AT_", "@"): GGML[v] for k, v in types.items()})
        return replace(self, types=t)


def _mix(**kw: str) -> dict:
    return {k.replace("_AT_", "@"): GGML[v] for k, v in kw.items()}


_Q4K = _mix(embd="Q4_K", output="Q6_K", attn_q="Q4_K", attn_k="Q4_K", attn_v="Q6_K", attn_output="Q4_K",
            exp_gate="Q4_K", exp_up="Q4_K", exp_down="Q4_K", shexp="Q8_0")

PRESETS: dict[str, ModelShape] = {
    # Qwen/Qwen3-30B-A3B config.json
    "qwen3-30b-a3b": ModelShape("qwen3moe", 48, 2048, 32, 4, 128, 128, 8, 768, 151936, n_ctx=40960,
                                rope_base=1e6, types=_Q4K),
    # Qwen/Qwen3-235B-A22B config.json
    "qwen3-235b-a22b": ModelShape("qwen3moe", 94, 4096, 64, 4, 128, 128, 8, 1536, 151936, n_ctx=40960,
                                  rope_base=1e6, types=_Q4K),
    # mistralai/Mixtral-8x7B-v0.1 config.json (GGUF arch `llama`)
    "mixtral-8x7b": ModelShape("llama", 32, 4096, 32, 8, 128, 8, 2, 14336, 32000, n_ctx=32768,
                               rope_base=1e6, rms_eps=1e-5, types=_Q4K),
    # allenai/OLMoE-1B-7B-0924 config.json
    "olmoe-1b-7b": ModelShape("olmoe", 16, 2048, 16, 16, 128, 64, 8, 1024, 50304, n_ctx=4096,
                              rope_base=1e4, rms_eps=1e-5, types=_Q4K),
    # The original engine's expert geometry (notes/original-source.md §8.1) as a qwen2moe file: 48 layers,
    # 512 experts, top-10, D 2560, F 640, one shared expert of F 640. Attention is ours (plain GQA).
    "flash-shape": ModelShape("qwen2moe", 48, 2560, 20, 4, 128, 512, 10, 640, 151936, n_ctx=32768,
                              n_ff_shexp=640, rope_base=1e7,
                              types=_mix(embd="Q4_K", output="Q6_K", attn_q="Q4_K", attn_k="Q4_K",
                                         attn_v="Q6_K", attn_output="Q4_K", exp_gate="IQ2_XS",
                                         exp_up="IQ2_XS", exp_down="IQ4_NL", shexp="Q8_0")),
}


# --- tiny presets: ours, <= 2 MB each, for tests and golden files. Between them they cover every weight type of
# SPEC §1's required list (K- and i-quants included); vocabularies come from the shared tiny BPE (1,024 tokens).
_TINY_V = 1024
PRESETS |= {
    "tiny-qwen3moe": ModelShape(
        "qwen3moe", 2, 256, 4, 2, 64, 8, 2, 128, _TINY_V, n_ctx=512, rope_base=1e6,
        types=_mix(embd="Q4_K", output="Q6_K", attn_q="Q5_K", attn_k="Q5_K", attn_v="Q8_0", attn_output="Q4_0",
                   exp_gate_AT_0="Q4_K", exp_up_AT_0="Q4_K", exp_down_AT_0="Q8_0",
                   exp_gate_AT_1="IQ2_XS", exp_up_AT_1="IQ2_XS", exp_down_AT_1="IQ4_NL")),
    "tiny-mixtral": ModelShape(
        "llama", 2, 256, 4, 2, 64, 4, 2, 256, _TINY_V, n_ctx=512, rope_base=1e6, rms_eps=1e-5,
        types=_mix(embd="Q8_0", output="TIED", attn_q="Q4_1", attn_k="Q5_0", attn_v="Q5_1", attn_output="Q4_1",
                   exp_gate_AT_0="Q3_K", exp_up_AT_0="Q3_K", exp_down_AT_0="Q6_K",
                   exp_gate_AT_1="IQ3_XXS", exp_up_AT_1="IQ3_XXS", exp_down_AT_1="Q5_K")),
    "tiny-qwen2moe": ModelShape(
        "qwen2moe", 2, 256, 4, 4, 64, 8, 2, 128, _TINY_V, n_ctx=512, n_ff_shexp=128, rope_base=1e6,
        types=_mix(embd="Q5_K", output="Q8_0", attn_q="Q6_K", attn_k="Q6_K", attn_v="Q8_0", attn_output="Q5_1",
                   router="BF16", shexp="Q8_0", shexp_gate="F16",
                   exp_gate_AT_0="IQ3_S", exp_up_AT_0="IQ3_S", exp_down_AT_0="Q5_0",
                   exp_gate_AT_1="Q2_K", exp_up_AT_1="Q2_K", exp_down_AT_1="Q4_1")),
    "tiny-olmoe": ModelShape(
        "olmoe", 2, 256, 4, 4, 64, 8, 2, 128, _TINY_V, n_ctx=512, rope_base=1e4, rms_eps=1e-5,
        types=_mix(embd="F16", output="Q4_K", attn_q="Q8_0", attn_k="Q8_0", attn_v="Q4_0", attn_output="Q8_0",
                   exp_gate_AT_0="IQ4_XS", exp_up_AT_0="IQ4_XS", exp_down_AT_0="Q5_1",
                   exp_gate_AT_1="IQ2_XXS", exp_up_AT_1="IQ2_XXS", exp_down_AT_1="Q2_0")),
}
