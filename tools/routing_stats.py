"""How unevenly a model uses its experts, from the reference engine's routing (`strata.routing_trace`).

    python tools/routing_stats.py [--model strata/data/strata-tiny.Q8_0.gguf] [--windows 40] [--trace F.jsonl]
    python tools/routing_stats.py --from-trace F.jsonl [F2.jsonl ...]

Runs the held-out `card` windows of golden/oracle/strata_tiny/oracle.npz through `RefEngine` (float path, one
window per fresh cache) with a `RoutingWriter`, then summarises the trace per layer: share of routed
(token, k) slots taken by the most used expert and by the top 25% of experts, the fitted Zipf exponent of
expert popularity (`strata.synth.router.zipf_slope`: minus the slope of log frequency on log rank), and the
entropy of the usage distribution over log E (1 = uniform). Also prints the reference's perplexity on those
windows. MODEL_CARD.md's routing table and reference perplexity come from this command.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from strata import routing_trace  # noqa: E402
from strata.synth.router import zipf_slope  # noqa: E402

ORACLE = os.path.join(ROOT, "golden", "oracle", "strata_tiny", "oracle.npz")


def layer_stats(counts: np.ndarray) -> dict:
    """counts [E]: routed slots per expert -> the card's figures."""
    E = counts.size
    f = np.sort(counts.astype(np.float64))[::-1] / counts.sum()
    p = f[f > 0]
    return {
        "top1": float(f[0]),
        "top25": float(f[: max(1, E // 4)].sum()),
        "zipf": zipf_slope(f),
        "entropy": float(-(p * np.log(p)).sum() / math.log(E)),
        "unused": int((counts == 0).sum()),
    }


def summarise(head: dict, counts) -> tuple[list[dict], dict]:
    L, E = head["n_layer"], head["n_expert"]
    per = np.zeros((L, E), np.int64)
    for (l, e), n in counts.items():
        per[l, e] += n
    rows = [layer_stats(per[l]) for l in range(L)]
    mean = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
    return rows, mean


def print_table(rows: list[dict], mean: dict, n_slots: int, E: int) -> None:
    print(
        f"routing over {n_slots:,} (token, k) slots per layer, {E} experts "
        f"(uniform: top-1 {1 / E:.3f}, top-25% {max(1, E // 4) / E:.3f}, Zipf 0, entropy 1)"
    )
    print("| layer | top-1 expert share | top-25% experts share | Zipf exponent | entropy / log E |")
    print("|---|---|---|---|---|")
    for l, r in enumerate(rows):
        print(f"| {l} | {r['top1']:.3f} | {r['top25']:.3f} | {r['zipf']:.2f} | {r['entropy']:.3f} |")
    print(f"| mean | {mean['top1']:.3f} | {mean['top25']:.3f} | {mean['zipf']:.2f} | {mean['entropy']:.3f} |")


def run_reference(model_path: str, windows: np.ndarray, trace: str) -> float:
    """Each window from an empty cache through RefEngine (float path), routing appended to `trace`;
    returns the perplexity of its W predictions per window."""
    from strata import models
    from strata.reference.engine import RefEngine

    m = models.load(model_path)
    writer = routing_trace.RoutingWriter(trace, m)
    nll, n = 0.0, 0
    for i, win in enumerate(windows):
        eng = RefEngine(m, "float", n_ctx=len(win) - 1, on_routing=writer.layer)
        writer.bind(eng)
        logits = eng.prefill([int(t) for t in win[:-1]]).astype(np.float64)  # [W, V]
        mx = logits.max(-1, keepdims=True)
        lse = mx[:, 0] + np.log(np.exp(logits - mx).sum(-1))
        nll += float((lse - logits[np.arange(len(win) - 1), win[1:]]).sum())
        n += len(win) - 1
        print(
            f"\rreference: window {i + 1}/{len(windows)}, perplexity so far {math.exp(nll / n):.4f}",
            end="",
            file=sys.stderr,
            flush=True,
        )
    print(file=sys.stderr)
    writer.close()
    m.close()
    return math.exp(nll / n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "strata", "data", "strata-tiny.Q8_0.gguf"))
    ap.add_argument("--windows", type=int, default=40, help="how many of the oracle's card windows")
    ap.add_argument("--trace", help="keep the routing trace here (JSONL)")
    ap.add_argument("--from-trace", nargs="+", metavar="F", help="summarise existing traces instead")
    a = ap.parse_args(argv)
    if a.from_trace:
        head, counts = routing_trace.profile(a.from_trace)
    else:
        with np.load(ORACLE) as z:
            win = z["card_ids"][: a.windows]
        trace = a.trace or os.path.join(tempfile.mkdtemp(), "routing.jsonl")
        p = run_reference(a.model, win, trace)
        print(
            f"reference float-path perplexity on {len(win)} held-out windows x {win.shape[1] - 1} tokens: "
            f"{p:.4f}"
        )
        if a.trace:
            print(f"routing trace in {a.trace}")
        head, counts = routing_trace.profile([trace])
    rows, mean = summarise(head, counts)
    n_slots = sum(n for (l, e), n in counts.items() if l == 0)
    print_table(rows, mean, n_slots, head["n_expert"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
