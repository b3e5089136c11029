"""TensorRT-LLM versions the llmapi flavour writes `model.yaml` for, and the keys each one's LLM API accepts.

The LLM API's configs are pydantic `StrictBaseModel`s: a key a version lacks fails the model's load on the GPU
host. So trtspec writes only keys listed here, per version and per `speculative_config` class, and refuses any
other in one line naming the version and the field. Each list is held by `tests/triton/test_llmapi_repo.py` to
the upstream text stored beside it (`tests/triton/upstream/`): TensorRT-LLM's versioned API reference of
`tensorrt_llm/llmapi/llm_args.py` at 1.3.0rc27 and 1.4.0rc4. `docs/upstream-sources.md` lists the files.

Versions 1.0-1.2 (the NGC 25.09-26.07 containers) are not in the table: their llm_args.py could not be read at a
tag here (the field names differ: `speculative_model_dir`, `eagle3_one_model`), and a guessed list would fail on
the host. The engine flow's own table is `trtspec.engine.trtllm_versions`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trtspec.errors import ConfigError

# DecodingBaseConfig: the fields every speculative_config class of a version lists first
_BASE_13 = ("max_draft_len", "max_total_draft_tokens", "speculative_model", "max_concurrency", "draft_len_schedule",
            "load_format", "acceptance_rate_window_size", "acceptance_rate_threshold", "use_rejection_sampling",
            "allow_advanced_sampling", "advanced_sampling_mode", "enable_penalty", "decoding_type")
_BASE_14 = _BASE_13[:3] + ("moe_backend", "moe_tactic") + _BASE_13[3:]

# decoding_type (the value model.yaml names the class by) → the class's fields
_V13 = {
    "Eagle3": _BASE_13 + ("eagle_choices", "use_dynamic_tree", "dynamic_tree_max_topK", "num_eagle_layers",
                          "max_non_leaves_per_layer", "eagle3_layers_to_capture", "eagle3_model_arch", "sa_config"),
    "MTP": _BASE_13 + ("use_relaxed_acceptance_for_thinking", "relaxed_topk", "relaxed_delta", "use_mtp_vanilla",
                       "use_dynamic_tree", "dynamic_tree_max_topK", "sa_config", "num_nextn_predict_layers",
                       "begin_thinking_phase_token", "end_thinking_phase_token"),
    "DraftTarget": _BASE_13,
}
_V14 = {
    "Eagle3": _BASE_14 + ("spec_dec_variant", "use_dynamic_tree", "dynamic_tree_max_topK", "num_eagle_layers",
                          "max_non_leaves_per_layer", "eagle3_layers_to_capture", "eagle3_model_arch", "sa_config"),
    "MTP": _BASE_14 + ("spec_dec_variant", "use_relaxed_acceptance_for_thinking", "relaxed_topk", "relaxed_delta",
                       "use_mtp_vanilla", "use_dynamic_tree", "dynamic_tree_max_topK", "draft_lm_head_dtype",
                       "draft_moe_dtype", "sa_config", "num_nextn_predict_layers", "begin_thinking_phase_token"),
    "NGram": _BASE_14 + ("spec_dec_variant", "max_matching_ngram_size", "is_keep_all", "is_use_oldest",
                         "is_public_pool"),
    "DraftTarget": _BASE_14,
}

# LLM(**args) keys trtspec writes (TorchLlmArgs / BaseLlmArgs), and KvCacheConfig's it writes; the same in both
TOP_LEVEL = ("model", "backend", "tensor_parallel_size", "pipeline_parallel_size", "max_batch_size",
             "max_num_tokens", "kv_cache_config", "speculative_config")
KV_CACHE = ("free_gpu_memory_fraction", "enable_block_reuse")
TRITON_CONFIG = ("max_batch_size", "decoupled")  # model.yaml's section model.py drops before LLM(**args)


@dataclass(frozen=True)
class LlmapiVersion:
    """A TensorRT-LLM release (major, minor) whose LLM-API keys trtspec holds, and the release it was held to."""

    major: int
    minor: int
    held_to: str  # the upstream release the lists were read at
    decoding: dict[str, tuple[str, ...]]  # decoding_type → speculative_config fields

    @property
    def short(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def name(self) -> str:
        return f"TensorRT-LLM {self.short} (held to {self.held_to})"

    def fields(self, decoding_type: str) -> tuple[str, ...]:
        if decoding_type not in self.decoding:
            raise ConfigError(f"{self.name}: trtspec holds no {decoding_type} field list for this version (no "
                              f"upstream text read); use --trtllm-version "
                              f"{' or '.join(v.short for v in VERSIONS.values() if decoding_type in v.decoding)}")
        return self.decoding[decoding_type]

    def check(self, decoding_type: str, keys) -> None:
        """Refuse, in one line, the first key the version's `decoding_type` class lacks."""
        allowed = self.fields(decoding_type)
        for key in keys:
            if key not in allowed:
                raise ConfigError(f"{self.name} has no {decoding_type} speculative_config field {key!r} (its "
                                  f"fields: {', '.join(allowed)})")


VERSIONS: dict[tuple[int, int], LlmapiVersion] = {
    (1, 3): LlmapiVersion(1, 3, "1.3.0rc27", _V13),
    (1, 4): LlmapiVersion(1, 4, "1.4.0rc4", _V14),
}
DEFAULT = (1, 4)
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?((?:rc|\.dev|\.post|a|b)\S*)?$")


def parse_llmapi_version(text: str | None) -> LlmapiVersion:
    """"X.Y" or "X.Y.Z[rcN]" → the held version of that minor (default: the newest held)."""
    if text is None:
        return VERSIONS[DEFAULT]
    match = _VERSION.match(str(text).strip())
    if not match:
        raise ConfigError(f"--trtllm-version {text!r} is not a version; write it as X.Y or X.Y.Z, e.g. 1.4")
    key = (int(match[1]), int(match[2]))
    if key not in VERSIONS:
        raise ConfigError(f"--trtllm-version {text}: the llmapi flavour holds the LLM-API keys of "
                          f"{', '.join(v.name for v in VERSIONS.values())} only; pick one of "
                          f"{', '.join(v.short for v in VERSIONS.values())}")
    return VERSIONS[key]
