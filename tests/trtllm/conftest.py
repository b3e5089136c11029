"""Config-only TensorRT-LLM checkpoints with the published 7B/8B shapes: planning needs config.json, not weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# engine-flow.md §1.4: the config.json examples/medusa/convert_checkpoint.py writes for Vicuna-7B.
VICUNA_7B = {
    "architecture": "LlamaForCausalLM", "dtype": "float16", "logits_dtype": "float32",
    "num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096, "intermediate_size": 11008,
    "num_key_value_heads": 32, "vocab_size": 32000, "position_embedding_type": "rope_gpt_neox",
    "max_position_embeddings": 2048, "hidden_act": "silu", "rotary_base": 10000.0, "rotary_scaling": None,
    "norm_epsilon": 1e-06, "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
    "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
    "use_parallel_embedding": False, "embedding_sharding_dim": 0, "model_type": "llama",
}
VICUNA_7B_MEDUSA = {**VICUNA_7B, "architecture": "MedusaForCausalLM", "max_draft_len": 63, "num_medusa_heads": 4,
                    "num_medusa_layers": 1}
# engine-flow.md §1.5: examples/eagle/convert_checkpoint.py for EAGLE-Vicuna-7B-v1.3.
VICUNA_7B_EAGLE = {**VICUNA_7B, "architecture": "EagleForCausalLM", "max_draft_len": 63, "num_eagle_layers": 4,
                   "max_non_leaves_per_layer": 10, "head_dim": 128, "head_size": 128,
                   "eagle_net_config": {**VICUNA_7B, "num_hidden_layers": 1, "head_dim": 128, "head_size": 128}}
# Llama-3.1-8B(-Instruct): GQA 8 KV heads, 128256 vocab, llama3 rope scaling, bfloat16.
LLAMA_31_8B = {
    **VICUNA_7B, "dtype": "bfloat16", "intermediate_size": 14336, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rotary_base": 500000.0, "norm_epsilon": 1e-05, "head_dim": 128,
    "head_size": 128, "rotary_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192, "rope_type": "llama3",
                                         "type": "llama3"},
}
# Llama-3.2-1B: the draft of the draft-target pair (same tokenizer and vocabulary as Llama-3.1-8B).
LLAMA_32_1B = {**LLAMA_31_8B, "num_hidden_layers": 16, "hidden_size": 2048, "intermediate_size": 8192,
               "num_attention_heads": 32, "head_dim": 64, "head_size": 64,
               "rotary_scaling": {**LLAMA_31_8B["rotary_scaling"], "factor": 32.0}}

CONFIGS = {"vicuna-7b": VICUNA_7B, "vicuna-7b-medusa": VICUNA_7B_MEDUSA, "vicuna-7b-eagle": VICUNA_7B_EAGLE,
           "llama-3.1-8b": LLAMA_31_8B, "llama-3.2-1b": LLAMA_32_1B}


def write_config_checkpoint(root: Path, name: str, *, weights: bool = False, **overrides) -> Path:
    """root/name/config.json (+ empty rank files when weights=True, enough for the build's file checks)."""
    out = Path(root) / name
    out.mkdir(parents=True, exist_ok=True)
    config = {**CONFIGS[name], **overrides}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if weights:
        for rank in range(config["mapping"]["world_size"]):
            (out / f"rank{rank}.safetensors").write_bytes(b"")
    return out


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("trtllm-ckpts")
    return {name: write_config_checkpoint(root, name, weights=True) for name in CONFIGS}
