"""`trtspec inspect`: detect what a checkpoint directory holds and summarise it."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trtspec.checkpoint.eagle import is_eagle3, read_eagle3_draft, read_eagle_draft
from trtspec.checkpoint.hf_config import read_base_config, read_json
from trtspec.checkpoint.llmapi_fields import eagle3_layer_ids, mtp_field
from trtspec.checkpoint.medusa import HEAD_FILES, has_embedded_heads, read_medusa_heads
from trtspec.checkpoint.redrafter import is_redrafter_drafter, read_redrafter_drafter
from trtspec.checkpoint.tensorfile import TensorStore, open_hf_weights
from trtspec.checkpoint.trtllm_reader import read_trtllm_checkpoint
from trtspec.errors import CheckpointError


@dataclass(frozen=True)
class CheckpointSummary:
    """What `inspect` reports; `details` holds the format-specific facts (heads, layers, shards …)."""

    path: str
    format: str  # trtllm | hf | medusa | eagle | eagle3 | redrafter
    architecture: str
    dtypes: dict[str, int]  # dtype → tensor count
    num_parameters: int
    files: dict[str, int]  # file → bytes
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def inspect_checkpoint(directory: Path) -> CheckpointSummary:
    """Detect the format of `directory` and summarise it; raise CheckpointError when it is none we know."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    config = read_json(directory / "config.json") if (directory / "config.json").is_file() else {}
    if "architecture" in config:
        return _trtllm(directory)
    if any((directory / name).is_file() for name in HEAD_FILES):
        return _medusa(directory)
    if is_redrafter_drafter(directory):
        return _redrafter(directory)
    if is_eagle3(directory):
        return _eagle3(directory)
    if set(config.get("architectures") or []) & {"LlamaForCausalLM"} and _looks_like_eagle(directory):
        return _eagle(directory)
    if mtp_field(config)[0] is not None:
        try:
            read_base_config(directory)
        except CheckpointError:  # an architecture trtspec does not convert (DeepSeek-V3): its config alone
            return _mtp_base(directory, config)
    return _hf(directory)


def _looks_like_eagle(directory: Path) -> bool:
    try:
        store = open_hf_weights(directory)
    except CheckpointError:
        return False
    return "fc.weight" in store and not any(k.startswith("model.") for k in store.keys())


def _tensor_stats(store: TensorStore) -> tuple[dict[str, int], int, dict[str, int]]:
    dtypes = Counter(str(store.info(k).dtype).removeprefix("torch.") for k in store.keys())
    params = sum(store.info(k).numel for k in store.keys())
    files = {p.name: p.stat().st_size for p in store.files}
    return dict(dtypes), params, files


def _summary(directory: Path, fmt: str, arch: str, store: TensorStore, details: dict) -> CheckpointSummary:
    dtypes, params, files = _tensor_stats(store)
    return CheckpointSummary(str(directory), fmt, arch, dtypes, params, files, details)


def _hf(directory: Path) -> CheckpointSummary:
    cfg = read_base_config(directory)
    store = open_hf_weights(directory)
    details = {"hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers, "num_heads": cfg.num_heads,
               "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "intermediate_size": cfg.intermediate_size,
               "vocab_size": cfg.vocab_size, "tie_word_embeddings": cfg.tie_word_embeddings,
               "config_dtype": cfg.dtype, "shards": len(store.files)}
    if has_embedded_heads(store):
        heads = read_medusa_heads(directory)
        details["medusa"] = {"variant": heads.variant, "heads": heads.stored_heads, "layers": heads.num_layers}
    details.update(_mtp_details(read_json(directory / "config.json")))
    return _summary(directory, "hf", cfg.architecture, store, details)


def _mtp_details(config: dict) -> dict:
    field_name, layers = mtp_field(config)
    if field_name is None:
        return {}
    return {"mtp_layers": f"{layers} ({field_name}): drafts with TensorRT-LLM's MTP (deploy --flavour llmapi --mtp)"}


def _mtp_base(directory: Path, config: dict) -> CheckpointSummary:
    """A base with multi-token-prediction layers whose architecture trtspec does not convert (DeepSeek-V3 / R1,
    Qwen3-Next): config.json's sizes and its MTP modules, for the llmapi flavour."""
    store = open_hf_weights(directory)
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "torch_dtype")
    details = {k: config[k] for k in keys if k in config}
    details.update(_mtp_details(config), shards=len(store.files))
    arch = ", ".join(config.get("architectures") or []) or str(config.get("model_type", "unknown"))
    return _summary(directory, "hf", arch, store, details)


