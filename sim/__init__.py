"""Strata's hardware simulator (SimPy): are the engine's decisions right on a machine, and what would a model
do on hardware we do not own.

hardware   GPU, CPU, link and machine records from data/catalogue.json (every figure with its source)
models     model shapes and quant mixes (presets, GGUF metadata), bytes and work per expert and layer
workload   routing: synthetic Zipf with per-chunk drift, or --dump-routing traces
costs      per-op durations (µs): rooflines, launches, the calibrated terms (data/calibration.json)
streams    SimPy processes: in-order device streams, the copy engine's link, the CPU pool
engine     the prefill loop of SPEC §3-§6, deciding with strata.policy's objects from simulated timings
walks      this engine's launch groups and walks (strata/accel/moe.py); the original's stay in engine
vram       the VRAM plan: cache slots, then strata.policy's chunk/loan plan
decode     decode speed, a roofline estimate
scenarios  the seeds' machines and measurements (SPEC §12); calibrate fits the constants to them
whatif     `python -m sim whatif`; sweep: `python -m sim sweep` on Dask
"""
