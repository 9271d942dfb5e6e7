"""Synthesise a valid GGUF MoE model for any supported architecture, shape and quant mix, deterministic from a
seed. Small models are drawn as floats and quantised by our encoders; large ones are written as random-but-valid
quantised blocks straight to disk, one expert at a time, so RAM stays small (issue: 17 GB in < 5 min, < 2 GB).

Every tensor gets its own generator seeded from (seed, crc32(name)), so bytes do not depend on write order.
"""

from __future__ import annotations

import sys
import time
import zlib
from dataclasses import dataclass

import numpy as np

from strata import quants
from strata.gguf_writer import GGUFWriter
from strata.models import arch_module
from strata.models.base import MoEConfig, QKNorm, Routing
from strata.synth import router as zipf
from strata.synth.presets import GGML, ModelShape

FLOAT_MODE_MAX_WEIGHTS = 64_000_000   # above this many weights in a tensor, write random quantised blocks
EMBD_BIAS_FRACTION = 0.5              # channel 0 of every embedding = this × sqrt(D) (see router.py)
# Zipf exponent of expert popularity: the mean fitted exponent of strata-tiny, our model trained on real text
# (strata/data/MODEL_CARD.md, "Routing statistics": 0.91 over its 4 layers, 0.71-1.25 per layer)
DEFAULT_SKEW = 0.9


# GGUF value types llama.cpp expects for tokenizer keys whose Python value does not say (llama-vocab.cpp)
TOKENIZER_KEY_TYPES = {"tokenizer.ggml.token_type": (None, 5), "tokenizer.ggml.scores": (None, 6),
                       "tokenizer.ggml.bos_token_id": (4, None), "tokenizer.ggml.eos_token_id": (4, None),
                       "tokenizer.ggml.eot_token_id": (4, None), "tokenizer.ggml.padding_token_id": (4, None),
                       "tokenizer.ggml.unknown_token_id": (4, None)}


def shape_config(shape: ModelShape) -> MoEConfig:
    """The MoEConfig a loader will read back from the file this shape produces."""
    arch = shape.arch
    tied = shape.types.get("output") == GGML["TIED"]
    return MoEConfig(
        arch=arch, n_layer=shape.n_layer, n_embd=shape.n_embd, n_head=shape.n_head, n_head_kv=shape.n_head_kv,
        head_dim=shape.head_dim, n_rot=shape.head_dim, n_expert=shape.n_expert, n_expert_used=shape.n_expert_used,
        n_ff_exp=shape.n_ff_exp, n_vocab=shape.n_vocab, n_ctx_train=shape.n_ctx,
        rope_base=float(np.float32(shape.rope_base)), rms_eps=float(np.float32(shape.rms_eps)),  # stored as f32
        rope_neox=arch != "llama",
        qk_norm={"qwen3moe": QKNorm.PER_HEAD, "olmoe": QKNorm.FULL}.get(arch, QKNorm.NONE),
        routing=Routing.SOFTMAX_TOPK_RENORM if arch in ("qwen3moe", "llama") else Routing.SOFTMAX_TOPK,
        qkv_bias=arch == "qwen2moe", n_ff_shexp=shape.n_ff_shexp, tied_output=tied)


def arch_metadata(w: GGUFWriter, shape: ModelShape, cfg: MoEConfig) -> None:
    a = shape.arch
    U32 = 4
    w.add(f"{a}.block_count", cfg.n_layer, U32)
    w.add(f"{a}.context_length", shape.n_ctx, U32)
    w.add(f"{a}.embedding_length", cfg.n_embd, U32)
    w.add(f"{a}.feed_forward_length", cfg.n_ff_exp, U32)
    w.add(f"{a}.attention.head_count", cfg.n_head, U32)
    w.add(f"{a}.attention.head_count_kv", cfg.n_head_kv, U32)
    w.add(f"{a}.attention.key_length", cfg.head_dim, U32)
    w.add(f"{a}.attention.value_length", cfg.head_dim, U32)
    w.add(f"{a}.rope.freq_base", float(cfg.rope_base))
    w.add(f"{a}.rope.dimension_count", cfg.n_rot, U32)
    w.add(f"{a}.attention.layer_norm_rms_epsilon", float(cfg.rms_eps))
    w.add(f"{a}.expert_count", cfg.n_expert, U32)
    w.add(f"{a}.expert_used_count", cfg.n_expert_used, U32)
    if a in ("qwen3moe", "qwen2moe"):
        w.add(f"{a}.expert_feed_forward_length", cfg.n_ff_exp, U32)
    if a == "qwen2moe":
        w.add(f"{a}.expert_shared_feed_forward_length", cfg.n_ff_shexp, U32)
    if a == "llama":
        w.add(f"{a}.vocab_size", cfg.n_vocab, U32)


