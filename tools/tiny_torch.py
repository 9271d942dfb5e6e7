"""strata-tiny in torch: the qwen3moe function exactly as `strata/models/qwen3moe.py` wires it and
docs/NUMERICS.md defines it, for training (float32) and as the perplexity/logit oracle (float32 or float64).

Block (llama.cpp `llm_build_qwen3moe`): x += o(attn(rope(qnorm(q(n(x)))), rope(knorm(k(n(x)))), v(n(x))));
x += Σ_k w_k · down(silu(gate h) * (up h)) with h = n'(x), softmax over all E router logits -> top-K ->
renormalise over the K. Head: output(norm(x)), untied. Weights keep the GGUF names (STYLE point 2) and numpy
shapes (= ggml `ne` reversed), so export and import are a name match.

Legend: B batch, T tokens, D hidden, H/Hkv heads, hd head size, E experts, K top-k, F expert FFN,
V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as Fn


@dataclass(frozen=True, slots=True)
class TinyConfig:
    n_layer: int = 4  # L
    n_embd: int = 256  # D: a multiple of 256, so Q4_K rows fit (QK_K = 256)
    n_head: int = 4  # H
    n_head_kv: int = 2  # Hkv (GQA, 2 query heads per key/value head)
    head_dim: int = 64  # hd; H*hd = 256, so attn_output rows are Q4_K-encodable too
    n_expert: int = 16  # E
    n_expert_used: int = 2  # K
    n_ff_exp: int = 64  # F (down rows of 64: Q8_0 in the K-quant file too)
    n_vocab: int = 2048  # V (byte-level BPE incl. 3 specials)
    n_ctx: int = 512  # context the model is trained for (rope positions)
    rope_base: float = 10000.0
    rms_eps: float = 1e-6

    def __post_init__(self):
        assert self.n_head % self.n_head_kv == 0, "query heads must be a multiple of key/value heads (GQA)"
        assert self.n_expert_used <= self.n_expert, "top-k cannot exceed the expert count"
        assert self.head_dim % 2 == 0, "NeoX RoPE rotates pairs (i, i + hd/2)"
        assert self.n_ff_exp % 32 == 0 and self.n_embd % 32 == 0, "rows must be whole Q8_0 blocks (32)"

    def to_dict(self) -> dict:
        return asdict(self)


def tensor_shapes(c: TinyConfig) -> dict[str, tuple[int, ...]]:
    """numpy shapes (ggml ne reversed) of every tensor, in GGUF names, in export order."""
    D, E, F, V = c.n_embd, c.n_expert, c.n_ff_exp, c.n_vocab
    out = {"token_embd.weight": (V, D)}
    for l in range(c.n_layer):
        p = f"blk.{l}."
        out |= {
            p + "attn_norm.weight": (D,),
            p + "attn_q.weight": (c.n_head * c.head_dim, D),
            p + "attn_k.weight": (c.n_head_kv * c.head_dim, D),
            p + "attn_v.weight": (c.n_head_kv * c.head_dim, D),
            p + "attn_q_norm.weight": (c.head_dim,),
            p + "attn_k_norm.weight": (c.head_dim,),
            p + "attn_output.weight": (D, c.n_head * c.head_dim),
            p + "ffn_norm.weight": (D,),
            p + "ffn_gate_inp.weight": (E, D),
            p + "ffn_gate_exps.weight": (E, F, D),
            p + "ffn_up_exps.weight": (E, F, D),
            p + "ffn_down_exps.weight": (E, D, F),
        }
    return out | {"output_norm.weight": (D,), "output.weight": (V, D)}


def rope_cos_sin(n_pos: int, hd: int, base: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """[P, hd/2]: angle p·base^(-2i/hd) in float64 rounded once to float32 (`strata.mathfn.rope_table`)."""
    i = torch.arange(hd // 2, dtype=torch.float64)
    inv = base ** (-2.0 * i / hd)
    ang = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float().to(dtype), ang.sin().float().to(dtype)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Over the last axis: (x / rms(x)) · w (ggml `rms_norm` then a multiply by the weight)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, hd], cos/sin [T, hd/2]: pairs (i, i + hd/2) rotated (ggml `rope_f32`, NeoX mode)."""
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


