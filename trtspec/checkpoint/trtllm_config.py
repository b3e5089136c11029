"""The TensorRT-LLM checkpoint `config.json` (PretrainedConfig.to_dict) for LLaMA-family bases, Medusa, EAGLE and
ReDrafter.

Field names and values follow the TensorRT-LLM converters for the 0.15-1.2.x engine flow
(`examples/{llama,medusa,eagle,redrafter}/convert_checkpoint.py`); the C++ runtime reads `num_medusa_heads` and
`max_draft_len` (Medusa) or `num_eagle_layers`, `max_non_leaves_per_layer`, `eagle_net_config` (EAGLE) from it;
ReDrafter's `redrafter_*` fields size the engine's beam search at build time.
"""

from __future__ import annotations

from trtspec.checkpoint.eagle import EagleDraft
from trtspec.checkpoint.hf_config import BaseModelConfig
from trtspec.checkpoint.medusa import MedusaHeads
from trtspec.checkpoint.redrafter import ReDrafterDrafter, exclude_modules, redrafter_architecture
from trtspec.checkpoint.sharding import Mapping

QUANTIZATION_NONE = {"quant_algo": None, "kv_cache_quant_algo": None}


def rotary_scaling(cfg: BaseModelConfig) -> dict | None:
    """HF rope_scaling with TensorRT-LLM's `type` key (HF writes `rope_type` since transformers 4.45)."""
    if not cfg.rope_scaling:
        return None
    scaling = dict(cfg.rope_scaling)
    scaling.setdefault("type", scaling.get("rope_type"))
    scaling.pop("rope_theta", None)
    return scaling


def base_config(cfg: BaseModelConfig, *, dtype: str, mapping: Mapping) -> dict:
    """The plain decoder's config (`LlamaForCausalLM`, or `Qwen2ForCausalLM` for Qwen2)."""
    out = {
        "architecture": "Qwen2ForCausalLM" if cfg.family == "qwen2" else "LlamaForCausalLM",
        "dtype": dtype,
        "logits_dtype": "float32",
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_key_value_heads": cfg.num_kv_heads,
        "vocab_size": cfg.vocab_size,
        "position_embedding_type": "rope_gpt_neox",
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": cfg.hidden_act,
        "rotary_base": cfg.rope_theta,
        "rotary_scaling": rotary_scaling(cfg),
        "norm_epsilon": cfg.rms_norm_eps,
        "quantization": dict(QUANTIZATION_NONE),
        "mapping": mapping.to_dict(),
        "use_parallel_embedding": False,
        "embedding_sharding_dim": 0,
        "share_embedding_table": False,
        "head_dim": cfg.head_dim,
        "head_size": cfg.head_dim,
        "attn_bias": cfg.qkv_bias,
        "mlp_bias": cfg.mlp_bias,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "model_type": cfg.model_type,
    }
    if cfg.family == "qwen2":
        out["qwen_type"] = "qwen2"
    return out


def medusa_config(cfg: BaseModelConfig, heads: MedusaHeads, *, dtype: str, mapping: Mapping,
                  max_draft_len: int) -> dict:
    out = base_config(cfg, dtype=dtype, mapping=mapping)
    out.update(architecture="MedusaForCausalLM", max_draft_len=max_draft_len,
               num_medusa_heads=heads.num_heads, num_medusa_layers=heads.num_layers)
    return out


def eagle_config(cfg: BaseModelConfig, draft: EagleDraft, *, dtype: str, mapping: Mapping, max_draft_len: int,
                 num_eagle_layers: int, max_non_leaves_per_layer: int) -> dict:
    out = base_config(cfg, dtype=dtype, mapping=mapping)
    out.update(architecture="EagleForCausalLM", max_draft_len=max_draft_len, num_eagle_layers=num_eagle_layers,
               max_non_leaves_per_layer=max_non_leaves_per_layer)
    net = base_config(cfg, dtype=dtype, mapping=mapping)  # vocab, rotary and activation come from the base
    net.update(architecture="LlamaForCausalLM", num_hidden_layers=draft.num_layers,
               num_attention_heads=draft.num_heads, num_key_value_heads=draft.num_kv_heads,
               hidden_size=draft.hidden_size, intermediate_size=draft.intermediate_size,
               norm_epsilon=draft.rms_norm_eps, head_dim=draft.head_dim, head_size=draft.head_dim,
               attn_bias=draft.qkv_bias, mlp_bias=False, model_type="llama",
               max_position_embeddings=draft.config.get("max_position_embeddings", cfg.max_position_embeddings))
    net.pop("qwen_type", None)
    out["eagle_net_config"] = net
    return out


def redrafter_config(cfg: BaseModelConfig, drafter: ReDrafterDrafter, *, dtype: str, mapping: Mapping,
                     num_beams: int, draft_len_per_beam: int, greedy_search: bool,
                     trtllm_version: tuple[int, int]) -> dict:
    """The base's config with the ReDrafter fields (`hf_redrafter_config`): the architecture the version names, the
    base's as base_model_architecture, the drafter's sizes, the beam search settings the build unrolls, and the
    drafter kept out of quantization."""
    out = base_config(cfg, dtype=dtype, mapping=mapping)
    out["base_model_architecture"] = out["architecture"]
    out["architecture"] = redrafter_architecture(out["architecture"], trtllm_version, where=str(cfg.path))
    out.update(redrafter_num_layers=drafter.num_draft_layers, redrafter_hidden_size=drafter.hidden_size,
               redrafter_exit_dim=drafter.exit_dim, redrafter_is_rnn=drafter.rnn, redrafter_num_beams=num_beams,
               redrafter_draft_len_per_beam=draft_len_per_beam, redrafter_greedy_search=greedy_search)
    out["quantization"]["exclude_modules"] = exclude_modules(drafter)
    return out
