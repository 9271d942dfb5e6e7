"""Models as the simulator sees them: shapes, quant types, bytes and work per expert and per layer.

A model is named ``preset:MIX`` (``qwen3-30b-a3b:Q4_K_M``) from ``strata.synth.presets``, or read from a GGUF
header (``shape_from_gguf``). MIXES are ours: the expert and attention types a llama.cpp recipe of that name
gives, simplified (Q4_K_M's ``use_more_bits`` layers take Q6_K for ffn_down, as llama.cpp does).
``flash-next`` is the original engine's model (the seeds' measurements): the flash-shape preset plus a
calibrated per-layer cost for what the preset lacks (GDN, QSA, hyper-connections, PLE; calibration.json).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from strata.synth.presets import BLOCK, GGML, PRESETS, ModelShape, row_bytes

TYPE_NAME = {v: k for k, v in GGML.items()}
IQ = {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS"}
KQ = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}
FLOAT = {"F32", "F16", "BF16"}


def family(type_name: str) -> str:
    """The CPU kernel family a type's vec_dot belongs to (unpack cost class)."""
    return (
        "iq" if type_name in IQ else "k" if type_name in KQ else "float" if type_name in FLOAT else "legacy"
    )


def _more_bits(i: int, n: int) -> bool:  # llama.cpp llama_model_quantize: use_more_bits()
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


# llama.cpp tensor_type_fallback: a row length that is not a whole number of 256-blocks takes this type
FALLBACK = {
    "Q2_K": "IQ4_NL",
    "Q3_K": "IQ4_NL",
    "Q4_K": "Q5_0",
    "Q5_K": "Q5_1",
    "Q6_K": "Q8_0",
    **{t: "IQ4_NL" for t in IQ if t != "IQ4_NL"},
}


def _fit(t: str, n: int) -> str:
    return FALLBACK.get(t, "Q8_0") if n % BLOCK[GGML[t]][0] else t


def _mix(
    shape: ModelShape,
    gate: str,
    down: str,
    attn: str = "Q4_K",
    attn_v: str = "Q6_K",
    down_more: str | None = None,
) -> dict:
    d, f = shape.n_embd, shape.n_ff_exp
    t = dict(
        embd=attn,
        output="Q6_K",
        attn_q=attn,
        attn_k=attn,
        attn_v=attn_v,
        attn_output=attn,
        exp_gate=_fit(gate, d),
        exp_up=_fit(gate, d),
        exp_down=_fit(down, f),
        shexp="Q8_0",
    )
    if down_more:
        t.update(
            {
                f"exp_down@{i}": _fit(down_more, f)
                for i in range(shape.n_layer)
                if _more_bits(i, shape.n_layer)
            }
        )
    return {
        k: GGML[_fit(v, d)] if k in ("attn_q", "attn_k", "attn_v", "embd", "output") else GGML[v]
        for k, v in t.items()
    }


MIXES = {
    "Q4_K_M": lambda s: _mix(s, "Q4_K", "Q4_K", down_more="Q6_K"),
    "Q4_K_S": lambda s: _mix(s, "Q4_K", "Q4_K", attn_v="Q4_K"),
    "Q5_K_M": lambda s: _mix(s, "Q5_K", "Q5_K", "Q5_K", down_more="Q6_K"),
    "Q6_K": lambda s: _mix(s, "Q6_K", "Q6_K", "Q6_K", "Q6_K"),
    "Q8_0": lambda s: _mix(s, "Q8_0", "Q8_0", "Q8_0", "Q8_0"),
    "Q2_K": lambda s: _mix(s, "Q2_K", "Q3_K"),
    "Q2_0": lambda s: _mix(s, "Q2_0", "Q2_0"),
    "IQ1_M": lambda s: _mix(s, "IQ1_M", "IQ1_M"),
    "IQ2_XS": lambda s: _mix(s, "IQ2_XS", "IQ2_XS"),
    "IQ3_XXS": lambda s: _mix(s, "IQ3_XXS", "IQ4_NL"),
    "IQ4_XS": lambda s: _mix(s, "IQ4_XS", "IQ4_XS"),
    "UD-Q4_K_XL": lambda s: _mix(s, "Q4_K", "Q5_K"),  # original-source.md 8.2: Q4_K/Q5_K (+ Q5_1/Q8_0)
    "MXFP4": lambda s: _mix(s, "MXFP4", "MXFP4"),
}
# the original's model: flash-shape geometry; the Coder keeps 256 of 512 experts (original-source.md 8.1)
VARIANTS = {"flash-next": ("flash-shape", {}), "flash-next-coder": ("flash-shape", {"n_expert": 256})}
# its attention reads a bounded number of cells per token: 36 of 48 layers are GDN (linear), the 12 QSA layers
# attend over top-k selected cells (original-source.md 1.2-1.3); ours: 4096 cells, spread over every layer
SPARSE_CELLS = {"flash-next": 4096, "flash-next-coder": 4096}


