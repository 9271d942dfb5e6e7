"""Hardware as data (STYLE 13): frozen records with units in their field names, read from the catalogue.

Every figure in ``sim/data/catalogue.json`` carries a source (a spec sheet, a seed measurement, a figure
measured on the H200 machine, or "derived:"/"assumed:"/"calibrated:" with the reasoning); ``check()`` fails on
a figure without one. Times are in µs, sizes in bytes, rates in GB/s (1e9 B/s = 1e3 B/µs).
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Mapping

CATALOGUE = Path(__file__).parent / "data" / "catalogue.json"
ISAS = ("avx2", "avx512", "amx")
APIS = ("cuda", "rocm")


@dataclass(frozen=True, slots=True)
class GPU:
    name: str
    vram_gib: float
    mem_gbps: float  # device memory bandwidth (spec)
    fp16_tflops: float  # dense FP16 matrix rate (FP32 accumulate where the vendor separates them)
    int8_tops: float  # dense INT8 matrix/dot rate; 0 = no int8 dot path (the FP16 path is used)
    api: str  # "cuda" or "rocm"
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self):
        assert self.api in APIS, f"{self.name}: api {self.api!r} not in {APIS}"
        assert self.vram_gib > 0 and self.mem_gbps > 0 and self.fp16_tflops > 0 and self.int8_tops >= 0, self


@dataclass(frozen=True, slots=True)
class CPU:
    name: str
    cores: int
    threads: int
    isa: str  # widest integer dot ISA the pool's kernels use: avx2, avx512, amx
    clock_ghz: float  # all-core clock under load
    mem_gbps: float  # practical DRAM read bandwidth (measured-style, not the channel product)
    turbo_ghz: float = 0.0  # clock with one core busy; 0: none known, every core count runs at clock_ghz
    mem_gbps_1t: float = 0.0  # one thread's streaming read; 0: none known, a thread may take all of mem_gbps
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self):
        assert self.isa in ISAS, f"{self.name}: isa {self.isa!r} not in {ISAS}"
        assert 0 < self.cores <= self.threads and self.clock_ghz > 0 and self.mem_gbps > 0, self
        assert self.turbo_ghz == 0 or self.turbo_ghz >= self.clock_ghz, f"{self.name}: turbo below all-core clock"
        assert 0 <= self.mem_gbps_1t <= self.mem_gbps, f"{self.name}: one thread reads more than all of them"

    def clock_at(self, busy: int) -> float:
        """The clock with `busy` cores computing: turbo_ghz at one, down to clock_ghz at all of them, linear in
        between (turbo bins step down with active cores: Intel's turbo-ratio tables, AMD's boost)."""
        if not self.turbo_ghz or self.cores == 1:
            return self.clock_ghz
        n = min(max(busy, 1), self.cores)
        return self.clock_ghz + (self.turbo_ghz - self.clock_ghz) * (self.cores - n) / (self.cores - 1)

    def read_gbps(self, threads: int) -> float:
        """DRAM read bandwidth `threads` threads reach together: each at most one thread's (its own misses in
        flight bound it), all of them at most mem_gbps (the channels)."""
        if not self.mem_gbps_1t:
            return self.mem_gbps
        return min(self.mem_gbps, max(threads, 1) * self.mem_gbps_1t)


@dataclass(frozen=True, slots=True)
class LinkSpec:
    name: str
    pcie_gen: int
    lanes: int
    h2d_gbps: float  # pinned host->device, large copies (measured-style)
    d2h_gbps: float
    h2d_latency_us: float  # fixed cost per copy
    h2d_curve: tuple[tuple[int, float], ...] = ()  # measured (bytes, µs) per copy, ascending; wins if given
    h2d_queued_us: float = 0.0  # fixed cost of a copy queued behind others on the copy stream (then bytes at
    #                             h2d_gbps); 0: none measured, a copy costs h2d_us however it is queued
    probe_factor: float = 1.0  # what bench/prefill.py's h2d_gbps probe (one blob copied back to back) reads on
    #                            this link, over the rate of queued_us at that size (the runs the constants fit)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self):
        assert self.pcie_gen in (3, 4, 5, 6) and self.lanes in (1, 4, 8, 16), self
        assert self.h2d_gbps > 0 and self.d2h_gbps > 0 and self.h2d_latency_us >= 0 and self.h2d_queued_us >= 0, self
        assert all(
            a[0] < b[0] and a[1] <= b[1] for a, b in zip(self.h2d_curve, self.h2d_curve[1:])
        ), f"{self.name}: h2d_curve must ascend in bytes and time"

    def h2d_us(self, nbytes: float) -> float:
        """One pinned H2D copy: piecewise-linear in the measured curve, else latency + bytes / bandwidth."""
        if not self.h2d_curve:
            return self.h2d_latency_us + nbytes / (self.h2d_gbps * 1e3)
        xs = [b for b, _ in self.h2d_curve]
        i = bisect.bisect_left(xs, nbytes)
        if i == 0:
            return self.h2d_curve[0][1] * max(nbytes, 1) / xs[0] if nbytes < xs[0] else self.h2d_curve[0][1]
        if i == len(xs):  # beyond the last point: its bandwidth
            b, t = self.h2d_curve[-1]
            return t + (nbytes - b) / (self.h2d_gbps * 1e3)
        (b0, t0), (b1, t1) = self.h2d_curve[i - 1], self.h2d_curve[i]
        return t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)

    def queued_us(self, nbytes: float) -> float:
        """One copy of ``nbytes`` (a run of neighbouring blobs) queued back to back with others on the copy stream:
        the link's rate and a fixed cost each, where measured (h2d_queued_us); else as a lone copy (h2d_us)."""
        if not self.h2d_queued_us:
            return self.h2d_us(nbytes)
        return self.h2d_queued_us + nbytes / (self.h2d_gbps * 1e3)

    def probed(self, gbps: float, nbytes: float) -> "LinkSpec":
        """This link as a lease's own probe measured it: `gbps` from bench/prefill.py's h2d_gbps at `nbytes` (a
        blob), every H2D time scaled by the ratio of the probe's reading to this link's (lent H200s read 46.7-50.4
        GB/s at flash-shape's blob, bench/results/h200/prefill_f8*.log)."""
        ref = self.probe_factor * nbytes / (self.queued_us(nbytes) * 1e3)
        s = gbps / ref
        return replace(self, h2d_gbps=self.h2d_gbps * s, h2d_latency_us=self.h2d_latency_us / s,
                                   h2d_curve=tuple((b, t / s) for b, t in self.h2d_curve),
                                   h2d_queued_us=self.h2d_queued_us / s)

    def d2h_us(self, nbytes: float) -> float:
        return self.h2d_latency_us + nbytes / (self.d2h_gbps * 1e3)


