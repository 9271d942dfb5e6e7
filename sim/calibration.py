"""The model's constants: calibrated from the seeds, measured on the H200 machine, or assumed, each with a
source (``sim/data/calibration.json``; ``python -m sim calibrate`` rewrites the fitted ones)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Mapping

PATH = Path(__file__).parent / "data" / "calibration.json"
GPU_EXPERTS = ("rows_gemm", "mmq")  # this engine's expert path (strata/accel/moe.py); the original's int8 MMQ


@dataclass(frozen=True, slots=True)
class Calib:
    host_issue_factor: float  # host time per streamed expert x this while the CPU pool is busy
    link_factor: float  # H2D bandwidth x this while the CPU pool reads DRAM
    host_issue_us: Mapping[str, float]  # per API, for machines composed on the fly
    launch_us: Mapping[str, float]  # per kernel launch, per API
    sync_us: Mapping[str, float]  # the routing sync's host wake-up, per API
    group_us: float  # host grouping: fixed part
    group_us_per_pair: float  # ... per (token, k) pair
    group_us_per_expert: float  # ... per expert of the layer (its counts, placement, launch groups' tables)
    pin_us_per_mib: float  # cudaHostAlloc/grow of a pinned buffer
    pool_dispatch_us: float  # CPU thread launch + join
    cpu_job_us: float  # per CPU expert job (barriers, activation quantisation)
    pool_crowded_factor: float  # a probed pool's cost in a prompt over its probe's, when it fills the machine
    cpu_cycles_per_weight: Mapping[str, float]  # unpack cost per weight by type family (AVX-512 widths)
    cpu_cycles_per_mac: float  # per weight per token (AVX-512 widths)
    cpu_token_curve: Mapping[str, tuple[float, ...]]  # family -> measured cost(t) / cost(1), t = 1..8 (else linear)
    isa_factor: Mapping[str, float]  # cycles x this by ISA (AVX2 has half AVX-512's lanes)
    gpu_experts: str  # whose expert kernels and launch groups: "rows_gemm" (this engine), "mmq" (the original's)
    gpu_mm_eff: float  # fraction of the dense matrix rate the expert/dense kernels reach
    gpu_bw_eff: float  # fraction of memory bandwidth they reach
    gpu_kernels_per_expert: int  # mmq: launches per group (gate/up, swiglu, quantise, down)
    gpu_expert_us: float  # mmq: per expert outside the roofline (gather into group buffers, tiles)
    gpu_group_launch_us: float  # rows_gemm: per kernel of a launch group (launch, fill and drain)
    gpu_rows_bw_eff: float  # rows_gemm: expert_rows, its blob read at this fraction of memory bandwidth
    gpu_dequant_bw_eff: float  # rows_gemm: dequant, blob read + fp16 write at this fraction
    gpu_gemm_eff: float  # rows_gemm: the grouped GEMM on 64-row tiles, this fraction of the dense fp16 rate
    gpu_gemm_bw_eff: float  # rows_gemm: ... and at least its fp16 weights read at this fraction of bandwidth
    gpu_gemm_q_us_per_mw: Mapping[str, float]  # rows_gemm: gemm_q, µs a million weights a 64-row tile, by type
                                               # family (a family not here: its groups keep the scratch path)
    gpu_kernels_per_layer: int  # launches per layer outside the experts (a decode step's graph)
    dense_launches: int  # launches per layer of a prompt chunk outside the experts
    gpu_dense_mm_eff: float  # fraction of the dense matrix rate a prompt chunk's projections and attention reach
    fp16_path_types: tuple[str, ...]  # types without an int8 (MMQ) instance: dequantise to FP16 + GEMM
    zipf_s: float  # routing: expert popularity ~ rank^-s per layer
    chunk_sigma: float  # routing: per-chunk lognormal spread of popularity (topic drift)
    default_link: Mapping[str, str]  # gpu -> link, for machines composed on the fly
    extra_dense: Mapping[str, Mapping[str, tuple[float, float]]]  # model -> machine -> (us/layer, us/token)
    extra_dense_reference: Mapping[str, str]  # model -> the machine whose figures scale to other machines
    sources: Mapping[str, str]

    def __post_init__(self):
        assert self.gpu_experts in GPU_EXPERTS, f"gpu_experts {self.gpu_experts!r} not in {GPU_EXPERTS}"

    def over(self, overrides: Mapping[str, object]) -> "Calib":
        """These constants with a machine's measured ones (catalogue `calib`) in place of the seed-fitted ones."""
        if not overrides:
            return self
        return replace(self, **{k: (dict(v) if isinstance(v, Mapping) else v) for k, v in overrides.items()})

    @classmethod
    def load(cls, path: Path = PATH) -> "Calib":
        d = json.loads(path.read_text())
        kw = {f.name: d[f.name] for f in fields(cls)}
        kw["fp16_path_types"] = tuple(kw["fp16_path_types"])
        kw["extra_dense"] = {m: {k: tuple(v) for k, v in per.items()} for m, per in kw["extra_dense"].items()}
        missing = [f.name for f in fields(cls) if f.name != "sources" and not d["sources"].get(f.name)]
        assert not missing, f"calibration.json: no source for {missing}"
        return cls(**kw)


CALIB = Calib.load()
