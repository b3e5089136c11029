"""Drafter training and initialisation: Medusa heads and EAGLE drafts for any base model."""

from trtspec.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {"TrainOptions": "trtspec.train.run", "train": "trtspec.train.run"})
