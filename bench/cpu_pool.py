"""The CPU expert pool's speed: host memory bandwidth, expert throughput by quant type × tokens per expert ×
worker count, and CPU-only prefill/decode of a synthesised model beside llama.cpp's CPU backend on the same GGUF.

python bench/cpu_pool.py [--types Q4_K,Q8_0,...] [--tokens 1,2,4,8] [--workers 0,1,3,7,15] [--experts 64]
                         [--preset olmoe-1b-7b --layers 4 | --model X.gguf] [--prompt-tokens 64] [--decode 32]
                         [--llama-python VENV/bin/python] [--rounds 3] [--json out.json]

Every figure is the median of interleaved rounds (each round runs every configuration once, in the same order;
pools sleep past their spin window between runs so one pool's spinning never steals another's cores). Expert
shape: Qwen3-30B-A3B's (D 2048, F 768) unless --shape D,F. GB/s counts weight bytes read (blobs); a batch holds
`--experts` distinct experts, and batches rotate over copies filling three times the last-level cache, so each
batch reads DRAM (the H200 host's L3 is 300 MiB: 64 Qwen3 experts would fit). Timed: the pool's run of a planned
batch with its workers awake, as in the engine (expert_throughput). llama.cpp runs in a subprocess through
llama-cpp-python (the column is skipped, with a note, when that interpreter is missing). pool_probe times a given
pool on a model's own experts as the prefill share runs them (bench/cpu_share.py probes each configuration's pool).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hw_probe import host_bandwidth  # noqa: E402
from strata import quants  # noqa: E402
from strata.accel.cpu.pool import MAXT, ExpertJob, ExpertPool, available_cores  # noqa: E402

_LLAMA_SCRIPT = r"""
import json, sys, time
import numpy as np
import llama_cpp
from llama_cpp import Llama
path, threads, n_ctx, prompt, n_dec = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]), int(sys.argv[5])
m = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=len(prompt),
          verbose=False)
def greedy():   # the last token's logits (llama-cpp-python keeps no scores without logits_all)
    return int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(m._ctx.ctx, -1), shape=(m.n_vocab(),))))
m.eval(prompt[:8]); greedy(); m.reset()   # warm-up (page-in, thread start)
t0 = time.perf_counter(); m.eval(prompt); tok = greedy(); t1 = time.perf_counter()
t2 = time.perf_counter()
for _ in range(n_dec):
    m.eval([tok]); tok = greedy()
