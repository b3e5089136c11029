"""Activation-aware pre-scaling (AWQ-style) of a float LLaMA-family TensorRT-LLM checkpoint, so that the int4
round-to-nearest build (`trtspec build --weights int4`, `quantize.quantize`) loses less.

For every linear group of every layer it searches per-input-channel scales s = mean|X|^α over α in [0, 1] on
calibration activations (from the Hugging Face model the checkpoint was converted from), keeps the α that minimises
the group's output error after quantization (α = 0 is plain round-to-nearest, so the error never grows), and folds s
into the weights and 1/s into the producer of X (a norm, the v rows, the gate rows): the float model computes the same
function. AWQ's scale search (Lin et al., MLSys 2024; mit-han-lab/llm-awq `awq/quantize/auto_scale.py`) without its
clipping search. The groups, the objective and where each scale is folded: docs/quantization-numerics.md.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtspec.errors import ConfigError
from trtspec.model.quantize import QuantScheme, fake_quantize

GROUPS = ("qkv", "fc", "dense", "proj")  # by the checkpoint's names; each read in the table above
PREFIX = "transformer.layers"


@dataclass(frozen=True)
class AwqOptions:
    bits: int = 4
    block_size: int = 32
    scheme: QuantScheme = QuantScheme.SYMMETRIC  # the int4 scheme the build will use (`--int4-scheme`)
    alphas: int = 21  # grid points over [0, 1]
    tokens: int = 4096  # calibration rows kept per group (a seeded random subset)


@dataclass(frozen=True)
class GroupScale:
    layer: int
    group: str
    alpha: float
    error_ratio: float  # the calibration output error with the scales ÷ without them (α = 0)


def calibration_inputs(hf_dir: Path, ids: list[list[int]], *, tokens: int = 4096, seed: int = 0,
                       threads: int | None = None) -> dict[tuple[int, str], np.ndarray]:
    """The inputs [T, K] of q_proj, o_proj, gate_proj and down_proj of every layer over `ids`, from the Hugging Face
    model (float32), keyed (layer, group) by the checkpoint's group names; at most `tokens` rows each."""
    import torch
    from transformers import AutoModelForCausalLM

    if threads:
        torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    rows: dict[tuple[int, str], list[np.ndarray]] = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        for group, module in (("qkv", layer.self_attn.q_proj), ("dense", layer.self_attn.o_proj),
                              ("fc", layer.mlp.gate_proj), ("proj", layer.mlp.down_proj)):
            def keep(module, args, key=(i, group)):
                rows.setdefault(key, []).append(args[0].detach().reshape(-1, args[0].shape[-1]).numpy().copy())
            hooks.append(module.register_forward_pre_hook(keep))
    with torch.inference_mode():
        for sequence in ids:
            model(torch.tensor([list(sequence)]))
    for hook in hooks:
        hook.remove()
    rng = np.random.default_rng(seed)
    out = {}
    for key, parts in rows.items():
        x = np.concatenate(parts)
        out[key] = x[np.sort(rng.choice(len(x), tokens, replace=False))] if len(x) > tokens else x
    return out


