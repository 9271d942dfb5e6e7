"""In one process, CUDA only (stop 50; run at stop 52, bench/results/h200/plain_rows_q8_stop52.log): auto's settled
unshared layers on the share-off path (rows on the device, pre-sync groups) against the host rows (rows_on_device
off: before this change, a chunk the share may take laid its rows on the host). Engines on one arena and pool: off;
auto with every size class's gate preset to a settled 'do not share'; that with rows_on_device off.

python bench/plain_rows_ab.py MODEL.gguf 250,600,900 ROUNDS"""
import sys
import numpy as np
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from kernel_ab import EngineAB, settle_gates, share_engines, share_line

path, lengths, rounds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
dev, m, pool, (e_off, e_set, e_nr) = share_engines(path, (0.0, None, None))
e_nr.rows_on_device = False
settle_gates((e_set, e_nr), lengths)
for label, a, b in (("auto settled, host rows (old) vs auto settled, the share-off path (new)", e_nr, e_set),
                    ("share off (old) vs auto settled, the share-off path (new)", e_off, e_set)):
    print(f"## {label}", flush=True)
    EngineAB(dev, m, a, b, rounds).prompts(lengths, np.random.default_rng(0))
for name, e in (("off", e_off), ("auto settled", e_set), ("auto settled host rows", e_nr)):
    print(f"{name}: guessed {e.stats.guessed}, streamed {e.stats.streamed_experts}"
          + ("" if e is e_off else "; " + share_line(e)), flush=True)
pool.close()
