"""The conversion plan: every TensorRT-LLM tensor of every rank, where it comes from, and its shape.

Names are data (HF suffix → TRT-LLM suffix); shapes are checked against the configs before anything is
written, and every source tensor is either consumed or deliberately skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from trtspec.checkpoint.eagle import EagleDraft, eagle_layer_keys
from trtspec.checkpoint.hf_config import BaseModelConfig
from trtspec.checkpoint.medusa import MedusaHeads
from trtspec.checkpoint.redrafter import ReDrafterDrafter
from trtspec.checkpoint.sharding import Mapping, QkvLayout, Split, shard, shard_shape, split_of
from trtspec.checkpoint.tensorfile import TensorStore
from trtspec.errors import CheckpointError

# HF decoder-layer suffix → TRT-LLM suffix. Naming trap: TRT-LLM `mlp.fc` is HF gate_proj, `mlp.gate` is up_proj.
LAYER_RENAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attn.o_proj.weight": "attention.dense.weight",
    "self_attn.o_proj.bias": "attention.dense.bias",
    "post_attention_layernorm.weight": "post_layernorm.weight",
    "mlp.gate_proj.weight": "mlp.fc.weight",
    "mlp.gate_proj.bias": "mlp.fc.bias",
    "mlp.up_proj.weight": "mlp.gate.weight",
    "mlp.up_proj.bias": "mlp.gate.bias",
    "mlp.down_proj.weight": "mlp.proj.weight",
    "mlp.down_proj.bias": "mlp.proj.bias",
}
QKV_SOURCES = {"weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
               "bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")}
# Source tensors that are not weights of the network (old checkpoints store RoPE buffers).
SKIPPABLE = re.compile(r".*rotary_emb\.inv_freq$")


@dataclass(frozen=True)
class Source:
    """One source tensor: a key in a store, or zeros of a shape when the format omits a tensor that is zero."""

    store: TensorStore | None
    key: str
    shape: tuple[int, ...]

    def load(self) -> torch.Tensor:
        return self.store.load(self.key) if self.store is not None else torch.zeros(self.shape)

    @property
    def where(self) -> str:
        return str(self.store.info(self.key).path) if self.store is not None else "(zeros)"


@dataclass(frozen=True)
class Rule:
    """How one TRT-LLM tensor is made from its sources, for ranks whose pipeline stage holds it."""

    name: str  # name inside the rank file (layer index local to the stage)
    sources: tuple[Source, ...]
    split: Split
    qkv: QkvLayout | None = None


@dataclass
class Plan:
    """Rules per pipeline stage plus the bookkeeping of which source keys were used."""

    mapping: Mapping
    dtype: torch.dtype
    stages: list[list[Rule]]
    consumed: dict[int, set[str]] = field(default_factory=dict)  # id(store) → keys

    def add(self, stage: int, rule: Rule) -> None:
        self.stages[stage].append(rule)
        for s in rule.sources:
            if s.store is not None:
                self.consumed.setdefault(id(s.store), set()).add(s.key)

    def tensors_for_rank(self, rank: int) -> list[tuple[Rule, tuple[int, ...], Callable[[], torch.Tensor]]]:
        tp, tp_rank = self.mapping.tp_size, self.mapping.tp_rank(rank)
        out = []
        for rule in self.stages[self.mapping.pp_rank(rank)]:
            shape = shard_shape(rule.sources[0].shape, rule.split, tp, rule.qkv)
            out.append((rule, shape, _producer(rule, tp, tp_rank, self.dtype)))
        return out


def _producer(rule: Rule, tp: int, tp_rank: int, dtype: torch.dtype) -> Callable[[], torch.Tensor]:
    def produce() -> torch.Tensor:
        return shard([s.load().to(dtype) for s in rule.sources], rule.split, tp, tp_rank, rule.qkv)
    return produce


def expect_shape(source: Source, shape: tuple[int, ...], why: str) -> Source:
    """Check a source tensor's shape against what the config implies, naming file, key and config fields."""
    if source.shape != shape:
        raise CheckpointError(f"{source.where}: tensor {source.key} has shape {list(source.shape)}, "
                              f"expected {list(shape)} ({why})")
    return source


def source(store: TensorStore, key: str) -> Source:
    if key not in store:
        raise CheckpointError(f"{store.directory}: tensor {key} not found in {', '.join(map(str, store.files))}")
    return Source(store, key, store.info(key).shape)