@dataclass(frozen=True, slots=True)
class Machine:
    name: str
    gpu: GPU
    cpu: CPU
    link: LinkSpec
    ram_gib: float
    host_issue_us: float  # host time per streamed expert with the CPU pool idle (issue, events, staging)
    pool_workers: int  # CPU pool threads (the engine's default: one per core)
    os: str = "linux"
    # the host's time for this engine's walks (calib gpu_experts rows_gemm) by what it issues, where measured; 0:
    # host_issue_us a streamed expert. A launch group's kernels and its slots' release; a copy run (neighbouring
    # experts in neighbouring slots, strata/accel/stream.py Walk); a CUDA event recorded after a copy
    host_group_us: float = 0.0
    host_copy_us: float = 0.0
    host_event_us: float = 0.0
    host_embed_us: float = 0.0  # a prompt token's embedding row dequantised on the host (engines before d616513)
    host_refill_us: float = 0.0  # a refill copy issued by the engine thread at the prompt's end (give-back): one a
    #                              lent slot before ac18e97, one a run of a layer's neighbouring experts since
    host_queue_us: float = 0.0  # a stream-all chunk's queue entry, laid out by the host before its first copy
    calib: Mapping[str, object] = field(default_factory=dict, compare=False)  # calibrated constants measured here
    #   (calibration.json field -> value), over the seed-fitted ones: the engine's own CPU kernels, say
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self):
        assert (
            self.ram_gib > 0 and self.host_issue_us > 0 and 1 <= self.pool_workers <= self.cpu.threads
        ), self
        from .calibration import Calib

        known = {f.name for f in fields(Calib)} - {"sources"}
        bad = sorted(set(self.calib) - known)
        assert not bad, f"{self.name}: calib overrides {bad} are not calibration.json fields"


