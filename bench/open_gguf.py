"""Open time of a GGUF with a real-size vocabulary: Strata's header parser against gguf.GGUFReader.

python bench/open_gguf.py [--vocab 151936] [--rounds 5]   (interleaved rounds, medians)
"""

import argparse
import os
import statistics
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    import gguf

    from strata.gguf_file import GGUFFile
    from strata.gguf_writer import GGUFWriter

    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "v.gguf")
        w = GGUFWriter("qwen3moe")
        w.add("tokenizer.ggml.tokens", [f"Ġtoken{i}" for i in range(a.vocab)])
        w.add("tokenizer.ggml.token_type", [1] * a.vocab, item_type=5)
        w.add("tokenizer.ggml.merges", [f"Ġt oken{i}" for i in range(a.vocab - 500)])
        w.write(p)
        ours, theirs = [], []
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            GGUFFile(p).close()
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            gguf.GGUFReader(p)
            theirs.append(time.perf_counter() - t0)
        mo, mt = statistics.median(ours), statistics.median(theirs)
        print(f"open {a.vocab:,}-token vocabulary + merges: strata {mo * 1e3:.0f} ms, gguf.GGUFReader "
              f"{mt * 1e3:.0f} ms (median of {a.rounds} interleaved rounds; ratio {mt / mo:.1f}x)")


if __name__ == "__main__":
    main()
