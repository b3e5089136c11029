"""Tiny random checkpoints in every released on-disk format, for tests and examples.

Each writer lays a directory out the way the released tools do (HF base, FasterDecoding Medusa heads,
yuhuili EAGLE-1/2 and EAGLE-3 drafts, apple/ml-recurrent-drafter ReDrafter drafters), with seeded random weights
of the right names, shapes and dtype.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

Shapes = dict[str, tuple[int, ...]]
StateDict = dict[str, torch.Tensor]

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
HF_STORAGES = ("safetensors", "sharded", "bin", "streamed")
MEDUSA_VARIANTS = ("pt", "safetensors", "full_model", "modelopt")
MEDUSA_CONFIGS = ("match", "mismatch", "alt_key", "no_count", "absent")
EAGLE_STORAGES = ("bin", "safetensors")
# ReDrafter drafter key spellings TensorRT-LLM's examples/redrafter/convert_checkpoint.py reads: apple's
# save_pretrained (input_proj.*, lm_head.{i}.linear.*, lm_head.{N}.weight), the plural one (input_projs.*,
# lm_heads.*) and the indexed one (0.{i}.linear.*, 0.{N}.weight; its input_proj keeps the singular name)
REDRAFTER_SPELLINGS = {"lm_head": ("input_proj.", "lm_head."), "lm_heads": ("input_projs.", "lm_heads."),
                       "indexed": ("input_proj.", "0.")}
REDRAFTER_STORAGES = {"safetensors": "model.safetensors", "pt": "model.pt"}
BASE_SEED = 0  # seed of the base weights inside full-model Medusa checkpoints (= write_hf_base's default)
MAX_SHARD_BYTES = 256 * 2**20  # sharded storage never puts more than this (or half the model) in one file
MODELOPT_PRODUCER = {"name": "modelopt", "version": "0.15.0"}
VOCAB_TABLES = ("embed_tokens.weight", "lm_head.weight")  # the tensors TinyModel.embedding_std sizes


@dataclass(frozen=True, kw_only=True)
class TinyModel:
    """Dimensions and config of a tiny decoder-only target model."""

    arch: str = "llama"
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2  # == num_heads means MHA
    intermediate_size: int = 128
    vocab_size: int = 256
    tie_word_embeddings: bool = False
    dtype: str = "float32"
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 512
    rms_norm_eps: float = 1e-6
    # std of the vocabulary tables (embed_tokens, a base's lm_head); a trained model's are several times its other
    # weights', so a token's embedding weighs in an EAGLE fc as it does there
    embedding_std: float = 0.02

    def __post_init__(self) -> None:
        _check_choice("arch", self.arch, tuple(ARCHITECTURES))
        _check_choice("dtype", self.dtype, tuple(DTYPES))
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                     "vocab_size", "max_position_embeddings"):
            _check_positive(name, getattr(self, name))
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not a multiple of num_heads={self.num_heads}; "
                             "pick sizes that divide")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}; "
                             "pick a num_kv_heads that divides num_heads")
        if isinstance(self.embedding_std, bool) or not isinstance(self.embedding_std, (int, float)) \
                or not self.embedding_std > 0:
            raise ValueError(f"embedding_std must be a positive number, got {self.embedding_std!r}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
            raise ValueError(f"rope_scaling must be a dict or None, got {type(self.rope_scaling).__name__}")

    @property
    def head_dim(self) -> int:
        """Return the per-head dimension."""
        return self.hidden_size // self.num_heads

    @property
    def torch_dtype(self) -> torch.dtype:
        """Return the torch dtype of the stored tensors."""
        return DTYPES[self.dtype]


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    """Raise ValueError unless value is one of choices."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; use one of {', '.join(choices)}")