@dataclass(frozen=True, slots=True)
class SimModel:
    name: str
    shape: ModelShape
    extra: str = ""  # key of a calibrated extra dense cost (calibration.json "extra_dense"), or ""
    attn_cells: int | None = None  # attention reads at most this many cells a token (None: full causal)

    @property
    def n_layer(self) -> int:
        return self.shape.n_layer

    @property
    def n_expert(self) -> int:
        return self.shape.n_expert

    @property
    def k(self) -> int:
        return self.shape.n_expert_used

    @property
    def expert_weights(self) -> int:
        """Weights in one expert: gate and up (F x D each) and down (D x F)."""
        return 3 * self.shape.n_embd * self.shape.n_ff_exp

    def blob_bytes(self, layer: int) -> int:
        return self.shape.expert_blob_bytes(layer)

    @property
    def max_blob(self) -> int:
        return max(self.blob_bytes(l) for l in range(self.n_layer))

    def expert_type(self, layer: int = 0) -> str:
        return TYPE_NAME[self.shape.type_of("exp_gate", layer)]

    def dense_params(self) -> int:
        """Weights per layer outside the routed experts: attention, router, shared expert."""
        s = self.shape
        q, kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
        return s.n_embd * (2 * q + 2 * kv) + s.n_embd * s.n_expert + 3 * s.n_embd * s.n_ff_shexp

    def dense_bytes(self, layer: int = 0) -> int:
        s = self.shape
        q, kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
        rb = lambda role, n: row_bytes(s.type_of(role, layer), n)  # noqa: E731
        attn = q * rb("attn_q", s.n_embd) + kv * rb("attn_k", s.n_embd) + kv * rb("attn_v", s.n_embd)
        attn += s.n_embd * rb("attn_output", q)
        return attn + s.n_expert * rb("router", s.n_embd) + 3 * s.n_ff_shexp * rb("shexp", s.n_embd)

    def head_bytes(self) -> int:
        return self.shape.n_vocab * row_bytes(self.shape.type_of("output"), self.shape.n_embd)

    def kv_bytes_per_token(self) -> int:
        """fp16 K and V for every layer."""
        return self.shape.n_layer * 2 * self.shape.n_head_kv * self.shape.head_dim * 2


def model(name: str) -> SimModel:
    """``preset:MIX`` or a variant (``flash-next:IQ2_XS``); the mix defaults to the preset's own types."""
    base, _, mix = name.partition(":")
    extra = ""
    if base in VARIANTS:
        preset, over = VARIANTS[base]
        shape, extra = replace(PRESETS[preset], **over), base
    elif base in PRESETS:
        shape = PRESETS[base]
    else:
        known = sorted(PRESETS) + sorted(VARIANTS)
        raise KeyError(f"no model {base!r} (known: {', '.join(known)}; or a .gguf path)")
    if "/" in mix:  # GATE/DOWN: the experts' gate/up type and down type, e.g. IQ2_XS/Q2_0
        gate, down = mix.split("/")
        for tname in (gate, down):
            if tname not in GGML:
                raise KeyError(f"no ggml type {tname!r} in {name!r}")
        shape = replace(shape, types=_mix(shape, gate, down))
    elif mix:
        if mix not in MIXES:
            raise KeyError(f"no quant mix {mix!r} (known: {', '.join(sorted(MIXES))}, or GATE/DOWN types)")
        shape = replace(shape, types=MIXES[mix](shape))
    for l in range(shape.n_layer):  # every expert row must be whole blocks of its type
        for role, n in (("exp_gate", shape.n_embd), ("exp_down", shape.n_ff_exp)):
            q = BLOCK[shape.type_of(role, l)][0]
            assert n % q == 0, f"{name}: {role} rows of {n} are not whole {q}-blocks"
    return SimModel(name, shape, extra, SPARSE_CELLS.get(extra))


def from_gguf_metadata(meta: dict, tensor_types: dict, name: str = "gguf") -> SimModel:
    """A model from a GGUF header: ``meta`` maps keys to values (``qwen3moe.block_count`` ...), and
    ``tensor_types`` maps tensor names to ggml type ids (``blk.0.ffn_gate_exps.weight`` -> 12). This is what
    ``strata.gguf_file`` (or gguf's GGUFReader) hands over; the names are GGUF's own."""
    arch = meta["general.architecture"]
    k = lambda key, default=None: meta.get(f"{arch}.{key}", default)  # noqa: E731
    n_head = int(k("attention.head_count"))
    n_embd = int(k("embedding_length"))
    n_ff = k("expert_feed_forward_length") or k("feed_forward_length")
    vocab = meta.get("tokenizer.ggml.tokens")
    shape = ModelShape(
        arch,
        int(k("block_count")),
        n_embd,
        n_head,
        int(k("attention.head_count_kv", n_head)),
        int(k("attention.key_length", n_embd // n_head)),
        int(k("expert_count")),
        int(k("expert_used_count")),
        int(n_ff),
        len(vocab) if vocab is not None else 32000,
        n_ctx=int(k("context_length", 4096)),
        n_ff_shexp=int(k("expert_shared_feed_forward_length", 0)),
    )
    roles = {
        "token_embd": "embd",
        "output": "output",
        "attn_q": "attn_q",
        "attn_k": "attn_k",
        "attn_v": "attn_v",
        "attn_output": "attn_output",
        "ffn_gate_inp": "router",
        "ffn_gate_exps": "exp_gate",
        "ffn_up_exps": "exp_up",
        "ffn_down_exps": "exp_down",
        "ffn_up_shexp": "shexp",
    }
    types: dict = {}
    for tname, qtype in tensor_types.items():
        parts = tname.split(".")
        if parts[0] == "blk" and parts[2] in roles:
            types[f"{roles[parts[2]]}@{int(parts[1])}"] = int(qtype)
            types.setdefault(roles[parts[2]], int(qtype))
        elif parts[0] in roles:
            types[roles[parts[0]]] = int(qtype)
    missing = [r for r in ("exp_gate", "exp_up", "exp_down") if r not in types]
    if missing:
        raise ValueError(
            f"{name}: no routed-expert tensors for {missing} (is this a mixture-of-experts model?)"
        )
    return SimModel(name, replace(shape, types=types))