def _build(cls, name: str, entry: dict, **extra):
    kw = {f.name: entry[f.name] for f in fields(cls) if f.name in entry and f.name not in ("name", "sources")}
    if "h2d_curve" in kw:
        kw["h2d_curve"] = tuple((int(b), float(t)) for b, t in kw["h2d_curve"])
    return cls(name=name, sources=dict(entry.get("sources", {})), **kw, **extra)


@lru_cache(maxsize=4)
def catalogue(path: str = str(CATALOGUE)) -> dict:
    data = json.loads(Path(path).read_text())
    gpus = {k: _build(GPU, k, v) for k, v in data["gpus"].items()}
    cpus = {k: _build(CPU, k, v) for k, v in data["cpus"].items()}
    links = {k: _build(LinkSpec, k, v) for k, v in data["links"].items()}
    machines = {}
    for k, v in data["machines"].items():
        rest = {n: v[n] for n in v if n not in ("gpu", "cpu", "link")}
        machines[k] = _build(Machine, k, rest, gpu=gpus[v["gpu"]], cpu=cpus[v["cpu"]], link=links[v["link"]])
    return {"gpus": gpus, "cpus": cpus, "links": links, "machines": machines}


def machine(name: str) -> Machine:
    m = catalogue()["machines"]
    if name not in m:
        raise KeyError(f"no machine {name!r} in the catalogue (known: {', '.join(sorted(m))})")
    return m[name]


def compose(
    gpu: str,
    cpu: str,
    link: str | None = None,
    ram_gib: float = 64.0,
    host_issue_us: float | None = None,
    workers: int | None = None,
) -> Machine:
    """A machine the catalogue does not list, from its parts (whatif's --gpu/--cpu). The link defaults to the
    GPU's usual one; the host issue cost to the API's default (calibration.json)."""
    from .calibration import CALIB

    cat = catalogue()
    for kind, key in (("gpus", gpu), ("cpus", cpu)):
        if key not in cat[kind]:
            raise KeyError(f"no {kind[:-1]} {key!r} in the catalogue (known: {', '.join(sorted(cat[kind]))})")
    g, c = cat["gpus"][gpu], cat["cpus"][cpu]
    link = link or CALIB.default_link[gpu]
    if link not in cat["links"]:
        raise KeyError(f"no link {link!r} in the catalogue (known: {', '.join(sorted(cat['links']))})")
    issue = host_issue_us if host_issue_us is not None else CALIB.host_issue_us[g.api]
    return Machine(
        f"{gpu}+{cpu}",
        g,
        c,
        cat["links"][link],
        ram_gib,
        issue,
        workers or c.cores,
        sources={"host_issue_us": f"default for {g.api} (calibration.json)"},
    )


def check(path: str = str(CATALOGUE)) -> list[str]:
    """Figures without a source; [] when the catalogue is complete."""
    data = json.loads(Path(path).read_text())
    missing = []
    for kind in ("gpus", "cpus", "links", "machines"):
        for name, entry in data[kind].items():
            src = entry.get("sources", {})
            for key, val in entry.items():
                if key != "sources" and isinstance(val, (int, float, list)) and not src.get(key):
                    missing.append(f"{kind}.{name}.{key}")
            for key in entry.get("calib", {}):
                if not src.get(f"calib.{key}"):
                    missing.append(f"{kind}.{name}.calib.{key}")
    return missing
