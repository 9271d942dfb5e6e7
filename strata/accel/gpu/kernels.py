"""The device kernel set the GPU engine uses. Two implementations with one contract: CudaKernels (CuPy raw
kernels, cuda_kernels.py) and HostKernels (numpy on the host twin's stream threads, host_kernels.py).

Every method is asynchronous on its `stream` and takes device arrays. Host-side tables (numpy) reach the device
through `upload`, which snapshots them at call time. Legend: T tokens, D hidden, R = T·K expert-major rows,
G experts in a group, N/K a matrix's rows/row length, H/Hkv heads, hd head size, S cached positions.

Arithmetic (SPEC §2: the GPU path is its own, held to the reference by tolerance): weights in fp16 (dequantised
exactly, then rounded), activations rounded to fp16 at a matrix product's input, fp32 accumulation, fp32 outputs
and fp32 elementwise work. Results for an expert's rows depend only on those rows and that expert's weights, never
on which other experts share a launch or where the blob came from (cache slot or ring slot): residency must not
change arithmetic.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np

from strata.accel.rows_host import group_tiles

# Head sizes whose prompt attention keeps its scores in registers (CUDA: attn_kernels.cu; the host twin keeps
# none): those need no score buffers in the step's memory (buffers.attn_scratch_bytes).
ONE_PASS_HEAD_DIMS = (64, 128)
ROUTE_TILE = 512    # (token, k) pairs a `route_hist` tile (cuda/route_kernels.cu RT_TILE)


@dataclass(frozen=True, slots=True)
class BlobRef:
    """One expert blob in device memory: row `index` of a [n, slot_bytes] uint8 device array."""

    buf: object
    index: int


@dataclass(frozen=True, slots=True)
class ExpertSource:
    """Where a layer's expert blobs are, for the decode graph's `moe_gemv`: expert e's blob is row
    slot_of[e] of `cache` when slot_of[e] >= 0, else row e of `arena` (pinned host memory, read over PCIe).
    slot_of is a device int32 [E] whose contents may change between launches (residency moves)."""

    cache: object      # device uint8 [slots, slot_bytes]
    slot_of: object    # device int32 [E]
    arena: np.ndarray  # pinned uint8 [E, blob_bytes]


class Kernels(abc.ABC):
    gemm_big_rows = 0  # the larger GEMM row tile `gemm_grouped` takes (rows_host.many_tile), 0 if none
    gemm_q_types: frozenset = frozenset()    # the weight types `gemm_q` takes (the others: dequant + gemm_grouped)
    route_max_experts = 1 << 30     # the most experts a layer may have for `route_rows` (CUDA: its shared memory)

    @abc.abstractmethod
    def upload(self, host: np.ndarray, stream) -> object:
        """A device copy of a small host table, taken now (later host writes do not reach it)."""

    @abc.abstractmethod
    def pull(self, dst, src: np.ndarray, stream) -> None:
        """dst (device uint8, contiguous) <- pinned src (uint8, as many bytes, a multiple of 16, 16-byte aligned) as
        the work reaches it on `stream`, by a kernel reading the host memory (no copy engine, no host call at run
        time: a captured graph re-reads what the host wrote there since)."""

    @abc.abstractmethod
    def copy(self, dst, src, stream) -> None:
        """dst <- src, two C-contiguous device arrays of one dtype and shape (a device-to-device copy)."""

    def upload_many(self, hosts: list[np.ndarray], stream) -> list:
        """Several small tables in one go (CUDA packs them into one copy)."""
        return [self.upload(h, stream) for h in hosts]

    @abc.abstractmethod
    def blob_table(self, refs: list[BlobRef], byte_off: int) -> np.ndarray:
        """A host table naming blobs (plus a byte offset into each) for `dequant` (upload it first)."""

    def expert_tables(self, sets: list[tuple[object, np.ndarray]], offs: tuple[int, ...], tiles: list[np.ndarray],
                      stream, riders: tuple = ()) -> tuple[list[tuple], list]:
        """A layer's expert groups in one upload. sets[g] = (buf, idx): the group's blobs are rows idx (int
        array) of the [n, slot_bytes] device array buf; offs: byte offsets into each blob (gate, up, down);
        tiles[g]: the group's GEMM tiles i32 [n_tiles, 3]; riders: other i32 host tables that go in the same
        upload (the layer's row tables: `combine`'s slot, `gather_f16`'s src). Returns (per group (one blob table
        per offset..., tiles table, n_tiles), the tables as `dequant` and `gemm_grouped` take them; the riders as
        `gather_f16` and `combine` take them)."""
        hosts = []
        for (buf, idx), t in zip(sets, tiles):
            refs = [BlobRef(buf, int(i)) for i in idx]
            hosts += [self.blob_table(refs, o) for o in offs] + [t]
        dev = self.upload_many(hosts + list(riders), stream)
        w = len(offs) + 1
        return [tuple(dev[w * g:w * g + w]) + (len(t),) for g, t in enumerate(tiles)], dev[len(hosts):]

    def layer_tables(self, groups: list[tuple[object, np.ndarray]], offs: tuple[int, ...], cnt: np.ndarray,
                     starts: np.ndarray, first: np.ndarray, size: np.ndarray, tiling: tuple[int, int, np.ndarray], stream,
                     riders: tuple = ()) -> tuple[list[tuple], list[int], list]:
        """A layer's launch groups' tables in one upload (moe.ExpertRunner.tables). groups[g] = (buf, idx): group
        g's members' blobs are rows idx of buf; cnt, starts [n]: rows and first row of each expert in row order;
        group g holds positions first[g] .. first[g] + size[g] - 1; tiling: (few_rows, rows_tile, bm [G]) of
        rows_host.group_tiles. Returns (per set 2g: the members' tables for expert_rows, 2g + 1: the many-row
        members' for dequant / gemm, each as `expert_tables` gives it; n_many [G]; the riders on the device)."""
        tl, cut, many, n_many = group_tiles(cnt, starts, first, size, *tiling)
        idx_all = np.concatenate([np.asarray(i) for _, i in groups])
        idx_many = idx_all[many]
        a = np.concatenate([[0], np.cumsum(size)]).tolist()
        b = np.concatenate([[0], np.cumsum(n_many)]).astype(np.int64).tolist()
        sets, tiles = [], []
        for i, (buf, _) in enumerate(groups):
            sets += [(buf, idx_all[a[i]:a[i + 1]]), (buf, idx_many[b[i]:b[i + 1]])]
            tiles += [tl[cut[2 * i]:cut[2 * i + 1]], tl[cut[2 * i + 1]:cut[2 * i + 2]]]
        tabs, dev_riders = self.expert_tables(sets, offs, tiles, stream, riders)
        return tabs, n_many.tolist(), dev_riders

    # --- the row layout from the device's routing (moe_block.py) --------------------------------------------
    @abc.abstractmethod
    def route_hist(self, hist, ids, P: int, stream) -> None:
        """hist i32 [ceil(P / ROUTE_TILE), E] <- for each tile of ROUTE_TILE consecutive (token, k) pairs of ids
        (i32, token-major, the first P), the pairs routed to each expert."""

    @abc.abstractmethod
    def route_rows(self, slot, src, ids, off, hist, P: int, K: int, stream) -> None:
        """The expert-major row tables of the first P pairs of ids (rows_host.expert_major's rule: each expert's
        rows hold its pairs in order): slot i32 [P] <- the row of each pair, src i32 [P] <- the token of each row.
        off: the first row of each routed expert (i32 [E], an uploaded table); hist: route_hist's of these ids."""

    # --- a layer's cache hits before its routing sync (presync.py) -------------------------------------------
    @abc.abstractmethod
    def pre_tables(self, buf, shape) -> object:
        """The pre-sync groups' tables of presync.PreShape `shape` in buf (device u8, presync.pre_bytes(shape))."""

    @abc.abstractmethod
    def pre_route_off(self, pt) -> object:
        """pt's row offsets (i32 [E]) as `route_rows` takes its `off`."""

    @abc.abstractmethod
    def plan_groups(self, pt, hist, nt: int, order: np.ndarray, nc1: int, blobs: list, offs: tuple[int, ...],
                    J1: int, J: int, tiling: tuple[int, int, int], fill: tuple[int, int], stream) -> None:
        """presync.plan_host's tables into pt, from the counts of hist's first nt tiles (route_hist's) as the work
        reaches them: order (host i64 experts, the row order's prefix); the candidates are its first nc (nc1 of the
        first class), whose blobs are, in order, rows idx of buf for each (buf, idx) of blobs ([n, slot_bytes]
        device arrays: the cache, the ring); offs the byte offsets into a blob; groups [0, J1) of the first class,
        [J1, J) of the second; tiling (few_rows, rows_tile, bm): the tiles' rows; fill: the tiles each launch covers
        (presync.fills at the chunk's T)."""

    @abc.abstractmethod
    def plan_write(self, blk: np.ndarray, shape, nt: int, order: np.ndarray, nc1: int, blobs: list,
                   offs: tuple[int, ...], J1: int, J: int, tiling: tuple[int, int, int], fill: tuple[int, int]) -> None:
        """plan_groups' input (its arguments past pt and hist) into blk, host memory of presync.PlanLayout(shape.E,
        shape.W).nbytes (pinned), for plan_groups_at: the host's part only, nothing enqueued."""

    @abc.abstractmethod
    def plan_groups_at(self, pt, hist, blk: np.ndarray, dblk, J: int, stream) -> None:
        """plan_groups from the input plan_write left in blk, read as the work reaches it (so a captured graph plans
        from what the host wrote there since; dblk: device u8 of blk's size, where it lands first). J: the groups
        the input asks for, at most (the launch's shared memory)."""

    @abc.abstractmethod
    def pre_group(self, pt, j: int, fill: tuple[int, int], bm: int):
        """Group j's tables of pt as a presync.PreGroup (its GEMM tiles of bm rows)."""

    @abc.abstractmethod
    def swiglu_span(self, out, gu, span, f: int, rows: int, stream) -> None:
        """As swiglu over rows span[0] .. span[1] - 1 (a device i32 [2] a PreGroup names) of out f16 [R, f] and gu
        f32 [R, 2f] (whole, not row slices); rows: the most the span may hold."""

    # --- experts -------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def dequant(self, out, blobs, qtype: int, n: int, k: int, stream) -> None:
        """out f16 [G, n, k] <- rows [n, k] of type `qtype` at each uploaded blob_table entry (out[g] untouched where
        entry g is empty: a pre-sync group's member that takes expert_rows)."""

    @abc.abstractmethod
    def expert_rows(self, out, a, blobs, tiles, n_tiles: int, qtype: int, n: int, k: int, stream) -> None:
        """Few-row experts straight from their blobs: for each tile (g, r0, r1) of tiles i32 [n_tiles, 3]
        (r1 - r0 <= moe.ROWS_TILE; r0 == r1 an empty tile): out f32 [r0:r1, :n] = a f16 [r0:r1, :k] · W_gᵀ, W_g the
        n x k matrix of type `qtype` at blob_table entry g, each weight dequantised exactly and rounded to fp16, fp32
        sums (the order of the sums is the kernel's own, not gemm_grouped's). out may be a column slice (row stride >
        n)."""

    @abc.abstractmethod
    def gather_f16(self, out, x, src, stream) -> None:
        """out f16 [R, D] <- x f32 [T, D] rows src i32 [R] (uploaded: `upload` or an `expert_tables` rider; or the
        first R of a longer device table, route_rows')."""

    @abc.abstractmethod
    def gemm_grouped(self, out, a, w, tiles, n_tiles: int, stream, max_rows: int | None = None) -> None:
        """For each tile (g, r0, r1) of tiles i32 [n_tiles, 3]: out f32 [r0:r1, N] = a f16 [r0:r1, K] · w[g].T,
        w f16 [G, N, K]; an empty tile (r0 == r1) computes nothing. max_rows: the tile size the tiles were cut at
        (moe.GEMM_BM or gemm_big_rows; None: the larger), which a kernel set may use to pick its kernel; the result
        is the same."""

    def gemm_q(self, out, a, blobs, qtype: int, n: int, k: int, tiles, n_tiles: int, stream,
               max_rows: int | None = None) -> None:
        """`dequant` into a scratch then `gemm_grouped`, in one step with no scratch, for the types of
        `gemm_q_types`: for each tile (g, r0, r1) of tiles i32 [n_tiles, 3] (r0 == r1: an empty tile), out f32
        [r0:r1, :n] = a f16 [r0:r1, :k] · W_gᵀ, W_g the n x k matrix of type `qtype` at blob_table entry g, each
        weight as `dequant` rounds it: the same bits as that pair. out may be a column slice (row stride > n)."""
        raise NotImplementedError(f"{type(self).__name__} has no gemm_q")

    @abc.abstractmethod
    def swiglu(self, out, gu, f: int, stream) -> None:
        """out f16 [R, F] <- silu(gu[:, :F]) · gu[:, F:], gu f32 [R, 2F]."""

    @abc.abstractmethod
    def combine(self, out, dm, slot, w, stream) -> None:
        """out f32 [T, D] = Σ_k w[t,k] · dm[slot[t,k]] in k order (SPEC §3), dm f32 [R, D], slot i32 [T, K]
        (uploaded: `upload` or an `expert_tables` rider; or the first T·K of a longer flat device table,
        route_rows'), w f32 [T, K]."""

    # --- the decode graph: everything that changes between tokens is read from device memory --------------------
    moe_gemv_max_k = 1 << 30      # the longest matrix rows moe_gemv takes (CUDA: its shared memory)

    @abc.abstractmethod
    def moe_gemv(self, out, x, x_div: int, ids, src: ExpertSource, off: int, qtype: int, n: int, k: int,
                 stream, glu: bool = False) -> None:
        """out f32 [P, >= n] (row stride may exceed n): out[p, :n] = W_e · x[p // x_div] for e = ids[p], W_e the
        n x k matrix of type `qtype` at byte `off` of e's blob (see ExpertSource); x f32 or f16 [rows, k],
        rounded to fp16, fp32 sums. ids i32 [P] on the device. The same arithmetic for a cached and an arena blob.
        glu: x is gate|up f32 [rows, 2k] and the row used is `swiglu`'s fp16 silu(g)·u of it (the same bits)."""

    @abc.abstractmethod
    def kv_store_at(self, kc, vc, k, v, pos, stream) -> None:
        """kc/vc f16 [S, Hkv, hd] row pos[0] <- k/v f32 [1, Hkv, hd]; pos i32 [1] on the device."""

    def attn_decode_takes(self, hd: int) -> bool:
        """Whether `attn_decode` is built for heads of hd (else the engine decodes per layer)."""
        return True

    def attn_decode_cols(self, n_ctx: int, hd: int) -> int:
        """Floats per head of `attn_decode`'s scratch for a cache of n_ctx rows."""
        return n_ctx

    @abc.abstractmethod
    def attn_decode(self, out, q, kc, vc, pos, scratch, stream) -> None:
        """One query q f32 [1, H, hd] at position pos[0] (device i32 [1]) over cache rows 0..pos[0]: out f32
        [1, H·hd], `attention`'s arithmetic (the order of the sums is the kernel's own). scratch f32
        [H, >= attn_decode_cols(kc rows, hd)]."""

    # --- dense ---------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def dequant_matrix(self, out, raw, qtype: int, stream) -> None:
        """out [N, K] <- one matrix of N raw GGUF rows of type `qtype` (raw: device uint8 [N·row_bytes], contiguous):
        out f16 takes each weight's strata.quants float32 rounded to fp16 (nearest even: the dense weights at load),
        out f32 that float32 unrounded (exact where the type is in dequant.F32_EXACT: the embedding's rows)."""

    def embed_rows(self, out, raw, qtype: int, stream) -> None:
        """out f32 [T, D] <- T raw GGUF rows of type `qtype` (raw: uint8 [T·row_bytes], contiguous), each weight
        the exact float32 of strata.quants (the reference's embedding, unrounded)."""
        self.dequant_matrix(out, raw, qtype, stream)

    @abc.abstractmethod
    def rms_norm(self, out, x, w, eps: float, stream) -> None:
        """Over the last axis of x f32 [..., n]: x / sqrt(mean(x²) + eps) · w."""

    @abc.abstractmethod
    def linear(self, out, x, w, stream, bias=None) -> None:
        """out f32 [T, N] = x f32 [T, K] · w f16 [N, K].T (+ bias f32 [N])."""

    def linear_many(self, outs: list, x, ws: list, stream) -> None:
        """outs[i] = linear of x by ws[i], each as `linear` makes it (CUDA rounds x to fp16 once for them all)."""
        for o, w in zip(outs, ws):
            self.linear(o, x, w, stream)

    @abc.abstractmethod
    def rope(self, x, cos, sin, pos, n_rot: int, neox: bool, stream) -> None:
        """In place on x f32 [T, H, hd]; cos/sin f32 [P, n_rot/2]; pos i32 [T]."""

    def norm_rope(self, qo, ko, q, k, wq, wk, eps: float, cos, sin, pos, n_rot: int, neox: bool, stream) -> None:
        """qo/ko f32 [T, H/Hkv, hd] <- each head of q/k RMSNormed (wq/wk f32 [hd]), then RoPE'd: `rms_norm` then
        `rope`, their arithmetic (CUDA: one launch)."""
        self.rms_norm(qo, q, wq, eps, stream)
        self.rms_norm(ko, k, wk, eps, stream)
        self.rope(qo, cos, sin, pos, n_rot, neox, stream)
        self.rope(ko, cos, sin, pos, n_rot, neox, stream)

    @abc.abstractmethod
    def kv_store(self, kc, vc, k, v, pos0: int, stream) -> None:
        """kc/vc f16 [S, Hkv, hd] rows pos0.. <- k/v f32 [T, Hkv, hd]."""

    @abc.abstractmethod
    def attention(self, out, q, kc, vc, pos0: int, scratch, stream) -> None:
        """Causal GQA: out f32 [T, H·hd]; query t (position pos0+t) attends to cache rows 0..pos0+t. fp16 q, k,
        v and probabilities, fp32 scores and sums (where the probabilities are rounded is the kernel's own).
        `scratch` (uint8 device array) bounds the score buffers of a kernel that keeps them in memory (CUDA's
        blocked path, for head sizes its one-pass kernel is not built for)."""

    @abc.abstractmethod
    def router(self, ids, w, logits, k: int, renorm: bool, stream) -> None:
        """ids i32 [T, k], w f32 [T, k] <- softmax over logits f32 [T, E], top-k (ties: lower id), optional
        renormalisation over the k (w / Σ_k w, the f32 sum in k order from +0.0: RefOps.renorm's arithmetic)."""

    @abc.abstractmethod
    def add(self, out, a, b, stream) -> None:
        """out f32 = a + b (C-contiguous, one shape): a block's residual add."""

    @abc.abstractmethod
    def add_bias(self, out, y, b, stream) -> None:
        """out f32 [T, N] = y + b, b f32 [N] (C-contiguous): a projection's bias."""

    @abc.abstractmethod
    def sigmoid_gate(self, out, s, g, stream) -> None:
        """out f32 [T, D] = s · sigmoid(g), g f32 [T, 1] (qwen2moe's shared expert)."""
