"""In one process, CUDA only (stop 50; run at stop 52, bench/results/h200/plain_rows_q8_stop52.log): auto's settled
unshared layers on the share-off path (rows on the device, pre-sync groups) against the host rows (rows_on_device
off: before this change, a chunk the share may take laid its rows on the host). Engines on one arena and pool: off;
auto with every size class's gate preset to a settled 'do not share'; that with rows_on_device off.

python bench/plain_rows_ab.py MODEL.gguf 250,600,900 ROUNDS"""
import sys
import numpy as np
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from kernel_ab import EngineAB, share_engines
from strata.policy import size_class

path, lengths, rounds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
dev, m, pool, (e_off, e_set, e_nr) = share_engines(path, (0.0, None, None))
e_nr.rows_on_device = False
for e in (e_set, e_nr):
    for L in lengths:
        g = e.cpu_block.policy._class(size_class(L)).gate
        g.ratios.extend([2.0] * 5)
        g.gate = False
for label, a, b in (("auto settled, host rows (old) vs auto settled, the share-off path (new)", e_nr, e_set),
                    ("share off (old) vs auto settled, the share-off path (new)", e_off, e_set)):
    print(f"## {label}", flush=True)
    EngineAB(dev, m, a, b, rounds).prompts(lengths, np.random.default_rng(0))
for name, e in (("off", e_off), ("auto settled", e_set), ("auto settled host rows", e_nr)):
    s = e.stats
    cb = e.cpu_block
    cls = "" if e is e_off else "; " + ", ".join(
        f"class {k}: gate {'share' if v.gate.gate else 'do not share'}, exploring {v.gate.exploring()}, "
        f"layers {v.gate.layers}, vetoed {v.vetoed}" for k, v in sorted(cb.policy.by_class.items()))
    print(f"{name}: guessed {s.guessed}, streamed {s.streamed_experts}, CPU experts "
          f"{cb.stats.get('cpu_experts', 0) if cb else 0}, shared layers {cb.stats.get('shared_layers', 0) if cb else 0}"
          f"{cls}", flush=True)
pool.close()
