"""One module per `general.architecture` (the file name is the registry, STYLE point 1).

`load(path)` opens a GGUF, reads its architecture's config, checks every tensor the architecture needs (name,
shape, quant type) and returns a `Model`: config, named tensor views and zero-copy expert slices.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from strata.gguf_file import GGUFFile
from strata.models.base import (BadTensorShape, ExpertSlices, InconsistentConfig, MissingTensor, ModelError,
                                MoEConfig, QKNorm, Routing, TensorSet, UnsupportedArchitecture, expert_slices)

SUPPORTED = ("qwen3moe", "llama", "qwen2moe", "olmoe")
ALIASES = {"mixtral": "llama"}   # some tools write `mixtral`; llama.cpp reads Mixtral as `llama`

__all__ = ["load", "Model", "MoEConfig", "Routing", "QKNorm", "ExpertSlices", "ModelError",
           "UnsupportedArchitecture", "MissingTensor", "BadTensorShape", "InconsistentConfig", "SUPPORTED"]


def arch_module(arch: str) -> ModuleType:
    name = ALIASES.get(arch, arch)
    if name not in SUPPORTED:
        raise UnsupportedArchitecture(f"architecture {arch!r} is not supported; Strata runs: "
                                      f"{', '.join(SUPPORTED)} (Mixtral is `llama` with experts)")
    return importlib.import_module(f"strata.models.{name}")


class Model:
    """A loaded MoE model: `cfg`, `tensors` (checked), `arch` (its module), `gguf` (the open file)."""

    def __init__(self, gf: GGUFFile):
        self.gguf = gf
        self.arch = arch_module(gf.arch)
        self.cfg: MoEConfig = self.arch.config_from_gguf(gf)
        req, opt = self.arch.tensor_specs(self.cfg)
        self.tensors = TensorSet(gf, self.cfg, req, opt)

    @property
    def path(self) -> str:
        return self.gguf.path

    @property
    def metadata(self) -> dict:
        return self.gguf.metadata

    def view(self, name: str):
        return self.tensors.view(name)

    def qtype(self, name: str) -> int:
        return self.tensors.info(name).qtype

    def expert(self, layer: int, e: int) -> ExpertSlices:
        """Zero-copy [gate | up | down] slices of expert `e` in `layer` (SPEC §1)."""
        if not (0 <= layer < self.cfg.n_layer and 0 <= e < self.cfg.n_expert):
            raise IndexError(f"expert ({layer}, {e}) outside {self.cfg.n_layer} layers x {self.cfg.n_expert}")
        return expert_slices(self.tensors, layer, e)

    def expert_blob_bytes(self, layer: int = 0) -> int:
        return self.expert(layer, 0).nbytes

    def max_blob_bytes(self) -> int:
        return max(self.expert_blob_bytes(l) for l in range(self.cfg.n_layer))

    def forward_block(self, ops, x, layer: int, pos):
        return self.arch.block(ops, self.cfg, x, layer, pos)

    def close(self):
        self.gguf.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def load(path: str | os.PathLike) -> Model:
    gf = GGUFFile(path)
    try:
        return Model(gf)
    except Exception:
        gf.close()
        raise
