"""Engines and the speculative loop that drives them."""

from trtspec.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {"LocalGenerator": "trtspec.runtime.generator",
                                               "Tokenizer": "trtspec.runtime.tokenizer"})
