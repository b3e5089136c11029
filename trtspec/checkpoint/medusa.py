"""Medusa heads in every released on-disk form, normalised to FasterDecoding keys `{h}.{l}.linear.*`, `{h}.{L}.weight`.

Forms: FasterDecoding `medusa_lm_head.pt|.safetensors` + config.json (Medusa-1, and the heads-only "legacy"
variant without per-head lm_head); a full model folder with `medusa_head.` tensors (Medusa-2); a ModelOpt
folder with `medusa_heads.` tensors and `hf_quant_config.json`. The stored tensors decide the head count:
released configs are known to disagree with them (medusa-vicuna-7b-v1.3 says 2 heads and stores 4).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from trtspec.checkpoint.hf_config import read_json
from trtspec.checkpoint.tensorfile import TensorStore, open_hf_weights, open_tensor_file
from trtspec.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)

HEAD_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
FULL_MODEL_PREFIX = "medusa_head."
MODELOPT_PREFIX = "medusa_heads."
_LINEAR = re.compile(r"^(\d+)\.(\d+)\.linear\.(weight|bias)$")
_LM_HEAD = re.compile(r"^(\d+)\.(\d+)\.weight$")


@dataclass(frozen=True)
class MedusaHeads:
    """Medusa heads found in a directory, keyed the FasterDecoding way."""

    directory: Path
    variant: str  # "faster_decoding" | "full_model" | "modelopt"
    store: TensorStore
    num_heads: int  # heads to convert (the first num_heads stored heads)
    stored_heads: int
    num_layers: int
    per_head_lm_head: bool  # False: heads-only variant, each head reuses the base lm_head
    config_num_heads: int | None

    def linear_key(self, head: int, layer: int, kind: str) -> str:
        return f"{head}.{layer}.linear.{kind}"

    def lm_head_key(self, head: int) -> str:
        return f"{head}.{self.num_layers}.weight"

    @property
    def source(self) -> str:
        """The file(s) holding the heads, for messages."""
        return ", ".join(str(p) for p in self.store.files)


def has_embedded_heads(store: TensorStore) -> bool:
    return any(k.startswith((FULL_MODEL_PREFIX, MODELOPT_PREFIX)) for k in store.keys())


def read_medusa_heads(directory: Path, *, num_heads: int | None = None,
                      num_layers: int | None = None) -> MedusaHeads:
    """Find and validate the Medusa heads stored in `directory`."""
    directory = Path(directory)
    variant, store = _open_heads(directory)
    stored_heads, stored_layers, per_head_lm_head = _scan_keys(store)
    config_heads, config_layers = _config_counts(directory)
    if config_layers is not None and config_layers != stored_layers:
        log.warning("%s says medusa_num_layers=%s but the weights hold %d layer(s) per head; using %d",
                    directory / "config.json", config_layers, stored_layers, stored_layers)
    if num_layers is not None and num_layers != stored_layers:
        raise ConfigError(
            f"{store.files[0]} stores {stored_layers} ResBlock layer(s) per head but --num-medusa-layers "
            f"{num_layers} was given; pass --num-medusa-layers {stored_layers}")
    if num_heads is not None and not 1 <= num_heads <= stored_heads:
        raise ConfigError(
            f"{store.files[0]} stores {stored_heads} Medusa heads (0..{stored_heads - 1}) but "
            f"--num-medusa-heads {num_heads} was given; pass --num-medusa-heads {stored_heads} or fewer")
    if num_heads is None and config_heads is not None and config_heads != stored_heads:
        log.warning("%s says %d Medusa heads but %s stores %d; converting all %d "
                    "(pass --num-medusa-heads to choose)", directory / "config.json", config_heads,
                    store.files[0], stored_heads, stored_heads)
    return MedusaHeads(directory=directory, variant=variant, store=store,
                       num_heads=num_heads or stored_heads, stored_heads=stored_heads,
                       num_layers=stored_layers, per_head_lm_head=per_head_lm_head,
                       config_num_heads=config_heads)


def _open_heads(directory: Path) -> tuple[str, TensorStore]:
    for name in HEAD_FILES:
        if (directory / name).is_file():
            return "faster_decoding", TensorStore.from_files([open_tensor_file(directory / name)], directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: Medusa directory not found")
    try:
        weights = open_hf_weights(directory)
    except CheckpointError:
        weights = None
    for prefix, variant in ((MODELOPT_PREFIX, "modelopt"), (FULL_MODEL_PREFIX, "full_model")):
        if weights is not None and any(k.startswith(prefix) for k in weights.keys()):
            return variant, weights.with_prefix(prefix)
    raise CheckpointError(
        f"{directory}: no Medusa heads found (expected {' or '.join(HEAD_FILES)}, or "
        f"{FULL_MODEL_PREFIX}* / {MODELOPT_PREFIX}* tensors in the model weights)")


def _scan_keys(store: TensorStore) -> tuple[int, int, bool]:
    """Return (heads, layers per head, whether heads carry their own lm_head), validating the key set."""
    linear: dict[int, set[int]] = {}
    lm_head: dict[int, int] = {}
    for key in store.keys():
        if m := _LINEAR.match(key):
            linear.setdefault(int(m[1]), set()).add(int(m[2]))
        elif m := _LM_HEAD.match(key):
            lm_head[int(m[1])] = int(m[2])
        else:
            raise CheckpointError(f"{store.info(key).path}: unexpected tensor {key} among Medusa heads")
    if not linear:
        raise CheckpointError(f"{store.directory}: Medusa weights hold no {{h}}.{{l}}.linear.weight tensors")
    heads = sorted(linear)
    if heads != list(range(len(heads))):
        raise CheckpointError(f"{store.files[0]}: Medusa head indices {heads} are not 0..{len(heads) - 1}")
    layers = len(linear[0])
    for h in heads:
        _check_head(store, h, linear[h], layers, lm_head.get(h))
    if lm_head and set(lm_head) != set(heads):
        missing = sorted(set(heads) - set(lm_head))
        raise CheckpointError(f"{store.files[0]}: Medusa heads {missing} lack their lm_head ({missing[0]}.{layers}.weight)")
    return len(heads), layers, bool(lm_head)


def _check_head(store: TensorStore, h: int, layers: set[int], expected: int, lm_index: int | None) -> None:
    if layers != set(range(expected)):
        raise CheckpointError(f"{store.files[0]}: Medusa head {h} has layers {sorted(layers)}, head 0 has {expected}")
    for layer in layers:
        for kind in ("weight", "bias"):
            if f"{h}.{layer}.linear.{kind}" not in store:
                raise CheckpointError(f"{store.files[0]}: Medusa head {h} is missing {h}.{layer}.linear.{kind}")
    if lm_index is not None and lm_index != expected:
        raise CheckpointError(
            f"{store.files[0]}: Medusa head {h} lm_head is {h}.{lm_index}.weight, expected {h}.{expected}.weight")


def _config_counts(directory: Path) -> tuple[int | None, int | None]:
    """Head and layer counts from config.json, accepting every key spelling in the wild."""
    path = directory / "config.json"
    if not path.is_file():
        return None, None
    raw = read_json(path)
    nested = raw.get("medusa") if isinstance(raw.get("medusa"), dict) else {}
    heads = raw.get("medusa_num_heads", raw.get("num_medusa_heads", nested.get("num_medusa_heads")))
    layers = raw.get("medusa_num_layers", raw.get("num_medusa_layers", nested.get("num_medusa_layers")))
    return heads, layers