def layer_rules(store: TensorStore, hf_prefix: str, trt_prefix: str, keys: list[str], *, hidden: int,
                qkv: QkvLayout, intermediate: int, where: str) -> list[Rule]:
    """Rules for one decoder layer: `keys` are the HF suffixes present (q/k/v fuse into attention.qkv)."""
    nh, nkv, hd = qkv.num_heads, qkv.num_kv_heads, qkv.head_dim
    shapes = {
        "self_attn.q_proj.weight": (nh * hd, hidden), "self_attn.k_proj.weight": (nkv * hd, hidden),
        "self_attn.v_proj.weight": (nkv * hd, hidden), "self_attn.o_proj.weight": (hidden, nh * hd),
        "self_attn.q_proj.bias": (nh * hd,), "self_attn.k_proj.bias": (nkv * hd,), "self_attn.v_proj.bias": (nkv * hd,),
        "self_attn.o_proj.bias": (hidden,), "mlp.gate_proj.weight": (intermediate, hidden),
        "mlp.up_proj.weight": (intermediate, hidden), "mlp.down_proj.weight": (hidden, intermediate),
        "mlp.gate_proj.bias": (intermediate,), "mlp.up_proj.bias": (intermediate,), "mlp.down_proj.bias": (hidden,),
        "input_layernorm.weight": (hidden,), "post_attention_layernorm.weight": (hidden,),
    }
    why = (f"{where}: hidden_size={hidden}, num_attention_heads={nh}, num_key_value_heads={nkv}, "
           f"head_dim={hd}, intermediate_size={intermediate}")
    rules = []
    for kind, qkv_keys in QKV_SOURCES.items():
        if qkv_keys[0] in keys:
            srcs = tuple(expect_shape(source(store, hf_prefix + k), shapes[k], why) for k in qkv_keys)
            rules.append(Rule(f"{trt_prefix}attention.qkv.{kind}", srcs, Split.QKV, qkv))
    for hf, trt in LAYER_RENAMES.items():
        if hf in keys:
            src = expect_shape(source(store, hf_prefix + hf), shapes[hf], why)
            rules.append(Rule(trt_prefix + trt, (src,), split_of(trt_prefix + trt)))
    return rules


