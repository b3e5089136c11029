"""EAGLE drafts: EAGLE-1/2 (one or more LLaMA layers over fc([embed, feature])) and EAGLE-3 (midlayer over
three fused target features, reduced draft vocabulary with `d2t` / `t2d`).

EAGLE-1/2 converts into TensorRT-LLM's `EagleForCausalLM`; EAGLE-3 is read and validated only: the TensorRT
engine flow has no EAGLE-3 model (TensorRT-LLM runs it in its PyTorch backend). An EAGLE-1/2 draft may carry
EAGLE-3's `d2t` / `t2d` too (trtspec's trained drafts do): the CPU engine then drafts over that reduced
vocabulary (see draft_vocab.py).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from trtspec.checkpoint.draft_vocab import DraftVocab
from trtspec.checkpoint.hf_config import read_json
from trtspec.checkpoint.tensorfile import TensorStore, open_hf_weights
from trtspec.errors import CheckpointError

log = logging.getLogger(__name__)

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, kw_only=True)
class EagleDraft:
    """An EAGLE-1/2 draft module as released by the EAGLE authors."""

    directory: Path
    store: TensorStore
    config: dict
    num_layers: int  # transformer layers of the draft (1 in every release), not the tree depth
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    qkv_bias: bool
    has_fc_bias: bool
    has_embed_tokens: bool
    config_bias: bool  # the config's `bias` key; absent means True (the EAGLE repository default)
    has_first_input_layernorm: bool  # released layer 0 has none; TRT-LLM's drafter never uses one
    has_vocab_maps: bool  # d2t / t2d present: a reduced draft vocabulary (read with draft_vocab())

    def draft_vocab(self, vocab_size: int) -> DraftVocab | None:
        """The reduced draft vocabulary (validated against the target's vocab_size), or None."""
        if not self.has_vocab_maps:
            return None
        return DraftVocab.from_maps(self.store.load("d2t"), self.store.load("t2d"), vocab_size=vocab_size,
                                    where=str(self.store.info("d2t").path))


@dataclass(frozen=True, kw_only=True)
class Eagle3Draft:
    directory: Path
    store: TensorStore
    config: dict
    hidden_size: int
    target_hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    num_layers: int
    has_embed_tokens: bool


def is_eagle3(directory: Path) -> bool:
    """EAGLE-3 is marked by `draft_vocab_size` in config.json or `midlayer.*` tensors."""
    path = Path(directory) / "config.json"
    if path.is_file() and "draft_vocab_size" in read_json(path):
        return True
    try:
        return any(k.startswith("midlayer.") for k in open_hf_weights(directory).keys())
    except CheckpointError:
        return False


def read_eagle_draft(directory: Path) -> EagleDraft:
    """Read and validate an EAGLE-1/2 draft directory."""
    directory = Path(directory)
    if is_eagle3(directory):
        raise CheckpointError(
            f"{directory} is an EAGLE-3 draft (draft_vocab_size / midlayer.*); --eagle takes EAGLE-1/2 drafts, "
            "the only kind the TensorRT-LLM engine flow supports (EAGLE-3 runs in TensorRT-LLM's PyTorch "
            f"backend from the HF folder as is); `trtspec inspect {directory}` validates it")
    cfg = read_json(directory / "config.json")
    store = open_hf_weights(directory)
    hidden = _cfg_int(cfg, "hidden_size", directory)
    heads = _cfg_int(cfg, "num_attention_heads", directory)
    layers = _layer_indices(store)
    declared = cfg.get("num_hidden_layers", len(layers))
    if declared != len(layers):
        raise CheckpointError(
            f"{directory / 'config.json'}: num_hidden_layers={declared} but the weights hold layers {layers}")
    draft = EagleDraft(
        directory=directory, store=store, config=cfg, num_layers=len(layers), hidden_size=hidden,
        num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or hidden // heads,
        intermediate_size=_cfg_int(cfg, "intermediate_size", directory),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        qkv_bias=bool(cfg.get("qkv_bias", False)) or "layers.0.self_attn.q_proj.bias" in store,
        has_fc_bias="fc.bias" in store, has_embed_tokens="embed_tokens.weight" in store,
        config_bias=bool(cfg.get("bias", True)),
        has_first_input_layernorm="layers.0.input_layernorm.weight" in store,
        has_vocab_maps="d2t" in store or "t2d" in store,
    )
    _check_eagle_keys(draft)
    return draft


def eagle_layer_keys(draft: EagleDraft, j: int) -> list[str]:
    """The source keys of draft layer j (layer 0 has no input_layernorm in TRT-LLM's drafter)."""
    keys = [f"layers.{j}.self_attn.{p}.weight" for p in ATTN]
    keys += [f"layers.{j}.self_attn.{p}.bias" for p in ATTN[:3] if draft.qkv_bias]
    keys += [f"layers.{j}.mlp.{p}.weight" for p in MLP]
    keys.append(f"layers.{j}.post_attention_layernorm.weight")
    if j > 0:
        keys.append(f"layers.{j}.input_layernorm.weight")
    return keys


def _check_eagle_keys(d: EagleDraft) -> None:
    expected = {"fc.weight"} | {k for j in range(d.num_layers) for k in eagle_layer_keys(d, j)}
    optional = {"fc.bias", "embed_tokens.weight", "layers.0.input_layernorm.weight", "d2t", "t2d"}
    where = d.store.files[0]
    missing = sorted(expected - set(d.store.keys()))
    if missing:
        raise CheckpointError(f"{where}: EAGLE draft is missing tensor {missing[0]}"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    unknown = sorted(set(d.store.keys()) - expected - optional)
    if unknown:
        raise CheckpointError(f"{d.store.info(unknown[0]).path}: unexpected tensor {unknown[0]} in an EAGLE-1/2 draft "
                              "(the draft has no lm_head or final norm; it reuses the base lm_head)")
    fc = d.store.info("fc.weight").shape
    if fc != (d.hidden_size, 2 * d.hidden_size):
        raise CheckpointError(f"{where}: fc.weight has shape {list(fc)}, expected "
                              f"[{d.hidden_size}, {2 * d.hidden_size}] (hidden_size, 2*hidden_size)")
    if d.has_fc_bias and not d.config_bias:
        log.warning("%s: fc.bias is present although config.json says bias=false; using it", where)
    if not d.has_fc_bias and d.config_bias:
        raise CheckpointError(
            f"{where}: EAGLE draft has no fc.bias but {d.directory / 'config.json'} does not say \"bias\": false "
            "(the EAGLE default is a biased fc); add \"bias\": false if the draft was trained without it")
    if d.has_vocab_maps and not {"d2t", "t2d"} <= set(d.store.keys()):
        raise CheckpointError(f"{where}: a reduced draft vocabulary needs both d2t and t2d (EAGLE-3's maps)")
    if d.has_first_input_layernorm:
        log.warning("%s: layers.0.input_layernorm.weight is ignored (EAGLE's first layer has no input norm)", where)


def _layer_indices(store: TensorStore) -> list[int]:
    return sorted({int(m[1]) for k in store.keys() if (m := re.match(r"^layers\.(\d+)\.", k))})


def _cfg_int(cfg: dict, key: str, directory: Path) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"{directory / 'config.json'}: field {key} must be a positive integer, found {value!r}")
    return value


def read_eagle3_draft(directory: Path) -> Eagle3Draft:
    """Read an EAGLE-3 draft and validate its shapes and vocabulary maps."""
    directory = Path(directory)
    cfg = read_json(directory / "config.json")
    store = open_hf_weights(directory)
    hidden = _cfg_int(cfg, "hidden_size", directory)
    vocab = _cfg_int(cfg, "vocab_size", directory)
    draft_vocab = cfg.get("draft_vocab_size") or vocab
    target_hidden = cfg.get("target_hidden_size") or hidden
    layers = _layer_indices(store) or [0]
    d = Eagle3Draft(directory=directory, store=store, config=cfg, hidden_size=hidden,
                    target_hidden_size=target_hidden, vocab_size=vocab, draft_vocab_size=draft_vocab,
                    num_layers=len(layers), has_embed_tokens="embed_tokens.weight" in store)
    _check_eagle3(d)
    return d


def _check_eagle3(d: Eagle3Draft) -> None:
    h, where = d.hidden_size, d.store.files[0]
    expect = {"fc.weight": (h, 3 * d.target_hidden_size), "norm.weight": (h,),
              "lm_head.weight": (d.draft_vocab_size, h)}
    prefix = "midlayer." if d.num_layers == 1 and "midlayer.self_attn.q_proj.weight" in d.store else "layers.0."
    expect[f"{prefix}self_attn.q_proj.weight"] = (None, 2 * h)
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        expect[f"{prefix}{norm}.weight"] = (h,)
    for key, shape in expect.items():
        if key not in d.store:
            raise CheckpointError(f"{where}: EAGLE-3 draft is missing tensor {key}")
        actual = d.store.info(key).shape
        if len(actual) != len(shape) or any(e is not None and a != e for a, e in zip(actual, shape)):
            raise CheckpointError(f"{where}: {key} has shape {list(actual)}, expected "
                                  f"{[e if e is not None else '*' for e in shape]}")
    if d.draft_vocab_size != d.vocab_size:
        _check_vocab_maps(d)


def _check_vocab_maps(d: Eagle3Draft) -> None:
    """target_id = draft_id + d2t[draft_id] must be a strictly increasing subset marked in t2d."""
    where = d.store.files[0]
    for key in ("d2t", "t2d"):
        if key not in d.store:
            raise CheckpointError(f"{where}: EAGLE-3 draft with draft_vocab_size={d.draft_vocab_size} < "
                                  f"vocab_size={d.vocab_size} is missing {key}")
    vocab = DraftVocab.from_maps(d.store.load("d2t"), d.store.load("t2d"), vocab_size=d.vocab_size, where=str(where))
    if vocab.size != d.draft_vocab_size:
        raise CheckpointError(f"{where}: d2t has {vocab.size} entries, draft_vocab_size is {d.draft_vocab_size}")
