"""A prompt chunk's dense part as captured graphs, one between each two MoE blocks (ours; the accel GPU issue's
"CUDA graphs where they pay", here for prompts).

Between one layer's MoE block and the next layer's routing sync the host issues ~15 device calls (the residual
adds, the norms, q|k|v, qk-norm and RoPE, the KV store, the attention, o, the router and its top-k) and needs
nothing back. On the H200 that took 312 us of host time at 256 tokens against ~140 us of GPU work, and 611 us
against ~500 at 1,280 (bench/results/h200/probe_stop34.log): in qwen3's narrow layers the GPU waited on the host.
That stretch, a *segment*, is captured once and then replayed: one launch, with the model code's calls answered
from the capture's tape (13 us at 256 tokens, 32 at 1,280).

- Rows: a chunk of T tokens runs its segments on Tb = T rounded up to BUCKET rows, so that prompts of nearby
  lengths share graphs. The rows past T are zeros, and no real row reads them: the attention is causal, and every
  other op works row by row. The MoE blocks, the head and the logits take the T real rows.
- Keys: (layer, Tb, first position). A key's first segment runs eagerly, its second is captured, later ones replay:
  a shape met once costs no capture. A segment that did array arithmetic (`DeviceOps.arith`: a non-contiguous add) or
  outgrew its region is never captured. Chunks past GRAPH_ROWS tokens run op by op.
- Memory: a segment carves every allocation from one of two regions (even and odd layers), from its start, none
  freed. So every graph of one parity writes the same bytes, and a segment reads what the one before it left in the
  other region. Inputs sit at fixed addresses: `x` (the embedding, then each MoE block's output), `pos` (the rows'
  positions), `ids` and `w` (the routing the top-k writes and the MoE block reads).
Legend: T tokens, Tb padded rows, D hidden, K top-k.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from strata.accel.buffers import segment_bytes, temp_bytes
from strata.accel.gpu.kernels import ONE_PASS_HEAD_DIMS

BUCKET = 64          # rows a segment is padded to (the prompt attention's 64-row blocks)
# chunks of more tokens run their dense parts op by op: there the GPU's work covers the host's issue, and the
# regions cost VRAM as the rows. Up to 1,024 rows: a 900-token chunk's replayed segment leaves the host free to issue
# a narrow layer's pre-sync groups (presync.py) while the GPU runs the dense part: qwen3's quarter cache 1.053x at
# 900 tokens with the graphs alone, 1.096x with both; flash-shape 0.998x; +83 MiB of regions for qwen3, +112 for
# flash-shape (bench/results/h200/graph_rows_*_stop49.log; 640 rows until then, ab_graphs_*_stop34.log)
GRAPH_ROWS = 1024
SEEN_MAX = 1 << 16   # keys met once that PromptGraphs remembers
EAGER, CAPTURE, REPLAY = "eager", "capture", "replay"
TAPED = ("rms_norm", "linear", "add", "add_bias", "rope", "qk_norm_rope", "attention", "router_probs", "topk",
         "ffn", "sigmoid_gate")        # the ops contract (strata/models/common.py) but embed and experts


def graph_temp_bytes(cfg, cap: int) -> int:
    """Step temporaries of an engine whose prompt chunks of `cap` tokens run their dense parts as segments: the
    memory pool's for the chunks past GRAPH_ROWS (temp_bytes), two regions and the fixed inputs for the others."""
    rows = min(cap, GRAPH_ROWS)
    return temp_bytes(cfg, cap) + 2 * segment_bytes(cfg, rows) + rows * (cfg.n_embd * 4 + cfg.n_expert_used * 8 + 4)


def usable(dev, cfg) -> bool:
    """Whether a model's segments can be graphs on `dev`: CUDA's blocked attention (head sizes outside
    ONE_PASS_HEAD_DIMS) keeps its scores in the step buffers, whose address changes with the prompt's loan."""
    return dev.kind != "cuda" or cfg.head_dim in ONE_PASS_HEAD_DIMS


@dataclasses.dataclass
class _Segment:
    graph: object
    tape: list          # [(op name, what it returned)], in call order


