"""The torch oracle for strata-tiny: held-out perplexity and logits of the exported GGUFs, computed by an
independent implementation of qwen3moe (`tools/tiny_torch.py`) on the files' own dequantised weights.

    python golden/oracle/strata_tiny/make_oracle.py [--ckpt final.pt]    (torch, the `train` extra; ~6 min)

Writes `oracle.npz` beside this file; `tests/test_strata_tiny.py` runs the reference engine on the same
windows and compares. Windows are cut from the held-out text (the files named in the GGUF's
strata.train.heldout_files, each followed by <|endoftext|>, encoded with the GGUF's tokenizer); a window of
W+1 tokens scores W predictions:
  ci    5 windows of 64+1 tokens, evenly spread       (the test: reference vs torch within 0.5%)
  card  40 windows of 256+1 tokens, evenly spread     (MODEL_CARD's reference figure: tools/routing_stats.py)
  full  every non-overlapping 256+1 window            (MODEL_CARD's torch figure)
Keys, per quantisation Q in (Q8_0, Q4_K): {set}_ids [n, W+1] int32 (shared by Q), {Q}_{set}_nll_f64/_f32 [n]
(summed negative log-likelihood per window, nats), {Q}_logits [2, 8, V] float32 (torch float64, the first 8
positions of ci windows 0 and 1). With --ckpt, also prints the unquantised trained weights' full-set figure.
"""

from __future__ import annotations

import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tools")]

import numpy as np  # noqa: E402

from strata import models, quants  # noqa: E402

QUANTS = ("Q8_0", "Q4_K")
SETS = {"ci": (5, 64), "card": (40, 256)}  # name -> (windows, tokens scored per window)
FULL_W = 256
N_LOGIT_POS = 8


def model_path(q: str) -> str:
    return os.path.join(ROOT, "strata", "data", f"strata-tiny.{q}.gguf")


def heldout_ids(m) -> np.ndarray:
    """The held-out token stream, re-made from the stdlib sources the GGUF names (Python 3.11.7's)."""
    from strata.synth.corpus import stdlib_corpus
    from strata.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(m.metadata)
    eot = tok.token_id("<|endoftext|>")
    out = []
    for f in m.metadata["strata.train.heldout_files"]:
        c = stdlib_corpus((f,))
        out += tok.encode(c.text, add_special=False, parse_special=False) + [eot]
    return np.asarray(out, np.int32)


def spread_windows(ids: np.ndarray, n: int, w: int) -> np.ndarray:
    """n windows of w+1 tokens whose starts are evenly spaced over the stream -> [n, w+1]."""
    starts = [round(i * (len(ids) - w - 1) / (n - 1)) for i in range(n)]
    return np.stack([ids[s : s + w + 1] for s in starts])


def weights_of(m) -> dict[str, np.ndarray]:
    """Every tensor dequantised exactly (the quant classes), in numpy shape (ggml ne reversed)."""
    out = {}
    for name in sorted(m.tensors.names):
        info, view = m.tensors.info(name), m.view(name)
        shape = tuple(reversed(info.ne))
        if view.dtype == np.float32:
            out[name] = np.asarray(view, np.float32).reshape(shape)
        else:
            q = quants.get(info.qtype)
            out[name] = q.dequantize(np.ascontiguousarray(view).reshape(-1, q.type_size)).reshape(shape)
    return out


def torch_model(m, dtype):
    import torch
    from tiny_torch import TinyConfig, TinyMoE

    c = m.cfg
    cfg = TinyConfig(
        n_layer=c.n_layer,
        n_embd=c.n_embd,
        n_head=c.n_head,
        n_head_kv=c.n_head_kv,
        head_dim=c.head_dim,
        n_expert=c.n_expert,
        n_expert_used=c.n_expert_used,
        n_ff_exp=c.n_ff_exp,
        n_vocab=c.n_vocab,
        n_ctx=max(c.n_ctx_train, FULL_W + 1),
        rope_base=c.rope_base,
        rms_eps=c.rms_eps,
    )
    tm = TinyMoE(cfg).to(dtype)
    tm.load_gguf_state({k: torch.from_numpy(np.array(v)) for k, v in weights_of(m).items()})
    return tm.eval()


def window_nll(tm, windows: np.ndarray, batch: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Summed next-token NLL per window (log-softmax in float64) and the float64 logits."""
    import torch

    nll, logits_all = [], []
    with torch.no_grad():
        for i in range(0, len(windows), batch):
            x = torch.from_numpy(windows[i : i + batch].astype(np.int64))
            logits = tm(x[:, :-1]).double()  # [b, W, V]
            lp = torch.log_softmax(logits, -1).gather(-1, x[:, 1:, None])[..., 0]  # [b, W]
            nll.append((-lp).sum(-1).numpy())
            logits_all.append(logits[:, :N_LOGIT_POS].numpy())
    return np.concatenate(nll), np.concatenate(logits_all)


def ppl(nll: np.ndarray, n_windows: int, w: int) -> float:
    return math.exp(float(nll.sum()) / (n_windows * w))


def unquantised_full_ppl(ckpt: str, full: np.ndarray) -> float:
    import torch
    from tiny_torch import TinyConfig, TinyMoE

    ck = torch.load(ckpt, weights_only=False)
    cfg = TinyConfig(**(ck["config"] | {"n_ctx": max(ck["config"]["n_ctx"], FULL_W + 1)}))
    tm = TinyMoE(cfg)
    tm.load_gguf_state(ck["weights"])
    nll, _ = window_nll(tm.eval(), full)
    return ppl(nll, len(full), FULL_W)


def main(argv=None) -> int:
    import argparse

    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", help="final.pt of the training run: also report the unquantised weights")
    a = ap.parse_args(argv)

    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    out = {}
    with models.load(model_path("Q8_0")) as m:
        ids = heldout_ids(m)
    sets = {name: spread_windows(ids, n, w) for name, (n, w) in SETS.items()}
    full = np.stack([ids[s : s + FULL_W + 1] for s in range(0, len(ids) - FULL_W - 1, FULL_W)])
    for name, win in sets.items():
        out[f"{name}_ids"] = win.astype(np.int32)
    print(f"held-out stream: {len(ids):,} tokens; full set {len(full)} windows of {FULL_W}")
    if a.ckpt:
        print(
            f"unquantised torch f32 full: {len(full)} windows x {FULL_W} tokens, perplexity "
            f"{unquantised_full_ppl(a.ckpt, full):.4f}",
            flush=True,
        )
    for q in QUANTS:
        with models.load(model_path(q)) as m:
            for dt, tag in ((torch.float64, "f64"), (torch.float32, "f32")):
                tm = torch_model(m, dt)
                for name, win in list(sets.items()) + [("full", full)]:
                    if name == "full" and tag == "f64":
                        continue  # the card's full figure is float32 torch; f64 adds minutes, not information
                    nll, logits = window_nll(tm, win)
                    out[f"{q}_{name}_nll_{tag}"] = nll
                    if name == "ci" and tag == "f64":
                        out[f"{q}_logits"] = logits[:2].astype(np.float32)
                    w = win.shape[1] - 1
                    print(
                        f"{q} torch {tag} {name:4s}: {len(win)} windows x {w} tokens, "
                        f"perplexity {ppl(nll, len(win), w):.4f}",
                        flush=True,
                    )
    path = os.path.join(HERE, "oracle.npz")
    np.savez_compressed(path, **out)
    print(f"wrote {path} ({os.path.getsize(path):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
