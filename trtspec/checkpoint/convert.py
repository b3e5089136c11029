"""`trtspec convert`: a Hugging Face base (+ Medusa heads, an EAGLE-1/2 draft or a ReDrafter drafter) → a TensorRT-LLM
checkpoint.

Output: `config.json` + `rank{r}.safetensors` (r = tp_rank + pp_rank * tp_size) as the TensorRT-LLM converters
write them, plus `trtspec-convert.json` recording where every part came from. Everything is validated before
the first byte is written, tensors are streamed one at a time, and the directory appears only when complete.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from trtspec.checkpoint import plan as P
from trtspec.checkpoint.draft_vocab import DraftVocab, write_checkpoint_vocab
from trtspec.checkpoint.eagle import EagleDraft, read_eagle_draft
from trtspec.checkpoint.hf_config import BaseModelConfig, read_base_config, read_json
from trtspec.checkpoint.medusa import FULL_MODEL_PREFIX, MODELOPT_PREFIX, has_embedded_heads, read_medusa_heads
from trtspec.checkpoint.redrafter import (DEFAULT_DRAFT_LEN_PER_BEAM, DEFAULT_NUM_BEAMS, ReDrafterDrafter,
                                          read_redrafter_drafter, redrafter_mismatches)
from trtspec.checkpoint.safetensors_writer import PlannedTensor, write_safetensors
from trtspec.checkpoint.sharding import Mapping, check_tp_divisibility
from trtspec.checkpoint.tensorfile import open_hf_weights
from trtspec.checkpoint.trtllm_config import base_config, eagle_config, medusa_config, redrafter_config
from trtspec.errors import CheckpointError, ConfigError
from trtspec.outdir import atomic_output_dir, check_output_dir
from trtspec.progress import progress_bar

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
EAGLE_MAX_DRAFT_LEN = 256  # asserted by TensorRT-LLM's EAGLE converter
PROVENANCE_FILE = "trtspec-convert.json"
NEWEST_TRTLLM = "1.2"  # engine/trtllm_versions.py NEWEST (checkpoint does not import engine: engine imports it)


@dataclass(frozen=True, kw_only=True)
class ConvertOptions:
    """The `trtspec convert` flags (kebab-case twins of the TensorRT-LLM converter flags)."""

    base: Path
    out: Path
    medusa: Path | None = None
    num_medusa_heads: int | None = None
    num_medusa_layers: int | None = None
    eagle: Path | None = None
    num_eagle_layers: int = 4
    max_non_leaves_per_layer: int = 10
    redrafter: Path | None = None
    redrafter_num_beams: int = DEFAULT_NUM_BEAMS
    redrafter_draft_len_per_beam: int = DEFAULT_DRAFT_LEN_PER_BEAM
    redrafter_greedy_search: bool = True
    trtllm_version: str | None = None  # ReDrafter only: the release whose names the checkpoint uses (None: newest)
    max_draft_len: int = 63
    dtype: str | None = None  # None: the base's stored dtype
    tp_size: int = 1
    pp_size: int = 1
    force: bool = False

    def __post_init__(self):
        given = [f"--{name}" for name in ("medusa", "eagle", "redrafter") if getattr(self, name)]
        if len(given) > 1:
            raise ConfigError(f"{' and '.join(given)} are exclusive: a checkpoint has one speculative method")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ConfigError(f"--dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        for name in ("max_draft_len", "num_eagle_layers", "max_non_leaves_per_layer", "redrafter_num_beams",
                     "redrafter_draft_len_per_beam"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.eagle and self.max_draft_len > EAGLE_MAX_DRAFT_LEN:
            raise ConfigError(f"--max-draft-len {self.max_draft_len} exceeds {EAGLE_MAX_DRAFT_LEN}, "
                              "the EAGLE limit of TensorRT-LLM")
        if self.eagle and self.pp_size != 1:
            raise ConfigError(f"--pp-size {self.pp_size}: TensorRT-LLM's EagleForCausalLM supports pp_size 1 only")
        if self.redrafter and self.pp_size != 1:
            raise ConfigError(f"--pp-size {self.pp_size}: TensorRT-LLM's ReDrafter converter writes pp_size 1 only")
        if self.trtllm_version is not None and not self.redrafter:
            raise ConfigError(f"--trtllm-version {self.trtllm_version} applies to --redrafter only (its architecture "
                              "name changed in 1.0); plain, Medusa and EAGLE checkpoints are the same for every "
                              "version")
        if self.redrafter:
            trtllm_version_key(self.trtllm_version)


@dataclass(frozen=True)
class ConvertResult:
    out: Path
    architecture: str
    world_size: int
    num_tensors: int
    bytes_written: int
    seconds: float


def convert(opts: ConvertOptions, *, show_progress: bool = True) -> ConvertResult:
    """Validate everything, then write the TensorRT-LLM checkpoint atomically into opts.out."""
    start = time.perf_counter()
    check_output_dir(Path(opts.out), force=opts.force)
    cfg = read_base_config(opts.base)
    for directory in (opts.base, opts.medusa, opts.eagle, opts.redrafter):
        if directory is not None:
            _check_not_quantized(directory)
    mapping = Mapping(tp_size=opts.tp_size, pp_size=opts.pp_size)
    _check_parallelism(cfg, mapping)
    dtype = opts.dtype or cfg.dtype or "float32"
    plan, config, provenance, draft_vocab = _make_plan(opts, cfg, mapping, DTYPES[dtype])
    with atomic_output_dir(Path(opts.out), force=opts.force) as tmp:
        n_tensors, n_bytes = 0, 0
        for rank in range(mapping.world_size):
            planned = [PlannedTensor(rule.name, shape, DTYPES[dtype], produce)
                       for rule, shape, produce in plan.tensors_for_rank(rank)]
            with progress_bar(f"rank {rank}", total=len(planned), enabled=show_progress) as advance:
                n_bytes += write_safetensors(tmp / f"rank{rank}.safetensors", planned, lambda _: advance())
            n_tensors += len(planned)
        (tmp / "config.json").write_text(json.dumps(config, indent=4) + "\n")
        if draft_vocab is not None:
            write_checkpoint_vocab(tmp, draft_vocab)
        (tmp / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
    return ConvertResult(Path(opts.out), config["architecture"], mapping.world_size, n_tensors, n_bytes,
                         time.perf_counter() - start)


def _make_plan(opts: ConvertOptions, cfg: BaseModelConfig, mapping: Mapping,
               dtype: torch.dtype) -> tuple[P.Plan, dict, dict, DraftVocab | None]:
    store = open_hf_weights(opts.base)
    dtype_name = next(k for k, v in DTYPES.items() if v == dtype)
    plan = P.Plan(mapping, dtype, [[] for _ in range(mapping.pp_size)])
    P.add_base(plan, store, cfg)
    provenance = {"base": str(Path(opts.base).resolve()), "base_architecture": cfg.architecture,
                  "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(opts).items()}}
    embedded = (FULL_MODEL_PREFIX, MODELOPT_PREFIX)
    draft_vocab = None
    if opts.medusa:
        heads = read_medusa_heads(opts.medusa, num_heads=opts.num_medusa_heads, num_layers=opts.num_medusa_layers)
        P.add_medusa(plan, heads, store, cfg)
        unused = tuple(f"{h}." for h in range(heads.num_heads, heads.stored_heads))
        P.check_all_consumed(plan, heads.store, unused)
        config = medusa_config(cfg, heads, dtype=dtype_name, mapping=mapping, max_draft_len=opts.max_draft_len)
        provenance["medusa"] = {"directory": str(Path(opts.medusa).resolve()), "variant": heads.variant,
                                "stored_heads": heads.stored_heads, "config_num_heads": heads.config_num_heads,
                                "per_head_lm_head": heads.per_head_lm_head}
    elif opts.eagle:
        if cfg.family == "qwen2":
            raise ConfigError(f"{cfg.path}: TensorRT-LLM's EagleForCausalLM is LLaMA-based; "
                              f"a {cfg.architecture} base cannot take an EAGLE draft in the engine flow")
        draft = read_eagle_draft(opts.eagle)
        _check_draft_fits(draft, cfg, mapping)
        P.add_eagle(plan, draft, store, cfg, opts.num_eagle_layers)
        draft_vocab = draft.draft_vocab(cfg.vocab_size)
        P.check_all_consumed(plan, draft.store, ("layers.0.input_layernorm.", "d2t", "t2d"))
        config = eagle_config(cfg, draft, dtype=dtype_name, mapping=mapping, max_draft_len=opts.max_draft_len,
                              num_eagle_layers=opts.num_eagle_layers,
                              max_non_leaves_per_layer=opts.max_non_leaves_per_layer)
        provenance["eagle"] = {"directory": str(Path(opts.eagle).resolve()), "fc_bias": draft.has_fc_bias,
                               "embed_tokens": "draft" if draft.has_embed_tokens else "base",
                               "draft_vocab_size": draft_vocab.size if draft_vocab else cfg.vocab_size}
    elif opts.redrafter:
        drafter = read_redrafter_drafter(opts.redrafter, strict=False)
        mismatches = redrafter_mismatches(drafter, cfg)
        if mismatches:
            raise CheckpointError("; ".join(mismatches))
        _check_redrafter_parallelism(drafter, mapping)
        version = trtllm_version_key(opts.trtllm_version)
        config = redrafter_config(cfg, drafter, dtype=dtype_name, mapping=mapping, num_beams=opts.redrafter_num_beams,
                                  draft_len_per_beam=opts.redrafter_draft_len_per_beam,
                                  greedy_search=opts.redrafter_greedy_search, trtllm_version=version)
        P.add_redrafter(plan, drafter)
        P.check_all_consumed(plan, drafter.store)
        provenance["redrafter"] = {"directory": str(Path(opts.redrafter).resolve()), "weights": drafter.weights.name,
                                   "spelling": drafter.spelling, "trtllm_version": ".".join(map(str, version))}
    else:
        config = base_config(cfg, dtype=dtype_name, mapping=mapping)
    if has_embedded_heads(store) and not opts.medusa:
        log.warning("%s also holds Medusa heads; they are not converted (pass --medusa %s to convert them)",
                    opts.base, opts.base)
    P.check_all_consumed(plan, store, embedded)
    return plan, config, provenance, draft_vocab


def _check_draft_fits(draft: EagleDraft, cfg: BaseModelConfig, mapping: Mapping) -> None:
    where = str(draft.directory / "config.json")
    vocab = draft.config.get("vocab_size", cfg.vocab_size)
    if vocab != cfg.vocab_size:
        raise CheckpointError(f"{where}: EAGLE draft vocab_size={vocab} but the base {cfg.path} has "
                              f"vocab_size={cfg.vocab_size}; the draft was trained for another model")
    check_tp_divisibility(mapping.tp_size, num_heads=draft.num_heads, num_kv_heads=draft.num_kv_heads,
                          hidden_size=draft.hidden_size, intermediate_size=draft.intermediate_size, where=where)


def trtllm_version_key(text: str | None) -> tuple[int, int]:
    """(major, minor) of a TensorRT-LLM version ("1.2", "0.21.0", "1.0.0rc4"; None: the newest). The CLI checks
    the supported range (engine/trtllm_versions.parse_version) before it gets here."""
    match = re.match(r"^(\d+)\.(\d+)", (text or NEWEST_TRTLLM).strip())
    if not match:
        raise ConfigError(f"--trtllm-version {text!r} is not a version; write it as X.Y or X.Y.Z, e.g. 1.2")
    return int(match[1]), int(match[2])


def _check_redrafter_parallelism(drafter: ReDrafterDrafter, mapping: Mapping) -> None:
    """Each drafter Linear is split on its output rows (exit_dim, hidden_size; the vocabulary is padded)."""
    if drafter.exit_dim % mapping.tp_size:
        raise ConfigError(f"--tp-size {mapping.tp_size} does not divide exit_dim={drafter.exit_dim} "
                          f"({drafter.config_path})")


def _check_not_quantized(directory: Path) -> None:
    """Quantized (ModelOpt FP8 / INT4 …) checkpoints need calibration scales trtspec does not convert yet."""
    path = Path(directory) / "hf_quant_config.json"
    if path.is_file():
        algo = (read_json(path).get("quantization") or {}).get("quant_algo")
        if algo:
            raise ConfigError(f"{path}: quant_algo={algo!r}; trtspec converts unquantized checkpoints only "
                              "(use the unquantized export of this model)")


def _check_parallelism(cfg: BaseModelConfig, mapping: Mapping) -> None:
    check_tp_divisibility(mapping.tp_size, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                          hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, where=str(cfg.path))
    if cfg.num_layers % mapping.pp_size:
        raise ConfigError(f"--pp-size {mapping.pp_size} does not divide num_hidden_layers={cfg.num_layers} "
                          f"({cfg.path})")