class TinyMoE(torch.nn.Module):
    """Parameters live in `self.w` under their GGUF names (dots -> '/' because ParameterDict forbids dots)."""

    def __init__(self, cfg: TinyConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        g = torch.Generator().manual_seed(seed)
        self.w = torch.nn.ParameterDict()
        for name, shape in tensor_shapes(cfg).items():
            if name.endswith("norm.weight"):
                t = torch.ones(shape)
            else:  # N(0, 0.02); projections back into the residual scaled by 1/sqrt(2L) (GPT-2 init)
                std = (
                    0.02 / math.sqrt(2 * cfg.n_layer)
                    if ("attn_output" in name or "down_exps" in name)
                    else 0.02
                )
                t = torch.randn(shape, generator=g) * std
            self.w[name.replace(".", "/")] = torch.nn.Parameter(t)
        cos, sin = rope_cos_sin(cfg.n_ctx, cfg.head_dim, cfg.rope_base, torch.float32)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def p(self, name: str) -> torch.Tensor:
        return self.w[name.replace(".", "/")]

    def state_gguf(self) -> dict[str, torch.Tensor]:
        """GGUF name -> tensor (numpy shape)."""
        return {k.replace("/", "."): v.detach() for k, v in self.w.items()}

    def load_gguf_state(self, state: dict[str, torch.Tensor]) -> None:
        want = tensor_shapes(self.cfg)
        assert set(state) == set(want), f"tensor names differ: {sorted(set(state) ^ set(want))[:6]}"
        with torch.no_grad():
            for k, v in state.items():
                assert tuple(v.shape) == want[k], f"{k}: shape {tuple(v.shape)}, the config needs {want[k]}"
                self.w[k.replace(".", "/")].copy_(v.to(self.w[k.replace(".", "/")].dtype))

    # --- blocks ---------------------------------------------------------------------------------------
    def attention(self, x: torch.Tensor, l: int) -> torch.Tensor:
        c, p = self.cfg, f"blk.{l}."
        B, T, _ = x.shape
        h = rms_norm(x, self.p(p + "attn_norm.weight"), c.rms_eps)  # [B, T, D]
        q = (h @ self.p(p + "attn_q.weight").T).view(B, T, c.n_head, c.head_dim)  # [B, T, H, hd]
        k = (h @ self.p(p + "attn_k.weight").T).view(B, T, c.n_head_kv, c.head_dim)  # [B, T, Hkv, hd]
        v = (h @ self.p(p + "attn_v.weight").T).view(B, T, c.n_head_kv, c.head_dim)  # [B, T, Hkv, hd]
        q = rms_norm(q, self.p(p + "attn_q_norm.weight"), c.rms_eps)  # per head
        k = rms_norm(k, self.p(p + "attn_k_norm.weight"), c.rms_eps)
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        q, k = rope_neox(q, cos, sin), rope_neox(k, cos, sin)
        g = c.n_head // c.n_head_kv  # query head i reads kv head i // g (the reference: np.repeat)
        k = k.repeat_interleave(g, dim=2)  # [B, T, H, hd]
        v = v.repeat_interleave(g, dim=2)
        o = Fn.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=True,
            scale=1.0 / math.sqrt(c.head_dim),
        )  # [B, H, T, hd]
        o = o.transpose(1, 2).reshape(B, T, c.n_head * c.head_dim)  # [B, T, H*hd]
        return o @ self.p(p + "attn_output.weight").T  # [B, T, D]

    def moe(self, x: torch.Tensor, l: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> output [B, T, D], router probs [N, E], chosen ids [N, K] (N = B·T)."""
        c, p = self.cfg, f"blk.{l}."
        B, T, D = x.shape
        h = rms_norm(x, self.p(p + "ffn_norm.weight"), c.rms_eps).reshape(B * T, D)  # [N, D]
        probs = torch.softmax(h @ self.p(p + "ffn_gate_inp.weight").T, dim=-1)  # [N, E]
        w, ids = torch.topk(probs, c.n_expert_used, dim=-1)  # [N, K]
        w = w / w.sum(-1, keepdim=True)  # renormalise over K
        gate, up, down = (
            self.p(p + n) for n in ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
        )
        flat = ids.reshape(-1)  # [N*K] (t, k) pairs
        order = torch.argsort(flat, stable=True)  # expert-major rows
        counts = torch.bincount(flat, minlength=c.n_expert).tolist()
        hs = h[order // c.n_expert_used]  # [N*K, D] one gather
        ys = [
            (Fn.silu(he @ g.T) * (he @ u.T)) @ d.T  # [n_e, D] unweighted
            for he, g, u, d in zip(hs.split(counts), gate.unbind(0), up.unbind(0), down.unbind(0))
        ]
        dm = torch.cat(ys) * w.reshape(-1)[order, None]  # [N*K, D] weighted
        out = dm[torch.argsort(order)].view(B * T, c.n_expert_used, D).sum(1)  # [N, D] back to (t, k)
        return out.view(B, T, D), probs, ids

    def forward(self, idx: torch.Tensor, with_routing: bool = False):
        """idx [B, T] -> logits [B, T, V] (+ per-layer (probs, ids) when with_routing)."""
        x = self.p("token_embd.weight")[idx]  # [B, T, D]
        routing = []
        for l in range(self.cfg.n_layer):
            x = x + self.attention(x, l)
            y, probs, ids = self.moe(x, l)
            x = x + y
            routing.append((probs, ids))
        x = rms_norm(x, self.p("output_norm.weight"), self.cfg.rms_eps)
        logits = x @ self.p("output.weight").T  # [B, T, V]
        return (logits, routing) if with_routing else logits


def load_balance_loss(routing, n_expert: int) -> torch.Tensor:
    """Switch/Qwen auxiliary loss, averaged over layers: E · Σ_e (tokens routed to e / N) · mean_n p[n, e]
    (transformers `load_balancing_loss_func`; K at perfectly uniform routing)."""
    total = 0.0
    for probs, ids in routing:
        frac = torch.bincount(ids.reshape(-1), minlength=n_expert).to(probs.dtype) / ids.shape[0]  # [E]
        total = total + n_expert * (frac * probs.mean(0)).sum()
    return total / len(routing)
