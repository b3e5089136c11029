"""The reference network: a LLaMA-family decoder (+ Medusa heads) in plain torch over TensorRT-LLM checkpoint weights.

It is the numerical ground truth the exported graphs and engines are checked against. The KV cache is explicit:
a step takes the past keys/values and a boolean mask over [past | new] columns, and returns the new tokens'
keys/values, so one forward serves prefill, decoding, tree verification and padded batches alike.
Module and parameter names follow the TensorRT-LLM checkpoint (`mlp.fc` is HF gate_proj, `mlp.gate` is up_proj).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from trtspec.checkpoint.model_shape import ModelShape, ReDrafterNet
from trtspec.errors import CheckpointError
from trtspec.model.rope import apply_rope, rope_cos_sin, rope_inv_freq

if TYPE_CHECKING:
    from trtspec.checkpoint.trtllm_reader import TrtllmCheckpoint

# Module parameter prefix → checkpoint tensor prefix. Below these, names are the checkpoint's own, except that the
# fused `attention.qkv` is held as three projections `attention.{q,k,v}`.
BASE_PREFIXES = {"vocab_embedding.": "transformer.vocab_embedding.", "layers.": "transformer.layers.",
                 "ln_f.": "transformer.ln_f.", "lm_head.": "lm_head.", "medusa_heads.": "medusa_heads."}
_QKV_PART = re.compile(r"^(.*\.attention\.)([qkv])\.(weight|bias)$")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # As HF LlamaRMSNorm: normalise in float32, scale in the input dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked attention in float32. q [B, nh, T, hd]; k, v [B, nkv, S, hd]; mask [B, T, S] bool, True = may attend."""
    rep = q.shape[1] // k.shape[1]  # GQA: query head j reads KV head j // rep
    k = k.float().repeat_interleave(rep, dim=1)  # [B, nh, S, hd]
    v = v.float().repeat_interleave(rep, dim=1)
    scores = q.float() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [B, nh, T, S]
    bias = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))[:, None]  # [B, 1, T, S]
    probs = torch.softmax(scores + bias, dim=-1)
    probs = torch.where(mask.any(-1)[:, None, :, None], probs, 0.0)  # a row with nothing visible reads 0, not NaN
    return (probs @ v).to(q.dtype)  # [B, nh, T, hd]


class Attention(nn.Module):
    def __init__(self, c: ModelShape):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.qkv_bias)
        self.k = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.dense = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias)

    def forward(self, x, cos, sin, mask, past_key, past_value):
        """x [B, T, H]; past [B, nkv, P, hd] → (out [B, T, H], new key and value [B, nkv, T, hd], RoPE applied)."""
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # [B, nh, T, hd]
        k = self.k(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, nkv, T, hd]
        v = self.v(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys = torch.cat([past_key.to(k.dtype), k], dim=2)  # [B, nkv, P+T, hd]
        values = torch.cat([past_value.to(v.dtype), v], dim=2)
        out = attend(q, keys, values, mask)  # [B, nh, T, hd]
        return self.dense(out.transpose(1, 2).reshape(B, T, -1)), k, v


class FeedForward(nn.Module):
    """SwiGLU: proj(silu(fc(x)) * gate(x)); TRT-LLM `fc` is the activated branch (HF gate_proj)."""

    def __init__(self, c: ModelShape):
        super().__init__()
        self.fc = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.gate = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.silu(self.fc(x)) * self.gate(x))


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer; `input_norm=False` is the EAGLE drafter's first layer (no input_layernorm)."""

    def __init__(self, c: ModelShape, *, input_norm: bool = True):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps) if input_norm else nn.Identity()
        self.attention = Attention(c)
        self.post_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = FeedForward(c)

    def forward(self, x, cos, sin, mask, past_key, past_value):
        h, k, v = self.attention(self.input_layernorm(x), cos, sin, mask, past_key, past_value)
        x = x + h
        return x + self.mlp(self.post_layernorm(x)), k, v


def run_layers(layers: nn.ModuleList, x, cos, sin, mask, past_key, past_value):
    """Run x [B, T, H] through the layers; past [L, B, nkv, P, hd] → (x, new keys, new values [L, B, nkv, T, hd])."""
    keys, values = [], []
    for layer, pk, pv in zip(layers, past_key, past_value):
        x, k, v = layer(x, cos, sin, mask, pk, pv)
        keys.append(k)
        values.append(v)
    return x, torch.stack(keys), torch.stack(values)


