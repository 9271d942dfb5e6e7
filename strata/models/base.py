"""What every MoE architecture shares: the config, the routing variants, tensor checks and expert blobs.

Legend: L layers, D hidden (n_embd), H query heads, Hkv key/value heads, hd head size, E experts per layer,
K experts per token, F expert FFN size, Fs shared-expert FFN size, V vocabulary.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from strata.gguf_file import GGUFError, GGUFFile, TensorInfo, type_name


class ModelError(GGUFError):
    """A GGUF that parses but is not a model Strata can run (architecture, tensors, hyperparameters)."""


class UnsupportedArchitecture(ModelError):
    pass


class MissingTensor(ModelError):
    pass


class BadTensorShape(ModelError):
    pass


class InconsistentConfig(ModelError):
    pass


class Routing(enum.Enum):
    """How router logits become (ids, weights); llama.cpp hard-codes it per architecture (SPEC §1)."""

    SOFTMAX_TOPK_RENORM = "softmax, top-k, renormalise over the k"   # qwen3moe, llama (Mixtral)
    SOFTMAX_TOPK = "softmax, top-k"                                   # qwen2moe, olmoe


class QKNorm(enum.Enum):
    NONE = "none"
    PER_HEAD = "per head (hd)"          # qwen3moe: RMSNorm over each head after the reshape
    FULL = "whole projection (H*hd)"    # olmoe: RMSNorm over the whole q/k projection, before the reshape


@dataclass(frozen=True, slots=True)
class MoEConfig:
    arch: str
    n_layer: int            # L
    n_embd: int             # D
    n_head: int             # H
    n_head_kv: int          # Hkv
    head_dim: int           # hd
    n_rot: int              # rotary dims per head (<= hd)
    n_expert: int           # E
    n_expert_used: int      # K
    n_ff_exp: int           # F
    n_vocab: int            # V
    n_ctx_train: int
    rope_base: float
    rms_eps: float
    rope_neox: bool         # NeoX RoPE rotates (i, i + n_rot/2); the normal kind rotates (2i, 2i+1)
    qk_norm: QKNorm
    routing: Routing
    qkv_bias: bool = False  # qwen2moe
    n_ff_shexp: int = 0     # Fs; 0 = no shared expert (qwen2moe has one, gated by sigmoid)
    tied_output: bool = False  # no output.weight: the head reuses token_embd (llama.cpp's fallback)

    def __post_init__(self):
        def check(ok, why):
            if not ok:
                raise InconsistentConfig(f"{self.arch}: {why}")

        for f in ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_expert", "n_expert_used",
                  "n_ff_exp", "n_vocab"):
            check(getattr(self, f) > 0, f"{f} must be positive, got {getattr(self, f)}")
        check(self.n_head % self.n_head_kv == 0,
              f"query heads ({self.n_head}) must be a multiple of key/value heads ({self.n_head_kv}) for GQA")
        check(self.n_expert_used <= self.n_expert,
              f"expert_used_count ({self.n_expert_used}) exceeds expert_count ({self.n_expert})")
        check(0 < self.n_rot <= self.head_dim and self.n_rot % 2 == 0,
              f"rope dimension count {self.n_rot} must be even and within the head size {self.head_dim}")
        check(self.rms_eps > 0 and self.rope_base > 0, "rms epsilon and rope base must be positive")

    @property
    def n_q(self) -> int:       # H*hd
        return self.n_head * self.head_dim

    @property
    def n_kv(self) -> int:      # Hkv*hd
        return self.n_head_kv * self.head_dim

    @property
    def renormalise(self) -> bool:
        return self.routing is Routing.SOFTMAX_TOPK_RENORM


def meta_get(meta: dict, arch: str, key: str, default=None, *, required=True):
    """`{arch}.{key}` from GGUF metadata, with a specific error when a required key is missing."""
    full = f"{arch}.{key}"
    if full in meta:
        return meta[full]
    if default is not None or not required:
        return default
    raise InconsistentConfig(f"{arch}: metadata key {full} is missing")


def read_config(gf: GGUFFile, arch: str, *, rope_base: float, rope_neox: bool, qk_norm: QKNorm, routing: Routing,
                qkv_bias: bool = False, shared_expert: bool = False) -> MoEConfig:
    """The hyperparameters every architecture here stores under the same `{arch}.*` keys (llama.cpp's
    `llm_load_hparams`); the architecture file passes what llama.cpp hard-codes for it."""
    m = gf.metadata
    D = meta_get(m, arch, "embedding_length")
    H = meta_get(m, arch, "attention.head_count")
    hd = meta_get(m, arch, "attention.key_length", D // H)      # Qwen3: 128 even where D/H differs
    # the expert size: expert_feed_forward_length, or feed_forward_length where converters put it there
    # (Mixtral, OLMoE: notes/tooling.md §2.2)
    F = meta_get(m, arch, "expert_feed_forward_length", None, required=False) or \
        meta_get(m, arch, "feed_forward_length")
    return MoEConfig(
        arch=arch, n_layer=meta_get(m, arch, "block_count"), n_embd=D, n_head=H,
        n_head_kv=meta_get(m, arch, "attention.head_count_kv", H), head_dim=hd,
        n_rot=meta_get(m, arch, "rope.dimension_count", hd),
        n_expert=meta_get(m, arch, "expert_count"), n_expert_used=meta_get(m, arch, "expert_used_count"),
        n_ff_exp=F, n_vocab=vocab_size(gf, arch), n_ctx_train=meta_get(m, arch, "context_length"),
        rope_base=meta_get(m, arch, "rope.freq_base", rope_base),
        rms_eps=meta_get(m, arch, "attention.layer_norm_rms_epsilon"), rope_neox=rope_neox, qk_norm=qk_norm,
        routing=routing, qkv_bias=qkv_bias,
        n_ff_shexp=meta_get(m, arch, "expert_shared_feed_forward_length", F) if shared_expert else 0,
        tied_output="output.weight" not in gf.tensors,
    )


def vocab_size(gf: GGUFFile, arch: str) -> int:
    """The tokenizer's size where it has one (llama.cpp's n_vocab), else `{arch}.vocab_size`, else the
    embedding's row count."""
    toks = gf.metadata.get("tokenizer.ggml.tokens")
    if toks:
        return len(toks)
    if f"{arch}.vocab_size" in gf.metadata:
        return int(gf.metadata[f"{arch}.vocab_size"])
    t = gf.tensors.get("token_embd.weight")
    if t is None:
        raise MissingTensor(f"{gf.path}: no tokenizer, no {arch}.vocab_size and no token_embd.weight")
    return int(t.ne[1])


# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ExpertSlices:
    """Zero-copy views of one expert's three weight slices in the file; `blob` order is [gate | up | down]."""

    gate: np.ndarray   # [F, row_bytes(D)] uint8 (or typed for F32/F16)
    up: np.ndarray     # [F, row_bytes(D)]
    down: np.ndarray   # [D, row_bytes(F)]
    types: tuple[int, int, int]

    @property
    def nbytes(self) -> int:
        return self.gate.nbytes + self.up.nbytes + self.down.nbytes

    def copy_into(self, dst: np.ndarray) -> None:
        """Write the blob into a uint8 buffer of at least `nbytes` (the arena and the staging ring use this)."""
        g, u = self.gate.nbytes, self.up.nbytes
        dst[:g] = self.gate.reshape(-1).view(np.uint8)
        dst[g:g + u] = self.up.reshape(-1).view(np.uint8)
        dst[g + u:g + u + self.down.nbytes] = self.down.reshape(-1).view(np.uint8)

    def blob(self) -> np.ndarray:
        out = np.empty(self.nbytes, np.uint8)
        self.copy_into(out)
        return out


class TensorSet:
    """Named tensors of one file, checked against what an architecture declares (STYLE point 2)."""

    def __init__(self, gf: GGUFFile, cfg: MoEConfig, specs: dict[str, tuple[int, ...]],
                 optional: dict[str, tuple[int, ...]]):
        self.gf, self.cfg = gf, cfg
        for name, ne in specs.items():
            self._check(name, ne, required=True)
        for name, ne in optional.items():
            self._check(name, ne, required=False)
        self.names = set(specs) | {n for n in optional if n in gf.tensors}

    def _check(self, name: str, ne: tuple[int, ...], required: bool):
        t = self.gf.tensors.get(name)
        if t is None:
            if required:
                raise MissingTensor(f"{self.gf.path}: {self.cfg.arch} needs tensor {name} (ggml shape {list(ne)}),"
                                    f" which the file does not have")
            return
        got = tuple(t.ne)
        # a trailing 1 is the same tensor to ggml ({D} == {D, 1}); llama.cpp accepts both
        while len(got) > len(ne) and got[-1] == 1:
            got = got[:-1]
        if got != tuple(ne):
            raise BadTensorShape(f"{self.gf.path}: tensor {name} has ggml shape {list(t.ne)}, "
                                 f"{self.cfg.arch} with this config needs {list(ne)}")
        from strata import quants

        try:
            quants.get(t.qtype)
        except quants.UnsupportedQuantType:
            raise quants.UnsupportedQuantType(
                f"{self.gf.path}: tensor {name} has ggml type {type_name(t.qtype)} (id {t.qtype}), which Strata "
                f"does not support; supported: {', '.join(c.name for c in quants.registered())}") from None

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def info(self, name: str) -> TensorInfo:
        return self.gf.info(name)

    def view(self, name: str) -> np.ndarray:
        return self.gf.view(name)


def expert_slices(ts: TensorSet, layer: int, e: int) -> ExpertSlices:
    """Expert `e` of `layer`: rows `[e]` of the stacked `ffn_{gate,up,down}_exps` tensors (no copy)."""
    p = f"blk.{layer}."
    names = (p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight", p + "ffn_down_exps.weight")
    views = tuple(ts.view(n)[e] for n in names)
    return ExpertSlices(*views, types=tuple(ts.info(n).qtype for n in names))
