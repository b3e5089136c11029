"""Prompt sets for benchmarks and drafter training: real sets from PyPI wheels and user JSONL files."""

from trtspec.data.prompts import PROMPT_SETS, Prompt, generation_inputs, load_jsonl_prompts, load_prompts
from trtspec.lazy import lazy_exports

__getattr__, _lazy = lazy_exports(__name__, {"build_datastore": "trtspec.data.datastore_sources"})
__all__ = ["PROMPT_SETS", "Prompt", "generation_inputs", "load_jsonl_prompts", "load_prompts", *_lazy]
