"""ReDrafter (Apple's recurrent drafter) drafters, and what TensorRT-LLM calls their checkpoint in each version.

A drafter directory is apple/ml-recurrent-drafter's `save_pretrained` output: `config.json` (hidden_size, exit_dim,
num_draft_layers, rnn; vocab_size) and `model.safetensors`, or `model.pt`. Its module: `input_proj` (2·hidden →
exit_dim, bias) only when exit_dim ≠ 2·hidden, `num_draft_layers` ResBlocks x + silu(linear(x)) (exit_dim → exit_dim,
bias), the last layer (exit_dim → vocab, no bias) and with rnn `rnn_u` (hidden → hidden, bias), `rnn_w` (no bias).
The key spellings are those TensorRT-LLM's examples/redrafter/convert_checkpoint.py tries (`hf_drafter`), see
REDRAFTER_SPELLINGS. Every inconsistency is one line naming the file and field (`problems`, `redrafter_mismatches`).
Sources: docs/upstream-sources.md (ReDrafter).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from trtspec.checkpoint.hf_config import BaseModelConfig, read_json
from trtspec.checkpoint.tensorfile import TensorStore, open_tensor_file
from trtspec.errors import CheckpointError, ConfigError

WEIGHT_FILES = ("model.safetensors", "model.pt")  # the converter's order: model.pt only without model.safetensors
HEAD_PREFIXES = ("lm_head.", "lm_heads.", "0.")  # ResBlocks {p}{i}.linear.*, the last layer {p}{N}.weight
INPUT_PROJ_PREFIXES = ("input_proj.", "input_projs.")
RNN_KEYS = ("rnn_u.weight", "rnn_u.bias", "rnn_w.weight")
MODEL_TYPE = "recurrent_drafting_drafter"  # apple/ml-recurrent-drafter DrafterConfig.model_type
_HEAD_KEY = re.compile(r"^(lm_head\.|lm_heads\.|0\.)(\d+)\.(linear\.weight|linear\.bias|weight)$")

# TensorRT-LLM's ReDrafter architecture per base: one ReDrafterForCausalLM (LLaMA only) before 1.0, one class per
# base family from 1.0 (examples/redrafter/convert_checkpoint.py REDRAFTER_MAP; tensorrt_llm/models/__init__.py
# MODEL_MAP has no ReDrafterForCausalLM any more)
LEGACY_ARCHITECTURE = "ReDrafterForCausalLM"
ARCHITECTURES = {"LlamaForCausalLM": "ReDrafterForLLaMALM", "Qwen2ForCausalLM": "ReDrafterForQWenLM"}
PER_BASE_NAMES_FROM = (1, 0)
DEFAULT_NUM_BEAMS = 5  # the converter's --redrafter_num_beams
DEFAULT_DRAFT_LEN_PER_BEAM = 5  # --redrafter_draft_len_per_beam


@dataclass(frozen=True, kw_only=True)
class ReDrafterDrafter:
    """A ReDrafter drafter directory, read without judging it: `problems` lists what disagrees within it."""

    directory: Path
    weights: Path  # model.safetensors or model.pt
    store: TensorStore
    config: dict
    hidden_size: int
    exit_dim: int
    num_draft_layers: int
    rnn: bool
    config_vocab_size: int | None  # config.json's vocab_size (apple's DrafterConfig writes it), when present
    head_prefix: str  # one of HEAD_PREFIXES
    input_proj_prefix: str | None  # one of INPUT_PROJ_PREFIXES; None: no input_proj stored
    problems: tuple[str, ...]  # one line per inconsistency within the directory, naming the file and field

    @property
    def config_path(self) -> Path:
        return self.directory / "config.json"

    @property
    def needs_input_proj(self) -> bool:
        return self.exit_dim != 2 * self.hidden_size

    @property
    def lm_head_key(self) -> str:
        return f"{self.head_prefix}{self.num_draft_layers}.weight"

    @property
    def stored_lm_head_key(self) -> str | None:
        """The last layer as stored: lm_head_key, or the one {p}{j}.weight there is when num_draft_layers is wrong."""
        if self.lm_head_key in self.store:
            return self.lm_head_key
        last = [k for k in self.store.keys() if (m := _HEAD_KEY.match(k)) and m[1] == self.head_prefix
                and m[3] == "weight"]
        return last[0] if len(last) == 1 else None

    @property
    def vocab_size(self) -> int | None:
        """Rows of the stored last layer (the drafter's vocabulary), else config.json's vocab_size."""
        key = self.stored_lm_head_key
        return self.store.info(key).shape[0] if key else self.config_vocab_size

    @property
    def spelling(self) -> str:
        proj = f"{self.input_proj_prefix}*, " if self.input_proj_prefix else ""
        return f"{proj}{self.head_prefix}{{i}}.linear.*, {self.lm_head_key}"

    def tensor_map(self) -> dict[str, str]:
        """TensorRT-LLM tensor name → stored key (examples/redrafter/convert_checkpoint.py `hf_drafter`: the base's
        TensorRT-LLM names are the plain model's, the drafter's sit under `drafter.`)."""
        out = {}
        if self.needs_input_proj:
            proj = self.input_proj_prefix or INPUT_PROJ_PREFIXES[0]
            out |= {f"drafter.input_proj.{k}": f"{proj}{k}" for k in ("weight", "bias")}
        for i in range(self.num_draft_layers):
            out |= {f"drafter.layers.{i}.linear.{k}": f"{self.head_prefix}{i}.linear.{k}" for k in ("weight", "bias")}
        out["drafter.lm_head.weight"] = self.lm_head_key
        if self.rnn:
            out |= {f"drafter.{k}": k for k in RNN_KEYS}
        return out

    def expected_shapes(self, vocab_size: int) -> dict[str, tuple[int, ...]]:
        """Stored key → the shape config.json implies (the vocabulary given)."""
        h, e = self.hidden_size, self.exit_dim
        by_name = {"drafter.input_proj.weight": (e, 2 * h), "drafter.input_proj.bias": (e,),
                   "drafter.lm_head.weight": (vocab_size, e), "drafter.rnn_u.weight": (h, h),
                   "drafter.rnn_u.bias": (h,), "drafter.rnn_w.weight": (h, h)}
        out = {}
        for name, key in self.tensor_map().items():
            out[key] = by_name.get(name) or ((e, e) if name.endswith(".weight") else (e,))
        return out


def is_redrafter_drafter(directory: Path) -> bool:
    """A drafter config.json: apple's model_type, or exit_dim and num_draft_layers side by side."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return False
    try:
        cfg = read_json(path)
    except CheckpointError:
        return False
    return cfg.get("model_type") == MODEL_TYPE or {"exit_dim", "num_draft_layers"} <= set(cfg)


def read_redrafter_drafter(directory: Path, *, strict: bool = True) -> ReDrafterDrafter:
    """Read a drafter directory; with `strict`, a CheckpointError lists every problem (one line each, joined by
    "; "), otherwise they are returned in `problems`. A config.json that is unreadable, or lacks a field everything
    else is checked against, is an error either way."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: ReDrafter drafter directory not found")
    config_path = directory / "config.json"
    cfg = read_json(config_path)
    weights = next((directory / n for n in WEIGHT_FILES if (directory / n).is_file()), None)
    if weights is None:
        raise CheckpointError(f"{directory}: no ReDrafter drafter weights (expected {' or '.join(WEIGHT_FILES)})")
    store = TensorStore.from_files([open_tensor_file(weights)], directory)
    hidden = _int(cfg, "hidden_size", config_path)
    exit_dim = _int(cfg, "exit_dim", config_path)
    layers = _int(cfg, "num_draft_layers", config_path, minimum=0)
    rnn = cfg.get("rnn")
    if not isinstance(rnn, bool):
        held = "holds" if "rnn_w.weight" in store else "lacks"
        raise CheckpointError(f"{config_path}: field rnn must be true or false, found {rnn!r} (true when the drafter "
                              f"has rnn_u / rnn_w, which {weights.name} {held})")
    vocab = cfg.get("vocab_size")
    config_vocab = vocab if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0 else None
    problems: list[str] = []
    if vocab is not None and config_vocab is None:
        problems.append(f"{config_path}: field vocab_size must be a positive integer, found {vocab!r}")
    head_prefix, proj_prefix = _spelling(store, weights, problems)
    drafter = ReDrafterDrafter(directory=directory, weights=weights, store=store, config=cfg, hidden_size=hidden,
                               exit_dim=exit_dim, num_draft_layers=layers, rnn=rnn, config_vocab_size=config_vocab,
                               head_prefix=head_prefix, input_proj_prefix=proj_prefix, problems=())
    problems += _structure_problems(drafter)
    drafter = replace(drafter, problems=tuple(problems))
    if strict and problems:
        raise CheckpointError("; ".join(problems))
    return drafter


def redrafter_mismatches(drafter: ReDrafterDrafter, base: BaseModelConfig) -> list[str]:
    """The drafter's own problems, then where it disagrees with the base (hidden size, vocabulary): one line each."""
    out = list(drafter.problems)
    if drafter.hidden_size != base.hidden_size:
        out.append(f"{drafter.config_path}: hidden_size={drafter.hidden_size} but the base {base.path} has "
                   f"hidden_size={base.hidden_size}; the drafter was trained for another model")
    if (key := drafter.stored_lm_head_key) is not None:
        rows = drafter.store.info(key).shape[0]
        if rows != base.vocab_size:
            out.append(f"{drafter.weights}: {key} scores {rows} tokens but the base {base.path} has "
                       f"vocab_size={base.vocab_size}; the drafter was trained for another model")
    elif drafter.config_vocab_size is not None and drafter.config_vocab_size != base.vocab_size:
        out.append(f"{drafter.config_path}: vocab_size={drafter.config_vocab_size} but the base {base.path} has "
                   f"vocab_size={base.vocab_size}")
    return out


def redrafter_architecture(base_architecture: str, trtllm_version: tuple[int, int], *, where: str) -> str:
    """The TensorRT-LLM architecture of a ReDrafter checkpoint over `base_architecture` (a TensorRT-LLM base name)."""
    if base_architecture not in ARCHITECTURES:
        raise ConfigError(f"{where}: TensorRT-LLM has no ReDrafter model over {base_architecture}; it takes "
                          f"{' and '.join(ARCHITECTURES)} bases")
    if trtllm_version >= PER_BASE_NAMES_FROM:
        return ARCHITECTURES[base_architecture]
    if base_architecture != "LlamaForCausalLM":
        raise ConfigError(f"{where}: TensorRT-LLM {trtllm_version[0]}.{trtllm_version[1]} has ReDrafter over LLaMA "
                          f"bases only ({LEGACY_ARCHITECTURE}); a {base_architecture} base needs 1.0 or later "
                          "(--trtllm-version 1.0)")
    return LEGACY_ARCHITECTURE


def exclude_modules(drafter: ReDrafterDrafter) -> list[str]:
    """The modules the converter keeps out of quantization: upstream's list (`hf_redrafter_config`), plus
    drafter.input_proj where the drafter has one (upstream's list leaves it out, so a quantized base would
    quantize it)."""
    out = ["drafter", "drafter.layers", "drafter.lm_head"]
    if drafter.rnn:
        out += ["drafter.rnn_u", "drafter.rnn_w"]
    for i in range(drafter.num_draft_layers):
        out += [f"drafter.layers.{i}", f"drafter.layers.{i}.linear"]
    if drafter.needs_input_proj:
        out.append("drafter.input_proj")
    return out


def _int(cfg: dict, key: str, path: Path, *, minimum: int = 1) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise CheckpointError(f"{path}: field {key} must be {what}, found {value!r}")
    return value


def _spelling(store: TensorStore, weights: Path, problems: list[str]) -> tuple[str, str | None]:
    """The stored ResBlock / last-layer prefix and input_proj prefix; mixed spellings and unknown keys are problems."""
    heads, projs, unknown = set(), set(), []
    for key in store.keys():
        if m := _HEAD_KEY.match(key):
            heads.add(m[1])
        elif key.startswith(INPUT_PROJ_PREFIXES) and key.split(".", 1)[1] in ("weight", "bias"):
            projs.add(key.split(".", 1)[0] + ".")
        elif key not in RNN_KEYS:
            unknown.append(key)
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        problems.append(f"{weights}: unexpected tensor {unknown[0]}{more} in a ReDrafter drafter (TensorRT-LLM's "
                        "converter reads input_proj(s).*, lm_head(s).{i}.* or 0.{i}.*, rnn_u.*, rnn_w.weight)")
    head = next((p for p in HEAD_PREFIXES if p in heads), HEAD_PREFIXES[0])
    if len(heads) > 1:
        problems.append(f"{weights}: the layers are stored under several spellings "
                        f"({', '.join(p + '*' for p in HEAD_PREFIXES if p in heads)}); one drafter uses one")
    if not heads:
        problems.append(f"{weights}: no drafter layers (expected lm_head.{{i}}.*, lm_heads.{{i}}.* or 0.{{i}}.*)")
    proj = next((p for p in INPUT_PROJ_PREFIXES if p in projs), None)
    if len(projs) > 1:
        problems.append(f"{weights}: both input_proj.* and input_projs.* are stored; one drafter has one input_proj")
    return head, proj


def _structure_problems(d: ReDrafterDrafter) -> list[str]:
    """num_draft_layers against the stored layers, input_proj against exit_dim, rnn against rnn_*, then shapes."""
    out, f, c = [], d.weights, d.config_path
    p = d.head_prefix
    linear = sorted({int(m[2]) for k in d.store.keys() if (m := _HEAD_KEY.match(k)) and m[1] == p
                     and m[3] == "linear.weight"})
    last = sorted({int(m[2]) for k in d.store.keys() if (m := _HEAD_KEY.match(k)) and m[1] == p and m[3] == "weight"})
    if linear != list(range(d.num_draft_layers)) or last != [d.num_draft_layers]:
        stored = (f"ResBlocks {', '.join(f'{p}{i}.linear' for i in linear) or 'none'} and last layer "
                  f"{', '.join(f'{p}{i}.weight' for i in last) or 'none'}")
        out.append(f"{c}: num_draft_layers={d.num_draft_layers} but {f.name} holds {stored} (expected ResBlocks "
                   f"{p}0..{d.num_draft_layers - 1}.linear and last layer {d.lm_head_key})" if d.num_draft_layers
                   else f"{c}: num_draft_layers=0 but {f.name} holds {stored} (expected last layer {d.lm_head_key} "
                   "only)")
    for i in linear:
        if f"{p}{i}.linear.bias" not in d.store:
            out.append(f"{f}: {p}{i}.linear.bias is missing (each ResBlock's linear has a bias)")
    if d.needs_input_proj and d.input_proj_prefix is None:
        out.append(f"{c}: exit_dim={d.exit_dim} is not 2 x hidden_size={d.hidden_size}, so the drafter needs "
                   f"input_proj.weight and input_proj.bias, which {f.name} lacks")
    elif d.needs_input_proj:
        for kind in ("weight", "bias"):
            if f"{d.input_proj_prefix}{kind}" not in d.store:
                out.append(f"{f}: {d.input_proj_prefix}{kind} is missing (input_proj has a bias)")
    elif d.input_proj_prefix is not None:
        out.append(f"{c}: exit_dim={d.exit_dim} is 2 x hidden_size={d.hidden_size}, so the drafter has no "
                   f"input_proj, yet {f.name} holds {d.input_proj_prefix}weight (exit_dim or hidden_size is wrong)")
    rnn_stored = [k for k in RNN_KEYS if k in d.store]
    if d.rnn and len(rnn_stored) < len(RNN_KEYS):
        missing = [k for k in RNN_KEYS if k not in d.store]
        out.append(f"{c}: rnn=true but {f.name} lacks {', '.join(missing)}")
    if not d.rnn and rnn_stored:
        out.append(f"{c}: rnn=false but {f.name} holds {', '.join(rnn_stored)} (a recurrent drafter says rnn: true)")
    vocab = d.vocab_size
    last = d.stored_lm_head_key
    if last and d.config_vocab_size is not None and vocab != d.config_vocab_size:
        out.append(f"{c}: vocab_size={d.config_vocab_size} but {last} in {f.name} scores {vocab} tokens")
    fields = f"hidden_size={d.hidden_size}, exit_dim={d.exit_dim}"
    shapes = d.expected_shapes(vocab or 0)
    if last and last != d.lm_head_key:
        shapes[last] = shapes.pop(d.lm_head_key)
    for key, shape in shapes.items():
        if key in d.store and (actual := d.store.info(key).shape) != shape:
            out.append(f"{f}: tensor {key} has shape {list(actual)}, expected {list(shape)} ({c.name}: {fields})")
    return out