def search_scale(x: np.ndarray, matrices: list[np.ndarray], options: AwqOptions = AwqOptions(),
                 tie: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[float, np.ndarray, float]:
    """(α, s [K], error ratio) minimising the summed output error of `matrices` [N_i, K] on inputs x [T, K]; `tie`
    maps the per-channel mean |x| to one value per group of channels that must share a scale."""
    mean = np.abs(x).astype(np.float64).mean(0)
    if tie is not None:
        mean = tie(mean)
    mean = np.maximum(mean, 1e-8)
    best_alpha, best_err, best_s, base = 0.0, np.inf, np.ones_like(mean), None
    for alpha in np.linspace(0.0, 1.0, options.alphas):
        s = mean ** alpha
        s = s / np.sqrt(s.max() * s.min())
        err = 0.0
        for w in matrices:
            q = fake_quantize(w * s[None, :], options.bits, options.block_size, options.scheme) / s[None, :]
            diff = x @ (w - q).T
            err += float(np.square(diff, dtype=np.float64).sum())
        base = err if base is None else base
        if err < best_err:
            best_alpha, best_err, best_s = float(alpha), err, s
    return best_alpha, best_s.astype(np.float32), best_err / base if base else 1.0


def prescale(weights: dict[str, np.ndarray], config: dict, inputs: dict[tuple[int, str], np.ndarray],
             options: AwqOptions = AwqOptions()) -> list[GroupScale]:
    """Search and fold every layer's scales into `weights` (a TensorRT-LLM LLaMA checkpoint's tensors, changed in
    place); returns what was chosen per group."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_size") or config["hidden_size"] // heads
    per_kv = heads // kv_heads

    def tie_kv(mean: np.ndarray) -> np.ndarray:
        shared = mean.reshape(kv_heads, per_kv, head_dim).mean(1)
        return np.repeat(shared[:, None, :], per_kv, axis=1).reshape(-1)

    chosen = []
    for i in range(config["num_hidden_layers"]):
        p = f"{PREFIX}.{i}"
        qkv, fc, gate = f"{p}.attention.qkv.weight", f"{p}.mlp.fc.weight", f"{p}.mlp.gate.weight"
        dense, proj = f"{p}.attention.dense.weight", f"{p}.mlp.proj.weight"

        alpha, s, ratio = search_scale(inputs[(i, "qkv")], [weights[qkv]], options)
        weights[qkv] = weights[qkv] * s[None, :]
        weights[f"{p}.input_layernorm.weight"] = weights[f"{p}.input_layernorm.weight"] / s
        chosen.append(GroupScale(i, "qkv", alpha, ratio))

        alpha, s, ratio = search_scale(inputs[(i, "fc")], [weights[fc], weights[gate]], options)
        weights[fc], weights[gate] = weights[fc] * s[None, :], weights[gate] * s[None, :]
        weights[f"{p}.post_layernorm.weight"] = weights[f"{p}.post_layernorm.weight"] / s
        chosen.append(GroupScale(i, "fc+gate", alpha, ratio))

        alpha, s, ratio = search_scale(inputs[(i, "dense")], [weights[dense]], options, tie=tie_kv)
        weights[dense] = weights[dense] * s[None, :]
        v_scale = s.reshape(kv_heads, per_kv, head_dim)[:, 0, :].reshape(-1)
        v0 = (heads + kv_heads) * head_dim
        weights[qkv] = weights[qkv].copy()
        weights[qkv][v0:] /= v_scale[:, None]
        if f"{p}.attention.qkv.bias" in weights:
            weights[f"{p}.attention.qkv.bias"] = weights[f"{p}.attention.qkv.bias"].copy()
            weights[f"{p}.attention.qkv.bias"][v0:] /= v_scale
        chosen.append(GroupScale(i, "dense", alpha, ratio))

        alpha, s, ratio = search_scale(inputs[(i, "proj")], [weights[proj]], options)
        weights[proj] = weights[proj] * s[None, :]
        weights[gate] = weights[gate] / s[:, None]
        chosen.append(GroupScale(i, "proj", alpha, ratio))
    for name, value in weights.items():
        weights[name] = np.ascontiguousarray(value, dtype=np.float32) if value.dtype == np.float64 else value
    return chosen


def prescale_checkpoint(ckpt: Path, out: Path, hf_dir: Path, ids: list[list[int]],
                        options: AwqOptions = AwqOptions(), *, threads: int | None = None) -> list[GroupScale]:
    """Write `out`: the float checkpoint `ckpt` with AWQ scales folded in (calibrated on `ids` through the Hugging
    Face model `hf_dir` it was converted from); awq.json beside it records the choices."""
    from safetensors.numpy import load_file, save_file

    ckpt, out = Path(ckpt), Path(out)
    config = json.loads((ckpt / "config.json").read_text())
    mapping = config.get("mapping") or {}
    if config.get("architecture") not in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"):
        raise ConfigError(f"{ckpt}: architecture {config.get('architecture')}: AWQ pre-scaling takes LLaMA-family "
                          "checkpoints")
    if (config.get("quantization") or {}).get("quant_algo"):
        raise ConfigError(f"{ckpt}: already quantized ({config['quantization']['quant_algo']})")
    if mapping.get("tp_size", 1) != 1 or mapping.get("pp_size", 1) != 1:
        raise ConfigError(f"{ckpt}: tp_size {mapping.get('tp_size')} / pp_size {mapping.get('pp_size')}: AWQ "
                          "pre-scaling takes an unsharded checkpoint (convert with --tp-size 1 --pp-size 1)")
    weights = {k: v.astype(np.float32) if v.dtype != np.float32 else v
               for k, v in load_file(str(ckpt / "rank0.safetensors")).items()}
    if config.get("dtype") != "float32":
        config["dtype"] = "float32"  # the folded scales are not representable in the original half precision
    inputs = calibration_inputs(hf_dir, ids, tokens=options.tokens, threads=threads)
    chosen = prescale(weights, config, inputs, options)
    out.mkdir(parents=True, exist_ok=True)
    for f in ckpt.iterdir():
        if f.is_file() and f.name not in ("rank0.safetensors", "config.json"):
            shutil.copy2(f, out / f.name)
    (out / "config.json").write_text(json.dumps(config, indent=4))
    save_file(weights, str(out / "rank0.safetensors"))
    (out / "awq.json").write_text(json.dumps({"source": str(ckpt), "hf": str(hf_dir), "calibration_sequences":
                                              len(ids), "options": vars(options),
                                              "groups": [vars(g) for g in chosen]}, indent=1))
    return chosen
