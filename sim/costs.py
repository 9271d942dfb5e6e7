"""Per-op durations (µs) for one machine and one model: rooflines plus launch costs, and the calibrated terms.

Units: bytes / (GB/s x 1e3) = µs; flops / (TFLOPS x 1e6) = µs. Work per expert: W = 3·D·F weights; a GPU
product pads the tokens to a tile of 8 (MMQ); the CPU pool splits each expert's rows across its workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from .calibration import CALIB, Calib
from .hardware import Machine, catalogue
from .models import TYPE_NAME, SimModel, family

TILE = 8  # tokens per MMQ column tile (ours: the padding a few-token expert pays)


class Costs:
    def __init__(self, machine: Machine, model: SimModel, calib: Calib = CALIB):
        if machine.calib:   # constants measured on this machine win over the seed-fitted ones
            calib = replace(calib, **{k: (dict(v) if isinstance(v, Mapping) else v) for k, v in machine.calib.items()})
        self.machine, self.model, self.calib = machine, model, calib
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
        self._body: dict[tuple[int, int], float] = {}
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

    def _expert_body_us(self, layer: int, nt: int) -> float:
        key = (layer, -(-nt // TILE))
        if key not in self._body:
            w, blob = self.model.expert_weights, self._blob[layer]
            flops = 2.0 * key[1] * TILE * w
            if self._fp16[layer]:  # no int8 path: dequantise to FP16, then a GEMM
                self._body[key] = self._bw_us(blob + 4.0 * w) + self._mm_us(flops, fp16=True)
            else:
                self._body[key] = max(self._bw_us(blob), self._mm_us(flops))
        return self._body[key]

    def grouped_us(self, layer: int, counts: list[int]) -> float:
        """Experts computed in groups of 16, one launch set per group (resident ones; a stream-all group)."""
        cal = self.calib
        groups = -(-len(counts) // 16)
        body = sum(cal.gpu_expert_us + self._expert_body_us(layer, n) for n in counts)
        return groups * cal.gpu_kernels_per_expert * self.launch_us + body

    def head_us(self) -> float:
        return self._bw_us(self.model.head_bytes()) + self.launch_us

    # --- host and link -----------------------------------------------------------------------------------
    def host_issue_us(self, pool_busy: bool) -> float:
        return self.machine.host_issue_us * (self.calib.host_issue_factor if pool_busy else 1.0)

    def copy_us(self, nbytes: float, pool_busy: bool) -> float:
        t = self.machine.link.h2d_us(nbytes)
        return t / self.calib.link_factor if pool_busy else t

    def sync_us(self) -> float:
        return self.calib.sync_us[self.machine.gpu.api]

    def group_us(self, t: int) -> float:
        return self.calib.group_us + self.calib.group_us_per_pair * t * self.model.k

    def input_d2h_us(self, t: int) -> float:
        return self.machine.link.d2h_us(t * self.model.shape.n_embd * 4.0)

    def rows_h2d_us(self, rows: int) -> float:
        return self.machine.link.h2d_us(rows * self.model.shape.n_embd * 4.0)

    def pin_us(self, nbytes: float) -> float:
        return self.calib.pin_us_per_mib * nbytes / 2**20

    # --- CPU pool ----------------------------------------------------------------------------------------
    def cpu_expert_us(self, layer: int, nt: int) -> float:
        """One expert of ``nt`` tokens on the pool: unpack once (gate+up are 2/3 of the weights), one
        multiply-accumulate per weight per token, split across the workers; at least the blob's DRAM read."""
        key = (layer, nt)
        if key not in self._cpu:
            c, cal = self.machine.cpu, self.calib
            curve = cal.cpu_token_curve.get(self._family[layer])
            if curve:   # measured on this machine's pool: unpack is then the whole cost of one token
                cycles = cal.isa_factor[c.isa] * self._unpack[layer] * curve[min(nt, len(curve)) - 1]
            else:
                cycles = cal.isa_factor[c.isa] * (self._unpack[layer] + nt * cal.cpu_cycles_per_mac)
            workers = min(self.machine.pool_workers, c.cores)
            compute = self.model.expert_weights * cycles / (workers * c.clock_ghz * 1e3)
            self._cpu[key] = cal.cpu_job_us + max(compute, self._blob[layer] / (c.mem_gbps * 1e3))
        return self._cpu[key]

    def cpu_pool_us(self, layer: int, counts: list[int]) -> float:
        """The CPU thread's wall time for its experts (each split by rows across all workers)."""
        return self.calib.pool_dispatch_us + sum(self.cpu_expert_us(layer, n) for n in counts)
