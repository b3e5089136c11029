"""Test helpers: tiny random checkpoints in every released on-disk format."""

from trtspec.testing.factory import (
    TinyModel,
    write_eagle3_draft,
    write_eagle_draft,
    write_example,
    write_hf_base,
    write_medusa_heads,
)

__all__ = [
    "TinyModel",
    "write_eagle3_draft",
    "write_eagle_draft",
    "write_example",
    "write_hf_base",
    "write_medusa_heads",
]
