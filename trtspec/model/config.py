"""What the reference network needs to know, read from a TensorRT-LLM checkpoint's `config.json`.

One frozen dataclass for the base (plus its Medusa heads) and, nested, the EAGLE drafter's `eagle_net_config`.
Field names of the source are TensorRT-LLM's (`trtspec/checkpoint/trtllm_config.py` writes them).
"""

from __future__ import annotations

from dataclasses import dataclass

from trtspec.errors import CheckpointError

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MedusaForCausalLM", "EagleForCausalLM")
HIDDEN_ACTS = ("silu",)  # every supported family is SwiGLU; Medusa ResBlocks use the same activation
DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Everything the network needs: dimensions, RoPE, biases, and the speculative parts' sizes."""

    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # HF rope_scaling dict; TRT-LLM adds "type" next to HF's "rope_type"
    max_position_embeddings: int
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    hidden_act: str
    dtype: str  # the stored dtype of the checkpoint
    num_medusa_heads: int = 0
    num_medusa_layers: int = 0
    max_draft_len: int = 0
    eagle: ModelConfig | None = None  # the drafter's eagle_net_config when architecture is EagleForCausalLM
    num_eagle_layers: int = 0  # EagleNet invocations (tree depth), not transformer layers
    max_non_leaves_per_layer: int = 0

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(f"num_attention_heads={self.num_heads} is not a multiple of "
                                  f"num_key_value_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise CheckpointError(f"head_size={self.head_dim} is odd; rotary embeddings need an even head size")

    @classmethod
    def from_trtllm(cls, config: dict) -> ModelConfig:
        """Read a TensorRT-LLM `config.json` dict; CheckpointError names the first bad or missing field."""
        arch = _choice(config, "architecture", ARCHITECTURES)
        hidden, heads = _int(config, "hidden_size"), _int(config, "num_attention_heads")
        kv_heads = _int(config, "num_key_value_heads") if config.get("num_key_value_heads") is not None else heads
        head_dim = next((_int(config, k) for k in ("head_size", "head_dim") if config.get(k) is not None),
                        hidden // heads)
        attn_bias = _bool(config, "attn_bias")
        speculative = _medusa_fields(config) if arch == "MedusaForCausalLM" else {}
        if arch == "EagleForCausalLM":
            speculative = _eagle_fields(config)
        return cls(
            architecture=arch, hidden_size=hidden, num_layers=_int(config, "num_hidden_layers"),
            num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
            intermediate_size=_int(config, "intermediate_size"), vocab_size=_int(config, "vocab_size"),
            rms_norm_eps=_float(config, "norm_epsilon", 1e-6), rope_theta=_float(config, "rotary_base", 10000.0),
            rope_scaling=_rope_scaling(config), max_position_embeddings=_int(config, "max_position_embeddings"),
            # Qwen2 has biases on q/k/v only; LLaMA's attention_bias puts one on o_proj (TRT `dense`) too.
            qkv_bias=attn_bias, o_bias=attn_bias and not _is_qwen(config), mlp_bias=_bool(config, "mlp_bias"),
            hidden_act=_choice(config, "hidden_act", HIDDEN_ACTS), dtype=_choice(config, "dtype", DTYPES),
            **speculative,
        )


def _medusa_fields(config: dict) -> dict:
    return {"num_medusa_heads": _int(config, "num_medusa_heads"),
            "num_medusa_layers": _int(config, "num_medusa_layers"), "max_draft_len": _int(config, "max_draft_len")}


def _eagle_fields(config: dict) -> dict:
    net = config.get("eagle_net_config")
    if not isinstance(net, dict):
        raise CheckpointError(f"config field eagle_net_config must be an object, found {net!r}")
    try:
        draft = ModelConfig.from_trtllm(net)
    except CheckpointError as e:
        raise CheckpointError(f"eagle_net_config: {e}") from None
    return {"eagle": draft, "num_eagle_layers": _int(config, "num_eagle_layers"),
            "max_non_leaves_per_layer": _int(config, "max_non_leaves_per_layer"),
            "max_draft_len": _int(config, "max_draft_len")}


def _is_qwen(config: dict) -> bool:
    return (config["architecture"] == "Qwen2ForCausalLM" or "qwen_type" in config
            or "qwen" in str(config.get("model_type", "")))


def _rope_scaling(config: dict) -> dict | None:
    scaling = config.get("rotary_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise CheckpointError(f"config field rotary_scaling must be an object or null, found {scaling!r}")
    return dict(scaling) if scaling else None


def _int(config: dict, key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"config field {key} must be a positive integer, found {value!r}")
    return value


def _float(config: dict, key: str, default: float) -> float:
    value = config.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"config field {key} must be a positive number, found {value!r}")
    return float(value)


def _bool(config: dict, key: str) -> bool:
    value = config.get(key, False)
    if not isinstance(value, bool):
        raise CheckpointError(f"config field {key} must be true or false, found {value!r}")
    return value


def _choice(config: dict, key: str, choices: tuple[str, ...]) -> str:
    value = config.get(key)
    if value not in choices:
        raise CheckpointError(f"config field {key}={value!r} is not supported; trtspec's reference model "
                              f"takes {', '.join(choices)}")
    return value
