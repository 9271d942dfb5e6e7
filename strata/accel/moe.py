"""One MoE layer on the device: router, routing sync, expert-major row layout, expert groups, combine (SPEC §3).

Legend: T tokens, K top-k, R = T·K rows, D hidden, F expert FFN, G experts per launch group.
Row order (Dm): [resident experts by id | streamed experts by id | CPU experts by id]; each expert owns a
contiguous row range, its tokens in order. Experts are computed in groups. An expert with few rows (at most
`few_rows`) runs straight from its blob (`expert_rows`: the blob read once, no fp16 copy); the others take a grouped
GEMM on tensor cores, which dequantises their blobs itself (`gemm_q`, the types the kernels have it for) or reads
an fp16 scratch `dequant` filled (the same bits). Either way: gate|up, SwiGLU, down, straight into their Dm rows.
Which path an expert takes depends only on its row count, so residency never changes the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from strata.accel.presync import where
from strata.accel.rows_host import group_rows, layout, order_layout, split_routed
from strata.policy.stream import resident_runs

GEMM_BM = 64           # rows per GEMM tile (gemm_grouped_mma's block tile); a launch group whose many-row members
                       # all have more takes Kernels.gemm_big_rows-row tiles where the kernels have them
                       # (rows_host.many_tile: gemm_grouped_mma128's 128)
ROWS_TILE = 8          # rows per expert_rows tile (cuda/rows_kernels.cu ER_RT)
GEMM_Q_TILES = 1.25    # gemm_q takes a group cut at GEMM_BM rows with at most this many tiles a many-row member: it
                       # dequantises W again in every tile (bench/results/h200/gemm_q_stop55.log: 0.63-0.92x the
                       # scratch path at 16-56 rows an expert, 1.4-2.9x at 128-512 on 128-row tiles)
PRE_Q_ROWS = 48        # a pre-sync group (its tiles made on the device) takes gemm_q where its layer's routed experts
                       # are expected to get at most this many rows on average, so that few need a second tile
FEW_ROWS = ROWS_TILE   # experts of one tile skip the fp16 scratch: each blob byte read once (bench/prefill.py
                       # --few-rows 16,0,8 on the H200, prefill_f8_fewrows.log: 16 re-reads blobs and was slower)


@dataclass
class RowLayout:
    """The routing sync's product: which rows each expert owns, and the tables the kernels read. A layout made by
    `row_order` has no host copy of the pairs' tables (ids, src, slot None): the device makes them
    (kernels.route_rows)."""

    ids: np.ndarray | None    # [T, K] routed expert ids
    order: np.ndarray         # experts in row order (resident | streamed | cpu)
    off: np.ndarray           # [E] first row of each routed expert (0 for the unrouted)
    cnt: np.ndarray           # [E] tokens per expert
    src: np.ndarray | None    # [R] token of each row
    slot: np.ndarray | None   # [T, K] row of each (token, k) pair
    resident: list = field(default_factory=list)
    streamed: list = field(default_factory=list)
    cpu: list = field(default_factory=list)
    rank: np.ndarray | None = None     # [E] each routed expert's position in `order`
    starts: np.ndarray | None = None   # [len(order)] first row of each expert in `order`


def placement(cnt: np.ndarray, resident: np.ndarray, cpu) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The routed experts (cnt [E] > 0) split into (resident, streamed, CPU), each in id order; resident [E]
    bool, cpu: the CPU's experts. The streamed ones are the routed-only walk's queue (SPEC §3).
    One compiled pass (rows_host.split_routed)."""
    on_cpu = np.zeros(cnt.shape[0], np.bool_)
    if len(cpu):
        on_cpu[np.asarray(cpu, np.int64)] = True
    return split_routed(cnt, resident, on_cpu)


def row_layout(ids: np.ndarray, cnt: np.ndarray, parts: tuple[np.ndarray, np.ndarray, np.ndarray]) -> RowLayout:
    """ids [T, K]; cnt [E] tokens per expert (bincount of ids); parts: placement()'s (resident, streamed, CPU).
    Row r of an expert's block holds its r-th token in order (rows_host.expert_major: a stable counting sort)."""
    T, K = ids.shape
    res, strm, cpu_ids = parts
    order, rank, off, src, slot, starts = layout(np.ascontiguousarray(ids, np.int32).reshape(-1), cnt,
                                                 res, strm, cpu_ids, K)
    return RowLayout(ids, order, off, cnt, src, slot.reshape(T, K),
                     res.tolist(), strm.tolist(), cpu_ids.tolist(), rank, starts)