class PromptGraphs:
    """The regions, fixed inputs and captured segments of one engine (chunks of up to `cap` tokens)."""

    def __init__(self, dev, cfg, chunk: int, n_ctx: int):
        cap = min(chunk, GRAPH_ROWS)
        self.dev, self.cfg, self.cap, self.n_ctx = dev, cfg, cap, n_ctx
        D, K = cfg.n_embd, cfg.n_expert_used
        self.regions = [dev.empty((segment_bytes(cfg, cap),), np.uint8) for _ in range(2)]
        self.x = dev.zeros((cap, D), np.float32)                     # [cap, D] each segment's input
        self.ids, self.w = dev.zeros((cap, K), np.int32), dev.zeros((cap, K), np.float32)
        self.pos = dev.zeros((cap + 4,), np.int32)              # padded: pulls move whole 16-byte words
        self.pos_host = dev.pinned((cap + 4) * 4).view(np.int32)
        self.pos_done = dev.event(timing=False)
        self.graphs: dict[tuple, _Segment] = {}
        self.seen: dict[tuple, bool] = {}       # key -> capturable, after its eager run
        self.used: dict[tuple, int] = {}        # key -> bytes its eager run carved
        self.captures = self.replays = self.eager = 0
        self.capture_s = 0.0

    def rows(self, T: int, pos0: int) -> int | None:
        """Tb for a chunk of T tokens from position pos0: T rounded up to BUCKET, within the regions' rows and the
        context; None past GRAPH_ROWS (op by op)."""
        if T > self.cap:
            return None
        return max(T, min(-(-T // BUCKET) * BUCKET, self.cap, self.n_ctx - pos0))

    def chunk(self, base, bufs, tokens, pos0: int, n_layer: int) -> "SegmentOps | None":
        """Bind `base` (DeviceOps) to a chunk: positions uploaded to `pos`, the embedding in `x` (zero past T).
        Returns the ops the model code runs on (`start` opens its first segment); None for a chunk past GRAPH_ROWS
        (the caller runs it op by op)."""
        T = len(tokens)
        Tb = self.rows(T, pos0)
        if Tb is None:
            return None
        dev, s = self.dev, self.dev.compute
        self.pos_done.synchronize()                  # the last chunk's upload has left the pinned positions
        self.pos_host[:Tb] = np.arange(pos0, pos0 + Tb, dtype=np.int32)
        n = -(-Tb // 4) * 4                          # pulled, not copied: not behind the ring's expert copies
        dev.k.pull(self.pos[:n].view(np.uint8), self.pos_host[:n].view(np.uint8), s)
        self.pos_done.record(s)
        base.begin(dataclasses.replace(bufs, ids=self.ids, w=self.w), pos0, Tb, pos_dev=self.pos[:Tb])
        base.embed("token_embd.weight", tokens, out=self.x[:T])
        if Tb > T:
            self.x[T:Tb].fill(0)
        return SegmentOps(self, base, T, Tb, pos0, n_layer)


class SegmentOps:
    """The ops the model code runs on for one chunk: the calls between two MoE blocks run eagerly, are captured,
    or (replay) are answered from the capture's tape while its graph runs; `experts` closes a segment, runs the MoE
    block on the T real rows into the fixed `x`, and opens the next."""

    def __init__(self, pg: PromptGraphs, base, T: int, Tb: int, pos0: int, n_layer: int):
        self.pg, self.base = pg, base
        self.T, self.Tb, self.pos0, self.n_layer = T, Tb, pos0, n_layer
        self.x = pg.x[:Tb]                                           # [Tb, D] the first segment's input
        self.mode, self.key, self.tape, self.i, self.arith, self.t0 = None, None, None, 0, 0, 0.0

    def start(self) -> None:
        """Open the first segment (after any copies the engine issues first: a capture must not record them)."""
        self._open(0)

    def _open(self, layer: int) -> None:
        pg = self.pg
        self.key = key = (layer, self.Tb, self.pos0)
        seg = pg.graphs.get(key)
        if seg is not None:                      # runs now: the model code's calls only read the tape
            seg.graph.launch()
            pg.replays += 1
            self.mode, self.tape, self.i = REPLAY, seg.tape, 0
            return
        capture = pg.seen.get(key, False)
        self.mode, self.tape, self.arith, self.t0 = (CAPTURE if capture else EAGER), ([] if capture else None), \
            self.base.arith, time.perf_counter()
        pg.dev.begin_segment(pg.regions[layer % 2], capture=capture)

    def _close(self) -> None:
        pg = self.pg
        if self.mode is REPLAY:
            assert self.i == len(self.tape), f"segment {self.key}: {self.i} of {len(self.tape)} taped calls made"
        elif self.mode is CAPTURE:
            graph, _, _ = pg.dev.end_segment()
            pg.graphs[self.key] = _Segment(graph, self.tape)
            graph.launch()                          # the capture ran nothing
            pg.captures += 1
            pg.capture_s += time.perf_counter() - self.t0
        else:
            _, used, spilled = pg.dev.end_segment()
            if self.key not in pg.seen:
                if len(pg.seen) >= SEEN_MAX:        # shapes that never came back (a chat's every turn starts at a
                    pg.seen.clear()                 # new position): forget them rather than grow without bound
                    pg.used.clear()
                pg.seen[self.key] = not spilled and self.base.arith == self.arith
            pg.used[self.key] = used
            pg.eager += 1
        self.mode = None

    def abort(self) -> None:
        """An exception left the model code: end an open segment (its capture is dropped) and run nothing of it."""
        if self.mode in (EAGER, CAPTURE):
            self.pg.dev.end_segment()
        self.mode = None

    def _call(self, name: str, *args, **kw):
        if self.mode is REPLAY:
            got, out = self.tape[self.i]
            assert got == name, f"segment {self.key}: call {self.i} is {name}, the capture's was {got}"
            self.i += 1
            return out
        out = getattr(self.base, name)(*args, **kw)
        if self.mode is CAPTURE:
            self.tape.append((name, out))
        return out

    def experts(self, h, layer: int, ids, w):
        """Close the segment (a capture's graph runs now), then the MoE block on the real rows."""
        self._close()
        T = self.T
        self.base.moe(h[:T], layer, ids[:T], w[:T], out=self.pg.x[:T])     # the engine's, through its ops
        if layer + 1 < self.n_layer:
            self._open(layer + 1)
        return self.x

    def __getattr__(self, name):                 # anything else the model code asks of the ops: the base's
        return getattr(self.base, name)


def _taped(name: str):
    def call(self, *args, **kw):
        return self._call(name, *args, **kw)

    call.__name__ = name
    return call


for _name in TAPED:
    setattr(SegmentOps, _name, _taped(_name))