def _check_positive(name: str, value: int) -> None:
    """Raise ValueError unless value is a positive int."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


# ---- shapes (pure) --------------------------------------------------------------------------------------

def _attn_shapes(m: TinyModel, prefix: str, in_dim: int, qkv_bias: bool) -> Shapes:
    """Return the attention projections of one layer reading in_dim features."""
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    shapes: Shapes = {f"{prefix}q_proj.weight": (q, in_dim), f"{prefix}k_proj.weight": (kv, in_dim),
                      f"{prefix}v_proj.weight": (kv, in_dim), f"{prefix}o_proj.weight": (m.hidden_size, q)}
    if qkv_bias:
        shapes |= {f"{prefix}q_proj.bias": (q,), f"{prefix}k_proj.bias": (kv,), f"{prefix}v_proj.bias": (kv,)}
    return shapes


def _mlp_shapes(m: TinyModel, prefix: str) -> Shapes:
    """Return the SwiGLU MLP of one layer."""
    h, i = m.hidden_size, m.intermediate_size
    return {f"{prefix}gate_proj.weight": (i, h), f"{prefix}up_proj.weight": (i, h), f"{prefix}down_proj.weight": (h, i)}


def _layer_shapes(m: TinyModel, prefix: str, *, input_norm: bool = True) -> Shapes:
    """Return one decoder layer under prefix (e.g. 'model.layers.0.')."""
    shapes: Shapes = {f"{prefix}input_layernorm.weight": (m.hidden_size,)} if input_norm else {}
    shapes |= _attn_shapes(m, f"{prefix}self_attn.", m.hidden_size, qkv_bias=m.arch == "qwen2")
    shapes |= _mlp_shapes(m, f"{prefix}mlp.")
    return shapes | {f"{prefix}post_attention_layernorm.weight": (m.hidden_size,)}


def _base_groups(m: TinyModel) -> list[Shapes]:
    """Return the HF base tensors as shard-able groups: embedding, each layer, then norm + lm_head."""
    tail: Shapes = {"model.norm.weight": (m.hidden_size,)}
    if not m.tie_word_embeddings:
        tail["lm_head.weight"] = (m.vocab_size, m.hidden_size)
    layers = [_layer_shapes(m, f"model.layers.{i}.") for i in range(m.num_layers)]
    return [{"model.embed_tokens.weight": (m.vocab_size, m.hidden_size)}, *layers, tail]


def _medusa_shapes(m: TinyModel, num_heads: int, num_layers: int, per_head_lm_head: bool, prefix: str) -> Shapes:
    """Return FasterDecoding Medusa head tensors: ResBlocks '{h}.{l}.linear.*' then '{h}.{L}.weight'."""
    h = m.hidden_size
    shapes: Shapes = {}
    for head in range(num_heads):
        for layer in range(num_layers):
            shapes[f"{prefix}{head}.{layer}.linear.weight"] = (h, h)
            shapes[f"{prefix}{head}.{layer}.linear.bias"] = (h,)
        if per_head_lm_head:
            shapes[f"{prefix}{head}.{num_layers}.weight"] = (m.vocab_size, h)
    return shapes


def _eagle_shapes(m: TinyModel, *, fc_bias: bool, embed_tokens: bool, num_layers: int) -> Shapes:
    """Return EAGLE-1/2 draft tensors; layer 0 has no input_layernorm."""
    h = m.hidden_size
    shapes: Shapes = {"embed_tokens.weight": (m.vocab_size, h)} if embed_tokens else {}
    shapes["fc.weight"] = (h, 2 * h)  # input is cat(embed(token), feature)
    if fc_bias:
        shapes["fc.bias"] = (h,)
    for j in range(num_layers):
        shapes |= _layer_shapes(m, f"layers.{j}.", input_norm=j >= 1)
    return shapes


def _eagle3_shapes(m: TinyModel, draft_vocab_size: int, embed_tokens: bool) -> Shapes:
    """Return EAGLE-3 draft float tensors (d2t / t2d are added separately)."""
    h = m.hidden_size
    shapes: Shapes = _attn_shapes(m, "midlayer.self_attn.", 2 * h, qkv_bias=False)  # reads cat(emb, hidden)
    shapes |= _mlp_shapes(m, "midlayer.mlp.")
    shapes |= {f"midlayer.{n}.weight": (h,) for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")}
    shapes |= {"fc.weight": (h, 3 * h), "norm.weight": (h,), "lm_head.weight": (draft_vocab_size, h)}
    if embed_tokens:
        shapes["embed_tokens.weight"] = (m.vocab_size, h)
    return shapes


def _redrafter_shapes(m: TinyModel, *, exit_dim: int, num_draft_layers: int, rnn: bool) -> Shapes:
    """Return a ReDrafter drafter's tensors under canonical names (input_proj., layers.{i}., lm_head., rnn_*);
    _redrafter_key spells them as stored."""
    h, e = m.hidden_size, exit_dim
    shapes: Shapes = {}
    if e != 2 * h:  # the drafter reads cat(hidden state, token embedding state); input_proj only when sizes differ
        shapes |= {"input_proj.weight": (e, 2 * h), "input_proj.bias": (e,)}
    for i in range(num_draft_layers):
        shapes |= {f"layers.{i}.linear.weight": (e, e), f"layers.{i}.linear.bias": (e,)}
    shapes["lm_head.weight"] = (m.vocab_size, e)
    if rnn:
        shapes |= {"rnn_u.weight": (h, h), "rnn_u.bias": (h,), "rnn_w.weight": (h, h)}
    return shapes


def _redrafter_key(canonical: str, spelling: str, num_draft_layers: int) -> str:
    """The stored name of a canonical ReDrafter tensor name in one of REDRAFTER_SPELLINGS."""
    proj, head = REDRAFTER_SPELLINGS[spelling]
    if canonical.startswith("input_proj."):
        return proj + canonical.removeprefix("input_proj.")
    if canonical.startswith("layers."):
        return head + canonical.removeprefix("layers.")
    if canonical == "lm_head.weight":
        return f"{head}{num_draft_layers}.weight"
    return canonical


def _nbytes(shapes: Shapes, dtype: torch.dtype) -> int:
    """Return the stored size of shapes in bytes."""
    size = dtype.itemsize
    return sum(size * torch.Size(s).numel() for s in shapes.values())


def _pack_shards(groups: list[Shapes], dtype: torch.dtype) -> list[Shapes]:
    """Pack groups greedily into shards of at most min(MAX_SHARD_BYTES, total/2) bytes (>= 2 shards)."""
    budget = min(MAX_SHARD_BYTES, sum(_nbytes(g, dtype) for g in groups) // 2)
    shards: list[Shapes] = [{}]
    for group in groups:
        if shards[-1] and _nbytes(shards[-1], dtype) + _nbytes(group, dtype) > budget:
            shards.append({})
        shards[-1] |= group
    return shards


# ---- random values --------------------------------------------------------------------------------------

def _random_tensors(shapes: Shapes, dtype: torch.dtype, gen: torch.Generator,
                    embedding_std: float = 0.02) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield seeded random tensors: norms ~ 1 + 0.1·N(0,1), the vocabulary tables (embed_tokens, lm_head)
    ~ embedding_std·N(0,1), other weights and biases ~ 0.02·N(0,1)."""
    for key, shape in shapes.items():
        mean, std = ((1.0, 0.1) if key.endswith("norm.weight") else
                     (0.0, embedding_std) if key.endswith(VOCAB_TABLES) else (0.0, 0.02))
        yield key, torch.empty(shape, dtype=torch.float32).normal_(mean, std, generator=gen).to(dtype)


