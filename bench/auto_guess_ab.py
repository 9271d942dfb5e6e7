"""In one process, CUDA only: the default CPU share (auto) with guessed walks where its policy allows them
(SharePolicy.guesses: an unshared layer once the gate's verdict is settled on "do not share", or while the floor veto
holds) against auto without any guess beside the share (guesses() forced False: stop 49's rule), then the share off
against the former. Three quarter-cache engines (bench/prefill.py's budget) on one arena and one pool of the host's
cores less one; kernel_ab.AB's prompts: arms alternating, medians, per-round ratios. The logits differ where the two
autos' gates had the CPU take different experts (its q8 path).

python bench/auto_guess_ab.py MODEL.gguf 250,600,900 ROUNDS"""
import os, sys
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_ab import EngineAB, share_engines

path, lengths, rounds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
dev, m, pool, (e_off, e_old, e_new) = share_engines(path, (0.0, None, None))
e_old.cpu_block.policy.guesses = lambda layer: False
print(f"pool {pool.workers} workers; share old {e_old.share}, new {e_new.share}, off {e_off.share}", flush=True)
for label, a, b in (("auto without guesses (old) vs auto guessing unshared layers (new)", e_old, e_new),
                    ("share off (old) vs auto guessing unshared layers (new)", e_off, e_new)):
    print(f"## {label}", flush=True)
    EngineAB(dev, m, a, b, rounds).prompts(lengths, np.random.default_rng(0))
for name, e in (("off", e_off), ("auto old", e_old), ("auto new", e_new)):
    s = e.stats
    cpu = e.cpu_block.stats.get("cpu_experts", 0) if e.cpu_block is not None else 0
    print(f"{name}: guessed {s.guessed}, unrouted {s.guessed_unrouted}, missed {s.guessed_missed}, streamed "
          f"{s.streamed_experts}, CPU experts {cpu}", flush=True)
pool.close()
