"""Hugging Face `config.json` of the supported base families (LLaMA, Mistral, Qwen2), read into a ModelShape."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trtspec.checkpoint.model_shape import ModelShape
from trtspec.errors import CheckpointError

# HF architecture → family; every family here is a LLaMA-style decoder (RMSNorm, RoPE, SwiGLU).
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
TORCH_DTYPE_NAMES = ("float32", "float16", "bfloat16")


def read_json(path: Path) -> dict:
    """Read a JSON object from `path`, with a one-line error naming the file."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


@dataclass(frozen=True, kw_only=True)
class BaseModelConfig(ModelShape):
    """A base model's shape as its Hugging Face config.json gives it, with where it was read from and the HF
    model_type (written on into the TensorRT-LLM config); every shape fact is ModelShape's."""

    path: Path  # the config.json
    model_type: str

    @property
    def family(self) -> str:
        return SUPPORTED_ARCHITECTURES[self.architecture]


def read_base_config(directory: Path) -> BaseModelConfig:
    """Read and validate a supported HF base model's config.json."""
    path = Path(directory) / "config.json"
    raw = read_json(path)
    arch = _architecture(raw, path)
    family = SUPPORTED_ARCHITECTURES[arch]
    hidden, heads = _int(raw, "hidden_size", path), _int(raw, "num_attention_heads", path)
    head_dim = _int(raw, "head_dim", path) if raw.get("head_dim") is not None else hidden // heads
    kv_heads = _int(raw, "num_key_value_heads", path) if raw.get("num_key_value_heads") is not None else heads
    if heads % kv_heads:
        raise CheckpointError(f"{path}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    rope = raw.get("rope_parameters") or {}  # transformers 5 moves rope_theta / rope_type here
    scaling = raw.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    if head_dim % 2:
        raise CheckpointError(f"{path}: head_dim={head_dim} is odd; rotary embeddings need an even head size")
    attention_bias = bool(raw.get("attention_bias", False))
    return BaseModelConfig(
        path=path, architecture=arch, model_type=raw.get("model_type", family),
        hidden_size=hidden, num_layers=_int(raw, "num_hidden_layers", path), num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_size=_int(raw, "intermediate_size", path), vocab_size=_int(raw, "vocab_size", path),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(raw.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rope_scaling=dict(scaling) if scaling else None,
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        hidden_act=raw.get("hidden_act", "silu"),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=family == "qwen2" or attention_bias,
        o_bias=family != "qwen2" and attention_bias,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        dtype=_dtype_name(raw.get("torch_dtype") or raw.get("dtype")),
    )


def _architecture(raw: dict, path: Path) -> str:
    archs = raw.get("architectures") or []
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return arch
    shown = ", ".join(archs) if archs else f"none (model_type={raw.get('model_type')!r})"
    raise CheckpointError(
        f"{path}: unsupported architecture {shown}; trtspec converts {', '.join(SUPPORTED_ARCHITECTURES)}")


def _int(raw: dict, key: str, path: Path) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"{path}: field {key} must be a positive integer, found {value!r}")
    return value


def _dtype_name(value) -> str | None:
    if isinstance(value, str):
        value = value.removeprefix("torch.")
        return value if value in TORCH_DTYPE_NAMES else None
    return None
