"""A drafter checked against its base before `deploy --flavour llmapi` writes a model.yaml that names both.

TensorRT-LLM's LLM API reads the folders only when the GPU host loads the model, and a mismatch there is a
load failure or, for a vocabulary, silently wrong drafts. What can be read from config.json and the safetensors
headers is checked here, one line per mismatch: an EAGLE-3 draft's hidden size and vocabulary against the base
(a reduced draft vocabulary needs its `d2t` map), a draft model's vocabulary, and that an MTP base declares its
next-token layers (DeepSeek-V3 `num_nextn_predict_layers`; Qwen3-Next `mtp_num_hidden_layers`).
"""

from __future__ import annotations

from pathlib import Path

from trtspec.checkpoint.hf_config import read_json
from trtspec.errors import CheckpointError

MTP_LAYER_FIELDS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")


def base_config(base_dir: Path) -> dict:
    """The base's config.json (any architecture the LLM API runs; read, not interpreted)."""
    return read_json(Path(base_dir) / "config.json")


def mtp_layers(config: dict) -> int:
    """The MTP modules a base declares (0: none)."""
    for key in MTP_LAYER_FIELDS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def check_drafter(base_dir: Path, drafter: str | None, draft_dir: Path | None = None) -> list[str]:
    """Every mismatch between `drafter` (eagle3 / mtp / draft_target / ngram / None) and the base, one line each."""
    base = Path(base_dir)
    config = base_config(base)
    where = base / "config.json"
    if drafter == "mtp":
        if not mtp_layers(config):
            return [f"{where}: --mtp needs a base with multi-token-prediction layers, but it declares none "
                    f"({' or '.join(MTP_LAYER_FIELDS)} > 0; DeepSeek-V3 / R1 do)"]
        return []
    if drafter == "eagle3":
        return _eagle3_lines(config, where, Path(draft_dir))
    if drafter == "draft_target":
        draft = read_json(Path(draft_dir) / "config.json")
        return _vocab_lines(config, where, draft, Path(draft_dir) / "config.json", "vocab_size")
    return []


def _eagle3_lines(config: dict, where: Path, draft_dir: Path) -> list[str]:
    draft_where = draft_dir / "config.json"
    draft = read_json(draft_where)
    lines = []
    hidden = config.get("hidden_size")
    # an EAGLE-3 draft's fc reads three of the target's hidden states: target_hidden_size when it differs
    target_hidden = draft.get("target_hidden_size") or draft.get("hidden_size")
    if target_hidden != hidden:
        key = "target_hidden_size" if draft.get("target_hidden_size") else "hidden_size"
        lines.append(f"{draft_where}: {key} {target_hidden} differs from the base's hidden_size {hidden} "
                     f"({where}); the draft reads the base's hidden states")
    lines += _vocab_lines(config, where, draft, draft_where, "vocab_size")
    vocab = draft.get("vocab_size")
    draft_vocab = draft.get("draft_vocab_size") or vocab
    if isinstance(draft_vocab, int) and isinstance(vocab, int) and draft_vocab < vocab:
        if "d2t" not in _tensor_names(draft_dir):
            lines.append(f"{draft_dir}: draft_vocab_size {draft_vocab} < vocab_size {vocab} but the weights hold no "
                         "d2t (the map from draft to target token ids)")
    elif isinstance(draft_vocab, int) and isinstance(vocab, int) and draft_vocab > vocab:
        lines.append(f"{draft_where}: draft_vocab_size {draft_vocab} exceeds vocab_size {vocab}")
    return lines


def _vocab_lines(config: dict, where: Path, draft: dict, draft_where: Path, key: str) -> list[str]:
    if draft.get(key) != config.get("vocab_size"):
        return [f"{draft_where}: {key} {draft.get(key)} differs from the base's vocab_size {config.get('vocab_size')} "
                f"({where}); draft and base must share a tokenizer"]
    return []


def _tensor_names(directory: Path) -> set[str]:
    from trtspec.checkpoint.tensorfile import open_hf_weights

    try:
        return set(open_hf_weights(directory).keys())
    except CheckpointError:
        return set()