class MedusaLayer(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))  # Medusa ResBlock


class MedusaHead(nn.Module):
    def __init__(self, c: ModelShape):
        super().__init__()
        self.medusa_layers = nn.ModuleList(MedusaLayer(c.hidden_size) for _ in range(c.num_medusa_layers))
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for layer in self.medusa_layers:
            hidden = layer(hidden)
        return self.lm_head(hidden).float()  # [B, T, V]


class ReDrafterReference(nn.Module):
    """A ReDrafter checkpoint's drafter (`drafter.*`; TensorRT-LLM tensorrt_llm/models/redrafter/drafter.py), one
    beam-search step as the exported `redrafter` graph computes it (onnx_graph.redrafter_graph)."""

    def __init__(self, net: ReDrafterNet, vocab_size: int):
        super().__init__()
        H, E = net.hidden_size, net.exit_dim
        self.net = net
        self.input_proj = nn.Linear(2 * H, E) if net.has_input_proj else None
        self.layers = nn.ModuleList(MedusaLayer(E) for _ in range(net.num_layers))  # the same ResBlock
        self.lm_head = nn.Linear(E, vocab_size, bias=False)
        self.rnn_u = nn.Linear(H, H) if net.rnn else None
        self.rnn_w = nn.Linear(H, H, bias=False) if net.rnn else None

    @classmethod
    def from_checkpoint(cls, ckpt: TrtllmCheckpoint | str | Path) -> ReDrafterReference:
        ckpt = open_checkpoint(ckpt)
        model = cls(ReDrafterNet.from_trtllm(ckpt.config), ckpt.config["vocab_size"])
        used = load_weights(model, ckpt, {"": "drafter."})
        check_all_used(ckpt, used, lambda name: name.startswith("drafter."))
        return model.eval()

    def forward(self, hidden, embedded, state, has_state) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden, embedded, state [N, H], has_state [N, 1] → logits [N, V], next_state [N, H]."""
        if self.net.rnn:
            state = self.rnn_w(embedded) + has_state * self.rnn_u(state)
        else:
            state = embedded + state
        x = torch.cat([hidden, state], dim=-1)
        if self.input_proj is not None:
            x = self.input_proj(x)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(x).float(), state


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [B, T, V] float32
    hidden: torch.Tensor  # [B, T, H] after ln_f: the Medusa heads' input and the EAGLE-1 feature
    medusa_logits: torch.Tensor | None  # [num_medusa_heads, B, T, V] float32
    new_key: torch.Tensor  # [L, B, nkv, T, hd], RoPE applied
    new_value: torch.Tensor  # [L, B, nkv, T, hd]


class ReferenceModel(nn.Module):
    """The base decoder (and its Medusa heads, if any) of a TensorRT-LLM checkpoint; EAGLE drafters live apart."""

    def __init__(self, config: ModelShape, *, dtype: torch.dtype = torch.float32):
        super().__init__()
        c, self.config, self.dtype = config, config, dtype
        self.vocab_embedding = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_layers))
        self.ln_f = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.medusa_heads = nn.ModuleList(MedusaHead(c) for _ in range(c.num_medusa_heads))
        self.to(dtype)
        # A plain attribute, not a buffer, so that .to(dtype) never rounds the frequencies.
        self.inv_freq = rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling)  # [hd/2] float32

    @classmethod
    def from_checkpoint(cls, ckpt: TrtllmCheckpoint | str | Path, *,
                        dtype: torch.dtype = torch.float32) -> ReferenceModel:
        """Load the base (and Medusa heads) of a TensorRT-LLM checkpoint, computing in `dtype`."""
        ckpt = open_checkpoint(ckpt)
        model = cls(ModelShape.from_trtllm(ckpt.config), dtype=dtype)
        used = load_weights(model, ckpt, BASE_PREFIXES)
        check_all_used(ckpt, used, lambda name: not name.startswith(("eagle_nets.", "drafter.")))
        return model.eval()

    def forward(self, input_ids, position_ids, attention_mask, past_key, past_value) -> ModelOutput:
        """One step over T new tokens; attention_mask [B, T, P+T] covers [past | new] columns."""
        check_step_inputs(self.config, input_ids, position_ids, attention_mask, past_key, past_value)
        cos, sin = rope_cos_sin(self.inv_freq, position_ids)  # [B, T, hd]
        x = self.vocab_embedding(input_ids)  # [B, T, H]
        x, new_key, new_value = run_layers(self.layers, x, cos, sin, attention_mask, past_key, past_value)
        hidden = self.ln_f(x)  # [B, T, H]
        medusa = torch.stack([head(hidden) for head in self.medusa_heads]) if self.medusa_heads else None
        return ModelOutput(self.lm_head(hidden).float(), hidden, medusa, new_key, new_value)

    def empty_cache(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return an empty past (P = 0): keys and values [L, B, nkv, 0, hd]."""
        return empty_cache(self.config, batch, self.dtype)