t3 = time.perf_counter()
print(json.dumps({"prefill_tps": len(prompt) / (t1 - t0), "decode_tps": n_dec / (t3 - t2)}))
"""


def _llc_bytes() -> int:
    """The last-level cache's size: the largest cache index of cpu0 in sysfs, else `getconf`, else 512 MiB (a
    generous guess only costs memory)."""
    base, best = "/sys/devices/system/cpu/cpu0/cache", 0
    for idx in os.listdir(base) if os.path.isdir(base) else ():
        try:
            with open(os.path.join(base, idx, "size")) as fh:
                v = fh.read().strip().upper()
            best = max(best, int(v.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(v[-1:], 1))
        except (OSError, ValueError):
            continue
    if not best:
        try:
            best = int(subprocess.run(["getconf", "LEVEL3_CACHE_SIZE"], capture_output=True, text=True).stdout or 0)
        except (OSError, ValueError):
            best = 0
    return best or 512 << 20


def _blobs(qtype: int, d: int, f: int, n: int, min_bytes: int, rng) -> tuple[list[list[np.ndarray]], int]:
    """Batches of n distinct expert blobs, at least two and at least `min_bytes` in all (copies of one random
    batch: distinct memory, same values), and the blob size."""
    cls = quants.get(qtype)
    size = 2 * f * cls.row_bytes(d) + d * cls.row_bytes(f)
    raw = cls.random_blocks(rng, n * size // cls.type_size, 0.02).reshape(n, -1)
    out = []
    for _ in range(max(2, -(-min_bytes // (n * size)))):
        c = raw.copy()
        out.append([c[i] for i in range(n)])
    return out, size


def expert_throughput(a, threads_all: int) -> list[dict]:
    """Steady-state batches: plan rows built before the clock starts (the engine's CPU block and CpuOps build
    them in numpy, not per job), workers awake (a one-expert batch wakes them first: the engine calls its pool
    every layer, inside the spin window), and every timed batch on blobs last read more than twice the
    last-level cache ago (batches rotate over enough copies), so the weights come from DRAM."""
    d, f = a.shape
    rng = np.random.default_rng(0)
    pools = {}
    modes = (False, True) if a.pipeline == "both" else (a.pipeline == "on",)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for w in a.workers:
            for pipe in modes:
                pools[w, pipe] = ExpertPool(w, pipeline=pipe)
    llc = _llc_bytes()
    data = {}
    for name in a.types:
        qt = next(c.qtype for c in quants.registered() if c.name == name)
        blobs, size = _blobs(qt, d, f, a.experts, 3 * llc, rng)
        xs = {n: rng.standard_normal((a.experts, n, d)).astype(np.float32) for n in a.tokens}
        outs = {n: np.empty((a.experts, n, d), np.float32) for n in a.tokens}
        data[name] = (qt, blobs, size, xs, outs)
    print(f"expert batches rotate over >= 3x the last-level cache ({llc / 2**20:.0f} MiB)")
    res: dict[tuple, list[float]] = {}
    turn = dict.fromkeys(data, 0)    # each type cycles through its own batches: a batch's blobs were last read
    for r in range(a.rounds + 1):   # all its other batches ago. Round 0 warms up (compiles, pages in)
        for name, (qt, blobs, size, xs, outs) in data.items():
            for (w, pipe), pool in pools.items():
                for n in a.tokens:
                    batch = blobs[turn[name] % len(blobs)]
                    turn[name] += 1
                    plan = batch_plan(pool, batch, (qt, qt, qt), d, f, xs[n], outs[n], n)
                    wake = batch_plan(pool, batch[:1], (qt, qt, qt), d, f, xs[n], outs[n], n)
                    time.sleep(0.005)   # every pool past its spin window: parked, not competing
                    pool.run_plan(*wake)
                    t0 = time.perf_counter()
                    pool.run_plan(*plan)
                    dt = time.perf_counter() - t0
                    if r:
                        res.setdefault((name, w, pipe, n), []).append(dt)
    rows = []
    for (name, w, pipe, n), dts in res.items():
        dt = statistics.median(dts)
        size = data[name][2]
        rows.append({"type": name, "threads": w + 1, "pipeline": pipe, "tokens": n, "ms": dt * 1e3,
                     "gbps": a.experts * size / dt / 1e9, "experts_per_s": a.experts / dt})
    for pool in pools.values():
        pool.close()
    return rows


def batch_plan(pool, blobs, types, d: int, f: int, xs, outs, n: int):
    """The pool's plan for one expert a blob on its own n token rows (xs[i][:n] -> outs[i][:n]): the rows
    CpuBlock._jobs builds for a share, whose experts never share input rows (so no job reuses another's
    quantised activations)."""
    return pool.plan([ExpertJob(b, types, d, f, xs[i][:n], outs[i][:n]) for i, b in enumerate(blobs)])


def share_us(pool, plan) -> float:
    """Wall µs of one batch run as the prefill share runs it (strata/accel/cpu_block.py run_share)."""
    from strata.accel.cpu_block import run_share

    t0 = time.perf_counter()
    run_share(pool, plan)
    return (time.perf_counter() - t0) * 1e6


def _probe_slots(layers, probed: list[int], n: int) -> list[tuple[int, int]]:
    """(layer, first expert) of every run of n neighbouring experts in the probed layers, layer-interleaved:
    consecutive batches read far-apart blobs, so a batch finds its blobs in DRAM, as a share does."""
    per = [[(l, e0) for e0 in range(0, layers[l].shape[0] - n + 1, n)] for l in probed]
    return [s for group in zip(*per) for s in group]


def pool_probe(pool, layers, types, d: int, f: int, experts: int = 32, reps: int = 5, seed: int = 0) -> dict:
    """This pool's speed on a model's own experts as the prefill share runs them (SPEC §4: the CPU takes experts
    of 1..MAXT tokens): wall µs an expert at t = 1..MAXT tokens, and a batch's fixed µs (dispatch + join).

    layers: per layer the [E, blob] uint8 experts as the pool reads them (the engine's arena); types: per layer
    (gate, up, down) ggml ids; the layers of the most common types are probed. A batch holds `experts` distinct
    experts or a quarter of that (the stored H200 runs' fixed shares gave the CPU 84-215 a layer: a line through
    the two sizes reaches them, and a one-worker pool probes in seconds). Per t the two sizes' medians over `reps`
    interleaved rounds (one more, first, warms up) give batch(n) = batch_us + n x us(t); the fixed part is the
    median over t of the lines' intercepts (a batch costs it whatever its t), us(t) what the large batch leaves."""
    common = Counter(types).most_common(1)[0][0]   # ties: the first layer's
    probed = [l for l, t in enumerate(types) if t == common]
    big = max(1, min(experts, min(layers[l].shape[0] for l in probed)))
    sizes = (big, max(1, big // 4))
    slots = _probe_slots(layers, probed, big)
    rng = np.random.default_rng(seed)
    xs = (0.5 * rng.standard_normal((big, MAXT, d))).astype(np.float32)   # [n, MAXT, D]
    outs = np.empty((big, MAXT, d), np.float32)
    wall = {(n, t): [] for n in sizes for t in range(1, MAXT + 1)}
    turn, t_start = 0, time.perf_counter()
    for r in range(reps + 1):
        for t in range(1, MAXT + 1):
            for n in sizes:
                l, e0 = slots[turn % len(slots)]
                turn += 1
                plan = batch_plan(pool, list(layers[l][e0:e0 + n]), common, d, f, xs, outs, t)
                us = share_us(pool, plan)
                if r:
                    wall[n, t].append(us)
    med = {k: statistics.median(v) for k, v in wall.items()}
    b, s = sizes
    ts = range(1, MAXT + 1)
    lines = [(b * med[s, t] - s * med[b, t]) / (b - s) for t in ts] if b > s else [0.0]
    batch_us = min(max(0.0, statistics.median(lines)), min(med[s, t] for t in ts))   # within the smallest batch
    return {"workers": pool.workers, "types": [quants.type_name(q) for q in common], "layers": probed,
            "experts": list(sizes), "reps": reps, "us_per_expert": [(med[b, t] - batch_us) / b for t in ts],
            "batch_us": batch_us, "wall_us": {str(n): [med[n, t] for t in ts] for n in sizes},
            "seconds": time.perf_counter() - t_start}


def merge_probes(probes: list[dict]) -> dict:
    """One probe of several taken through a run: per t the median µs an expert, the median batch µs (a one-worker
    pool on the H200 read 515..2,362 µs and a minute later 721..3,142 µs: one probe before the rounds missed the
    rounds' pool by up to 22%, share_f_w1b_stop20.log); `each` keeps every probe's µs at 1..MAXT tokens and
    `wall_us` every probe's raw batch medians."""
    first = probes[0]
    us = [statistics.median(p["us_per_expert"][i] for p in probes) for i in range(len(first["us_per_expert"]))]
    return {**first, "us_per_expert": us, "batch_us": statistics.median(p["batch_us"] for p in probes),
            "seconds": sum(p["seconds"] for p in probes), "probes": len(probes),
            "each": [p["us_per_expert"] for p in probes], "wall_us": [p["wall_us"] for p in probes]}


def probe_line(p: dict) -> str:
    return (f"pool probe ({p['workers']} workers, {'/'.join(p['types'])} experts, batches of "
            f"{' and '.join(map(str, p['experts']))}, medians of {p['reps']}, {p['seconds']:.1f} s): us an expert at "
            f"1..{len(p['us_per_expert'])} tokens " + " ".join(f"{u:.1f}" for u in p["us_per_expert"])
            + f"; a batch {p['batch_us']:.0f} us"
            + (f" (medians of {p['probes']} probes through the run; at {MAXT} tokens "
               f"{min(e[-1] for e in p['each']):.0f}..{max(e[-1] for e in p['each']):.0f} us)" if p.get("probes") else ""))


def model_file(a) -> str:
    if a.model:
        return a.model
    path = os.path.join(tempfile.gettempdir(), f"strata-bench-{a.preset}-L{a.layers or 'all'}.gguf")
    if not os.path.exists(path):
        print(f"synthesising {a.preset} ({a.layers or 'all'} layers) -> {path}", file=sys.stderr)
        cmd = [sys.executable, "-m", "strata.synth", "--preset", a.preset, "--out", path + ".part"]
        subprocess.run(cmd + (["--layers", str(a.layers)] if a.layers else []), check=True)
        os.replace(path + ".part", path)
    return path


def ours(eng, prompt: list[int], n_dec: int) -> dict:
    eng.reset()
    t0 = time.perf_counter()
    logits = eng.prefill(prompt, logits="last")   # the head on the last row only, as llama.cpp
    t1 = time.perf_counter()
    tok = int(np.argmax(logits[-1]))
    t2 = time.perf_counter()
    for _ in range(n_dec):
        tok = int(np.argmax(eng.decode(tok)))
    t3 = time.perf_counter()
    return {"prefill_tps": len(prompt) / (t1 - t0), "decode_tps": n_dec / (t3 - t2)}


def llama(a, path: str, prompt: list[int], threads: int) -> dict | None:
    exe = a.llama_python
    if not exe or not (os.path.exists(exe) or shutil.which(exe)):
        return None
    env = dict(os.environ)
    if a.llama_path:   # llama_cpp (and diskcache) carried as plain folders: put them on the path
        env["PYTHONPATH"] = a.llama_path + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([exe, "-c", _LLAMA_SCRIPT, path, str(threads), str(len(prompt) + a.decode + 8),
                        json.dumps(prompt), str(a.decode)], capture_output=True, text=True, timeout=1800, env=env)
    if p.returncode != 0:
        print(f"llama.cpp run failed: {p.stderr.strip()[-500:]}", file=sys.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def model_speed(a, threads_all: int) -> dict:
    from strata import models
    from strata.accel.cpu.ops import CpuEngine

    path = model_file(a)
    m = models.load(path)
    prompt = np.random.default_rng(1).integers(0, m.cfg.n_vocab, a.prompt_tokens).tolist()
    pool = ExpertPool(threads_all - 1, pipeline=a.pipeline == "on")
    eng = CpuEngine(m, pool=pool, n_ctx=a.prompt_tokens + a.decode + 8)
    ours(eng, prompt[:8], 2)   # warm-up: loads the kernels, pages the file in
    runs: dict[str, list[dict]] = {"strata": [], "llama.cpp": []}
    note = None
    for _ in range(a.rounds):
        time.sleep(0.01)
        runs["strata"].append(ours(eng, prompt, a.decode))
        time.sleep(0.01)   # our workers park before llama.cpp's threads start
        r = llama(a, path, prompt, threads_all)
        if r is None:
            note = f"llama.cpp column skipped: no working llama-cpp-python at {a.llama_python!r}"
        else:
            runs["llama.cpp"].append(r)
    eng.close()
    out = {"model": path, "arch": m.cfg.arch, "layers": m.cfg.n_layer, "threads": threads_all, "note": note}
    for who, rs in runs.items():
        if rs:
            out[who] = {k: statistics.median(r[k] for r in rs) for k in ("prefill_tps", "decode_tps")}
    if runs["llama.cpp"]:
        out["ratio"] = {k: out["strata"][k] / out["llama.cpp"][k] for k in ("prefill_tps", "decode_tps")}
    m.close()
    return out


def main():
    cores = available_cores()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="Q4_K,Q8_0,Q6_K,Q5_K,IQ4_XS,Q4_0,Q3_K,IQ2_XS")
    ap.add_argument("--tokens", default="1,2,4,8")
    ap.add_argument("--workers", default=",".join(str(w) for w in sorted({0, 1, 3, 7, cores - 1}) if w < cores))
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--shape", default="2048,768", help="D,F of the experts (default Qwen3-30B-A3B's)")
    ap.add_argument("--pipeline", choices=("off", "on", "both"), default="both",
                    help="pool mode for the expert runs; both = phased and pipelined pools interleaved")
    ap.add_argument("--model", help="a GGUF for the CPU-only run (default: synthesise --preset)")
    ap.add_argument("--preset", default="olmoe-1b-7b")
    ap.add_argument("--layers", type=int, default=0, help="layers of the synthesised model (0: the preset's)")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--llama-python", default="",
                    help="an interpreter that can import llama_cpp (llama-cpp-python built from source, CPU; "
                         "tools/build_llama_cpp.sh); without it the llama.cpp column is skipped")
    ap.add_argument("--llama-path", help="folder holding llama_cpp/ (and diskcache/) to add to its PYTHONPATH")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma list of sections to skip: bandwidth,experts,model")
    ap.add_argument("--json")
    a = ap.parse_args()
    a.types = [t.strip().upper() for t in a.types.split(",") if t.strip()]
    a.tokens = [int(t) for t in a.tokens.split(",")]
    a.workers = [int(w) for w in a.workers.split(",")]
    a.shape = tuple(int(v) for v in a.shape.split(","))
    skip = set(a.skip.split(","))
    result = {"cores": cores}
    if "bandwidth" not in skip:
        bw = {t: host_bandwidth(t) for t in sorted({1, 4, cores})}
        result["host_read_gbps"] = bw
        print("host memory bandwidth (streaming read): " + ", ".join(f"{t} thr {g:.1f} GB/s" for t, g in bw.items()))
    if "experts" not in skip:
        rows = expert_throughput(a, cores)
        result["experts"] = rows
        print(f"\nexpert throughput, D,F = {a.shape}, {a.experts} experts per batch "
              f"(GB/s of weights | experts/s; P = pipeline on)")
        for name in a.types:
            print(f"  {name}")
            for n in a.tokens:
                cells = [r for r in rows if r["type"] == name and r["tokens"] == n]
                print(f"    {n} tok/expert: " + "  ".join(
                    f"{r['threads']:2d}{'P' if r['pipeline'] else ' '} {r['gbps']:6.1f} GB/s {r['experts_per_s']:6.0f}/s"
                    for r in cells))
    if "model" not in skip:
        ms = model_speed(a, cores)
        result["model"] = ms
        print(f"\nCPU-only {ms['arch']} ({ms['layers']} layers, {ms['threads']} threads): {ms['model']}")
        for who in ("strata", "llama.cpp"):
            if who in ms:
                print(f"  {who:10s} prefill {ms[who]['prefill_tps']:8.1f} tok/s   decode {ms[who]['decode_tps']:7.2f} tok/s")
        if "ratio" in ms:
            print(f"  ratio      prefill {ms['ratio']['prefill_tps']:8.2f}x        decode {ms['ratio']['decode_tps']:7.2f}x")
        if ms["note"]:
            print(f"  note: {ms['note']}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
