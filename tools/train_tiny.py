"""Train strata-tiny: a qwen3moe of ~5 M parameters on the CPython standard library's sources (PSF licence).

    python tools/train_tiny.py --out CKPT_DIR [--steps 640] [--resume]

Deterministic: fixed seeds, `torch.use_deterministic_algorithms(True)`, 2 threads, a data order that is a pure
function of (seed, step), so a resumed run equals an uninterrupted one. The text is `strata.synth.corpus`'s
recorded stdlib file list on Python 3.11.7 (its SHA-256 is checked); every 10th file is held out for
perplexity.
The vocabulary (byte-level BPE, qwen2 pre-tokeniser) is learnt from the training files only. Writes
`<out>/ckpt.pt` every `--ckpt-every` steps and `<out>/final.pt` (weights by GGUF name, config, vocabulary,
training record) for `tools/export_tiny.py`. Needs torch (the `train` extra).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tools")]

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402

from tiny_torch import TinyConfig, TinyMoE, load_balance_loss  # noqa: E402

THREADS = 2
SEED = 1234
HELDOUT_EVERY = 10  # file i of the sorted list is held out when i % 10 == 9
EOT = "<|endoftext|>"  # separates documents (files); the model's EOS/EOT


def split_files(files: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    train = tuple(f for i, f in enumerate(files) if i % HELDOUT_EVERY != HELDOUT_EVERY - 1)
    held = tuple(f for i, f in enumerate(files) if i % HELDOUT_EVERY == HELDOUT_EVERY - 1)
    return train, held


def build_data(vocab_size: int, allow_other_python: bool = False) -> dict:
    """Vocabulary from the training files; each file encoded on its own, files joined by EOT, per split."""
    from strata.synth.bpe import QWEN_SPECIALS, tokenizer_metadata, train_bpe
    from strata.synth.corpus import STDLIB_FILES, stdlib_corpus
    from strata.tokenizer import Tokenizer

    full = stdlib_corpus()
    if not full.recorded and not allow_other_python:
        raise SystemExit(
            f"train_tiny: the stdlib text differs from the recorded one (Python {full.python_version}, "
            f"sha256 {full.sha256[:12]}); strata-tiny was trained on Python 3.11.7's. Pass "
            f"--allow-other-python to train on this one anyway (the figures will differ)."
        )
    train_files, held_files = split_files(STDLIB_FILES)
    tokens, types, merges = train_bpe(stdlib_corpus(train_files).text, vocab_size, QWEN_SPECIALS, pre="qwen2")
    meta = tokenizer_metadata(tokens, types, merges, "qwen2", bos=None, eos=EOT, eot=EOT, chat_template=None)
    tok = Tokenizer.from_metadata(meta)
    eot = tok.token_id(EOT)

    def encode(files):
        out = []
        for f in files:
            out += tok.encode(stdlib_corpus((f,)).text, add_special=False, parse_special=False) + [eot]
        return np.asarray(out, np.int32)

    return {
        "tokens": tokens,
        "types": types,
        "merges": merges,
        "train_ids": encode(train_files),
        "heldout_ids": encode(held_files),
        "train_files": train_files,
        "heldout_files": held_files,
        "corpus_sha256": full.sha256,
        "python": full.python_version,
    }


def batch_starts(n_tokens: int, T: int, B: int, step: int, seed: int = SEED) -> np.ndarray:
    """Window starts of batch `step`: epoch e cuts the stream at offset (61·e mod T) into windows of T+1
    tokens and visits them in a permutation drawn from seed·1000 + e. A pure function of its arguments."""
    per_epoch = (n_tokens - 1 - T) // T  # windows per epoch (the same count whatever the offset)
    out = []
    for i in range(step * B, (step + 1) * B):
        e, j = divmod(i, per_epoch)
        perm = torch.randperm(per_epoch, generator=torch.Generator().manual_seed(seed * 1000 + e)).numpy()
        out.append((61 * e) % T + int(perm[j]) * T)
    return np.asarray(out)


def windows(ids: np.ndarray, starts, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = np.stack([ids[s : s + T + 1] for s in starts]).astype(np.int64)
    return torch.from_numpy(x[:, :-1]), torch.from_numpy(x[:, 1:])


@torch.no_grad()
def heldout_loss(
    model: TinyMoE, ids: np.ndarray, T: int, n_windows: int | None = None, batch: int = 16
) -> float:
    """Mean next-token cross-entropy over non-overlapping windows of T+1 tokens at 0, T, 2T, ..."""
    starts = list(range(0, len(ids) - T - 1, T))[:n_windows]
    tot, n = 0.0, 0
    for i in range(0, len(starts), batch):
        x, y = windows(ids, starts[i : i + batch], T)
        logits = model(x)
        tot += float(Fn.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum"))
        n += y.numel()
    return tot / n


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="scratch directory for data, checkpoints and final.pt")
    ap.add_argument("--steps", type=int, default=640)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--aux", type=float, default=1e-3, help="load-balancing loss coefficient (Qwen: 0.001)")
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--ckpt-every", type=int, default=25)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--allow-other-python", action="store_true")
    a = ap.parse_args(argv)

    torch.manual_seed(SEED)
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    os.makedirs(a.out, exist_ok=True)
    data_path = os.path.join(a.out, "data.pt")
    if os.path.exists(data_path):
        data = torch.load(data_path, weights_only=False)
    else:
        t0 = time.monotonic()
        data = build_data(a.vocab, a.allow_other_python)
        torch.save(data, data_path)
        print(
            f"data: {len(data['train_ids']):,} training and {len(data['heldout_ids']):,} held-out tokens, "
            f"vocabulary of {len(data['tokens'])} in {time.monotonic() - t0:.0f} s",
            flush=True,
        )
    cfg = TinyConfig(n_vocab=len(data["tokens"]), n_ctx=a.seq)
    model = TinyMoE(cfg, seed=SEED)
    decay = [p for n, p in model.w.items() if not n.endswith("norm/weight")]
    no_decay = [p for n, p in model.w.items() if n.endswith("norm/weight")]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=a.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        foreach=False,
    )
    step, elapsed, log = 0, 0.0, []
    ckpt = os.path.join(a.out, "ckpt.pt")
    if a.resume and os.path.exists(ckpt):
        s = torch.load(ckpt, weights_only=False)
        model.load_state_dict(s["model"])
        opt.load_state_dict(s["opt"])
        step, elapsed, log = s["step"], s["elapsed"], s["log"]
        print(f"resumed at step {step} ({elapsed:.0f} s of training so far)", flush=True)
    train_ids, held_ids = data["train_ids"], data["heldout_ids"]
    T, B = a.seq, a.batch
    t_last = time.monotonic()
    while step < a.steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a.steps, a.lr, a.warmup)
        x, y = windows(train_ids, batch_starts(len(train_ids), T, B, step), T)
        logits, routing = model(x, with_routing=True)
        ce = Fn.cross_entropy(logits.reshape(-1, cfg.n_vocab), y.reshape(-1))
        aux = load_balance_loss(routing, cfg.n_expert)
        opt.zero_grad(set_to_none=True)
        (ce + a.aux * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        now = time.monotonic()
        elapsed += now - t_last
        t_last = now
        rec = {"step": step, "ce": float(ce), "aux": float(aux), "elapsed_s": round(elapsed, 1)}
        if step % 50 == 0 or step == a.steps:
            model.eval()
            rec["heldout_ce"] = heldout_loss(model, held_ids, T, n_windows=32)
            model.train()
            t_last = time.monotonic()  # evaluation is not training time
        log.append(rec)
        print(
            f"step {step:4d}  ce {rec['ce']:.3f}  aux {rec['aux']:.3f}  lr {opt.param_groups[0]['lr']:.2e}  "
            f"{step * B * T / elapsed:5.0f} tok/s  {elapsed / 60:5.1f} min"
            + (
                f"  held-out ce {rec['heldout_ce']:.3f} (ppl {math.exp(rec['heldout_ce']):.2f})"
                if "heldout_ce" in rec
                else ""
            ),
            flush=True,
        )
        if step % a.ckpt_every == 0 or step == a.steps:
            torch.save(
                {
                    "model": model.state_dict(),
                    "opt": opt.state_dict(),
                    "step": step,
                    "elapsed": elapsed,
                    "log": log,
                },
                ckpt + ".tmp",
            )
            os.replace(ckpt + ".tmp", ckpt)
    final = {
        "config": cfg.to_dict(),
        "weights": {k: v.clone() for k, v in model.state_gguf().items()},
        "tokens": data["tokens"],
        "types": data["types"],
        "merges": data["merges"],
        "record": {
            "steps": a.steps,
            "batch": B,
            "seq": T,
            "lr": a.lr,
            "warmup": a.warmup,
            "aux_coef": a.aux,
            "tokens_seen": a.steps * B * T,
            "train_tokens": len(train_ids),
            "heldout_tokens": len(held_ids),
            "train_seconds": round(elapsed, 1),
            "threads": THREADS,
            "seed": SEED,
            "torch": torch.__version__,
            "python": data["python"],
            "corpus_sha256": data["corpus_sha256"],
            "train_files": list(data["train_files"]),
            "heldout_files": list(data["heldout_files"]),
            "machine": platform.processor() or platform.machine(),
            "log": log,
        },
    }
    torch.save(final, os.path.join(a.out, "final.pt"))
    print(
        f"trained {a.steps} steps ({a.steps * B * T:,} tokens) in {elapsed / 60:.1f} min -> "
        f"{os.path.join(a.out, 'final.pt')}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