def _random_state(shapes: Shapes, dtype: torch.dtype, seed: int, embedding_std: float = 0.02) -> StateDict:
    """Return a state dict of seeded random tensors for shapes."""
    return dict(_random_tensors(shapes, dtype, torch.Generator().manual_seed(seed), embedding_std))


# ---- configs (pure) -------------------------------------------------------------------------------------

def _llama_like_config(m: TinyModel) -> dict[str, Any]:
    """Return the config keys every LLaMA-family config.json shares."""
    return {"hidden_size": m.hidden_size, "intermediate_size": m.intermediate_size,
            "num_attention_heads": m.num_heads, "num_key_value_heads": m.num_kv_heads,
            "num_hidden_layers": m.num_layers, "vocab_size": m.vocab_size, "rms_norm_eps": m.rms_norm_eps,
            "rope_theta": m.rope_theta, "max_position_embeddings": m.max_position_embeddings,
            "hidden_act": "silu", "torch_dtype": m.dtype}


def _hf_config(m: TinyModel) -> dict[str, Any]:
    """Return config.json as transformers writes it for the model's *ForCausalLM."""
    config = {"architectures": [ARCHITECTURES[m.arch]], "model_type": m.arch, **_llama_like_config(m),
              "rope_scaling": m.rope_scaling, "tie_word_embeddings": m.tie_word_embeddings,
              "bos_token_id": 1, "eos_token_id": 2, "head_dim": m.head_dim}
    extra = {"llama": {"attention_bias": False, "mlp_bias": False}, "mistral": {"sliding_window": None},
             "qwen2": {"use_sliding_window": False}}
    return config | extra[m.arch]