def row_order(cnt: np.ndarray, parts: tuple[np.ndarray, np.ndarray, np.ndarray]) -> RowLayout:
    """row_layout's order, offsets and starts from the counts alone (cnt [E]; parts: placement()'s), for a layer
    whose pairs' rows the device makes from its own copy of the routing (kernels.route_rows, the same rule)."""
    res, strm, cpu_ids = parts
    order, rank, off, starts = order_layout(cnt, res, strm, cpu_ids)
    return RowLayout(None, order, off, cnt, None, None, res.tolist(), strm.tolist(), cpu_ids.tolist(), rank, starts)


def takes_gemm_q(bm: int, n_tiles: int, n_many: int) -> bool:
    """Whether a group's many-row experts take gemm_q (where the kernels have it for their types): tiles of GEMM_BM
    rows, about one a member (GEMM_Q_TILES). The bits are the scratch path's either way."""
    return n_many > 0 and bm == GEMM_BM and n_tiles <= GEMM_Q_TILES * n_many


def pre_takes_gemm_q(bm: int, rows: float | None) -> bool:
    """takes_gemm_q for a pre-sync group, whose tiles the device makes: its tiling's small tile, and its layer's
    routed experts expected to get at most PRE_Q_ROWS rows on average (rows, the route memory's; None: no history
    yet, taken as few, as the tiling takes it)."""
    return bm == GEMM_BM and (0.0 if rows is None else rows) <= PRE_Q_ROWS


def blob_offsets(cfg, types: tuple[int, int, int]) -> tuple[int, int, int]:
    """Byte offsets of the gate, up and down matrices in an expert blob of these types: [gate | up | down]."""
    from strata import quants

    gb = quants.get(types[0]).row_bytes(cfg.n_embd) * cfg.n_ff_exp
    ub = quants.get(types[1]).row_bytes(cfg.n_embd) * cfg.n_ff_exp
    return 0, gb, gb + ub


@dataclass
class GroupTables:
    """A group's device tables: `few` for expert_rows (blob tables over every member, tiles of ROWS_TILE rows
    of the few-row members, g = member index), `many` for gemm_q or dequant + gemm_grouped (blob tables over the
    many-row members only, tiles of `rows` rows, g = index among them). Each is (gate, up, down, tiles, n_tiles).
    rows: the row tile the many-row tiles were cut at (rows_host.many_tile), which picks the GEMM kernel."""

    few: tuple
    many: tuple
    n_many: int
    rows: int


