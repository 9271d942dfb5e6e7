"""GPU time by kernel op over one prompt: a diagnostic of where a prefill's device time goes (not a benchmark).

python bench/prefill_ops.py --model X.gguf [--prompts 900,2048] [--cache-frac 0.25] [--configs quarter,resident]
                            [--device cuda|host] [--ctx 8200]

For each prompt length, the quarter-cache engine (the budget of bench/prefill.py) and the all-resident engine each
run the prompt twice to warm up, once untimed for the wall time, then once with every `Kernels` method bracketed
by two device events on the stream it was given. Each op's time is the sum of its brackets, so where the host is
the bottleneck an op's time includes waiting for its own launch. The share is off (bench/cpu_share.py measures it).
Legend of the op names: the methods of strata/accel/gpu/kernels.py.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
import time

import numpy as np

from strata.accel.device.base import Stream

# table builders are host work that only stages a copy; linear_many is its linear calls (timed) after at most one
# to_f16; everything else launches device work
SKIP = {"upload", "upload_many", "expert_tables", "layer_tables", "blob_table", "linear_many"}


class OpTimer:
    """Wraps a kernel set's methods: while `on`, each call is bracketed by two events on its stream."""

    def __init__(self, dev, kernels):
        self.dev, self.on, self.marks = dev, False, []
        for name in dir(type(kernels)):
            if name.startswith("_") or name in SKIP or not callable(getattr(kernels, name)):
                continue
            setattr(kernels, name, self._wrap(name, getattr(kernels, name)))

    def _wrap(self, name, fn):
        def timed(*a, **kw):
            # the stream: a keyword, or the positional Stream (gemm_grouped's max_rows, attention's spill follow it)
            stream = kw.get("stream", next((x for x in reversed(a) if isinstance(x, Stream)), None))
            if not self.on or not isinstance(stream, Stream):
                return fn(*a, **kw)
            e0, e1 = self.dev.event(), self.dev.event()
            e0.record(stream)
            out = fn(*a, **kw)
            e1.record(stream)
            self.marks.append((name, e0, e1))
            return out
        return timed

    def totals(self) -> tuple[collections.Counter, collections.Counter]:
        ms, calls = collections.Counter(), collections.Counter()
        for name, e0, e1 in self.marks:
            e1.synchronize()
            ms[name] += e0.elapsed_ms(e1)
            calls[name] += 1
        return ms, calls


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", default="900,2048")
    ap.add_argument("--cache-frac", type=float, default=0.25)
    ap.add_argument("--configs", default="quarter,resident", help="which engines: quarter, resident or both")
    ap.add_argument("--device", choices=("cuda", "host"), default="cuda", help="host: a smoke test on the CPU twin")
    ap.add_argument("--ctx", type=int, default=8200,
                    help="context tokens, bench/prefill.py's default: its plan's chunk, so its prompts' chunks (a "
                         "context just past the prompt gave 768-token chunks, whose layer-major MoE blocks on the "
                         "side stream overlap the compute stream's brackets, ops_q48_stop55.log)")
    a = ap.parse_args()
    from strata import models, policy
    from strata.accel.arena import Arena
    from strata.accel.device.base import get_device
    from strata.accel.engine import GpuEngine
    from strata.accel.memplan import budget_holding, scratch_group

    lengths = [int(x) for x in a.prompts.split(",")]
    m = models.load(a.model)
    c = m.cfg
    dev = get_device(a.device)
    n_ctx = max(a.ctx, max(lengths) + 8)
    arena = Arena(m, dev)
    cfg = dataclasses.replace(policy.from_process(), cpu_share=0.0)
    rng = np.random.default_rng(0)
    prompts = {L: rng.integers(0, c.n_vocab, L).tolist() for L in lengths}
    configs = a.configs.split(",")
    unknown = set(configs) - {"quarter", "resident"}
    if unknown:
        ap.error(f"--configs: unknown {sorted(unknown)} (quarter, resident)")
    for label in configs:
        budget = budget_holding(m, n_ctx, int(a.cache_frac * c.n_layer * c.n_expert)) if label == "quarter" else None
        eng = GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget, config=cfg, arena=arena)
        timer = OpTimer(dev, eng.k)
        for L in lengths:
            for _ in range(2):
                eng.reset()
                eng.prefill(prompts[L])
            eng.reset()
            dev.synchronize()
            t0 = time.perf_counter()
            eng.prefill(prompts[L])
            dev.synchronize()
            wall = (time.perf_counter() - t0) * 1e3
            eng.reset()
            timer.marks, timer.on = [], True
            eng.prefill(prompts[L])
            timer.on = False
            dev.synchronize()
            ms, calls = timer.totals()
            print(f"{a.model.rsplit('/', 1)[-1]} {L} tokens {label} (chunk {eng.plan.chunk}, groups of "
                  f"{scratch_group(eng.plan.for_prompt(eng.config, eng.share, L)[3])}): wall {wall:.1f} ms untimed; GPU ms by op "
                  f"(calls): " + ", ".join(f"{n} {ms[n]:.2f} ({calls[n]})" for n, _ in ms.most_common()), flush=True)
        del eng
    dev.close()


if __name__ == "__main__":
    sys.exit(main())