def _medusa(directory: Path) -> CheckpointSummary:
    heads = read_medusa_heads(directory)
    details = {"variant": heads.variant, "heads": heads.stored_heads, "config_num_heads": heads.config_num_heads,
               "layers_per_head": heads.num_layers, "per_head_lm_head": heads.per_head_lm_head,
               "hidden_size": heads.store.info("0.0.linear.weight").shape[0]}
    if heads.per_head_lm_head:
        details["vocab_size"] = heads.store.info(heads.lm_head_key(0)).shape[0]
    return _summary(directory, "medusa", "Medusa heads", heads.store, details)


def _eagle(directory: Path) -> CheckpointSummary:
    d = read_eagle_draft(directory)
    details = {"draft_layers": d.num_layers, "hidden_size": d.hidden_size, "num_heads": d.num_heads,
               "num_kv_heads": d.num_kv_heads, "fc_bias": d.has_fc_bias, "embed_tokens": d.has_embed_tokens}
    return _summary(directory, "eagle", "EAGLE-1/2 draft", d.store, details)


def _eagle3(directory: Path) -> CheckpointSummary:
    """The fields TensorRT-LLM's Eagle3 loader reads (trtspec.checkpoint.llmapi_fields): sizes, the reduced
    vocabulary and its maps, the base layers the draft names, its eagle_config."""
    d = read_eagle3_draft(directory)
    field_name, ids = eagle3_layer_ids(d.config)
    details = {"architectures": ", ".join(d.config.get("architectures") or []) or "(none)",
               "draft_layers": d.num_layers, "hidden_size": d.hidden_size,
               "target_hidden_size": d.target_hidden_size, "vocab_size": d.vocab_size,
               "draft_vocab_size": d.draft_vocab_size,
               "vocab_maps": ", ".join(k for k in ("d2t", "t2d") if k in d.store) or "none (the full vocabulary)",
               "embed_tokens": d.has_embed_tokens,
               "target_layers": f"{ids} ({field_name})" if field_name else
               "not named (TensorRT-LLM captures its default, 1, N/2 - 1, N - 4 of an N-layer base)"}
    eagle = d.config.get("eagle_config") if isinstance(d.config.get("eagle_config"), dict) else {}
    rest = {k: v for k, v in eagle.items() if k != "eagle_aux_hidden_state_layer_ids"}
    if rest:  # eh_proj_before_attn, norm_before_fc, ...: how TensorRT-LLM builds the draft's layers
        details["eagle_config"] = rest
    details["serve"] = ("TensorRT-LLM's LLM API, PyTorch backend (trtspec deploy --flavour llmapi --eagle3 DIR); not "
                        "its engine flow")
    return _summary(directory, "eagle3", "EAGLE-3 draft", d.store, details)


def _redrafter(directory: Path) -> CheckpointSummary:
    """The drafter's sizes as config.json and the weights give them; what disagrees within it under `problems` (one
    line each). Checked against a base by `convert --redrafter`."""
    d = read_redrafter_drafter(directory, strict=False)
    details = {"weights": d.weights.name, "spelling": d.spelling, "hidden_size": d.hidden_size, "exit_dim": d.exit_dim,
               "input_proj": d.input_proj_prefix is not None, "num_draft_layers": d.num_draft_layers, "rnn": d.rnn,
               "vocab_size": d.vocab_size}
    if d.problems:
        details["problems"] = list(d.problems)
    return _summary(directory, "redrafter", "ReDrafter drafter", d.store, details)


def _trtllm(directory: Path) -> CheckpointSummary:
    ckpt = read_trtllm_checkpoint(directory)
    cfg = ckpt.config
    dtypes = Counter(str(i.dtype).removeprefix("torch.") for f in ckpt.ranks for i in f.infos.values())
    keys = ("dtype", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "max_draft_len", "num_medusa_heads", "num_medusa_layers", "num_eagle_layers",
            "max_non_leaves_per_layer", "base_model_architecture", "redrafter_num_layers", "redrafter_hidden_size",
            "redrafter_exit_dim", "redrafter_is_rnn", "redrafter_num_beams", "redrafter_draft_len_per_beam",
            "redrafter_greedy_search")
    details = {k: cfg[k] for k in keys if k in cfg}
    details.update(tp_size=ckpt.mapping.tp_size, pp_size=ckpt.mapping.pp_size, tensors=len(ckpt.names()))
    q = cfg.get("quantization") or {}
    if q.get("quant_algo") or q.get("kv_cache_quant_algo"):  # e.g. "W4A16_AWQ, group_size 128"
        details["quantization"] = ", ".join([str(q.get("quant_algo"))] + [f"{k} {q[k]}" for k in (
            "group_size", "kv_cache_quant_algo") if q.get(k) is not None])
    if "eagle_net_config" in cfg:
        details["eagle_draft_layers"] = cfg["eagle_net_config"]["num_hidden_layers"]
    files = {f.path.name: f.path.stat().st_size for f in ckpt.ranks}
    return CheckpointSummary(str(directory), "trtllm", ckpt.architecture, dict(dtypes), ckpt.num_parameters(),
                             files, details)
