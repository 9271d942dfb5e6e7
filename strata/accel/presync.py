"""A prompt layer's cache hits launched before its routing sync: the groups' tables made on the device (SPEC §3).

Legend: T tokens, K top-k, P = T·K pairs, E experts, G members a group (the weight scratch's experts), W blob
offsets (gate, up, down), J groups launched before the sync.

Between a narrow layer's routing sync and its first launch the host lays out the layer (placement, row order, tables,
launches) with the GPU idle: 255-350 us a layer at 900 tokens on the H200 (bench/results/h200/window_q8_stop44.log),
which the layer's order puts on the prompt's chain. Here the device makes what the cache's experts need from the
routing's counts (kernels.route_hist) as soon as the router has run: the row offsets of every expert (`off`, the
rule of rows_host.order_layout: the `order` prefix first, then the other routed experts by id), and the tables of J
launch groups over the routed experts among the first `nc` of `order` (the layer's resident experts by id, then a
guessed walk's experts, whose copies were issued before the sync), G a group in row order. The host issues those
groups before it waits in the sync; after it, the host's layout (moe.row_order) gives the same rows, and only the
experts past those groups take the host's tables. Which path an expert's rows take (expert_rows at most few_rows,
else dequantise + GEMM) is the host's rule and every GEMM row tile makes the same sums (mma.cuh), so the bits are
the host path's. The host sizes what it launches from the route memory (MoeBlock._issue_pre): how many groups, which
row tile.

Tables a group (its member p is the p-th routed candidate of the group, g = p in every table): `few` pointer
tables [W][G] (every member), `many` pointer tables [W][G] (0 where the member takes expert_rows: dequant skips
it), tiles i32 (g, r0, r1) for expert_rows (rows_tile rows) and for the GEMM (bm rows, the host's pick), each
filled with empty tiles (0, 0, 0) up to its launch's grid (a kernel's block exits on one), and the group's rows
[r0, r1) for swiglu_span. `plan_host` is the rule; the CUDA kernel (cuda/route_kernels.cu plan_groups) and the host
twin give its tables.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Callable

import numpy as np

BLOB_PARTS = 3      # W: a blob's matrices (gate, up, down), each at its offset
PRE_GROUPS = 2      # launch groups a layer issues before its routing sync, at most (MoeBlock.pre_groups)
PRE_GROUPS_MAX = 4  # the most a chunk's buffers hold tables for (buffers.carve)
CARVE_FEW_ROWS = 64  # the largest few_rows (moe.FEW_ROWS, bench/prefill.py --few-rows) the carved tables fit
PRE_MIN_TOKENS = 0   # a layer whose cache lacks some of its experts takes pre-sync groups in chunks this long or
                     # longer (MoeBlock.pre_min_tokens), its groups replayed as graphs (PreGraphs): every chunk,
                     # 1.039/1.059x at 250/600 tokens on qwen3's 8-layer quarter cache, 1.121/1.186x on the 48-layer
                     # one, against 768 (bench/results/h200/narrow_ab_q8_stop54.log, narrow_ab_q48_stop54.log)
PRE_MIN_TOKENS_EAGER = 768  # the same, the groups launched one by one (STRATA_PROMPT_GRAPH=0): shorter chunks were
                            # 0.90-0.93x at 250/600 tokens on the 48-layer qwen3 (narrow_ab_q48_stop52.log) and
                            # 0.98-1.01x on the 8-layer one (graph_rows_q8_stop49.log, presync_gate_q8_stop49.log)
PRE_WIDE_TOKENS = 1024  # below it, only a narrow layer (pre_wide_tokens, takes_pre): the prompt path's chain is
                        # the host's and the GPU's there, while a broad layer's is the link's (flash-shape 0.98-0.99x)
PRE_MARGIN = 1.25   # residents' groups for this many times the routed residents the route memory expects (+1)
PRE_BIG_ROWS = 96   # the larger GEMM row tile where a routed expert is expected to get this many rows or more
                    # (gemm_grouped_mma128 is faster from ~80, bench/results/h200/gemm_kernel_stop44.log)


@dataclass(frozen=True)
class PreShape:
    """A chunk's pre-sync tables: J groups of G members, W offsets, E experts; the tile tables' strides (at the
    chunk's capacity and the smallest GEMM row tile); a launch's grid covers its fill (presync.fills at T tokens)."""

    J: int
    G: int
    W: int
    E: int
    sf: int            # stride of a group's expert_rows tiles
    sg: int            # of its GEMM tiles

    @staticmethod
    def of(J: int, G: int, W: int, E: int, cap: int, K: int, few_rows: int, rows_tile: int, bm: int) -> PreShape:
        """Strides that hold the fills of any T <= cap with few_rows up to `few_rows` (or none: the GEMM's most)
        and GEMM row tiles of at least bm."""
        return PreShape(J, G, W, E, fills(cap, K, G, few_rows, rows_tile, bm)[0], fills(cap, K, G, 0, rows_tile, bm)[1])

    @property
    def ts(self) -> int:
        return self.sf + self.sg


def takes_pre(T: int, all_cached: bool, streamed: Callable[[], float | None], ring: int, min_tokens: int,
              wide_tokens: int) -> bool:
    """Whether a prompt layer of a chunk of T tokens takes pre-sync groups: always where the cache holds all its
    experts; else from min_tokens tokens, and below wide_tokens only where the route memory expects it to stream
    no more than the guessed walk's ring holds. `streamed()`: the routed non-resident experts it expects (None
    before the layer's first note), asked only there (the short prompts' chain is the host's)."""
    if all_cached:
        return True
    if T < min_tokens:
        return False
    if T >= wide_tokens:
        return True
    n = streamed()
    return n is not None and n <= ring


def carve_shape(E: int, cap: int, K: int, group: int) -> PreShape:
    """The tables a chunk of `cap` tokens carves (buffers.carve): PRE_GROUPS_MAX groups of the weight scratch's
    `group` experts, few_rows up to CARVE_FEW_ROWS, GEMM row tiles of moe.GEMM_BM or more."""
    from strata.accel.moe import GEMM_BM, ROWS_TILE

    return PreShape.of(PRE_GROUPS_MAX, group, BLOB_PARTS, E, cap, K, CARVE_FEW_ROWS, ROWS_TILE, GEMM_BM)


def fills(T: int, K: int, G: int, few_rows: int, rows_tile: int, bm: int) -> tuple[int, int]:
    """Tiles a group's launches may need at T tokens (expert_rows', the GEMM's of bm rows): each member at most T
    rows (a token routes an expert once), the group at most T·K; every member's last tile may be partial. No GEMM
    where no member can have more than few_rows rows."""
    few = G * -(-min(few_rows, T) // rows_tile)
    if few_rows >= T:
        return few, 0
    return few, -(-min(G * T, T * K) // bm) + G


PLAN_PRM = 16       # plan_groups' sizes at the head of its input (route_kernels.cu plan_groups' prm)


@dataclass(frozen=True)
class PlanLayout:
    """plan_groups' input, as the host writes it for the device (Kernels.plan_write): the sizes i32 [PLAN_PRM] |
    order i32 [E] | the candidates' blob addresses u64 [E] | offs u64 [W], 256-byte aligned parts. The parts sit
    where they would for E of each, so a captured plan reads an input of any length at the same addresses."""

    E: int
    W: int

    @property
    def order_at(self) -> int:
        return 4 * PLAN_PRM

    @property
    def ptrs_at(self) -> int:
        return self.order_at + up256(4 * self.E)

    @property
    def offs_at(self) -> int:
        return self.ptrs_at + 8 * self.E

    @property
    def nbytes(self) -> int:
        return up256(self.offs_at + 8 * self.W)


def up256(n: int) -> int:
    """n rounded up to the tables' 256-byte alignment (a part's start)."""
    return -(-n // 256) * 256


def pre_bytes(shape: PreShape) -> int:
    """Device bytes of the tables (CUDA's layout: off i32 [E] | ptrs u64 [J, 2, W, G] | tiles i32 [J, ts, 3] |
    spans i32 [J, 2]; 256-byte aligned parts)."""
    s = shape
    return up256(4 * s.E) + up256(8 * s.J * 2 * s.W * s.G) + up256(12 * s.J * s.ts) + up256(8 * s.J)


def plan_host(cnt: np.ndarray, order: np.ndarray, nc1: int, nc: int, J1: int, J: int, G: int, few_rows: int,
              rows_tile: int, bm: int):
    """The rule. cnt [E] the routing's counts; order: experts whose rows come first, in this order (the rest
    follow by id); groups [0, J1) take the routed experts among order[:nc1], G a group in order, groups [J1, J)
    those among order[nc1:nc] (the cache's experts; a guessed walk's, whose copies the compute stream waits for
    between the two); a member of more than few_rows rows takes the GEMM in tiles of bm rows (the host picks bm:
    every tiling gives the same sums, mma.cuh), the others expert_rows in tiles of rows_tile. -> (off [E] i64 (0
    for the unrouted), members [J] lists of indices into `order`, tiles [J] (few, gemm) lists of (g, r0, r1), spans
    [J] (r0, r1))."""
    E = cnt.shape[0]
    off = np.zeros(E, np.int64)
    in_order = np.zeros(E, np.bool_)
    in_order[order] = True
    s, memb = 0, ([], [])
    for i, e in enumerate(order.tolist()):
        if cnt[e] > 0:
            off[e] = s
            cls = 0 if i < nc1 else 1 if i < nc else None
            if cls is not None and len(memb[cls]) < (J1, J - J1)[cls] * G:
                memb[cls].append((i, s))
            s += int(cnt[e])
    for e in range(E):
        if not in_order[e] and cnt[e] > 0:
            off[e] = s
            s += int(cnt[e])
    members, tiles, spans = [], [], []
    for j in range(J):
        q = j * G if j < J1 else (j - J1) * G
        ms = memb[0 if j < J1 else 1][q:q + G]
        m = [i for i, _ in ms]
        st = [r for _, r in ms]
        c = [int(cnt[order[i]]) for i in m]
        few_t, gemm_t = [], []
        for p, (x, r) in enumerate(zip(c, st)):
            t, size = (few_t, rows_tile) if x <= few_rows else (gemm_t, bm)
            for r0 in range(r, r + x, size):
                t.append((p, r0, min(r0 + size, r + x)))
        members.append(m)
        tiles.append((few_t, gemm_t))
        spans.append((st[0], st[-1] + c[-1]) if m else (0, 0))
    return off, members, tiles, spans


@dataclass(frozen=True)
class PreGroup:
    """One pre-sync group's tables as the kernels take them (CUDA: (address, length) tuples; the twin: arrays):
    few / many: W pointer tables of G entries; tiles and the grids' tile counts (nf expert_rows, ng the GEMM's of
    bm rows; 0: not launched); span: its rows for swiglu_span."""

    few: tuple
    many: tuple
    tf: object
    tg: object
    nf: int
    ng: int
    bm: int
    span: object


PRE_GRAPHS_MAX = 256   # pre-sync group graphs an engine keeps (prompt lengths and loans give their tables new homes)


def where(x) -> object:
    """A hashable stand-in for what a launch reads: ints as they are, device arrays (CUDA or the twin's) by address,
    shape and strides, tuples item by item."""
    if x is None or isinstance(x, (bool, int, float, str, np.integer)):
        return x
    if isinstance(x, (tuple, list)):
        return tuple(where(v) for v in x)
    if is_dataclass(x):
        return (type(x).__name__,) + tuple(where(getattr(x, f.name)) for f in fields(x))
    ai = getattr(x, "__cuda_array_interface__", None) or getattr(x, "__array_interface__", None)
    if ai is None:
        raise TypeError(f"{type(x).__name__}: not a launch argument presync.where knows")
    return ai["data"][0], tuple(ai["shape"]), ai.get("strides")


class PreGraphs:
    """A pre-sync group's launches (ExpertRunner.group_pre: dequantisation, expert_rows, GEMMs, SwiGLU, ~8 a group)
    as graphs replayed with one launch. Their arguments are the chunk's buffers and the group's device tables, which
    plan_groups rewrites on the device before each run, so a key of those addresses (and the grids' sizes) meets
    the same launches again. Why: on the H200's host those launches took ~150 us of a narrow layer's ~420 us from its
    block's entry to its routing sync at 900 tokens, while the GPU, done with the layer's dense part, waited
    (bench/results/h200/presync_lines_900_stop54.log). As prompt_graph.py's segments: a key's first run is eager,
    its second captured, later ones replayed; a capture allocates nothing (its region is too small: an allocation
    fails it)."""

    def __init__(self, dev, most: int = PRE_GRAPHS_MAX):
        self.dev, self.most = dev, most
        self.region = dev.empty((1,), np.uint8)
        self.graphs: dict = {}
        self.seen: dict = {}                  # key -> capturable (False once a capture of it allocated)
        self.captures = self.replays = self.eager = 0

    def run(self, key, fn) -> None:
        """fn() enqueues the launches on the compute stream: run, captured or replayed as the key was met (a graph
        replays on the stream it was captured on: the stream is part of the key)."""
        key = (key, id(self.dev.compute))
        g = self.graphs.get(key)
        if g is not None:
            g.launch()
            self.replays += 1
            return
        capturable = self.seen.get(key)
        if not capturable:                         # met first now, or a capture of it allocated
            if capturable is None:
                if len(self.seen) >= self.most:    # keys that never came back: forget them rather than grow
                    self.seen.clear()
                self.seen[key] = True
            fn()
            self.eager += 1
            return
        if len(self.graphs) >= self.most:
            self.graphs.clear()
        dev = self.dev
        dev.begin_segment(self.region, capture=True)
        try:
            fn()
        except MemoryError:                        # it allocates: run it as it is from now on
            dev.end_segment()
            self.seen[key] = False
            fn()
            self.eager += 1
            return
        except BaseException:
            dev.end_segment()
            raise
        graph, _, _ = dev.end_segment()
        self.graphs[key] = graph
        graph.launch()                             # the capture ran nothing
        self.captures += 1
