"""Per-op durations (µs) for one machine and one model: rooflines plus launch costs, and the calibrated terms.

Units: bytes / (GB/s x 1e3) = µs; flops / (TFLOPS x 1e6) = µs. Work per expert: W = 3·D·F weights. A GPU launch
group runs this engine's path (strata/accel/moe.py, calib ``gpu_experts`` "rows_gemm"): an expert of at most
FEW_ROWS rows reads its blob once (expert_rows), the others are multiplied on 64-row tiles, dequantised inside the
GEMM (gemm_q: a group of about a tile a member, types of a family in calib gpu_gemm_q_us_per_mw) or first into
fp16 (dequant + gemm_grouped); or the original's (the seeds' machines, "mmq"): int8 MMQ on tiles of 8 tokens.
The CPU pool splits each expert's rows across its workers; a run's probe of its own pool (PoolProbe) replaces that
model where given.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .calibration import CALIB, Calib
from .hardware import Machine, catalogue
from .models import TYPE_NAME, SimModel, family

TILE = 8  # mmq: tokens per MMQ column tile (ours: the padding a few-token expert pays)
FEW_ROWS = 8  # rows_gemm: strata/accel/moe.py FEW_ROWS, experts of at most this many rows run from their blobs
GEMM_ROWS = 64  # rows_gemm: strata/accel/moe.py GEMM_BM, the grouped GEMM's row tile (rows pad up to it)
GEMM_Q_TILES = 1.25  # rows_gemm: strata/accel/moe.py GEMM_Q_TILES, the most row tiles a member of a gemm_q group


def takes_gemm_q(many: list[int]) -> bool:
    """strata/accel/moe.py takes_gemm_q for a launch group of many-row experts of these rows: cut at 64-row tiles
    (rows_host.many_tile: some member of at most GEMM_ROWS rows) with at most GEMM_Q_TILES tiles a member."""
    return bool(many) and min(many) <= GEMM_ROWS and sum(-(-n // GEMM_ROWS) for n in many) <= GEMM_Q_TILES * len(many)


@dataclass(frozen=True, slots=True)
class PoolProbe:
    """A run's own pool measured on its model's experts (bench/cpu_pool.py pool_probe, stored by bench/cpu_share.py
    as a configuration's "pool_probe"): the lent machines' pools differ 1.2-1.4x from lease to lease, which no
    catalogue constant holds. It replaces the modelled cost of the experts of its types and the batch's fixed cost."""

    types: tuple[str, str, str]  # (gate, up, down) ggml type names of the probed experts
    us_per_expert: tuple[float, ...]  # wall µs an expert of t = 1..8 tokens in a batch
    batch_us: float  # a batch's fixed wall µs (dispatch + join)
    workers: int

    def __post_init__(self):
        assert self.us_per_expert and all(u > 0 for u in self.us_per_expert), f"a probe needs costs > 0: {self}"
        assert self.batch_us >= 0, f"a batch's fixed cost is at least 0: {self}"

    @classmethod
    def from_json(cls, d: dict) -> "PoolProbe":
        return cls(tuple(d["types"]), tuple(float(u) for u in d["us_per_expert"]), float(d["batch_us"]),
                   int(d["workers"]))


class Costs:
    def __init__(self, machine: Machine, model: SimModel, calib: Calib = CALIB, probe: PoolProbe | None = None,
                 layout: tuple[tuple[int, float], ...] | None = None):
        calib = calib.over(machine.calib)   # constants measured on this machine win over the seed-fitted ones
        self.machine, self.model, self.calib = machine, model, calib
        self.mmq = calib.gpu_experts == "mmq"
        s, L = model.shape, model.n_layer
        self._blob = [model.blob_bytes(l) for l in range(L)]  # per-layer tables: the hot path reads these
        self._fp16 = [
            model.expert_type(l) in calib.fp16_path_types or machine.gpu.int8_tops == 0 for l in range(L)
        ]
        self._unpack = [
            sum(
                n * calib.cpu_cycles_per_weight[family(TYPE_NAME[s.type_of(role, l)])]
                for role, n in (("exp_gate", 2), ("exp_down", 1))
            )
            / 3
            for l in range(L)
        ]
        self._family = [family(TYPE_NAME[s.type_of("exp_gate", l)]) for l in range(L)]
        # gemm_q's µs a 64-row tile of a layer's expert (its gate|up and down by their families), None where a
        # family has no measured rate (its groups priced as the scratch path)
        q, D, F = calib.gpu_gemm_q_us_per_mw, s.n_embd, s.n_ff_exp
        fams = [[family(TYPE_NAME[s.type_of(r, l)]) for r in ("exp_gate", "exp_up", "exp_down")] for l in range(L)]
        self._gemm_q = [sum(D * F / 1e6 * q[f] for f in fl) if all(f in q for f in fl) else None for fl in fams]
        self.probe = probe   # measured on the run's own pool: its layers' CPU experts cost what it measured
        # measured on the run's own host, (tokens, µs) by chunk size: a layer's layout (group_us); the lent hosts'
        # Python differs lease to lease (flash-shape, 1,000 tokens: 2.6 ms a layer at fa942c0, prefill_timeline)
        self.layout = tuple(zip(*sorted(layout))) if layout else None   # ((tokens...), (µs...)) for np.interp
        roles = ("exp_gate", "exp_up", "exp_down")
        self._probed = [probe is not None and probe.types == tuple(TYPE_NAME[s.type_of(r, l)] for r in roles)
                        for l in range(L)]
        # a pool that fills every core beside the engine thread and the driver's runs slower in a prompt than in
        # its probe, where the engine thread idles (the H200's 14 of 16: x1.1, catalogue calib.pool_crowded_factor)
        crowded = machine.pool_workers + 2 >= machine.cpu.threads
        self.crowded = calib.pool_crowded_factor if crowded else 1.0
        # kernels a matrix pass takes: gate|up is one [2F, D] matrix when both have one type (moe.py), then down
        self._mats = [2 if s.type_of("exp_gate", l) == s.type_of("exp_up", l) else 3 for l in range(L)]
        self._body: dict[tuple[int, int], float] = {}
        self._gemm: dict[tuple[int, int], float] = {}
        self._cpu: dict[tuple[int, int], float] = {}

    def blob(self, layer: int) -> int:
        return self._blob[layer]

    # --- GPU ---------------------------------------------------------------------------------------------
    @property
    def launch_us(self) -> float:
        return self.calib.launch_us[self.machine.gpu.api]

    def _mm_us(self, flops: float, fp16: bool = False, eff: float | None = None) -> float:
        g = self.machine.gpu
        rate = g.fp16_tflops if fp16 or g.int8_tops == 0 else g.int8_tops
        return flops / (rate * 1e6 * (self.calib.gpu_mm_eff if eff is None else eff))

    def _bw_us(self, nbytes: float) -> float:
        return nbytes / (self.machine.gpu.mem_gbps * 1e3 * self.calib.gpu_bw_eff)

    def extra_dense(self) -> tuple[float, float]:
        """The model's calibrated extra cost per layer (fixed µs, µs per token) on this machine."""
        per = self.calib.extra_dense.get(self.model.extra)
        if not per:
            return (0.0, 0.0)
        if self.machine.name in per:
            return per[self.machine.name]
        ref_name = self.calib.extra_dense_reference[self.model.extra]
        ref = catalogue()["machines"][ref_name]
        fixed, per_tok = per[ref_name]
        g = self.machine.gpu
        return (
            fixed * self.launch_us / self.calib.launch_us[ref.gpu.api],
            per_tok * ref.gpu.fp16_tflops / g.fp16_tflops,
        )

    def dense_us(self, t: int, ctx: int) -> float:
        """One layer outside the routed experts: projections, attention over ``ctx`` earlier tokens, router,
        shared expert, norms."""
        s = self.model.shape
        cells = ctx + t / 2 if self.model.attn_cells is None else min(ctx + t / 2, self.model.attn_cells)
        flops = 2.0 * t * self.model.dense_params() + 4.0 * t * cells * s.n_head * s.head_dim
        nbytes = self.model.dense_bytes() + 6.0 * t * s.n_embd * 4
        fixed, per_tok = self.extra_dense()
        body = max(self._mm_us(flops, fp16=True, eff=self.calib.gpu_dense_mm_eff), self._bw_us(nbytes))
        return self.calib.dense_launches * self.launch_us + body + fixed + per_tok * t

    def combine_us(self, t: int) -> float:
        return self.launch_us + self._bw_us(t * self.model.k * self.model.shape.n_embd * 4.0)

    def _mmq_body_us(self, layer: int, nt: int) -> float:
        key = (layer, -(-nt // TILE))
        if key not in self._body:
            w, blob = self.model.expert_weights, self._blob[layer]
            flops = 2.0 * key[1] * TILE * w
            if self._fp16[layer]:  # no int8 path: dequantise to FP16, then a GEMM
                self._body[key] = self._bw_us(blob + 4.0 * w) + self._mm_us(flops, fp16=True)
            else:
                self._body[key] = max(self._bw_us(blob), self._mm_us(flops))
        return self._body[key]

    def rows_us(self, layer: int, rows: int = 1) -> float:
        """expert_rows: `rows` rows of experts of at most FEW_ROWS rows, straight from their blobs. The kernel
        decodes the blob for each row (bench/results/h200/prefill_ops_*_stop21.log: its time follows the rows,
        2.6-3.9 us a row, not the experts, 7.7-16.6 us an expert of flash-shape between 250 and 2,048 tokens)."""
        return rows * self._blob[layer] / (self.machine.gpu.mem_gbps * 1e3 * self.calib.gpu_rows_bw_eff)

    def dequant_us(self, layer: int) -> float:
        """dequant: one expert's blob read and its fp16 copy (2 bytes a weight) written to the weight scratch."""
        nbytes = self._blob[layer] + 2.0 * self.model.expert_weights
        return nbytes / (self.machine.gpu.mem_gbps * 1e3 * self.calib.gpu_dequant_bw_eff)

    def gemm_us(self, layer: int, nt: int) -> float:
        """gemm_grouped, gate|up and down of one expert of ``nt`` rows: its rows padded to 64-row tiles, at least
        its fp16 weights read once."""
        key = (layer, -(-nt // GEMM_ROWS))
        if key not in self._gemm:
            g, cal, w = self.machine.gpu, self.calib, self.model.expert_weights
            tiles = 2.0 * key[1] * GEMM_ROWS * w / (g.fp16_tflops * 1e6 * cal.gpu_gemm_eff)
            self._gemm[key] = max(tiles, 2.0 * w / (g.mem_gbps * 1e3 * cal.gpu_gemm_bw_eff))
        return self._gemm[key]

    def gemm_q_us(self, layer: int, nt: int) -> float | None:
        """gemm_q, gate|up and down of one expert of ``nt`` rows: each 64-row tile dequantises the weights again;
        None where the layer's types have no measured rate."""
        q = self._gemm_q[layer]
        return None if q is None else q * -(-nt // GEMM_ROWS)

    def grouped_us(self, layer: int, counts: list[int]) -> float:
        """One launch group's GPU time; ``counts`` are its experts' rows (tokens routed to each)."""
        cal = self.calib
        if self.mmq:   # the original: one launch set per 16 experts, MMQ tiles of 8
            groups = -(-len(counts) // 16)
            body = sum(cal.gpu_expert_us + self._mmq_body_us(layer, n) for n in counts)
            return groups * cal.gpu_kernels_per_expert * self.launch_us + body
        few = sum(1 for n in counts if n <= FEW_ROWS)
        many = [n for n in counts if n > FEW_ROWS]
        mats = self._mats[layer]
        fused = self._gemm_q[layer] is not None and takes_gemm_q(many)
        # swiglu; expert_rows; gemm_q's matrices, or dequant's and 2 GEMMs
        launches = 1 + (mats if few else 0) + ((mats if fused else mats + 2) if many else 0)
        body = self.rows_us(layer, sum(n for n in counts if n <= FEW_ROWS)) + sum(
            self.gemm_q_us(layer, n) if fused else self.dequant_us(layer) + self.gemm_us(layer, n) for n in many)
        F = self.model.shape.n_ff_exp
        swiglu = self._bw_us(sum(counts) * F * (2 * 4 + 2))   # GU fp32 [rows, 2F] in, H fp16 [rows, F] out
        return launches * cal.gpu_group_launch_us + body + swiglu

    def expert_hit_us(self, layer: int) -> float:
        """A decode step's resident expert (one token)."""
        if self.mmq:
            return self._bw_us(self._blob[layer]) + self.calib.gpu_expert_us
        return self.rows_us(layer)

    def head_us(self) -> float:
        return self._bw_us(self.model.head_bytes()) + self.launch_us

    # --- host and link -----------------------------------------------------------------------------------
    def host_issue_us(self, pool_busy: bool) -> float:
        return self.machine.host_issue_us * (self.calib.host_issue_factor if pool_busy else 1.0)

    def copy_us(self, nbytes: float, pool_busy: bool) -> float:
        t = self.machine.link.h2d_us(nbytes)
        return t / self.calib.link_factor if pool_busy else t

    # this engine's walks, where the machine measures the host by what it issues (Machine.host_group_us): the
    # copies go as runs of neighbouring blobs (strata/accel/stream.py Walk._issue by policy.IssueOrder), each
    # queued behind others
    @property
    def by_issue(self) -> bool:
        return self.machine.host_group_us > 0

    def copy_run_us(self, nbytes: float, count: int, pool_busy: bool) -> float:
        t = self.machine.link.queued_us(count * nbytes)
        return t / self.calib.link_factor if pool_busy else t

    def host_group_us(self, pool_busy: bool) -> float:
        return self.machine.host_group_us * (self.calib.host_issue_factor if pool_busy else 1.0)

    def host_copy_us(self, pool_busy: bool, event: bool) -> float:
        m = self.machine
        return (m.host_copy_us + (m.host_event_us if event else 0.0)) * (
            self.calib.host_issue_factor if pool_busy else 1.0)

    def embed_host_us(self, t: int) -> float:
        return self.machine.host_embed_us * t

    def sync_us(self) -> float:
        return self.calib.sync_us[self.machine.gpu.api]

    def group_us(self, t: int) -> float:
        """The host's time from a layer's routing sync to its first launch group (the choice, the first copies,
        the row layout, the tables): the run's own where measured (engine Stats.layout_s, bench/cpu_share.py),
        linear between its chunk sizes and flat beyond them (it holds the first copy runs' issue, which the walk
        charges too: a few runs, under 0.1 ms); else the catalogue's line (a fixed part, a part a layer's expert,
        a part a (token, k) pair)."""
        if self.layout:
            return float(np.interp(t, *self.layout))
        cal = self.calib
        return cal.group_us + cal.group_us_per_expert * self.model.n_expert + cal.group_us_per_pair * t * self.model.k

    def input_d2h_us(self, t: int) -> float:
        return self.machine.link.d2h_us(t * self.model.shape.n_embd * 4.0)

    def rows_h2d_us(self, rows: int) -> float:
        return self.machine.link.h2d_us(rows * self.model.shape.n_embd * 4.0)

    def pin_us(self, nbytes: float) -> float:
        return self.calib.pin_us_per_mib * nbytes / 2**20

    # --- CPU pool ----------------------------------------------------------------------------------------
    def cpu_expert_us(self, layer: int, nt: int) -> float:
        """One expert of ``nt`` tokens on the pool: what the run's probe measured for this layer's types; else
        unpack once (gate+up are 2/3 of the weights), one multiply-accumulate per weight per token, split across
        the workers at their clock; at least the blob's DRAM read at the workers' bandwidth."""
        if self._probed[layer]:
            return self.crowded * self.probe.us_per_expert[min(nt, len(self.probe.us_per_expert)) - 1]
        key = (layer, nt)
        if key not in self._cpu:
            c, cal = self.machine.cpu, self.calib
            curve = cal.cpu_token_curve.get(self._family[layer])
            if curve:   # measured on this machine's pool: unpack is then the whole cost of one token
                cycles = cal.isa_factor[c.isa] * self._unpack[layer] * curve[min(nt, len(curve)) - 1]
            else:
                cycles = cal.isa_factor[c.isa] * (self._unpack[layer] + nt * cal.cpu_cycles_per_mac)
            # each worker computes at the clock its busy cores allow and reads DRAM at its share of the
            # bandwidth (hardware.CPU.clock_at, read_gbps): one worker turbos, a full pool does not
            workers = min(self.machine.pool_workers, c.cores)
            compute = self.model.expert_weights * cycles / (workers * c.clock_at(workers) * 1e3)
            self._cpu[key] = cal.cpu_job_us + max(compute, self._blob[layer] / (c.read_gbps(workers) * 1e3))
        return self._cpu[key]

    def cpu_pool_us(self, layer: int, counts: list[int]) -> float:
        """The CPU thread's wall time for its experts (each split by rows across all workers)."""
        fixed = self.probe.batch_us if self.probe is not None else self.calib.pool_dispatch_us
        return fixed + sum(self.cpu_expert_us(layer, n) for n in counts)
