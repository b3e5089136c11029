"""Test helpers: tiny random checkpoints in every released on-disk format."""

from trtspec.testing.checkpoints import tiny_engine, tiny_trtllm_checkpoints
from trtspec.testing.tokenizers import write_tiny_tokenizer
from trtspec.testing.factory import (
    add_llama_biases,
    TinyModel,
    write_eagle3_draft,
    write_eagle_draft,
    write_example,
    write_hf_base,
    write_medusa_heads,
    write_redrafter_drafter,
)

__all__ = [
    "add_llama_biases",
    "tiny_engine",
    "tiny_trtllm_checkpoints",
    "TinyModel",
    "write_eagle3_draft",
    "write_eagle_draft",
    "write_example",
    "write_hf_base",
    "write_medusa_heads",
    "write_redrafter_drafter",
    "write_tiny_tokenizer",
]
