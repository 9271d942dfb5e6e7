"""ggml quant types: one registered class per type (see base.py), activation quantisers, q8-path dots."""

from strata.quants.base import QuantType, UnsupportedQuantType, get, registered, type_name

__all__ = ["QuantType", "UnsupportedQuantType", "get", "registered", "type_name"]
