"""Prompt sets for benchmarks and drafter training: real sets from PyPI wheels and user JSONL files."""

from trtspec.data.prompts import PROMPT_SETS, Prompt, load_jsonl_prompts, load_prompts

__all__ = ["PROMPT_SETS", "Prompt", "load_jsonl_prompts", "load_prompts"]