def base_layer_suffixes(cfg: BaseModelConfig) -> list[str]:
    keys = ["input_layernorm.weight", "post_attention_layernorm.weight", *QKV_SOURCES["weight"],
            "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
    keys += list(QKV_SOURCES["bias"]) if cfg.qkv_bias else []
    keys += ["self_attn.o_proj.bias"] if cfg.o_bias else []
    keys += ["mlp.gate_proj.bias", "mlp.up_proj.bias", "mlp.down_proj.bias"] if cfg.mlp_bias else []
    return keys


def base_qkv(cfg: BaseModelConfig) -> QkvLayout:
    return QkvLayout(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)


def lm_head_source(store: TensorStore, cfg: BaseModelConfig) -> Source:
    """The base lm_head, or the embedding when the model ties them."""
    key = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    if not cfg.tie_word_embeddings and key not in store and "model.embed_tokens.weight" in store:
        raise CheckpointError(f"{store.directory}: lm_head.weight is missing and config.json does not set "
                              "tie_word_embeddings=true")
    return expect_shape(source(store, key), (cfg.vocab_size, cfg.hidden_size),
                        f"{cfg.path}: vocab_size={cfg.vocab_size}, hidden_size={cfg.hidden_size}")


def add_base(plan: Plan, store: TensorStore, cfg: BaseModelConfig) -> None:
    """Embedding on the first stage, decoder layers split over stages, ln_f and lm_head on the last."""
    vh = f"{cfg.path}: vocab_size={cfg.vocab_size}, hidden_size={cfg.hidden_size}"
    embed = expect_shape(source(store, "model.embed_tokens.weight"), (cfg.vocab_size, cfg.hidden_size), vh)
    last = plan.mapping.pp_size - 1
    plan.add(0, Rule("transformer.vocab_embedding.weight", (embed,), Split.REPLICATE))
    suffixes = base_layer_suffixes(cfg)
    for stage in range(plan.mapping.pp_size):
        layers = plan.mapping.pp_layers(cfg.num_layers, stage)
        for i in layers:
            for rule in layer_rules(store, f"model.layers.{i}.", f"transformer.layers.{i - layers.start}.",
                                    suffixes, hidden=cfg.hidden_size, qkv=base_qkv(cfg),
                                    intermediate=cfg.intermediate_size, where=str(cfg.path)):
                plan.add(stage, rule)
    ln_f = expect_shape(source(store, "model.norm.weight"), (cfg.hidden_size,), vh)
    plan.add(last, Rule("transformer.ln_f.weight", (ln_f,), Split.REPLICATE))
    plan.add(last, Rule("lm_head.weight", (lm_head_source(store, cfg),), Split.VOCAB))


def add_medusa(plan: Plan, heads: MedusaHeads, base_store: TensorStore, cfg: BaseModelConfig) -> None:
    """Heads on the last pipeline stage; the heads-only variant gets the base lm_head materialised per head."""
    last, h = plan.mapping.pp_size - 1, cfg.hidden_size
    why = f"the base {cfg.path} has hidden_size={h}, vocab_size={cfg.vocab_size}; these heads belong to another model"
    for head in range(heads.num_heads):
        for layer in range(heads.num_layers):
            prefix = f"medusa_heads.{head}.medusa_layers.{layer}.linear."
            for kind, shape in (("weight", (h, h)), ("bias", (h,))):
                src = expect_shape(source(heads.store, heads.linear_key(head, layer, kind)), shape, why)
                plan.add(last, Rule(prefix + kind, (src,), Split.COLUMN))
        lm = (expect_shape(source(heads.store, heads.lm_head_key(head)), (cfg.vocab_size, h), why)
              if heads.per_head_lm_head else lm_head_source(base_store, cfg))
        plan.add(last, Rule(f"medusa_heads.{head}.lm_head.weight", (lm,), Split.VOCAB))


def add_eagle(plan: Plan, draft: EagleDraft, base_store: TensorStore, cfg: BaseModelConfig,
              num_eagle_layers: int) -> None:
    """The draft network copied into each of the num_eagle_layers EagleNets, each with the base lm_head."""
    h, store = draft.hidden_size, draft.store
    why = f"the base {cfg.path} has hidden_size={cfg.hidden_size}, vocab_size={cfg.vocab_size}"
    if h != cfg.hidden_size:
        raise CheckpointError(f"{draft.directory / 'config.json'}: EAGLE draft hidden_size={h} but {why}")
    embed = (source(store, "embed_tokens.weight") if draft.has_embed_tokens
             else source(base_store, "model.embed_tokens.weight"))  # EAGLE's embedding is a frozen base copy
    embed = expect_shape(embed, (cfg.vocab_size, h), why)
    fc_w = expect_shape(source(store, "fc.weight"), (h, 2 * h), f"{draft.directory}: hidden_size={h}")
    fc_b = (expect_shape(source(store, "fc.bias"), (h,), f"{draft.directory}: hidden_size={h}")
            if draft.has_fc_bias else Source(None, "fc.bias", (h,)))  # TRT-LLM's fc always has a bias
    qkv = QkvLayout(draft.num_heads, draft.num_kv_heads, draft.head_dim)
    lm = lm_head_source(base_store, cfg)
    for k in range(num_eagle_layers):
        p = f"eagle_nets.{k}."
        plan.add(0, Rule(p + "drafter.vocab_embedding.weight", (embed,), Split.REPLICATE))
        plan.add(0, Rule(p + "drafter.fc.weight", (fc_w,), Split.COLUMN))
        plan.add(0, Rule(p + "drafter.fc.bias", (fc_b,), Split.COLUMN))
        for j in range(draft.num_layers):
            suffixes = [key.removeprefix(f"layers.{j}.") for key in eagle_layer_keys(draft, j)]
            for rule in layer_rules(store, f"layers.{j}.", f"{p}drafter.layers.{j}.", suffixes, hidden=h,
                                    qkv=qkv, intermediate=draft.intermediate_size, where=str(draft.directory)):
                plan.add(0, rule)
        plan.add(0, Rule(p + "lm_head.weight", (lm,), Split.VOCAB))


def add_redrafter(plan: Plan, drafter: ReDrafterDrafter) -> None:
    """The drafter under `drafter.` beside the base (one pipeline stage: the ReDrafter converter has no PP), each
    Linear split on dim 0; its lm_head padded to the base's padded vocabulary, which the model sizes it to."""
    for name, key in drafter.tensor_map().items():
        plan.add(0, Rule(name, (source(drafter.store, key),), split_of(name)))


def check_all_consumed(plan: Plan, store: TensorStore, skip_prefixes: tuple[str, ...] = ()) -> None:
    """Every source tensor must be converted or deliberately skipped; name the first one that is neither."""
    used = plan.consumed.get(id(store), set())
    leftover = [k for k in store.keys()
                if k not in used and not SKIPPABLE.match(k) and not k.startswith(skip_prefixes)]
    if leftover:
        k = leftover[0]
        more = f" (and {len(leftover) - 1} more)" if len(leftover) > 1 else ""
        raise CheckpointError(f"{store.info(k).path}: tensor {k}{more} has no place in the TensorRT-LLM checkpoint; "
                              "the model has weights trtspec does not know how to convert")