def empty_cache(c: ModelShape, batch: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (c.num_layers, batch, c.num_kv_heads, 0, c.head_dim)
    return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)


def check_step_inputs(c: ModelShape, input_ids, position_ids, mask, past_key, past_value) -> None:
    """Raise ValueError when a step's tensors do not fit together (a caller bug, named precisely)."""
    B, T = input_ids.shape
    P = past_key.shape[3]
    expected = {"position_ids": (position_ids, (B, T)), "attention_mask": (mask, (B, T, P + T)),
                "past_key": (past_key, (c.num_layers, B, c.num_kv_heads, P, c.head_dim)),
                "past_value": (past_value, (c.num_layers, B, c.num_kv_heads, P, c.head_dim))}
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} has shape {list(tensor.shape)}, expected {list(shape)} "
                             f"(input_ids [B={B}, T={T}], past length P={P})")
    if mask.dtype != torch.bool:
        raise ValueError(f"attention_mask must be bool (True = may attend), got {mask.dtype}")


# ---- loading ------------------------------------------------------------------------------------------------

def open_checkpoint(ckpt: TrtllmCheckpoint | str | Path) -> TrtllmCheckpoint:
    from trtspec.checkpoint.trtllm_reader import read_trtllm_checkpoint

    return read_trtllm_checkpoint(Path(ckpt)) if isinstance(ckpt, (str, Path)) else ckpt


def checkpoint_name(param: str, prefixes: dict[str, str]) -> tuple[str, int | None]:
    """The checkpoint tensor holding module parameter `param`, and its q/k/v index inside a fused qkv."""
    prefix = next(p for p in prefixes if param.startswith(p))
    name = prefixes[prefix] + param.removeprefix(prefix)
    m = _QKV_PART.match(name)
    return (f"{m[1]}qkv.{m[3]}", "qkv".index(m[2])) if m else (name, None)


def load_weights(module: nn.Module, ckpt: TrtllmCheckpoint, prefixes: dict[str, str]) -> set[str]:
    """Copy every parameter of `module` from the checkpoint (cast to its dtype); return the tensor names used."""
    qkv: dict[str, tuple[torch.Tensor, ...]] = {}
    used = set()
    for param_name, param in module.named_parameters():
        name, part = checkpoint_name(param_name, prefixes)
        if part is None:
            tensor = ckpt.tensor(name)
        else:
            if name not in qkv:
                qkv[name] = ckpt.split_qkv(name)  # (q, k, v), KV heads duplicated for TP folded back
            tensor = qkv[name][part]
        if tuple(tensor.shape) != tuple(param.shape):
            part_name = "" if part is None else f" ({'qkv'[part]} part)"
            raise CheckpointError(f"{ckpt.directory}: tensor {name}{part_name} has shape {list(tensor.shape)}, "
                                  f"but config.json implies {list(param.shape)}")
        with torch.no_grad():
            param.copy_(tensor.to(param.dtype))
        used.add(name)
    return used


def check_all_used(ckpt: TrtllmCheckpoint, used: set[str], belongs) -> None:
    """Every checkpoint tensor the module owns (`belongs(name)`) must have been loaded; name the first that was not."""
    leftover = sorted(n for n in ckpt.names() if belongs(n) and n not in used)
    if leftover:
        more = f" (and {len(leftover) - 1} more)" if len(leftover) > 1 else ""
        raise CheckpointError(f"{ckpt.directory}: tensor {leftover[0]}{more} has no place in the reference model; "
                              "config.json does not describe these weights (e.g. attn_bias / mlp_bias is false)")