class ExpertRunner:
    """Computes groups of experts into Dm. Owns the fp16 weight scratch; knows each layer's blob layout."""

    def __init__(self, dev, cfg, layer_types: list[tuple[int, int, int]], bufs, few_rows: int = FEW_ROWS,
                 graphs=None, fused: frozenset | None = None):
        self.dev, self.k, self.cfg, self.bufs = dev, dev.k, cfg, bufs
        # the weight types whose many-row experts take Kernels.gemm_q (no fp16 scratch); None: all the kernels take
        self.fused = dev.k.gemm_q_types if fused is None else fused
        self.graphs, self._where = graphs, None       # the engine's presync.PreGraphs, or None: launched one by one
        self.types = layer_types
        self.offsets = [blob_offsets(cfg, t) for t in layer_types]
        self.few_rows = few_rows
        self.pre = self.k.pre_tables(bufs.pre, bufs.pre_shape)         # the pre-sync groups' (presync.py)

    def resident_groups(self, resident: list[int], lay: RowLayout) -> list[list[int]]:
        """Runs of the resident experts (row order) of at most policy.GROUP_RESIDENT, and at most the weight
        scratch's many-row experts: few-row experts need no scratch, so a prompt layer's cache hits take few
        launches (policy.resident_runs)."""
        many = lay.cnt[resident] > self.few_rows
        return [[resident[i] for i in g] for g in resident_runs(many, self.bufs.w_d.shape[0])]

    def tables(self, layer: int, groups: list[tuple[list[int], object, np.ndarray]], lay: RowLayout,
               riders: tuple = ()) -> tuple[list, list]:
        """Every group's GroupTables of a layer in one upload: groups[g] = (members, buf, idx), the members'
        blobs being rows idx of buf (cache slots or ring slots, known before the copies land); riders: other
        tables for the same upload (Kernels.layer_tables). A prompt layer has tens of groups, and this runs on
        the host between the routing sync and the launches: the tiles are one compiled pass
        (rows_host.group_tiles), and on CUDA the whole packing (rows_host.pack_layer). Returns (the
        GroupTables, the riders on the device)."""
        n_g = len(groups)
        cnt = lay.cnt[lay.order].astype(np.int64)                  # rows of each expert, in row order
        first = lay.rank[[m[0] for m, _, _ in groups]]
        size = np.fromiter((len(m) for m, _, _ in groups), np.int64, n_g)
        assert np.array_equal(lay.rank[[m[-1] for m, _, _ in groups]] - first, size - 1), \
            "a group must be a run of experts in row order"
        rows = group_rows(cnt, first, size, self.few_rows, GEMM_BM, self.k.gemm_big_rows)    # each group's row tile
        tabs, n_many, dev_riders = self.k.layer_tables(
            [(buf, idx) for _, buf, idx in groups], self.offsets[layer], cnt, lay.starts, first, size,
            (self.few_rows, ROWS_TILE, rows), self.dev.compute, riders)
        rows = rows.tolist()
        return [GroupTables(tabs[2 * i], tabs[2 * i + 1], n_many[i], rows[i]) for i in range(n_g)], dev_riders

    def pre_tiling(self, big: bool) -> tuple[int, int, int]:
        """presync's tiling: (few_rows, rows_tile, bm), bm the kernels' larger GEMM row tile where `big` and they
        have one (rows_host.many_tile's choice, made before the counts are known)."""
        return self.few_rows, ROWS_TILE, self.k.gemm_big_rows if big and self.k.gemm_big_rows > GEMM_BM else GEMM_BM

    def group_pre(self, layer: int, g, read=None, rows: float | None = None) -> None:
        """Enqueue a pre-sync group (presync.PreGroup g, tables the device made from the routing): the same launches
        as `group`, over grids of its capacity whose blocks past the device's tiles exit, the scratch indexed by
        member (a member that takes expert_rows has no many-row pointer, so dequant leaves its scratch alone).
        `read`: an event to record once the members' blobs are read (the last launch that reads them). With the
        engine's PreGraphs the launches go as graphs (presync.PreGraphs), `read` recorded between two of them; not
        where gate and up differ in type and take the scratch (their dequantisation takes a temporary). `rows`: the
        route memory's mean rows an expert of the layer, which decide gemm_q (PRE_Q_ROWS)."""
        s, tg, tu = self.dev.compute, *self.types[layer][:2]
        gr = self.graphs
        fz = self._fused(layer, pre_takes_gemm_q(g.bm, rows))
        if gr is None or (tg != tu and not fz[0]):
            self._pre_first(layer, g, fz)
            if read is not None:
                read.record(s)
            self._pre_last(layer, g, fz)
            return
        try:
            hash(g)                               # CUDA's tables: addresses and sizes
        except TypeError:                         # the twin's: arrays
            g_key = where(g)
        else:
            g_key = g
        key = (self._buffers_key(), self.types[layer], fz, g_key)
        if read is None:
            gr.run(key + (0,), lambda: (self._pre_first(layer, g, fz), self._pre_last(layer, g, fz)))
            return
        gr.run(key + (1,), lambda: self._pre_first(layer, g, fz))
        read.record(s)                            # a new event each group: recorded outside the graphs
        if g.ng and not fz[1]:
            gr.run(key + (2,), lambda: self._pre_last(layer, g, fz))

    def pre_head(self, layer: int, pin: tuple, ids, h, P: int, J1: int, J: int, fill: tuple[int, int],
                 tiling: tuple[int, int, int], rows: float | None) -> None:
        """The pre-sync groups' start, once Kernels.plan_write has put the plan's input in pin[0] (pin: its pinned
        block and the device's): plan_groups_at, the pairs' rows (route_rows), the gather, then the residents'
        groups [0, J1) as group_pre launches them. With the engine's PreGraphs all of it is one graph, read from
        pin when it runs: one host launch for what took five or more (~30 us each on the H200's host at stop 54,
        bench/results/h200/presync_lines_900_stop54b.log); one by one where group_pre goes one by one."""
        k, s, b = self.k, self.dev.compute, self.bufs

        def start():
            k.plan_groups_at(self.pre, b.hist, pin[0], pin[1], J, s)
            k.route_rows(b.slot, b.src, ids, k.pre_route_off(self.pre), b.hist, P, self.cfg.n_expert_used, s)
            k.gather_f16(b.xg[:P], h, b.src, s)                              # Xg [R, D] fp16, row order
        # the chunk's buffers and the block's address are in _pre_run's key part; the layer's input and ids vary
        self._pre_run(layer, range(J1), fill, tiling, rows, start,
                      ("head", where((ids, h)), pin[0].__array_interface__["data"][0], P, J))

    def pre_tail(self, layer: int, J1: int, J: int, fill: tuple[int, int], tiling: tuple[int, int, int],
                 rows: float | None) -> None:
        """The guessed experts' pre-sync groups [J1, J), after pre_head and the compute stream's wait for their
        copies: one graph, as pre_head's (the caller records the event that frees their ring slots after it)."""
        self._pre_run(layer, range(J1, J), fill, tiling, rows, None, ("tail",))

    def _pre_run(self, layer: int, js: range, fill, tiling, rows, start, key: tuple) -> None:
        """start() (or nothing), then groups js of the pre-sync tables, each group_pre's launches: as one graph of
        the engine's PreGraphs, keyed by `key` and what the launches read; one by one where group_pre would be."""
        k, pt, bm = self.k, self.pre, tiling[2]
        fz = self._fused(layer, pre_takes_gemm_q(bm, rows))

        def run():
            if start is not None:
                start()
            for j in js:
                g = k.pre_group(pt, j, fill, bm)
                self._pre_first(layer, g, fz)
                self._pre_last(layer, g, fz)

        tg, tu = self.types[layer][:2]
        if self.graphs is None or (js and tg != tu and not fz[0]):
            run()
            return
        self.graphs.run(key + (self._buffers_key(), self.types[layer], fz, js, fill, tiling), run)

    def _buffers_key(self):
        """The chunk's buffers as a key part (presync.where), made once a chunk: one part for all its groups and
        layers (where() takes ~5 us an array on the H200's host, bench/results/h200/presync_lines_900_stop54b.log)."""
        if self._where is None:
            b = self.bufs
            self._where = where((b.w_gu, b.gu, b.xg, b.hh, b.dm, b.w_d, b.rows, b.slot, b.src, b.hist, b.pre))
        return self._where

    def _fused(self, layer: int, fits: bool) -> tuple[bool, bool]:
        """Whether a group of a layer takes gemm_q straight from the blobs for (gate|up, down): where its tiles
        suit it (`fits`, takes_gemm_q) and the kernels have it for the types."""
        tg, tu, td = self.types[layer]
        return fits and tg in self.fused and tu in self.fused, fits and td in self.fused

    def _gate_up(self, layer: int, blobs: tuple, tiles, n_tiles: int, bm: int, fz: tuple[bool, bool]) -> None:
        """GU[rows] = Xg[rows] · Wgu[g]ᵀ for the many-row members: gemm_q from their blobs (blobs: the gate and up
        tables) where the layer's types allow, else gemm_grouped from the scratch `_dequant` filled."""
        k, s, b = self.k, self.dev.compute, self.bufs
        D, F = self.cfg.n_embd, self.cfg.n_ff_exp
        tg, tu, _ = self.types[layer]
        if not fz[0]:
            k.gemm_grouped(b.gu, b.xg, b.w_gu, tiles, n_tiles, s, bm)
        elif tg == tu:    # [gate rows | up rows] is one [2F, D] matrix of one type
            k.gemm_q(b.gu, b.xg, blobs[0], tg, 2 * F, D, tiles, n_tiles, s, bm)
        else:
            k.gemm_q(b.gu[:, :F], b.xg, blobs[0], tg, F, D, tiles, n_tiles, s, bm)
            k.gemm_q(b.gu[:, F:], b.xg, blobs[1], tu, F, D, tiles, n_tiles, s, bm)

    def _down(self, layer: int, blob, tiles, n_tiles: int, bm: int, fz: tuple[bool, bool]) -> None:
        """Dm[rows] = H[rows] · Wd[g]ᵀ for the many-row members, as `_gate_up`."""
        k, s, b = self.k, self.dev.compute, self.bufs
        td = self.types[layer][2]
        if fz[1]:
            k.gemm_q(b.dm, b.hh, blob, td, self.cfg.n_embd, self.cfg.n_ff_exp, tiles, n_tiles, s, bm)
        else:
            k.gemm_grouped(b.dm, b.hh, b.w_d, tiles, n_tiles, s, bm)

    def _dequant(self, layer: int, blobs: tuple, n: int, fz: tuple[bool, bool]) -> None:
        """The scratch of the matrices that do not take gemm_q: the members' fp16 weights (the kernel fills g < n
        only; out of a split gate|up of two types, each half alone)."""
        k, s, b = self.k, self.dev.compute, self.bufs
        D, F = self.cfg.n_embd, self.cfg.n_ff_exp
        tg, tu, td = self.types[layer]
        fgu, fd = fz
        if not fgu:
            if tg == tu:
                k.dequant(b.w_gu, blobs[0], tg, 2 * F, D, s)
            else:
                k.dequant(b.w_gu[:n, :F], blobs[0], tg, F, D, s)
                k.dequant(b.w_gu[:n, F:], blobs[1], tu, F, D, s)
        if not fd:
            k.dequant(b.w_d, blobs[2], td, D, F, s)

    def _pre_first(self, layer: int, g, fz: tuple[bool, bool]) -> None:
        """group_pre's launches up to the last that reads the members' blobs."""
        k, s, b = self.k, self.dev.compute, self.bufs
        D, F = self.cfg.n_embd, self.cfg.n_ff_exp
        tg, tu, td = self.types[layer]
        if g.ng:
            self._dequant(layer, g.many, b.w_d.shape[0], fz)
        if g.nf:
            if tg == tu:
                k.expert_rows(b.gu, b.xg, g.few[0], g.tf, g.nf, tg, 2 * F, D, s)
            else:
                k.expert_rows(b.gu[:, :F], b.xg, g.few[0], g.tf, g.nf, tg, F, D, s)
                k.expert_rows(b.gu[:, F:], b.xg, g.few[1], g.tf, g.nf, tu, F, D, s)
        if g.ng:
            self._gate_up(layer, g.many, g.tg, g.ng, g.bm, fz)
        k.swiglu_span(b.hh, b.gu, g.span, F, b.rows, s)                          # H = silu(G) · U
        if g.nf:
            k.expert_rows(b.dm, b.hh, g.few[2], g.tf, g.nf, td, D, F, s)
        if g.ng and fz[1]:
            self._down(layer, g.many[2], g.tg, g.ng, g.bm, fz)

    def _pre_last(self, layer: int, g, fz: tuple[bool, bool]) -> None:
        """group_pre's down GEMM from the dequantised scratch: after the members' blobs are read (a down that takes
        gemm_q reads them, and runs in `_pre_first`)."""
        if g.ng and not fz[1]:
            self._down(layer, g.many[2], g.tg, g.ng, g.bm, fz)

    def group(self, layer: int, members: list[int], tab: GroupTables, lay: RowLayout, on_released=None):
        """Enqueue one group (its `tables` entry): the many-row members' gate|up (gemm_q from their blobs, or
        dequantised into scratch for gemm_grouped), the few-row members' from their blobs, SwiGLU, down; the blobs
        released (on_released) right after the last launch that reads them."""
        k, s, b = self.k, self.dev.compute, self.bufs
        D, F = self.cfg.n_embd, self.cfg.n_ff_exp
        n = tab.n_many
        assert n <= b.w_d.shape[0], f"a group of {n} experts exceeds the {b.w_d.shape[0]}-expert weight scratch"
        tg, tu, td = self.types[layer]
        f_gate, f_up, f_down, f_tiles, n_few = tab.few
        m_gate, m_up, m_down, m_tiles, n_tiles = tab.many
        fz = self._fused(layer, takes_gemm_q(tab.rows, n_tiles, n))
        fgu, fd = fz
        if n:
            self._dequant(layer, tab.many, n, fz)
            if on_released and not n_few and not fgu and not fd:
                on_released()
        r0 = int(lay.off[members[0]])
        r1 = int(lay.off[members[-1]] + lay.cnt[members[-1]])
        if n_few:
            if tg == tu:
                k.expert_rows(b.gu, b.xg, f_gate, f_tiles, n_few, tg, 2 * F, D, s)
            else:
                k.expert_rows(b.gu[:, :F], b.xg, f_gate, f_tiles, n_few, tg, F, D, s)
                k.expert_rows(b.gu[:, F:], b.xg, f_up, f_tiles, n_few, tu, F, D, s)
        if n:                      # tab.rows, the row tile the tables were cut at, picks the kernel (the same sums)
            self._gate_up(layer, tab.many, m_tiles, n_tiles, tab.rows, fz)
            if on_released and fgu and not fd and not n_few:
                on_released()
        k.swiglu(b.hh[r0:r1], b.gu[r0:r1], F, s)                          # H = silu(G) · U
        if n_few:
            k.expert_rows(b.dm, b.hh, f_down, f_tiles, n_few, td, D, F, s)
            if on_released and not fd:
                on_released()
        if n:
            self._down(layer, m_down, m_tiles, n_tiles, tab.rows, fz)
            if on_released and fd:
                on_released()
