"""A drafter checked against its base before `deploy --flavour llmapi` writes a model.yaml that names both.

TensorRT-LLM's LLM API reads the folders only when the GPU host loads the model, and a mismatch there is a
load failure or, for a vocabulary, silently wrong drafts. What can be read from config.json and the safetensors
headers is checked here, one line per mismatch: an EAGLE-3 draft's hidden size and vocabulary against the base
(a reduced draft vocabulary needs its `d2t` map), a draft model's vocabulary, and that an MTP base declares its
next-token layers (DeepSeek-V3 `num_nextn_predict_layers`; Qwen3-Next `mtp_num_hidden_layers`). An EAGLE-3 draft
that names the base layers it fuses is checked against the base's layer count, and against the layers TensorRT-LLM
captures (`eagle3_capture`: its default, or speculative_config's `eagle3_layers_to_capture`). The fields are read
by `trtspec.checkpoint.llmapi_fields`.
"""

from __future__ import annotations

from pathlib import Path

from trtspec.checkpoint.hf_config import read_json
from trtspec.checkpoint.llmapi_fields import MTP_LAYER_FIELDS, default_capture, eagle3_layer_ids, mtp_layers
from trtspec.errors import CheckpointError


def base_config(base_dir: Path) -> dict:
    """The base's config.json (any architecture the LLM API runs; read, not interpreted)."""
    return read_json(Path(base_dir) / "config.json")


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
    return lines + _layer_id_lines(config, where, draft, draft_where)


def _layer_id_lines(config: dict, where: Path, draft: dict, draft_where: Path) -> list[str]:
    """The base layers the draft names must exist in the base."""
    field, ids = eagle3_layer_ids(draft)
    if field is None:
        return []
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return [f"{draft_where}: {field} {ids!r} is not a list of layer ids"]
    layers = config.get("num_hidden_layers")
    outside = [i for i in ids if not isinstance(layers, int) or not 0 <= i <= layers]
    if outside:
        return [f"{draft_where}: {field} {ids} names layer {outside[0]}, but the base has {layers} layers ({where})"]
    return []


def eagle3_capture(config: dict, draft: dict, written=None) -> tuple[str, str]:
    """Whether the base layers TensorRT-LLM captures for the draft are the ones the draft names: (severity, line),
    severity "note" (they are, or the draft names none) or "warning". `written`: speculative_config's
    eagle3_layers_to_capture (None: TensorRT-LLM's default for the base)."""
    field, ids = eagle3_layer_ids(draft)
    layers = config.get("num_hidden_layers")
    default = default_capture(layers)
    if written is not None:
        captured, how = sorted(written) if isinstance(written, (list, tuple, set)) else written, \
            "speculative_config.eagle3_layers_to_capture"
    else:
        captured, how = (list(default) if default else None), f"its default for a base of {layers} layers"
    if captured is None:
        return ("warning", f"TensorRT-LLM has no default EAGLE-3 capture for a base of {layers} layers (it needs "
                           "more than 5); set speculative_config.eagle3_layers_to_capture (deploy "
                           "--speculative-option eagle3_layers_to_capture=[...])")
    if field is None:
        return "note", (f"TensorRT-LLM captures base layers {captured} ({how}); the draft's config names none to "
                        "check them against")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return "warning", f"the draft's {field} {ids!r} is not a list of layer ids"
    if not isinstance(captured, list):
        return "warning", f"{how} {captured!r} is not a list of layer ids"
    if sorted(ids) == sorted(captured):
        return "note", f"TensorRT-LLM captures base layers {captured} ({how}), the ones the draft's {field} names"
    if sorted(i - 1 for i in ids) == sorted(captured):
        return "note", (f"TensorRT-LLM captures base layers {captured} ({how}): the draft's {field} {ids}, counted "
                        "as vLLM counts them (its id i is the output of layer i - 1)")
    return "warning", (f"TensorRT-LLM captures base layers {captured} ({how}), but the draft's {field} names {ids}: "
                       f"set speculative_config.eagle3_layers_to_capture (deploy --speculative-option "
                       f"eagle3_layers_to_capture=[{', '.join(map(str, ids))}], or each id less 1 if the draft's "
                       "trainer counts as vLLM does)")


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