def role_of(name: str) -> tuple[str, int | None]:
    """Quant-mix role of a tensor name (presets.ROLES) and its layer, if any."""
    layer = int(name.split(".")[1]) if name.startswith("blk.") else None
    base = name.split(".")[-2] if layer is not None else name.split(".")[0]
    if name.endswith(".bias") or base.endswith("_norm") or base == "output_norm":
        return "norm", layer
    table = {"token_embd": "embd", "output": "output", "attn_q": "attn_q", "attn_k": "attn_k", "attn_v": "attn_v",
             "attn_output": "attn_output", "ffn_gate_inp": "router", "ffn_gate_exps": "exp_gate",
             "ffn_up_exps": "exp_up", "ffn_down_exps": "exp_down", "ffn_gate_inp_shexp": "shexp_gate",
             "ffn_gate_shexp": "shexp", "ffn_up_shexp": "shexp", "ffn_down_shexp": "shexp"}
    return table[base], layer


READERS = ("attn_q", "attn_k", "attn_v", "exp_gate", "exp_up", "shexp", "output")   # roles that read the residual


@dataclass
class Synth:
    shape: ModelShape
    seed: int = 0
    skew: float = DEFAULT_SKEW
    isolate: bool = True     # channel 0 feeds the router alone (False: the scheme the golden tiny models used)

    def __post_init__(self):
        self.cfg = shape_config(self.shape)
        self.gamma = zipf.calibrate_gamma(self.cfg.n_expert, self.cfg.n_expert_used, self.skew, self.seed)

    def rng(self, name: str, part: int = -1) -> np.random.Generator:
        key = [self.seed, zlib.crc32(name.encode())] + ([part] if part >= 0 else [])
        return np.random.default_rng(key)

    # --- float values (numpy shape: ne reversed) -------------------------------------------------------------
    def values(self, name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        role, layer = role_of(name)
        D = self.cfg.n_embd
        if role == "norm":
            if name.endswith(".bias"):
                return (rng.standard_normal(shape) * 0.02).astype(np.float32)
            return (1.0 + rng.standard_normal(shape) * 0.05).astype(np.float32)
        fan_in = shape[-1]
        std = {"embd": 1.0, "output": 3.0 / np.sqrt(fan_in)}.get(role, 1.0 / np.sqrt(fan_in))
        x = (rng.standard_normal(shape) * std).astype(np.float32)
        if role == "embd":
            x[:, 0] = EMBD_BIAS_FRACTION * np.sqrt(D)                  # the constant routing channel
        elif self._writes_residual(name, role):
            x[..., 0, :] = 0.0                                         # nothing writes residual channel 0
        elif role == "router":                                         # [E, D]: column 0 is the expert bias
            x *= zipf.NOISE_STD
            x[:, 0] = zipf.expert_bias(shape[0], self.cfg.n_expert_used, self.skew, rng, self.gamma) / self._h0()
        if self.isolate and self._reads_residual(name, role):
            # no other reader sees the constant channel: otherwise it leaks a constant into every layer's hidden
            # state, which gives each expert a fixed logit offset and skews routing on its own
            x[..., 0] = 0.0
        return x

    @staticmethod
    def _writes_residual(name: str, role: str) -> bool:
        return role in ("attn_output", "exp_down") or name.endswith("ffn_down_shexp.weight")

    @classmethod
    def _reads_residual(cls, name: str, role: str) -> bool:
        return (role in READERS or name.endswith("ffn_gate_inp_shexp.weight")) and not cls._writes_residual(name, role)

    def _h0(self) -> float:
        """Typical normed channel 0 after an FFN norm: c / rms(x) with the embedding's own rms."""
        c = EMBD_BIAS_FRACTION * np.sqrt(self.cfg.n_embd)
        return float(c / np.sqrt(1.0 + c * c / self.cfg.n_embd))

    # --- bytes ---------------------------------------------------------------------------------------------
    def qtype(self, name: str) -> int:
        role, layer = role_of(name)
        if name.endswith(".bias") or role == "norm":
            return GGML["F32"]
        return self.shape.type_of(role, layer)

    def producer(self, name: str, ne: tuple[int, ...], qtype: int):
        shape = tuple(reversed(ne))
        n = int(np.prod(ne))
        if n <= FLOAT_MODE_MAX_WEIGHTS or role_of(name)[0] in ("embd", "router"):
            return lambda: self._float_chunks(name, shape, qtype)
        return lambda: self._random_chunks(name, shape, qtype)

    def _encode(self, x: np.ndarray, qtype: int) -> np.ndarray:
        if qtype == GGML["F32"]:
            return x.astype(np.float32)
        if qtype == GGML["F16"]:
            return x.astype(np.float16)
        q = quants.get(qtype)
        rows = x.reshape(-1, x.shape[-1])
        return q.quantize(rows.reshape(-1, q.block_size)).reshape(rows.shape[0], -1)

    def _float_chunks(self, name, shape, qtype):
        if len(shape) == 3:                                          # stacked experts: one expert at a time
            for e in range(shape[0]):
                yield self._encode(self.values(name, shape[1:], self.rng(name, e)), qtype)
            return
        rows = shape[0] if len(shape) > 1 else 1
        step = max(1, (8 << 20) // max(1, shape[-1] * 4))
        if rows <= step:
            yield self._encode(self.values(name, shape, self.rng(name)), qtype)
            return
        for i, r0 in enumerate(range(0, rows, step)):   # row chunks, each with its own generator
            n = min(step, rows - r0)
            yield self._encode(self.values(name, (n,) + shape[1:], self.rng(name, i)), qtype)

    def _random_chunks(self, name, shape, qtype):
        q = quants.get(qtype)
        per = int(np.prod(shape[-2:])) // q.block_size                # blocks per expert (or per matrix)
        row_blocks = shape[-1] // q.block_size
        scale = 1.0 / np.sqrt(shape[-1])
        role = role_of(name)[0]
        zero_row0 = self._writes_residual(name, role)
        zero_col0 = self.isolate and self._reads_residual(name, role)
        rng = self.rng(name)
        for _ in range(shape[0] if len(shape) == 3 else 1):
            b = q.random_blocks(rng, per, scale)
            if zero_row0:
                b[:row_blocks] = 0                                   # all-zero bytes dequantise to 0 in every type
            if zero_col0:      # a quantised row cannot zero one weight: its first block goes (channels 0..Q-1)
                b.reshape(-1, row_blocks, q.type_size)[:, 0] = 0
            yield b


def synthesise(shape: ModelShape, out: str, *, seed: int = 0, skew: float = DEFAULT_SKEW, name: str = "",
               tokenizer_meta: dict | None = None, progress: bool = False, isolate: bool = True) -> int:
    """Write `shape` to `out`; returns the file size. `tokenizer_meta` = the tokenizer.* GGUF keys."""
    s = Synth(shape, seed, skew, isolate)
    cfg = s.cfg
    w = GGUFWriter(shape.arch)
    w.add("general.name", name or f"strata-synth-{shape.arch}")
    w.add("general.quantization_version", 2, 4)
    arch_metadata(w, shape, cfg)
    w.add("strata.synth.seed", int(seed), 4)
    w.add("strata.synth.routing_skew", float(skew))
    if tokenizer_meta is None:
        from strata.synth.vocab import tokenizer_meta_for

        tokenizer_meta = tokenizer_meta_for(shape)
    for k, v in tokenizer_meta.items():
        w.add(k, v, *TOKENIZER_KEY_TYPES.get(k, (None, None)))
    req, opt = arch_module(shape.arch).tensor_specs(cfg)
    for tname, ne in req.items():
        qt = s.qtype(tname)
        w.add_tensor(tname, ne, qt, s.producer(tname, ne, qt))
    t0, last = time.monotonic(), [0.0]

    def bar(done, total):
        now = time.monotonic()
        if progress and (now - last[0] > 0.5 or done == total):
            last[0] = now
            rate = done / max(now - t0, 1e-9) / 1e6
            print(f"\rsynth: {done / 2**30:6.2f} of {total / 2**30:.2f} GiB  {100 * done / total:5.1f}%  "
                  f"{rate:6.0f} MB/s", end="", file=sys.stderr, flush=True)

    size = w.write(out, bar)
    if progress:
        print(file=sys.stderr)
    return size