def _medusa_config(num_heads: int, num_layers: int, config: str, per_head_lm_head: bool) -> dict[str, Any] | None:
    """Return a FasterDecoding MedusaConfig config.json for the given config case, or None for 'absent'."""
    if config == "absent":
        return None
    counts = {"match": {"medusa_num_heads": num_heads}, "alt_key": {"num_medusa_heads": num_heads},
              "mismatch": {"medusa_num_heads": max(1, num_heads // 2)}, "no_count": {}}
    out = {**counts[config], "medusa_num_layers": num_layers, "base_model_name_or_path": "tiny-base"}
    return out if per_head_lm_head else out | {"version": "2"}


def _eagle_config(m: TinyModel, num_layers: int, config_bias: bool | None) -> dict[str, Any]:
    """Return an EAGLE-1/2 draft config.json (LlamaConfig-compatible)."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **_llama_like_config(m),
              "num_hidden_layers": num_layers}
    if config_bias is not None:
        config["bias"] = config_bias
    return config | ({"qkv_bias": True} if m.arch == "qwen2" else {})


def _eagle3_config(m: TinyModel, draft_vocab_size: int) -> dict[str, Any]:
    """Return an EAGLE-3 draft config.json."""
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **_llama_like_config(m),
            "draft_vocab_size": draft_vocab_size, "num_hidden_layers": 1}


# ---- writing --------------------------------------------------------------------------------------------

def _write_json(path: Path, obj: dict[str, Any]) -> None:
    """Write obj as indented, key-sorted JSON (as transformers does)."""
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _save_safetensors(state: StateDict, path: Path) -> None:
    """Save state to a safetensors file with the PyTorch format marker transformers expects."""
    save_file(state, str(path), metadata={"format": "pt"})


def _write_sharded(out: Path, m: TinyModel, seed: int) -> None:
    """Write the base as model-0000k-of-0000N.safetensors shards plus model.safetensors.index.json."""
    shards, gen = _pack_shards(_base_groups(m), m.torch_dtype), torch.Generator().manual_seed(seed)
    weight_map: dict[str, str] = {}
    for k, shapes in enumerate(shards, start=1):
        name = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        state = dict(_random_tensors(shapes, m.torch_dtype, gen, m.embedding_std))  # one shard in memory
        _save_safetensors(state, out / name)
        weight_map |= dict.fromkeys(shapes, name)
    total = sum(_nbytes(s, m.torch_dtype) for s in shards)
    _write_json(out / "model.safetensors.index.json",
                {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})


def _write_streamed(out: Path, m: TinyModel, seed: int) -> None:
    """Write one model.safetensors tensor by tensor (same values as "safetensors"): for multi-GB bases."""
    from trtspec.checkpoint.safetensors_writer import PlannedTensor, write_safetensors

    shapes: Shapes = {k: v for group in _base_groups(m) for k, v in group.items()}
    values = _random_tensors(shapes, m.torch_dtype, torch.Generator().manual_seed(seed), m.embedding_std)
    planned = [PlannedTensor(k, tuple(s), m.torch_dtype, lambda: next(values)[1]) for k, s in shapes.items()]
    write_safetensors(out / "model.safetensors", planned)


def _base_state(m: TinyModel, seed: int) -> StateDict:
    """Return the whole HF base state dict (same values as every storage with this seed)."""
    shapes: Shapes = {k: v for group in _base_groups(m) for k, v in group.items()}
    return _random_state(shapes, m.torch_dtype, seed, m.embedding_std)


def _mkdir(out_dir: str | Path) -> Path:
    """Create out_dir (with parents) and return it as a Path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_hf_base(out_dir: str | Path, model: TinyModel = TinyModel(), *, storage: str = "safetensors",
                  seed: int = 0) -> Path:
    """Write a tiny random HF base model (config.json + weights in the chosen storage)."""
    _check_choice("storage", storage, HF_STORAGES)
    out = _mkdir(out_dir)
    _write_json(out / "config.json", _hf_config(model))
    if storage == "sharded":
        _write_sharded(out, model, seed)
    elif storage == "bin":
        torch.save(_base_state(model, seed), out / "pytorch_model.bin")
    elif storage == "streamed":
        _write_streamed(out, model, seed)
    else:
        _save_safetensors(_base_state(model, seed), out / "model.safetensors")
    return out


def _check_medusa_args(variant: str, num_heads: int, num_layers: int, config: str, per_head_lm_head: bool) -> None:
    """Raise ValueError on an unsupported write_medusa_heads argument combination."""
    _check_choice("variant", variant, MEDUSA_VARIANTS)
    _check_choice("config", config, MEDUSA_CONFIGS)
    _check_positive("num_heads", num_heads)
    _check_positive("num_layers", num_layers)
    if variant in ("full_model", "modelopt") and config != "match":
        raise ValueError(f"config={config!r} applies to heads-only variants; use variant='pt' or 'safetensors'")
    if variant in ("full_model", "modelopt") and not per_head_lm_head:
        raise ValueError("per_head_lm_head=False is the heads-only legacy variant; use variant='pt' or 'safetensors'")


def _write_medusa_full(out: Path, m: TinyModel, heads: StateDict, variant: str, num_heads: int,
                       num_layers: int) -> None:
    """Write a full HF model with the heads in its model.safetensors (Medusa-2 or ModelOpt export)."""
    prefix = "medusa_head." if variant == "full_model" else "medusa_heads."
    state = _base_state(m, BASE_SEED) | {prefix + k: v for k, v in heads.items()}
    _save_safetensors(state, out / "model.safetensors")
    if variant == "full_model":
        extra: dict[str, Any] = {"medusa_num_heads": num_heads, "medusa_num_layers": num_layers}
    else:
        extra = {"medusa": {"num_medusa_heads": num_heads, "num_medusa_layers": num_layers}}
        _write_json(out / "hf_quant_config.json", {"producer": MODELOPT_PRODUCER,
                                                   "quantization": {"quant_algo": None, "kv_cache_quant_algo": None}})
    _write_json(out / "config.json", _hf_config(m) | extra)


def write_medusa_heads(out_dir: str | Path, model: TinyModel = TinyModel(), *, variant: str = "pt",
                       num_heads: int = 4, num_layers: int = 1, config: str = "match",
                       per_head_lm_head: bool = True, seed: int = 1) -> Path:
    """Write tiny random FasterDecoding Medusa heads in one of the released variants."""
    _check_medusa_args(variant, num_heads, num_layers, config, per_head_lm_head)
    out = _mkdir(out_dir)
    heads = _random_state(_medusa_shapes(model, num_heads, num_layers, per_head_lm_head, ""), model.torch_dtype, seed)
    if variant in ("full_model", "modelopt"):
        _write_medusa_full(out, model, heads, variant, num_heads, num_layers)
        return out
    if variant == "pt":
        torch.save(heads, out / "medusa_lm_head.pt")
    else:
        _save_safetensors(heads, out / "medusa_lm_head.safetensors")
    medusa_config = _medusa_config(num_heads, num_layers, config, per_head_lm_head)
    if medusa_config is not None:
        _write_json(out / "config.json", medusa_config)
    return out


def write_eagle_draft(out_dir: str | Path, model: TinyModel = TinyModel(), *, fc_bias: bool = True,
                      embed_tokens: bool = True, num_layers: int = 1, config_bias: bool | None = None,
                      storage: str = "bin", seed: int = 2, draft_vocab_size: int | None = None) -> Path:
    """Write a tiny random EAGLE-1/2 draft in the yuhuili/EAGLE layout; with draft_vocab_size, also EAGLE-3's
    d2t / t2d maps of a reduced draft vocabulary (as trtspec-trained drafts carry them)."""
    _check_choice("storage", storage, EAGLE_STORAGES)
    _check_positive("num_layers", num_layers)
    out = _mkdir(out_dir)
    shapes = _eagle_shapes(model, fc_bias=fc_bias, embed_tokens=embed_tokens, num_layers=num_layers)
    state = _random_state(shapes, model.torch_dtype, seed, model.embedding_std)
    if draft_vocab_size is not None:
        state["d2t"], state["t2d"] = _draft_vocab(model.vocab_size, draft_vocab_size,
                                                  torch.Generator().manual_seed(seed))
    if storage == "bin":
        torch.save(state, out / "pytorch_model.bin")
    else:
        _save_safetensors(state, out / "model.safetensors")
    _write_json(out / "config.json", _eagle_config(model, num_layers, config_bias))
    return out


def _draft_vocab(vocab_size: int, draft_vocab_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (d2t [Vd] int64, t2d [V] bool) for a sorted random draft vocabulary holding ids 0..min(8,Vd)-1."""
    fixed = min(8, draft_vocab_size)
    rest = torch.randperm(vocab_size - fixed, generator=gen)[: draft_vocab_size - fixed] + fixed
    subset = torch.cat([torch.arange(fixed), rest]).sort().values  # [Vd] target ids
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[subset] = True
    return subset - torch.arange(draft_vocab_size), t2d  # target_id = draft_id + d2t[draft_id]


def write_eagle3_draft(out_dir: str | Path, model: TinyModel = TinyModel(), *, draft_vocab_size: int = 128,
                       embed_tokens: bool = False, seed: int = 3) -> Path:
    """Write a tiny random EAGLE-3 draft (model.safetensors with d2t / t2d, plus config.json)."""
    _check_positive("draft_vocab_size", draft_vocab_size)
    if draft_vocab_size > model.vocab_size:
        raise ValueError(f"draft_vocab_size={draft_vocab_size} exceeds vocab_size={model.vocab_size}; "
                         "pass a draft_vocab_size <= vocab_size")
    out = _mkdir(out_dir)
    gen = torch.Generator().manual_seed(seed)
    state = dict(_random_tensors(_eagle3_shapes(model, draft_vocab_size, embed_tokens), model.torch_dtype, gen,
                                 model.embedding_std))
    state["d2t"], state["t2d"] = _draft_vocab(model.vocab_size, draft_vocab_size, gen)
    _save_safetensors(state, out / "model.safetensors")
    _write_json(out / "config.json", _eagle3_config(model, draft_vocab_size))
    return out


def write_redrafter_drafter(out_dir: str | Path, model: TinyModel = TinyModel(), *, spelling: str = "lm_head",
                            storage: str = "safetensors", rnn: bool = True, exit_dim: int | None = None,
                            num_draft_layers: int = 2, config_vocab_size: bool = True, seed: int = 4) -> Path:
    """Write a tiny random ReDrafter drafter as apple/ml-recurrent-drafter saves one (config.json of its
    DrafterConfig + model.safetensors), or model.pt; `spelling` picks one of REDRAFTER_SPELLINGS; exit_dim None is
    2 x hidden_size (no input_proj). The values depend on the seed and shapes only, not on spelling or storage."""
    _check_choice("spelling", spelling, tuple(REDRAFTER_SPELLINGS))
    _check_choice("storage", storage, tuple(REDRAFTER_STORAGES))
    exit_dim = 2 * model.hidden_size if exit_dim is None else exit_dim
    _check_positive("exit_dim", exit_dim)
    if isinstance(num_draft_layers, bool) or not isinstance(num_draft_layers, int) or num_draft_layers < 0:
        raise ValueError(f"num_draft_layers must be an int >= 0, got {num_draft_layers!r}")
    out = _mkdir(out_dir)
    shapes = _redrafter_shapes(model, exit_dim=exit_dim, num_draft_layers=num_draft_layers, rnn=rnn)
    canonical = _random_state(shapes, model.torch_dtype, seed)
    state = {_redrafter_key(k, spelling, num_draft_layers): v for k, v in canonical.items()}
    if storage == "pt":
        torch.save(state, out / REDRAFTER_STORAGES["pt"])
    else:
        _save_safetensors(state, out / REDRAFTER_STORAGES["safetensors"])
    config: dict[str, Any] = {"architectures": ["Drafter"], "model_type": "recurrent_drafting_drafter",
                              "hidden_size": model.hidden_size, "exit_dim": exit_dim,
                              "num_draft_layers": num_draft_layers, "num_lookback_tokens": -1, "rnn": rnn,
                              "torch_dtype": model.dtype}
    if config_vocab_size:
        config["vocab_size"] = model.vocab_size
    _write_json(out / "config.json", config)
    return out


def redrafter_source_keys(spelling: str, *, exit_dim_is_twice_hidden: bool, num_draft_layers: int,
                          rnn: bool) -> dict[str, str]:
    """TensorRT-LLM tensor name → the stored key write_redrafter_drafter gives it (the test oracle, written out
    from TensorRT-LLM's examples/redrafter/convert_checkpoint.py hf_drafter)."""
    proj, head = REDRAFTER_SPELLINGS[spelling]
    out = {}
    if not exit_dim_is_twice_hidden:
        out |= {"drafter.input_proj.weight": f"{proj}weight", "drafter.input_proj.bias": f"{proj}bias"}
    for i in range(num_draft_layers):
        out |= {f"drafter.layers.{i}.linear.{k}": f"{head}{i}.linear.{k}" for k in ("weight", "bias")}
    out["drafter.lm_head.weight"] = f"{head}{num_draft_layers}.weight"
    if rnn:
        out |= {f"drafter.{k}": k for k in ("rnn_u.weight", "rnn_u.bias", "rnn_w.weight")}
    return out


def write_example(out_dir: str | Path) -> dict[str, Path]:
    """Write a llama GQA base, Vicuna-like Medusa heads (config says fewer heads) and an EAGLE draft."""
    out, model = _mkdir(out_dir), TinyModel()
    return {"base": write_hf_base(out / "base", model),
            "medusa": write_medusa_heads(out / "medusa", model, variant="pt", config="mismatch"),
            "eagle": write_eagle_draft(out / "eagle", model, storage="bin")}


def add_llama_biases(folder: str | Path, *, seed: int = 7) -> Path:
    """Turn a written LLaMA base into one with attention_bias and mlp_bias (random biases on every projection)."""
    folder = Path(folder)
    state = load_file(str(folder / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    for key in [k for k in state if k.endswith("_proj.weight")]:
        state[key.removesuffix("weight") + "bias"] = 0.02 * torch.randn(state[key].shape[0], generator=gen)
    _save_safetensors(state, folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    _write_json(folder / "config.json", config | {"attention_bias": True, "mlp_bias": True})
    return folder
