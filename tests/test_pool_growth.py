"""CuPy's memory pool grows over a prompt (and the decode steps after it) by no more than the memory plan priced for a chunk's temporaries
(buffers.temp_bytes): what the plan leaves outside the cache and the loan is all a prompt may add. A long prompt's
layer-major walk once grew it by 2-4x that (reference cycles kept each deferred block's arrays until Python's
collector ran; the side stream's blocks kept every chunk's inputs for a whole layer: pool_growth_q8_stop41.log).
Oracle: the pool's high-water mark over the prompt (free blocks released before it), on a cut-down
qwen3-30b-a3b (two layers of the real shape: temporaries of the size the plan prices, not the golden models'
few KiB that the pool's 512-byte rounding would swamp). CUDA only."""

import dataclasses

import pytest

from strata import models, policy
from strata.accel.buffers import temp_bytes
from strata.synth.build import synthesise
from strata.synth.presets import PRESETS
from strata.synth.vocab import tokenizer_meta_for

pytestmark = pytest.mark.gpu

N_CTX = 4200          # a 4,096-token prompt and its decode steps


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    pytest.importorskip("cupy")
    shape = dataclasses.replace(PRESETS["qwen3-30b-a3b"], n_layer=2)
    path = str(tmp_path_factory.mktemp("pool") / "q2.gguf")
    synthesise(shape, path, seed=0, name="qwen3-30b-a3b", tokenizer_meta=tokenizer_meta_for(shape))
    return models.load(path)


@pytest.mark.parametrize("side", [True, False], ids=["side-stream", "in-place"])
def test_a_prompt_grows_the_pool_by_what_the_plan_priced(model, side):
    import cupy as cp
    import numpy as np

    from strata.accel.device.cuda import CudaDevice
    from strata.accel.engine import GpuEngine
    from strata.accel.memplan import budget_holding

    c = model.cfg
    dev = CudaDevice()
    # a cache of a layer and a half: a long prompt walks layer by layer (the cache keeps a layer beside its loan)
    e = GpuEngine(model, dev, n_ctx=N_CTX, vram_budget=budget_holding(model, N_CTX, 3 * c.n_expert // 2),
                  config=dataclasses.replace(policy.Config(), cpu_share=0.0))
    e.side_blocks = side
    pool, rng = cp.get_default_memory_pool(), np.random.default_rng(0)
    priced = temp_bytes(c, e.plan.chunk)
    try:
        for n in (e.plan.chunk // 2, e.plan.chunk, 4096):
            p = rng.integers(0, c.n_vocab, n).tolist()
            for _ in range(2):                  # the first: kernels compiled, graphs captured, the cache settled
                e.reset()
                dev.synchronize()
                pool.free_all_blocks()
                base = pool.total_bytes()
                out = e.prefill(p)
                walk = e.stats.chunks[-1][1]
                for _ in range(4):              # and a few decode steps after it
                    out = e.decode([int(out[-1].argmax())])
                dev.synchronize()
            grew = pool.total_bytes() - base
            assert grew <= priced, (f"{n} tokens ({walk}): the pool grew {grew / 2**20:.1f} MiB, the plan priced "
                                    f"{priced / 2**20:.1f} MiB for a chunk of {e.plan.chunk}")
        assert walk == "layer-major", walk
    finally:
        dev.close()
