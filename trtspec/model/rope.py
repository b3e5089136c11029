"""Rotary position embeddings (GPT-NeoX layout, TensorRT-LLM `rope_gpt_neox`) with the HF scaling variants.

The inverse frequencies are computed with the same float32 operations as transformers'
`modeling_rope_utils`, so the reference network and HF agree to the last bit on them.
"""

from __future__ import annotations

import math

import torch

from trtspec.errors import ConfigError

SCALING_TYPES = ("default", "linear", "llama3")
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Return the inverse frequencies [head_dim // 2] (float32) for `theta` and an HF rope_scaling dict."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float) / head_dim
    inv_freq = 1.0 / (theta ** exponents)  # [hd/2]
    kind = _scaling_type(scaling)
    if kind == "linear":  # positions divided by factor ≡ frequencies divided by factor
        return inv_freq / _param(scaling, "factor", kind)
    if kind == "llama3":
        return _llama3(inv_freq, *(_param(scaling, k, kind) for k in LLAMA3_KEYS))
    return inv_freq


def _scaling_type(scaling: dict | None) -> str:
    if not scaling:
        return "default"
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind not in SCALING_TYPES:
        raise ConfigError(f"rope scaling type {kind!r} is not supported by trtspec's reference model; "
                          f"supported: {', '.join(SCALING_TYPES)}")
    return kind


def _param(scaling: dict, key: str, kind: str) -> float:
    if not isinstance(scaling.get(key), (int, float)):
        raise ConfigError(f"rope scaling type {kind!r} needs a numeric {key!r}, found {scaling.get(key)!r}")
    return scaling[key]


def _llama3(inv_freq: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
            old_context_len: float) -> torch.Tensor:
    """Llama 3.1 scaling: keep short wavelengths, divide long ones by factor, interpolate in between."""
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(inv_freq: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return cos and sin [B, T, hd] (float32) for position_ids [B, T]."""
    freqs = position_ids[..., None].float() * inv_freq  # [B, T, hd/2]
    angles = torch.cat([freqs, freqs], dim=-1)  # [B, T, hd]: NeoX pairs dim i with dim i + hd/2
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, heads, T, hd] by the angles of cos/sin [B, T, hd], in float32; returns x's dtype."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)  # rotate_half
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)
