"""SPEC §10's pipeline parity grid: workers {1, 4, many} × host {off, on} × tokens {1, 2, 4} × jobs {1, 2, 7, 18, 97}
× 3 repeats, each output compared bit for bit with the phased pool (outputs poisoned with a sentinel before every
run), and the phased pool itself against a serial reference (strata.reference.linalg.swiglu_ffn on the q8 path).

Like the original's `pool_pipeline_parity`: 7 expert blobs per layer cycled over up to 97 jobs, random N(0, 0.2)
activations per layer, three layers with different weight types so every kernel family takes part. Tiny
dimensions (D = 256, F = 256) keep the 3 × 90 cells × 4 runs fast.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from strata import quants
from strata.accel.cpu.pool import ExpertJob, ExpertPool
from strata.reference import linalg

D, F = 256, 256
SENTINEL = np.float32(-1.2345e33)
LAYERS = {  # (gate, up, down) types, one layer per activation family mix
    0: (12, 12, 14),     # Q4_K, Q4_K, Q6_K        (Q8_K activations)
    1: (17, 17, 20),     # IQ2_XS, IQ2_XS, IQ4_NL  (Q8_K in, Q8_0 for the intermediate)
    2: (3, 3, 42),       # Q4_1, Q4_1, Q2_0        (Q8_1 in, Q8_0 for the intermediate)
}
MANY = 17  # more threads than the CI machine has cores: the oversubscribed (parking) mode


def _blob(rng, types):
    parts = []
    for t, (n, k) in zip(types, ((F, D), (F, D), (D, F))):
        cls = quants.get(t)
        parts.append(cls.random_blocks(rng, n * k // cls.block_size, 0.05).reshape(-1))
    return np.concatenate(parts)


def _serial(blob, types, x):
    """The reference's q8 path on one expert, from the blob's three slices."""
    g = F * quants.get(types[0]).row_bytes(D)
    u = F * quants.get(types[1]).row_bytes(D)
    gate, up, down = blob[:g].reshape(F, -1), blob[g:g + u].reshape(F, -1), blob[g + u:].reshape(D, -1)
    return linalg.swiglu_ffn(x, (gate, types[0]), (up, types[1]), (down, types[2]), linalg.Path.Q8)


@pytest.fixture(scope="module")
def layers():
    out = {}
    for layer, types in LAYERS.items():
        rng = np.random.default_rng(51 + layer)
        blobs = [_blob(rng, types) for _ in range(7)]
        acts = (rng.standard_normal((97, 4, D)) * 0.2).astype(np.float32)   # [job, token slot, D]
        out[layer] = (types, blobs, acts)
    return out


def _run(pool, types, blobs, acts, nt, nj, out):
    out.fill(SENTINEL)
    pool.run([ExpertJob(blobs[j % 7], types, D, F, acts[j, :nt], out[j, :nt]) for j in range(nj)])
    return out.copy()


@pytest.mark.parametrize("host", [False, True], ids=["host-off", "host-on"])
@pytest.mark.parametrize("workers", [1, 4, MANY])
def test_pipeline_bitwise_parity(layers, workers, host):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the oversubscription warning is expected here
        phased = ExpertPool(workers, pipeline=False, host=host)
        piped = ExpertPool(workers, pipeline=True, host=host)
    checks = 0
    try:
        out = np.empty((97, 4, D), np.float32)
        for layer, (types, blobs, acts) in layers.items():
            for nt in (1, 2, 4):
                for nj in (1, 2, 7, 18, 97):
                    base = _run(phased, types, blobs, acts, nt, nj, out)
                    assert np.isfinite(base[:nj, :nt]).all(), "phased pool left sentinel/non-finite rows"
                    if workers == 1 and not host:
                        for j in range(min(nj, 7)):
                            ref = _serial(blobs[j], types, acts[j, :nt])
                            bad = np.flatnonzero(base[j, :nt].view(np.uint32) != ref.view(np.uint32))
                            assert bad.size == 0, (f"layer {layer} nt={nt} job {j}: {bad.size} values differ from "
                                                   f"the serial reference, first at {bad[0]}")
                    for rep in range(3):
                        got = _run(piped, types, blobs, acts, nt, nj, out)
                        diff = np.flatnonzero(got[:nj, :nt].view(np.uint32) != base[:nj, :nt].view(np.uint32))
                        assert diff.size == 0, (f"layer {layer} workers={workers} host={host} nt={nt} jobs={nj} "
                                                f"repeat {rep}: {diff.size} values differ from the phased pool")
                        checks += 1
    finally:
        phased.close()
        piped.close()
    assert checks == 3 * 3 * 5 * 3   # layers × tokens × job counts × repeats, per (workers, host) cell
